// Package lock is the repository-wide QEMU lock: an exclusive flock on
// <git common dir>/.qemu.lock, so that only one server (or script) at a time
// boots QEMU on a repository's writable disk images, with a record of who
// holds it. Unlike the original server's lock it tells a live holder from a
// stale one and takes a stale lock over safely, even when many servers race.
//
// # Design
//
// The flock is what excludes; the record (pid, start time, ...) only says who
// holds it. A flock belongs to an open file description, so it can outlive
// the process that took it: a child that inherited the descriptor (the
// original wrapper's QEMU, say) keeps the file locked after the recorded
// holder died. Such a lock is stale: the flock is held, but the record names
// a process that is gone, a zombie, or a different process with the same PID
// (start times differ). The flock on that inode will not come free, so a
// stale lock is reclaimed by renaming a new, locked file (a new inode) over
// the path; the old inode is left to whoever still has it open.
//
// # Why exactly one acquirer wins
//
// Definitions: a process "holds the lock" when it holds the flock on the inode
// the path names and Acquire returned success to it.
//
// Every Acquire does all its work (open, flock, read and judge the record,
// write its record, create and rename a new inode) inside one critical
// section, serialized by a flock on the sibling guard file <path>.guard,
// which is never removed (removing it would give two guard inodes). Inspect
// takes the guard shared, so that an acquirer never mistakes its instant
// probe of the flock for a holder. The path changes in exactly three ways, and every one keeps "at most one
// holder, and the holder's inode is the one the path names":
//
//  1. Creation (O_CREAT on a missing path), inside the guard. Whoever creates
//     it must still win the flock like anyone else.
//  2. Rename of a new inode over the path (reclaim), inside the guard, only
//     after judging the current record stale, or the file one that other
//     users can open (see holders.go) while we hold its flock or only
//     other users' processes do. The reclaimer locks the new inode and
//     writes its complete record before the rename, so the inode appears
//     at the path already locked and already naming its holder.
//  3. Unlink by Release, only by the holder of the inode the path names, while
//     it still holds the flock.
//
// A holder is never judged stale: its record names itself with its own start
// time and was written completely inside the guard before the guard was
// released (or before the rename made it visible), so every later guard
// holder reads it whole and finds that process alive. Hence a holder's inode
// is never renamed away (2) or unlinked by another (3), and a second holder
// of that inode is impossible because the flock is exclusive. An acquirer
// that wins a flock checks, inside the guard, that the path still names the
// inode it locked; the only change possible by then is an unlink by the
// previous holder's Release (3) between our open and our flock, and the check
// catches it and retries with a fresh open.
//
// So when N servers race to reclaim one stale lock, the first through the
// guard renames its inode in; each later one opens that inode, fails its
// flock, reads the winner's record, finds it alive and gets a HeldError
// naming the winner. Renaming and then checking the inode without the guard
// is not enough: two reclaimers that each judged the old record stale could
// each rename and each find their own inode at the moment they check.
//
// The guard itself is never removed, but a guard file that other users can
// open is never used either: it is replaced by a private one (replaceGuard
// says why that keeps one acquirer at a time).
//
// What this cannot protect against is a foreign process that changes the
// path without the guard (rm of the lock file, or a script that takes the
// flock and writes its record while we are judging the old one); the window
// is a few microseconds, and a stale verdict is only acted on after the record
// read the same twice.
package lock

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

const (
	// guardSuffix names the sibling file whose flock serializes acquirers.
	guardSuffix = ".guard"
	// newSuffix names the file a reclaimer prepares before renaming it over
	// the lock path. Only a guard holder creates it, so one found there was
	// left by a reclaimer that died, and may be removed.
	newSuffix = ".new"
	// guardWait bounds the wait for other acquirers: each holds the guard
	// for a few milliseconds, so waiting this long means one is stuck
	// (stopped in a debugger, say).
	guardWait = 5 * time.Second
	// maxAttempts bounds the retries when the lock file is replaced or
	// removed between our open and our flock.
	maxAttempts = 10
	// unidentifiedWait is how long a holder whose record cannot be read gets
	// to finish writing it (a script that just took the flock) before we
	// report it as unidentified.
	unidentifiedWait = 200 * time.Millisecond
	// stableReadGap separates the two reads of a record that is about to be
	// judged stale, so that a record being written by a foreign process
	// (which does not take our guard) is not judged half-written.
	stableReadGap = 10 * time.Millisecond
	// maxUnstableReads bounds how often a record may change under us
	// before we give up judging it.
	maxUnstableReads = 10
)

