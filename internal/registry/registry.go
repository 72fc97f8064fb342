// Package registry keeps the record a running qemu-mcp server writes about
// itself (and only itself) in the runtime directory: server-<pid>-<start
// time>.json (see package names).
//
// A record names its process by PID and start time, so that a later reader
// (the reaper before a boot, or `qemu-mcp doctor`) can tell a server that
// still runs from a dead one whose PID was reused, and can see what the dead
// one left behind: its QEMU child, its TAP device, its lock. Nothing here
// finds a process by name; a PID is only trusted together with its start
// time (see package proc).
package registry

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

// Transports a server can record.
const (
	TransportStdio = "stdio"
	TransportHTTP  = "http"
)

// MaxPID is PID_MAX_LIMIT: no Linux process has a larger PID, so a record or
// file name naming one is garbage.
const MaxPID = names.MaxPID

// MaxRecordSize bounds what Read accepts: a record is a few hundred bytes,
// anything much larger is not one of ours.
const MaxRecordSize = 1 << 20

// ExeIdentity identifies the executable file a process was started from, so
// that a later check can tell whether the file now at that path is still the
// same binary (an upgrade replaces it: the old server then serves stale code).
type ExeIdentity struct {
	Dev   uint64 `json:"dev"`
	Inode uint64 `json:"inode"`
	Size  int64  `json:"size"`
	// MtimeNS is the modification time in nanoseconds since the epoch.
	MtimeNS int64 `json:"mtime_ns"`
}

// Child identifies a process the server started (its QEMU).
type Child struct {
	PID        int    `json:"pid"`
	StartTime  uint64 `json:"start_time"`
	Executable string `json:"executable"`
}

// Identity returns the child's PID and start time.
func (c Child) Identity() proc.Identity {
	return proc.Identity{PID: c.PID, StartTime: c.StartTime}
}

// Record is what a server writes about itself.
type Record struct {
	PID int `json:"pid"`
	// StartTime is in clock ticks after boot (field 22 of /proc/<pid>/stat).
	StartTime uint64 `json:"start_time"`
	// Executable is the path of the server binary at start.
	Executable string `json:"executable"`
	// ExeIdentity is the identity of that binary at start; nil if unknown.
	ExeIdentity *ExeIdentity `json:"exe_identity"`
	Cwd         string       `json:"cwd"`
	// PPID and ParentStartTime name the parent at start (for stdio, the
	// client that owns the server).
	PPID            int    `json:"ppid"`
	ParentStartTime uint64 `json:"parent_start_time"`
	// Transport is "stdio" or "http"; Address is the listen address for http.
	Transport string    `json:"transport"`
	Address   string    `json:"address,omitempty"`
	Version   string    `json:"version"`
	Started   time.Time `json:"started"`
	// Instances are the guests the server runs, each with what it made.
	Instances []Instance `json:"instances,omitempty"`

	// QEMU, TAP and Lock are what older versions, with one guest per
	// server, recorded; they are read so that their leftovers are reaped,
	// and never written.
	QEMU *Child `json:"qemu,omitempty"`
	TAP  string `json:"tap,omitempty"`
	Lock string `json:"lock,omitempty"`
}

// Instance is one guest of a server and what it made: recorded as each part
// is made, so that if the server is killed the next one can undo it.
type Instance struct {
	Name string `json:"name"`
	// QEMU is the running QEMU, nil while it is not started.
	QEMU *Child `json:"qemu,omitempty"`
	// TAP is the name of the TAP device made for the guest, if any.
	TAP string `json:"tap,omitempty"`
	// Lock is the path of the repository lock held for it, if any.
	Lock string `json:"lock,omitempty"`
}

// Owner is the identity the record's file name carries.
func (r Record) Owner() names.Owner { return names.Owner{PID: r.PID, StartTime: r.StartTime} }

// Children lists every QEMU the record names.
func (r Record) Children() []Child {
	var out []Child
	if r.QEMU != nil {
		out = append(out, *r.QEMU)
	}
	for _, in := range r.Instances {
		if in.QEMU != nil {
			out = append(out, *in.QEMU)
		}
	}
	return out
}

// Identity returns the server's PID and start time.
func (r Record) Identity() proc.Identity {
	return proc.Identity{PID: r.PID, StartTime: r.StartTime}
}

// FileName returns the base name of the record of the server o.
func FileName(o names.Owner) string { return names.Name(names.Record, o, "") }

// Path returns where the record of the server o lives in dir.
func Path(dir string, o names.Owner) string { return filepath.Join(dir, FileName(o)) }

