// Package reaper removes what dead qemu-mcp servers left in the runtime
// directory: their serial FIFOs, QMP socket and record, their QEMU if it
// outlived them, and their TAP device (through a hook).
//
// Ownership comes only from exact file names (package names: they carry the
// owner's PID and start time) and from the records servers write about
// themselves (package registry). A server is dead when its PID and start
// time no longer name a running process; that is read from the name itself,
// so an earlier process that had this server's own PID is dead too. For the
// PID-only names of older versions it comes from the record, and without a
// record a server is dead only when no process has that PID at all. A
// process is signalled only if a dead server's record names it and its PID,
// start time and executable all still match. Nothing is ever found by
// process name, nothing of a live server is touched, symlinks are never
// followed, and only FIFOs, sockets and regular files owned by this user,
// with the exact names above, are removed. captures/, images/ and every
// other name are left alone.
package reaper

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"golang.org/x/sys/unix"
)

// Options tune Scan and Reap.
type Options struct {
	// Self is the server whose entries are never touched; the zero value
	// means this process. With a zero StartTime every owner with Self's
	// PID counts as Self.
	Self names.Owner
	// Logger receives one line per action; nil discards.
	Logger *slog.Logger
	// DeleteTAP deletes the network link of that name, and must return nil
	// if it does not exist. Nil skips TAP deletion (reported as skipped).
	// It is only called with a name that a dead server's record gives and
	// that package names derives from that server and instance.
	DeleteTAP func(name string) error
	// KillWait bounds the wait for a killed QEMU to be gone; 0 means 2s.
	KillWait time.Duration
}

func (o Options) self() names.Owner {
	if o.Self.PID > 0 {
		return o.Self
	}
	if id, err := proc.Self(); err == nil {
		return names.Owner{PID: id.PID, StartTime: id.StartTime}
	}
	return names.Owner{PID: os.Getpid()}
}

