package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

// State summarizes a lock file for doctor and server_info.
type State string

// The states Inspect reports. Acquire takes Absent, Free, Stale and Foreign
// locks and refuses Held and Unidentified ones.
const (
	// Absent: there is no lock file.
	Absent State = "absent"
	// Free: the file exists but nobody holds the flock; its record, if
	// any, is left over from an earlier holder.
	Free State = "free"
	// Held: the flock is held and the record names a live process.
	Held State = "held"
	// Unidentified: the flock is held but the record names no process, or
	// the process it names cannot be checked.
	Unidentified State = "unidentified"
	// Stale: the flock is held but the record names a process that is gone,
	// a zombie, or a different process with the same PID.
	Stale State = "stale"
	// Foreign: only other users' processes hold the flock, on a lock file
	// that other users can open (an older version made it 0644): no
	// holder of ours. Acquire replaces the file by a private one.
	Foreign State = "foreign"
)

// Status is what Inspect found.
type Status struct {
	Path  string
	State State
	// Record is the lock file's record; RecordErr says why it names no
	// process (nil when it does, or when the file is absent).
	Record    Record
	RecordErr error
	// Liveness is that of the process Record names, and Holder what /proc
	// says about it (zero when it is gone); both are meaningful only when
	// RecordErr is nil.
	Liveness proc.Liveness
	Holder   proc.Info
	// Held is the error Acquire would return for a Held or Unidentified
	// lock, with the holder's details; nil otherwise.
	Held *HeldError
	// HeldBy names the other users' processes holding a Foreign lock.
	HeldBy string
}

// Refuses reports whether Acquire would refuse the lock as it is now.
func (s Status) Refuses() bool { return s.State == Held || s.State == Unidentified }

// String is a one-line summary for humans.
func (s Status) String() string {
	switch s.State {
	case Absent:
		return fmt.Sprintf("QEMU lock %s: free (no lock file)", s.Path)
	case Free:
		return fmt.Sprintf("QEMU lock %s: free", s.Path)
	case Stale:
		return fmt.Sprintf("QEMU lock %s: stale (held, but its record names process %d, which is %v); the next boot will take it over", s.Path, s.Record.PID, s.Liveness)
	case Foreign:
		return fmt.Sprintf("QEMU lock %s: held only by other users' processes (%s) on a lock file anyone can open, left by an older version; the next boot replaces it by a private one", s.Path, s.HeldBy)
	}
	if s.Held != nil {
		return s.Held.Error()
	}
	return fmt.Sprintf("QEMU lock %s: %s", s.Path, s.State)
}

// inspectGuardWait is how long Inspect waits for an acquirer to finish, so
// that it does not see a record half-written. Inspect goes ahead without the
// guard after that: a report slightly out of date is better than none.
const inspectGuardWait = 500 * time.Millisecond

// Inspect reports the state of the lock file at path without changing it: it
// creates nothing, takes the flock only for an instant (shared, so it cannot
// be mistaken for a holder with a record), and writes nothing.
func Inspect(path string) (Status, error) {
	st := Status{Path: path}
	// A shared guard keeps acquirers, which hold it exclusively, out while
	// we probe: our instant flock would otherwise make one of them see a
	// held lock with the old record.
	if g, err := lockGuard(path, unix.LOCK_SH, inspectGuardWait); err == nil {
		defer unix.Close(g)
	}
	fd, err := openLockFile(path, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) {
		st.State = Absent
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("inspect QEMU lock: %w", err)
	}
	defer unix.Close(fd)
	content, err := readRecord(fd)
	if err != nil {
		return st, fmt.Errorf("inspect QEMU lock %s: %w", path, err)
	}
	v := judge(content)
	st.Record, st.RecordErr, st.Liveness, st.Holder = v.rec, v.parseErr, v.live, v.info
	switch err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); {
	case err == nil:
		// Closing the descriptor (deferred) drops it; unlock now anyway
		// so that the window is as short as possible.
		unix.Flock(fd, unix.LOCK_UN)
		st.State = Free
	case errors.Is(err, unix.EWOULDBLOCK):
		var fst unix.Stat_t
		looseFile := unix.Fstat(fd, &fst) == nil && loose(&fst, permFor(path))
		foreign, hs := false, []holder(nil)
		if looseFile {
			foreign, hs = foreignHeld(fd, permFor(path))
		}
		switch {
		case foreign && !v.namesOneOf(hs):
			st.State = Foreign
			st.HeldBy = describeHolders(hs)
		case v.stale():
			st.State = Stale
		case v.parseErr != nil || v.checkErr != nil:
			st.State = Unidentified
			st.Held = v.heldError(path, fd)
		default:
			st.State = Held
			st.Held = v.heldError(path, fd)
		}
	default:
		return st, fmt.Errorf("inspect QEMU lock %s: flock: %w", path, err)
	}
	return st, nil
}