// Self returns a record describing the calling process: PID, start time,
// executable (path and identity), working directory, parent and its start
// time, and the start time as wall time. QEMU, TAP and Lock are left empty.
func Self(transport, address, version string) (Record, error) {
	pid := os.Getpid()
	info, exe, err := statExe(pid)
	if err != nil {
		return Record{}, err
	}
	// /proc/self/exe resolves to the inode this process runs, even if the
	// path was replaced since the exec.
	id, err := statIdentity("/proc/self/exe")
	if err != nil {
		return Record{}, fmt.Errorf("registry: executable of self: %w", err)
	}
	cwd, err := os.Getwd()
	if err != nil {
		return Record{}, fmt.Errorf("registry: working directory: %w", err)
	}
	rec := Record{
		PID:         pid,
		StartTime:   info.StartTime,
		Executable:  exe,
		ExeIdentity: &id,
		Cwd:         cwd,
		PPID:        info.PPID,
		Transport:   transport,
		Address:     address,
		Version:     version,
		Started:     time.Now().UTC().Truncate(time.Millisecond),
	}
	if started := proc.StartedAt(info.StartTime); !started.IsZero() {
		rec.Started = started.UTC()
	}
	if info.PPID > 0 {
		// The parent may be outside our PID namespace (PPID 0) or may
		// have died already; a record without its start time is still
		// useful (proc.Check then matches any start time).
		if pinfo, err := proc.Stat(info.PPID); err == nil {
			rec.ParentStartTime = pinfo.StartTime
		}
	}
	return rec, nil
}

// NewChild describes a process the caller started, typically QEMU right
// after exec.Cmd.Start returned (which is after the exec, so the executable
// is already QEMU's, and before Wait, so the PID cannot be reused yet).
func NewChild(pid int) (Child, error) {
	info, exe, err := statExe(pid)
	if err != nil {
		return Child{}, err
	}
	return Child{PID: pid, StartTime: info.StartTime, Executable: exe}, nil
}

// statExe reads pid's /proc stat and the path of its executable. The path
// is kept even if the file was replaced since the exec (Self's identity,
// and a child's check against its record, tell the two apart).
func statExe(pid int) (proc.Info, string, error) {
	info, err := proc.Stat(pid)
	if err != nil {
		return proc.Info{}, "", fmt.Errorf("registry: %w", err)
	}
	exe, err := proc.Exe(pid)
	if err != nil {
		return proc.Info{}, "", fmt.Errorf("registry: %w", err)
	}
	return info, strings.TrimSuffix(exe, deletedSuffix), nil
}

func statIdentity(path string) (ExeIdentity, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ExeIdentity{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return identityOf(&st), nil
}

func identityOf(st *unix.Stat_t) ExeIdentity {
	return ExeIdentity{
		Dev:     st.Dev,
		Inode:   st.Ino,
		Size:    st.Size,
		MtimeNS: st.Mtim.Nano(),
	}
}

// Validate reports what makes a record unusable: a PID out of range, or a
// QEMU child with one.
func (r Record) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

func (r Record) validate() error {
	if r.PID <= 0 || r.PID > MaxPID {
		return fmt.Errorf("record pid %d out of range", r.PID)
	}
	if r.PPID < 0 || r.PPID > MaxPID {
		return fmt.Errorf("record ppid %d out of range", r.PPID)
	}
	for _, c := range r.Children() {
		if c.PID <= 0 || c.PID > MaxPID {
			return fmt.Errorf("record qemu pid %d out of range", c.PID)
		}
	}
	return nil
}

// Marshal encodes a record as Write stores it.
func Marshal(rec Record) ([]byte, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("registry: encode record: %w", err)
	}
	return append(b, '\n'), nil
}

// Parse decodes a record. It never panics on garbage; unknown fields are
// ignored so that an older reader tolerates a newer writer.
func Parse(b []byte) (Record, error) {
	rec, err := parse(b)
	if err != nil {
		return Record{}, fmt.Errorf("registry: %w", err)
	}
	return rec, nil
}

func parse(b []byte) (Record, error) {
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&rec); err != nil {
		return Record{}, fmt.Errorf("parse record: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Record{}, errors.New("parse record: trailing data after the record")
	}
	if err := rec.validate(); err != nil {
		return Record{}, err
	}
	return rec, nil
}

// Write stores rec as dir/server-<pid>-<start time>.json atomically: it writes a new file
// in dir (O_EXCL|O_NOFOLLOW, mode 0600), syncs it and renames it over the
// old record, so a reader sees the old record or the new one, never half of
// one. Call it again to update the record (QEMU started or stopped, TAP).
func Write(dir string, rec Record) error {
	b, err := Marshal(rec)
	if err != nil {
		return err
	}
	f, tmp, err := createTemp(dir, rec.Owner())
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// The umask can only have removed bits; make the mode exact.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("registry: write record: %w", err)
	}
	// No fsync: a record names processes of this boot only (PIDs and
	// start times mean nothing after a power loss), so durability buys
	// nothing; the rename below is what makes the write atomic for the
	// readers that matter, which run at the same time.
	if err := f.Close(); err != nil {
		return fmt.Errorf("registry: close record: %w", err)
	}
	if err := os.Rename(tmp, Path(dir, rec.Owner())); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	ok = true
	return nil
}