// isSelf tells whether owner o is the server self.
func isSelf(o, self names.Owner) bool {
	return o.PID == self.PID && (self.StartTime == 0 || o.StartTime == self.StartTime)
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// File is one entry of the runtime directory that belongs to a server.
type File struct {
	Name string     `json:"name"`
	Path string     `json:"path"`
	Kind names.Kind `json:"kind"`
	// Instance is the guest the entry served ("" for records and the
	// names of older versions).
	Instance string   `json:"instance,omitempty"`
	Type     FileType `json:"type"`
	UID      int      `json:"uid"`
	// Problem says why it would not be removed even if its owner is dead
	// (wrong type, e.g. a symlink; another owner). Empty when removable.
	Problem string `json:"problem,omitempty"`

	ino uint64
}

// Owner is the set of entries named after one server (PID and start time),
// and the verdict on it.
type Owner struct {
	PID int `json:"pid"`
	// StartTime is the start time the names carry; zero for the PID-only
	// names of older versions.
	StartTime uint64 `json:"start_time,omitempty"`
	// Self marks the caller's own entries: never touched.
	Self bool `json:"self,omitempty"`
	// Dead tells whether the owner is known to be gone.
	Dead bool `json:"dead"`
	// Why explains the verdict.
	Why string `json:"why"`
	// Record is the owner's record when it could be read and trusted (a
	// regular file of ours naming this PID), RecordErr why not otherwise.
	Record    *registry.Record `json:"record,omitempty"`
	RecordErr string           `json:"record_error,omitempty"`
	Files     []File           `json:"files"`

	// reusedBy is the start time of the process that now has the PID, when
	// the recorded server is dead but its PID was reused.
	reusedBy time.Time
}

// Owner returns the identity the entries are named after.
func (o Owner) Owner() names.Owner { return names.Owner{PID: o.PID, StartTime: o.StartTime} }

// Inventory is what Scan found.
type Inventory struct {
	Dir    string  `json:"dir"`
	Owners []Owner `json:"owners"`
	// Unknown lists names that match no pattern (captures/ and images/
	// excepted): never touched.
	Unknown []string `json:"unknown,omitempty"`
}

// Dead returns the owners known to be dead.
func (inv Inventory) Dead() []Owner {
	var out []Owner
	for _, o := range inv.Owners {
		if o.Dead {
			out = append(out, o)
		}
	}
	return out
}

// KeepDirs are the names Scan never reports as unknown: they are expected
// (kept files, shared images), and never touched.
var KeepDirs = []string{"captures", "images"}

// Scan reads the runtime directory once and decides, for every PID named by
// an entry, whether its server is dead. It changes nothing. A missing
// directory is empty.
func Scan(dir string, opts Options) (Inventory, error) {
	inv, fd, err := scan(dir, opts)
	if fd >= 0 {
		unix.Close(fd)
	}
	return inv, err
}

func scan(dir string, opts Options) (Inventory, int, error) {
	inv := Inventory{Dir: dir}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return inv, -1, nil
		}
		return inv, -1, fmt.Errorf("reaper: open %s: %w", dir, err)
	}
	// Read through a duplicate so that fd stays ours for the *at calls.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return inv, fd, fmt.Errorf("reaper: %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(dup), dir)
	des, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return inv, fd, fmt.Errorf("reaper: read %s: %w", dir, err)
	}

	self := opts.self()
	uid := os.Getuid()
	owners := make(map[names.Owner]*Owner)
	for _, de := range des {
		name := de.Name()
		e, ok := names.Classify(name)
		if !ok {
			if !slices.Contains(KeepDirs, name) {
				inv.Unknown = append(inv.Unknown, name)
			}
			continue
		}
		f := File{Name: name, Path: filepath.Join(dir, name), Kind: e.Kind, Instance: e.Instance}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			f.Type, f.Problem = TypeOther, "lstat: "+err.Error()
		} else {
			f.Type, f.UID, f.ino = fileType(st.Mode), int(st.Uid), st.Ino
			f.Problem = removable(f, uid)
		}
		o := owners[e.Owner]
		if o == nil {
			o = &Owner{PID: e.Owner.PID, StartTime: e.Owner.StartTime}
			owners[e.Owner] = o
		}
		o.Files = append(o.Files, f)
	}
	slices.Sort(inv.Unknown)

	inv.Owners = make([]Owner, 0, len(owners))
	for _, o := range owners {
		slices.SortFunc(o.Files, func(a, b File) int {
			if a.Kind != b.Kind {
				return removalOrder(a.Kind) - removalOrder(b.Kind)
			}
			return strings.Compare(a.Name, b.Name)
		})
		switch {
		case isSelf(o.Owner(), self):
			o.Self, o.Why = true, "this process"
		case o.PID == self.PID:
			// This process never makes another's names, nor PID-only
			// ones: an earlier process that had our PID left them.
			judge(fd, o, uid)
			o.Dead, o.Why = true, "dead (an earlier process with this server's own pid "+strconv.Itoa(o.PID)+")"
		default:
			judge(fd, o, uid)
		}
		inv.Owners = append(inv.Owners, *o)
	}
	slices.SortFunc(inv.Owners, func(a, b Owner) int {
		if a.PID != b.PID {
			return a.PID - b.PID
		}
		return cmp.Compare(a.StartTime, b.StartTime)
	})
	return inv, fd, nil
}

// removalOrder sorts a dead server's files for removal: the record and its
// temporaries last, whatever kinds are added later, so that an interrupted
// reap leaves the record to find the rest again.
func removalOrder(k names.Kind) int {
	if k == names.Record || k == names.RecordTemp {
		return 1000 + int(k)
	}
	return int(k)
}