var (
	// errReplaced means the lock path stopped naming the inode we locked.
	errReplaced = errors.New("lock file was replaced while being locked")
	// errBusy means another acquirer is at work: wait a little and retry.
	errBusy = errors.New("another acquirer is at work")
	// errForeign means only other users' processes hold a guard that
	// other users can open: there is no acquirer of ours to wait for.
	errForeign = errors.New("the guard file is held by another user")
)

// Lock is a held QEMU lock. Release it when QEMU is down; if the process dies
// first, the kernel releases the flock and the record is recognised as stale.
// The descriptor is a raw one, without a finalizer, so a Lock that is dropped
// without Release keeps the lock until the process exits instead of losing
// it at some garbage collection.
type Lock struct {
	path      string
	rec       Record
	reclaimed *Reclaim

	mu       sync.Mutex
	fd       int // -1 once released
	dev, ino uint64
}

// Reclaim describes the stale lock an Acquire took over.
type Reclaim struct {
	// Stale is the record that was replaced.
	Stale Record
	// Liveness is why it was stale: proc.Gone, proc.Zombie or proc.Reused.
	Liveness proc.Liveness
	// HeldBy, when not empty, names the other users' processes that held
	// the flock on a lock file anyone could open (made by an older
	// version): they were no acquirers, and the file was replaced by a
	// private one under them.
	HeldBy string
}

// Path returns the lock file's path.
func (l *Lock) Path() string { return l.path }

// Record returns the record written in the lock file.
func (l *Lock) Record() Record { return l.rec }

// SetInstances rewrites the record with the names of the guests the lock
// now protects, so that a refused acquirer can say what holds it. The
// rewrite happens inside the guard, where acquirers read records, so none
// of them reads it half-written.
func (l *Lock) SetInstances(instances []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fd < 0 {
		return fmt.Errorf("update QEMU lock %s: already released", l.path)
	}
	guard, err := lockGuard(l.path, unix.LOCK_EX, guardWait)
	if err != nil {
		return err
	}
	defer unix.Close(guard)
	rec := l.rec
	rec.Instances = append([]string(nil), instances...)
	if err := writeRecord(l.fd, rec); err != nil {
		return fmt.Errorf("update QEMU lock %s: %w", l.path, err)
	}
	l.rec = rec
	return nil
}

// Reclaimed returns the stale lock this Lock replaced, or nil if the lock was
// free.
func (l *Lock) Reclaimed() *Reclaim {
	if l.reclaimed == nil {
		return nil
	}
	r := *l.reclaimed
	return &r
}

// Release removes the lock file if it is still ours and then drops the flock.
// Removing it while still holding the flock means no one can lock the inode
// we unlink and believe it is the lock: an acquirer that opened it just
// before wins the flock only after we close, then finds the path no longer
// names it and retries. Release is idempotent.
func (l *Lock) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fd < 0 {
		return nil
	}
	var errs []error
	var st unix.Stat_t
	err := unix.Lstat(l.path, &st)
	switch {
	case err == nil && uint64(st.Dev) == l.dev && st.Ino == l.ino:
		if err := unix.Unlink(l.path); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("release QEMU lock: remove %s: %w", l.path, err))
		}
	case err != nil && !errors.Is(err, unix.ENOENT):
		errs = append(errs, fmt.Errorf("release QEMU lock: stat %s: %w", l.path, err))
	}
	if err := unix.Close(l.fd); err != nil {
		errs = append(errs, fmt.Errorf("release QEMU lock %s: close: %w", l.path, err))
	}
	l.fd = -1
	return errors.Join(errs...)
}