func createTemp(dir string, o names.Owner) (*os.File, string, error) {
	for range 10 {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, "", fmt.Errorf("registry: %w", err)
		}
		name := names.TempName(o, hex.EncodeToString(rnd[:]))
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("registry: create record: %w", err)
		}
		return f, p, nil
	}
	return nil, "", errors.New("registry: create record: no free temporary name")
}

// Remove deletes the record of the server o. It removes only a regular file
// owned by this user (never a symlink, never what one points to); a missing
// record is not an error. A server calls it for itself on shutdown.
func Remove(dir string, o names.Owner) error {
	p := Path(dir, o)
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("registry: %s is not a regular file (%v): not removed", p, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
		return fmt.Errorf("registry: %s is not owned by this user: not removed", p)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

// Read reads and parses one record. It does not follow a symlink, does not
// block on a FIFO planted at the path, and refuses anything but a regular
// file of at most MaxRecordSize bytes.
func Read(path string) (Record, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return Record{}, fmt.Errorf("registry: %s is a symlink: not followed", path)
		}
		return Record{}, fmt.Errorf("registry: %w", err)
	}
	defer f.Close()
	return readOpen(f, path)
}

// ReadAt is Read for the entry name of the directory open as dirfd, with the
// same guarantees; it saves a path lookup per record when scanning a large
// directory.
func ReadAt(dirfd int, name, path string) (Record, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return Record{}, fmt.Errorf("registry: %s is a symlink: not followed", path)
		}
		return Record{}, fmt.Errorf("registry: %w", &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return readOpen(f, path)
}

func readOpen(f *os.File, path string) (Record, error) {
	fi, err := f.Stat()
	if err != nil {
		return Record{}, fmt.Errorf("registry: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Record{}, fmt.Errorf("registry: %s is not a regular file (%v)", path, fi.Mode().Type())
	}
	if fi.Size() > MaxRecordSize {
		return Record{}, fmt.Errorf("registry: %s is too large for a record (%d bytes)", path, fi.Size())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxRecordSize+1))
	if err != nil {
		return Record{}, fmt.Errorf("registry: read %s: %w", path, err)
	}
	if len(b) > MaxRecordSize {
		return Record{}, fmt.Errorf("registry: %s is too large for a record", path)
	}
	rec, err := parse(b)
	if err != nil {
		return Record{}, fmt.Errorf("registry: %s: %w", path, err)
	}
	return rec, nil
}

// ParseFileName returns the owner a record file name carries (see package
// names), legacy "server-<pid>.json" included.
func ParseFileName(name string) (names.Owner, bool) {
	e, ok := names.Classify(name)
	if !ok || e.Kind != names.Record {
		return names.Owner{}, false
	}
	return e.Owner, true
}

// Entry is one record file found by List: its record, or why it could not
// be used.
type Entry struct {
	// Name is the file name, Path the full path.
	Name string
	Path string
	// Owner is the identity in the file name; PID its PID.
	Owner names.Owner
	PID   int
	// Record is valid when Err is nil.
	Record Record
	Err    error
}

// List reads every record in dir, sorted by PID. A record that cannot be
// read or parsed, or whose pid or start time differs from its file name
// (a legacy name carries no start time), is returned with Err set: List fails only if dir
// cannot be read. A missing dir has no records.
func List(dir string) ([]Entry, error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	var out []Entry
	for _, de := range des {
		o, ok := ParseFileName(de.Name())
		if !ok {
			continue
		}
		e := Entry{Name: de.Name(), Path: filepath.Join(dir, de.Name()), Owner: o, PID: o.PID}
		e.Record, e.Err = Read(e.Path)
		if e.Err == nil {
			e.Err = e.Record.Names(o)
		}
		if e.Err != nil && e.Record.PID != 0 {
			e.Record = Record{}
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.PID != b.PID {
			return a.PID - b.PID
		}
		return cmp.Compare(a.Owner.StartTime, b.Owner.StartTime)
	})
	return out, nil
}

// Names checks that the record is the one a file named for owner o should
// hold: the same PID and, unless the name is legacy, the same start time.
func (r Record) Names(o names.Owner) error {
	if r.PID != o.PID || (!o.Legacy() && r.StartTime != o.StartTime) {
		return fmt.Errorf("registry: record names pid %d (start time %d), its file name %s: not trusted", r.PID, r.StartTime, o)
	}
	return nil
}