// judge decides whether o's server is dead, reading /proc once for its PID.
func judge(dirfd int, o *Owner, uid int) {
	for _, f := range o.Files {
		if f.Kind != names.Record {
			continue
		}
		if f.Problem != "" {
			o.RecordErr = "record not trusted: " + f.Problem
			break
		}
		rec, err := registry.ReadAt(dirfd, f.Name, f.Path)
		if err == nil {
			err = rec.Names(o.Owner())
		}
		if err != nil {
			o.RecordErr = err.Error()
		} else {
			o.Record = &rec
		}
	}
	switch {
	case !o.Owner().Legacy():
		// The names carry the start time: they are their own proof.
		judgeIdentity(o, proc.Identity{PID: o.PID, StartTime: o.StartTime}, "its names")
	case o.Record != nil:
		if o.Record.StartTime == 0 {
			live, _, err := proc.Check(o.Record.Identity())
			if err == nil && live == proc.Alive {
				o.Why = "record has no start time and a process has pid " + strconv.Itoa(o.PID) + ": left alone"
				return
			}
		}
		judgeIdentity(o, o.Record.Identity(), "its record")
	default:
		live, _, err := proc.Check(proc.Identity{PID: o.PID})
		switch {
		case err != nil:
			o.Why = "cannot tell: " + err.Error()
		case live == proc.Alive:
			o.Why = "no record, and a process has pid " + strconv.Itoa(o.PID) + ": cannot tell whether it is the owner, left alone"
		default:
			o.Dead = true
			o.Why = "no record, and no process has pid " + strconv.Itoa(o.PID) + " (" + live.String() + ")"
		}
	}
}

// judgeIdentity judges o by the identity that from (its names or record)
// gives.
func judgeIdentity(o *Owner, id proc.Identity, from string) {
	live, info, err := proc.Check(id)
	switch {
	case err != nil:
		o.Why = "cannot tell: " + err.Error()
	case live == proc.Alive:
		o.Why = "alive (pid and start time match " + from + ")"
	case live == proc.Reused:
		o.Dead = true
		o.reusedBy = proc.StartedAt(info.StartTime)
		o.Why = fmt.Sprintf("dead (pid %d now belongs to another process, started %s)",
			o.PID, o.reusedBy.Format(time.RFC3339))
	default:
		o.Dead = true
		o.Why = "dead (" + live.String() + ")"
	}
}

func fileType(mode uint32) FileType {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return TypeFIFO
	case unix.S_IFSOCK:
		return TypeSocket
	case unix.S_IFREG:
		return TypeRegular
	case unix.S_IFLNK:
		return TypeSymlink
	case unix.S_IFDIR:
		return TypeDir
	}
	return TypeOther
}

// removable says why f may not be removed whoever owns it; "" if it may.
func removable(f File, uid int) string {
	if f.Type != Want(f.Kind) {
		if f.Type == TypeSymlink {
			return "is a symlink where a " + string(Want(f.Kind)) + " belongs: not followed, not removed"
		}
		return "is a " + string(f.Type) + ", not a " + string(Want(f.Kind)) + ": not removed"
	}
	if f.UID != uid {
		return fmt.Sprintf("owned by uid %d, not by this user (uid %d): not removed", f.UID, uid)
	}
	return ""
}

// Report is what Reap did. It is part of the boot result.
type Report struct {
	Dir string `json:"dir"`
	// DeadServers lists the PIDs whose leftovers were reaped.
	DeadServers []int `json:"dead_servers,omitempty"`
	// Removed lists the paths removed.
	Removed []string `json:"removed,omitempty"`
	// KilledQEMU lists the QEMU processes of dead servers that were killed.
	KilledQEMU []Killed `json:"killed_qemu,omitempty"`
	// DeletedTAPs lists the TAP devices deleted.
	DeletedTAPs []string `json:"deleted_taps,omitempty"`
	// Skipped lists what was deliberately left alone, and why.
	Skipped []Skip `json:"skipped,omitempty"`
	// Errors lists what failed.
	Errors []string `json:"errors,omitempty"`
	// Kept counts the entries of live servers (including this one) and of
	// PIDs whose owner could not be told, left alone.
	Kept int `json:"kept"`
	// Unknown counts the entries matching no pattern, left alone.
	Unknown int `json:"unknown"`
	// Elapsed is how long Reap took.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Omitted counts the list entries Bounded left out.
	Omitted int `json:"omitted,omitempty"`
}