// HeldError means a live process holds the lock, or one that cannot be
// identified. Its message names the holder and says how to stop it.
type HeldError struct {
	// Path is the lock file.
	Path string
	// Holder is the holder's record; Holder.PID is 0 when it could not be
	// read (see Unidentified).
	Holder Record
	// Comm is the holder's command name from /proc ("" if unknown).
	Comm string
	// Exe is the holder's executable: from the record, else from /proc.
	Exe string
	// Since is when the holder took the lock, or else when it started; zero
	// if unknown.
	Since time.Time
	// Unidentified says why the holder could not be identified; empty when
	// Holder names it.
	Unidentified string
	// UID is the user of the process holding the flock, or, when /proc
	// hides it, of the lock file; -1 when unknown.
	UID int
	// Hidden says that /proc does not show us the holder: it is another
	// user's process and /proc is mounted with hidepid.
	Hidden bool
}

// other reports whether another user holds the lock: then only they (or
// root) can stop it, and our tools cannot see their process.
func (e *HeldError) other() bool { return e.UID >= 0 && e.UID != os.Geteuid() }

func (e *HeldError) Error() string {
	if e.Holder.PID <= 0 {
		if e.other() || e.Hidden {
			return fmt.Sprintf("QEMU lock %s is held by a process of %s that cannot be identified (%s), so it is not safe to take it over; ask them to stop it, or root: fuser -v %s",
				e.Path, userName(e.UID), e.Unidentified, strconv.Quote(e.Path))
		}
		return fmt.Sprintf("QEMU lock %s is held by a process that cannot be identified (%s), so it is not safe to take it over; "+
			"find the holder with: fuser -v %s (or: lsof %s), stop it or let it finish, then retry",
			e.Path, e.Unidentified, strconv.Quote(e.Path), strconv.Quote(e.Path))
	}
	pid := e.Holder.PID
	b := e.Holding()
	switch {
	case e.Self():
		return b + "; shut down the guests this server runs before booting again"
	case e.other():
		return b + fmt.Sprintf("; it is not yours to stop: ask %s to shut their guests down, or root to stop process %d", e.Owner(), pid)
	}
	return b + fmt.Sprintf("; stop its guests in the session that owns it (or boot your guest as another instance of that server), or run: kill -TERM %d", pid)
}

// Self says the holder is this very process.
func (e *HeldError) Self() bool { return e.Holder.PID == os.Getpid() }

// Other says another user holds the lock: only they, or root, can stop
// the holder.
func (e *HeldError) Other() bool { return e.other() }

// Owner names the user of the holder.
func (e *HeldError) Owner() string { return userName(e.UID) }

// Holding says who holds the lock, for what and since when, without what
// to do about it (Error adds that); empty for an unidentified holder.
func (e *HeldError) Holding() string {
	if e.Holder.PID <= 0 {
		return ""
	}
	pid := e.Holder.PID
	self := e.Self()
	var b bytes.Buffer
	fmt.Fprintf(&b, "QEMU lock %s is held by ", e.Path)
	if self {
		b.WriteString("this qemu-mcp server itself, ")
	}
	fmt.Fprintf(&b, "process %d", pid)
	switch {
	case e.Hidden:
		fmt.Fprintf(&b, " of %s, which you cannot see (/proc hides other users' processes)", userName(e.UID))
	case e.Comm != "" && e.Exe != "":
		fmt.Fprintf(&b, " (%s, %s)", e.Comm, e.Exe)
	case e.Comm != "" || e.Exe != "":
		fmt.Fprintf(&b, " (%s)", e.Comm+e.Exe)
	default:
		b.WriteString(" (details unavailable from /proc)")
	}
	if e.other() && !e.Hidden {
		fmt.Fprintf(&b, " of %s", userName(e.UID))
	}
	if e.Holder.Target != "" {
		fmt.Fprintf(&b, ", which protects %s", e.Holder.Target)
	}
	if len(e.Holder.Instances) > 0 {
		fmt.Fprintf(&b, " for its guest instance(s) %s", strings.Join(e.Holder.Instances, ", "))
	}
	if !e.Since.IsZero() {
		fmt.Fprintf(&b, " since %s", e.Since.Format(time.RFC3339))
	}
	return b.String()
}