// Bounded returns the report with each list cut to its first n entries,
// and how many were left out: ten thousand stale files make a report far
// too long for a tool result, and the log has all of it.
func (r Report) Bounded(n int) Report {
	cut := func(l int) int {
		if l > n {
			r.Omitted += l - n
			return n
		}
		return l
	}
	r.DeadServers = r.DeadServers[:cut(len(r.DeadServers))]
	r.Removed = r.Removed[:cut(len(r.Removed))]
	r.KilledQEMU = r.KilledQEMU[:cut(len(r.KilledQEMU))]
	r.DeletedTAPs = r.DeletedTAPs[:cut(len(r.DeletedTAPs))]
	r.Skipped = r.Skipped[:cut(len(r.Skipped))]
	r.Errors = r.Errors[:cut(len(r.Errors))]
	return r
}

// Killed is a QEMU that outlived its server and was killed.
type Killed struct {
	ServerPID  int    `json:"server_pid"`
	PID        int    `json:"pid"`
	StartTime  uint64 `json:"start_time"`
	Executable string `json:"executable"`
}

// Skip is something left alone on purpose.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// String summarises the report on one line.
func (r Report) String() string {
	if len(r.DeadServers) == 0 && len(r.Skipped) == 0 && len(r.Errors) == 0 {
		return fmt.Sprintf("reaper: nothing to reap (%d entries of live servers kept)", r.Kept)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "reaper: %d dead server(s): removed %d file(s)", len(r.DeadServers), len(r.Removed))
	if len(r.KilledQEMU) > 0 {
		pids := make([]string, len(r.KilledQEMU))
		for i, k := range r.KilledQEMU {
			pids[i] = strconv.Itoa(k.PID)
		}
		fmt.Fprintf(&b, ", killed QEMU %s", strings.Join(pids, ","))
	}
	if len(r.DeletedTAPs) > 0 {
		fmt.Fprintf(&b, ", deleted TAP %s", strings.Join(r.DeletedTAPs, ","))
	}
	fmt.Fprintf(&b, "; skipped %d, %d error(s), kept %d (%s)", len(r.Skipped), len(r.Errors), r.Kept, r.Elapsed.Round(time.Microsecond))
	return b.String()
}

// Reap removes what dead servers left in dir: it kills a dead server's
// recorded QEMU if that process verifiably still runs, deletes its TAP
// through opts.DeleteTAP, and removes its FIFOs, socket and record. A
// server whose QEMU cannot be verified gone keeps all its entries (the
// record is the only handle on that QEMU) and the failure is reported.
// Reap fails only if dir cannot be read; everything else is in the Report.
func Reap(dir string, opts Options) (Report, error) {
	start := time.Now()
	inv, fd, err := scan(dir, opts)
	if fd >= 0 {
		defer unix.Close(fd)
	}
	rep := Report{Dir: dir, Unknown: len(inv.Unknown)}
	if err != nil {
		return rep, err
	}
	r := reaper{opts: opts, log: opts.logger(), dirfd: fd, uid: os.Getuid(), rep: &rep}
	for i := range inv.Owners {
		o := &inv.Owners[i]
		if !o.Dead {
			rep.Kept += len(o.Files)
			continue
		}
		r.reapOwner(o)
	}
	rep.Elapsed = time.Since(start)
	if len(rep.DeadServers) > 0 || len(rep.Errors) > 0 {
		r.log.Info("reaped dead servers", "dir", dir, "summary", rep.String())
	}
	return rep, nil
}

type reaper struct {
	opts  Options
	log   *slog.Logger
	dirfd int
	uid   int
	rep   *Report
}

func (r *reaper) skip(path, reason string) {
	r.rep.Skipped = append(r.rep.Skipped, Skip{Path: path, Reason: reason})
	r.log.Info("reaper: left alone", "path", path, "reason", reason)
}

func (r *reaper) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.rep.Errors = append(r.rep.Errors, msg)
	r.log.Warn("reaper: " + msg)
}

func (r *reaper) reapOwner(o *Owner) {
	r.rep.DeadServers = append(r.rep.DeadServers, o.PID)
	keepRecord := false
	if rec := o.Record; rec != nil {
		gone := true
		for _, c := range rec.Children() {
			gone = r.qemuGone(o.PID, c) && gone
		}
		if !gone {
			// A QEMU may still run: leave everything, the record is the
			// only way to find that process again.
			for _, f := range o.Files {
				r.skip(f.Path, "a QEMU of this dead server may still run: kept")
			}
			return
		}
		if rec.TAP != "" && !r.deleteTAP(o.PID, rec.TAP, names.LegacyTAP(o.PID)) {
			keepRecord = true
		}
		for _, in := range rec.Instances {
			if in.TAP != "" && !r.deleteTAP(o.PID, in.TAP, names.TAP(rec.Owner(), in.Name)) {
				keepRecord = true
			}
		}
	}
	// The record goes last (Files are sorted by kind), so an interrupted
	// reap leaves it to be found again.
	for _, f := range o.Files {
		if f.Kind == names.Record && keepRecord {
			r.skip(f.Path, "kept: the TAP it names could not be deleted")
			continue
		}
		r.remove(o, f)
	}
}

// reusedSlack allows for StartedAt's precision (the boot time is known to a
// second) when comparing a file's ctime with a process start.
const reusedSlack = 2 * time.Second

func (r *reaper) remove(o *Owner, f File) {
	if f.Problem != "" {
		r.skip(f.Path, f.Problem)
		return
	}
	// Look again right before unlinking: the QEMU kill may have taken a
	// while, and the entry must still be the very file judged removable.
	var st unix.Stat_t
	if err := unix.Fstatat(r.dirfd, f.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			r.fail("lstat %s: %v", f.Path, err)
		}
		return
	}
	now := f
	now.Type, now.UID = fileType(st.Mode), int(st.Uid)
	if p := removable(now, r.uid); p != "" {
		r.skip(f.Path, p)
		return
	}
	if st.Ino != f.ino {
		r.skip(f.Path, "replaced while reaping: left alone")
		return
	}
	if o.Owner().Legacy() && !o.reusedBy.IsZero() && !time.Unix(st.Ctim.Unix()).Before(o.reusedBy.Add(-reusedSlack)) {
		// A process now has the PID and a PID-only name is not older
		// than it: it may be that process's, made after we read the old
		// record. (A name with a start time cannot be.)
		r.skip(f.Path, "not older than the process that now has pid "+strconv.Itoa(o.PID)+": left alone")
		return
	}
	if f.Kind == names.ProbeDir {
		// A probe's own files only (FIFOs, sockets, images, a replay
		// log); RemoveAll follows no symlink.
		if err := os.RemoveAll(f.Path); err != nil {
			r.fail("remove %s: %v", f.Path, err)
			return
		}
	} else if err := unix.Unlinkat(r.dirfd, f.Name, 0); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			r.fail("remove %s: %v", f.Path, err)
		}
		return
	}
	r.rep.Removed = append(r.rep.Removed, f.Path)
	r.log.Debug("reaper: removed", "path", f.Path, "owner", o.PID)
}

// deleteTAP deletes the TAP a dead server recorded, if it has the name that
// server would have given it (want). It reports whether the record may go
// (deleted, or nothing that can be done).
func (r *reaper) deleteTAP(pid int, name, want string) bool {
	if name != want {
		r.skip("tap:"+name, fmt.Sprintf("record of pid %d names TAP %q, not %q: not deleted", pid, name, want))
		return true
	}
	if r.opts.DeleteTAP == nil {
		r.skip("tap:"+name, "no TAP deletion available: not deleted")
		return true
	}
	if err := r.opts.DeleteTAP(name); err != nil {
		r.fail("delete TAP %s of dead server %d: %v", name, pid, err)
		return false
	}
	r.rep.DeletedTAPs = append(r.rep.DeletedTAPs, name)
	r.log.Info("reaper: deleted TAP", "name", name, "owner", pid)
	return true
}