// Acquire takes the QEMU lock at path and writes rec into it. Acquire fills
// in rec's PID and StartTime from the calling process (the record must name
// its holder: stale detection trusts it), and Exe and Started when empty.
//
// A lock nobody holds is taken whatever its old record says. A lock held by
// a live process, or by one that cannot be identified, fails with a
// *HeldError. A lock whose flock is held but whose record names a dead,
// zombie or reused PID is reclaimed (see the package comment). Acquire waits
// only for other acquirers, a few seconds at most, never for the holder.
func Acquire(path string, rec Record) (*Lock, error) {
	if path == "" {
		return nil, errors.New("acquire QEMU lock: empty lock file path")
	}
	rec, err := ownRecord(rec)
	if err != nil {
		return nil, err
	}
	guard, err := lockGuard(path, unix.LOCK_EX, guardWait)
	if err != nil {
		return nil, err
	}
	defer unix.Close(guard)
	for range maxAttempts {
		l, err := tryAcquire(path, rec)
		if errors.Is(err, errReplaced) {
			continue
		}
		return l, err
	}
	return nil, fmt.Errorf("acquire QEMU lock %s: the file kept being removed or replaced while we locked it (%d attempts); is something deleting it? retry", path, maxAttempts)
}

func ownRecord(rec Record) (Record, error) {
	self, err := proc.Self()
	if err != nil {
		return rec, fmt.Errorf("acquire QEMU lock: identify this process for the lock record: %w", err)
	}
	rec.PID, rec.StartTime = self.PID, self.StartTime
	if rec.Exe == "" {
		// An unknown executable only makes messages vaguer.
		rec.Exe, _ = proc.Exe(self.PID)
	}
	if rec.Started.IsZero() {
		rec.Started = time.Now().Truncate(time.Second)
	}
	return rec, nil
}

// tryAcquire makes one attempt, inside the guard. errReplaced asks for another.
func tryAcquire(path string, rec Record) (*Lock, error) {
	perm := permFor(path)
	fd, err := openLockFile(path, unix.O_RDWR|unix.O_CREAT, perm)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("acquire QEMU lock %s: fstat: %w", path, err)
	}
	deadline := time.Now().Add(unidentifiedWait)
	for unstable := 0; ; {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			if err := sameFile(path, fd); err != nil {
				return nil, err
			}
			if loose(&st, perm) {
				// Free, but other users could open it, and hold it
				// once we release it: put a private file in its
				// place while we hold this one.
				return replace(path, rec, nil)
			}
			if err := writeRecord(fd, rec); err != nil {
				return nil, fmt.Errorf("acquire QEMU lock %s: %w", path, err)
			}
			keep = true
			return newLock(path, rec, fd, nil)
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("acquire QEMU lock %s: flock: %w", path, err)
		}
		content, err := readRecord(fd)
		if err != nil {
			return nil, fmt.Errorf("acquire QEMU lock %s: %w", path, err)
		}
		v := judge(content)
		if loose(&st, perm) {
			// Only a holder of ours writes its own record into the
			// file, and other users cannot write it: a flock held by
			// other users alone, whatever the record says, holds
			// nothing of ours.
			if foreign, hs := foreignHeld(fd, perm); foreign && !v.namesOneOf(hs) {
				if err := sameFile(path, fd); err != nil {
					return nil, err
				}
				return replace(path, rec, &Reclaim{Stale: v.rec, Liveness: v.live, HeldBy: describeHolders(hs)})
			}
		}
		if v.parseErr != nil && time.Now().Before(deadline) {
			// Perhaps a script just took the flock and is writing its
			// record: give it a moment, then look again.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if !v.stale() {
			return nil, v.heldError(path, fd)
		}
		// The flock is held and the record names no live process. Act only
		// on a record that reads the same twice, and only if the path still
		// names the inode it came from.
		time.Sleep(stableReadGap)
		again, err := readRecord(fd)
		if err != nil {
			return nil, fmt.Errorf("acquire QEMU lock %s: %w", path, err)
		}
		if !bytes.Equal(content, again) {
			if unstable++; unstable >= maxUnstableReads {
				return nil, &HeldError{Path: path, UID: -1, Unidentified: "its record keeps changing, so something outside qemu-mcp is writing it"}
			}
			continue
		}
		if err := sameFile(path, fd); err != nil {
			return nil, err
		}
		return replace(path, rec, &Reclaim{Stale: v.rec, Liveness: v.live})
	}
}

// replace puts a new lock file at path, inside the guard: a new inode that
// is locked, private and carries our record before it appears at the path.
// It takes over a stale lock (r says whose), or a free or foreign-held one
// that other users could open (r nil, or r.HeldBy set).
func replace(path string, rec Record, r *Reclaim) (*Lock, error) {
	what := "reclaim stale QEMU lock"
	if r == nil || r.HeldBy != "" {
		what = "replace QEMU lock file that other users can open"
	}
	tmp := path + newSuffix
	if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("%s %s: remove leftover %s: %w", what, path, tmp, err)
	}
	fd, err := openLockFile(tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, permFor(path))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	fail := func(err error) (*Lock, error) {
		unix.Unlink(tmp)
		unix.Close(fd)
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	// Nobody else can have this inode open yet, so this cannot fail with
	// EWOULDBLOCK unless something outside our protocol is at work.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fail(fmt.Errorf("flock %s: %w", tmp, err))
	}
	if err := writeRecord(fd, rec); err != nil {
		return fail(err)
	}
	if err := unix.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("rename %s over it: %w", tmp, err))
	}
	if err := sameFile(path, fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return newLock(path, rec, fd, r)
}

func newLock(path string, rec Record, fd int, r *Reclaim) (*Lock, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("acquire QEMU lock %s: fstat: %w", path, err)
	}
	if r != nil && r.Stale.PID == 0 && r.HeldBy == "" {
		r = nil // a free file replaced: nothing was reclaimed
	}
	return &Lock{path: path, rec: rec, reclaimed: r, fd: fd, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// openLockFile opens a lock or guard file close-on-exec, so that QEMU and
// other children never inherit the flock (an inherited flock outlives us and
// makes the lock stale), and without following a symlink, so that nobody can
// point our lock, or the record we write, at another file. A file it
// creates gets mode perm exactly, whatever the umask: a lock of a
// repository shared with a group must be writable by the group.
func openLockFile(path string, flags int, perm uint32) (int, error) {
	const always = unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	open := func(flags int) (int, error) {
		for {
			// O_NONBLOCK: a FIFO or device planted at the path must not
			// hang the open; the type check below refuses it.
			fd, err := unix.Open(path, flags|always, perm)
			if !errors.Is(err, unix.EINTR) {
				return fd, err
			}
		}
	}
	var fd int
	var err error
	created := false
	switch {
	case flags&unix.O_CREAT == 0:
		fd, err = open(flags)
	case flags&unix.O_EXCL != 0:
		fd, err = open(flags)
		created = err == nil
	default:
		// Create it if missing (and then know that we did), else open
		// the one there; if it vanishes in between, create it again.
		for range maxAttempts {
			if fd, err = open(flags | unix.O_EXCL); err == nil {
				created = true
				break
			}
			if !errors.Is(err, unix.EEXIST) {
				break
			}
			if fd, err = open(flags &^ unix.O_CREAT); !errors.Is(err, unix.ENOENT) {
				break
			}
		}
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EEXIST) && isSymlink(path) {
		return -1, fmt.Errorf("lock file %s is a symbolic link; refusing to follow it (a lock file must be a plain file); remove the link if you did not mean it: rm %s", path, strconv.Quote(path))
	}
	if errors.Is(err, unix.EACCES) {
		return -1, accessError(path, err)
	}
	if err != nil {
		return -1, fmt.Errorf("open lock file %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat lock file %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fmt.Errorf("lock file %s is not a regular file (mode %#o); move it away and retry", path, st.Mode&unix.S_IFMT)
	}
	if created && st.Mode&0o777 != perm {
		if err := unix.Fchmod(fd, perm); err != nil {
			unix.Close(fd)
			unix.Unlink(path)
			return -1, fmt.Errorf("set the mode of lock file %s to %#o: %w", path, perm, err)
		}
	}
	return fd, nil
}

func isSymlink(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// accessError explains a lock file we may not open: it is another user's.
func accessError(path string, err error) error {
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("open lock file %s: %w: it belongs to %s; if no server of theirs runs on this repository, ask them (or root) to remove it", path, err, userName(int(st.Uid)))
	}
	return fmt.Errorf("open lock file %s: %w", path, err)
}

// sameFile reports errReplaced unless path names the inode open as fd.
func sameFile(path string, fd int) error {
	var fst, pst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return fmt.Errorf("fstat lock file %s: %w", path, err)
	}
	err := unix.Lstat(path, &pst)
	if errors.Is(err, unix.ENOENT) {
		return errReplaced
	}
	if err != nil {
		return fmt.Errorf("stat lock file %s: %w", path, err)
	}
	if fst.Dev != pst.Dev || fst.Ino != pst.Ino {
		return errReplaced
	}
	return nil
}

// lockGuard takes the guard flock next to lockPath, waiting at most wait. A
// shared guard (Inspect) does not create the file: without it there is no
// acquirer to wait for.
//
// A guard file other users can open (made by an older version) is never
// used as the guard: another user may hold its flock for ever. An
// exclusive guard replaces it by a private file (see replaceGuard); a
// shared one goes without the guard when only other users hold it.
func lockGuard(lockPath string, how int, wait time.Duration) (int, error) {
	gp := lockPath + guardSuffix
	perm := permFor(lockPath)
	flags := unix.O_RDONLY
	if how == unix.LOCK_EX {
		flags |= unix.O_CREAT
	}
	deadline := time.Now().Add(wait)
	backoff := time.Millisecond
	pause := func() bool {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 16*time.Millisecond)
		return true
	}
	for {
		fd, err := openLockFile(gp, flags, perm)
		if err != nil {
			return -1, fmt.Errorf("QEMU lock guard: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("QEMU lock guard %s: fstat: %w", gp, err)
		}
		if loose(&st, perm) {
			var nfd int
			if how == unix.LOCK_EX {
				nfd, err = replaceGuard(gp, fd, perm)
			} else {
				nfd, err = shareLooseGuard(gp, fd, perm)
			}
			if nfd != fd {
				unix.Close(fd)
			}
			switch {
			case err == nil:
				return nfd, nil
			case errors.Is(err, errReplaced):
				continue
			case errors.Is(err, errBusy) && pause():
				continue
			case errors.Is(err, errBusy):
				return -1, guardTimeout(lockPath, gp, wait, nil)
			}
			return -1, err
		}
		for {
			err = unix.Flock(fd, how|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || !pause() {
				break
			}
		}
		if err == nil {
			// The guard file is never removed by us; if something removed
			// it anyway, a flock on the old inode guards nothing.
			err = sameFile(gp, fd)
			if err == nil {
				return fd, nil
			}
		}
		var hs []holder
		if errors.Is(err, unix.EWOULDBLOCK) {
			hs, _ = flockHolders(fd)
		}
		unix.Close(fd)
		switch {
		case errors.Is(err, errReplaced) && time.Now().Before(deadline):
			continue
		case errors.Is(err, unix.EWOULDBLOCK), errors.Is(err, errReplaced):
			return -1, guardTimeout(lockPath, gp, wait, hs)
		default:
			return -1, fmt.Errorf("QEMU lock guard %s: flock: %w", gp, err)
		}
	}
}

func guardTimeout(lockPath, gp string, wait time.Duration, hs []holder) error {
	if len(hs) > 0 {
		return fmt.Errorf("another process has been acquiring the QEMU lock %s for over %v and still holds %s: %s; is it stopped?", lockPath, wait, gp, describeHolders(hs))
	}
	return fmt.Errorf("another process has been acquiring the QEMU lock %s for over %v and still holds %s; is it stopped? find it with: fuser -v %s", lockPath, wait, gp, strconv.Quote(gp))
}

// replaceGuard puts a private guard file in place of the one other users
// can open (old, which names path gp when we looked) and returns it locked.
//
// Why this keeps one acquirer at a time: no acquirer of this version ever
// enters the critical section on a loose guard, so replacing one cuts no
// acquirer of ours short. Older versions do use it, so it is replaced only
// while we hold its flock, or while only other users' processes hold it
// (they are no acquirers). Replacers of this version exclude each other by
// creating <guard>.new exclusively, already locked before it is renamed
// into place, and rename only while gp still names the loose inode: after
// one replacer's rename, every other finds gp changed and starts again on
// the private file, which is never replaced. A <guard>.new whose flock is
// free was left by a replacer that died, and is removed by whoever holds
// its flock while it is still there.
func replaceGuard(gp string, old int, perm uint32) (int, error) {
	switch err := unix.Flock(old, unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		if err := sameFile(gp, old); err != nil {
			return -1, err
		}
	case errors.Is(err, unix.EWOULDBLOCK):
		if foreign, _ := foreignHeld(old, perm); !foreign {
			return -1, errBusy // an acquirer of ours, for milliseconds
		}
	default:
		return -1, fmt.Errorf("QEMU lock guard %s: flock: %w", gp, err)
	}
	tmp := gp + newSuffix
	fd, err := openLockFile(tmp, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL, perm)
	if errors.Is(err, unix.EEXIST) {
		return -1, clearStaleTemp(tmp)
	}
	if err != nil {
		return -1, fmt.Errorf("replace QEMU lock guard %s: %w", gp, err)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			// Another replacer judged it stale before we locked it,
			// and removes it.
			return fail(errBusy)
		}
		return fail(fmt.Errorf("replace QEMU lock guard %s: flock %s: %w", gp, tmp, err))
	}
	if err := sameFile(tmp, fd); err != nil {
		return fail(err)
	}
	// We hold tmp's flock at tmp: no other replacer gets past here, and
	// nothing else changes gp.
	if err := sameFile(gp, old); err != nil {
		unix.Unlink(tmp)
		return fail(err)
	}
	if err := unix.Rename(tmp, gp); err != nil {
		unix.Unlink(tmp)
		return fail(fmt.Errorf("replace QEMU lock guard %s: rename %s over it: %w", gp, tmp, err))
	}
	return fd, nil
}

// clearStaleTemp removes a replacer's <guard>.new if its maker is gone,
// and says when to retry: errReplaced at once, errBusy after a pause.
func clearStaleTemp(tmp string) error {
	fd, err := openLockFile(tmp, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) {
		return errReplaced
	}
	if err != nil {
		return fmt.Errorf("QEMU lock guard: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return errBusy
		}
		return fmt.Errorf("QEMU lock guard: flock %s: %w", tmp, err)
	}
	if err := sameFile(tmp, fd); err != nil {
		return errReplaced
	}
	// Its maker died, or has not locked it yet and will find it gone.
	if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("QEMU lock guard: remove leftover %s: %w", tmp, err)
	}
	return errReplaced
}

// shareLooseGuard takes a loose guard shared, for Inspect, or reports
// errForeign when only other users hold it: an acquirer of ours replaces
// the file before it uses it, so there is nobody to wait for.
func shareLooseGuard(gp string, fd int, perm uint32) (int, error) {
	switch err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); {
	case err == nil:
		return fd, sameFile(gp, fd)
	case errors.Is(err, unix.EWOULDBLOCK):
		if foreign, _ := foreignHeld(fd, perm); foreign {
			return -1, errForeign
		}
		return -1, errBusy
	default:
		return -1, fmt.Errorf("QEMU lock guard %s: flock: %w", gp, err)
	}
}

// writeRecord replaces the file's content with rec. There is no fsync: the
// record is read only by processes running alongside the holder, through the
// page cache, and after a crash the flock is free, so a record lost in a
// crash is taken over like any other free lock.
func writeRecord(fd int, rec Record) error {
	b := rec.Format()
	if err := unix.Ftruncate(fd, 0); err != nil {
		return fmt.Errorf("truncate lock file: %w", err)
	}
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write lock record: %w", err)
		}
		off += n
	}
	return nil
}

// readRecord reads at most maxRecordSize bytes of the record.
func readRecord(fd int) ([]byte, error) {
	buf := make([]byte, maxRecordSize)
	off := 0
	for off < len(buf) {
		n, err := unix.Pread(fd, buf[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read lock record: %w", err)
		}
		if n == 0 {
			break
		}
		off += n
	}
	return buf[:off], nil
}

// verdict is what a record says about the process holding the flock.
type verdict struct {
	rec      Record
	parseErr error // the record names no process
	live     proc.Liveness
	info     proc.Info
	checkErr error // the process could not be checked
}

// stale reports whether the record names a process that cannot hold the
// lock. Anything uncertain counts as held: reclaiming a live lock would put
// two QEMUs on one disk image, refusing a stale one only costs a retry.
func (v verdict) stale() bool {
	if v.parseErr != nil || v.checkErr != nil {
		return false
	}
	return v.live == proc.Gone || v.live == proc.Zombie || v.live == proc.Reused
}

func judge(content []byte) verdict {
	rec, err := ParseRecord(content)
	if err != nil {
		return verdict{rec: rec, parseErr: err}
	}
	live, info, err := proc.Check(proc.Identity{PID: rec.PID, StartTime: rec.StartTime})
	v := verdict{rec: rec, live: live, info: info, checkErr: err}
	if err == nil && live == proc.Gone {
		// /proc mounted with hidepid hides other users' processes; the
		// kernel still answers kill(pid, 0) with EPERM for them.
		if kerr := unix.Kill(rec.PID, 0); kerr == nil || errors.Is(kerr, unix.EPERM) {
			v.checkErr = fmt.Errorf("process %d exists but /proc does not show it: %w", rec.PID, proc.ErrHidden)
		}
	}
	return v
}

// heldError describes the holder of the flock on fd, the lock file at path.
func (v verdict) heldError(path string, fd int) *HeldError {
	e := &HeldError{Path: path, UID: -1}
	var st unix.Stat_t
	if fd >= 0 && unix.Fstat(fd, &st) == nil {
		e.UID = int(st.Uid)
	}
	hs, _ := flockHolders(fd)
	for _, h := range hs {
		switch {
		case h.Err == nil:
			e.UID = h.Creds.UID
		case errors.Is(h.Err, proc.ErrHidden):
			e.Hidden = true
		}
	}
	if v.parseErr != nil {
		e.Unidentified = v.parseErr.Error()
		return e
	}
	if v.checkErr != nil && v.hidden() {
		e.Hidden = true
	}
	e.Holder = v.rec
	e.Comm = v.info.Comm
	e.Exe = v.rec.Exe
	if e.Exe == "" {
		e.Exe, _ = proc.Exe(v.rec.PID)
	}
	switch {
	case !v.rec.Started.IsZero():
		e.Since = v.rec.Started
	case v.info.StartTime != 0:
		e.Since = proc.StartedAt(v.info.StartTime)
	}
	return e
}

// hidden reports whether the record names a process /proc hides from us.
func (v verdict) hidden() bool { return errors.Is(v.checkErr, proc.ErrHidden) }

// namesOneOf reports whether the record names one of the flock's holders:
// a holder that wrote its own record into the file.
func (v verdict) namesOneOf(hs []holder) bool {
	if v.parseErr != nil {
		return false
	}
	for _, h := range hs {
		if h.PID == v.rec.PID {
			return true
		}
	}
	return false
}

// Advice is what a caller can do about the lock's holder: stop its own
// guest, ask the user who holds it, or stop the holding process.
func (e *HeldError) Advice() advice.Advice {
	h := e.Holding()
	switch {
	case h == "":
		return advice.Advice{}
	case e.Self():
		return advice.Advice{Action: advice.StopOwnGuest, Keep: h}
	case e.Other():
		return advice.Advice{Action: advice.AskOwner, Keep: h, Name: e.Owner(), N: e.Holder.PID}
	}
	return advice.Advice{Action: advice.StopHolder, Keep: h, N: e.Holder.PID}
}
