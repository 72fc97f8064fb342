// Package proc identifies processes by PID and start time from /proc, so that
// a recorded PID is only ever trusted (or signalled) while it still names the
// same process: kill(pid, 0) alone cannot tell a live process from a zombie or
// from an unrelated process that reused the PID.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// State is the one-letter process state from /proc/<pid>/stat.
type State byte

// Process states that matter for liveness decisions.
const (
	StateZombie State = 'Z'
	StateDead   State = 'X'
)

// Info is what /proc says about one process at one moment.
type Info struct {
	PID int
	// PPID is the parent PID at the time of reading.
	PPID int
	// State is the single-letter state (R, S, D, Z, ...).
	State State
	// StartTime is field 22 of /proc/<pid>/stat: clock ticks after boot.
	// Together with the PID it names a process uniquely for the life of
	// the boot.
	StartTime uint64
	// Comm is the short command name, for messages only: never match on it.
	Comm string
}

// ErrNotFound means there is no process with that PID.
var ErrNotFound = errors.New("no such process")

// Stat reads /proc/<pid>/stat.
func Stat(pid int) (Info, error) {
	b, err := readProcFile(pid, "stat")
	if err != nil {
		return Info{}, err
	}
	info, err := ParseStat(b)
	if err != nil {
		return Info{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	return info, nil
}

// readProcFile reads /proc/<pid>/<name>; no process with that PID is
// ErrNotFound.
func readProcFile(pid int, name string) ([]byte, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("read process %d: %w", pid, ErrNotFound)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + name)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("read process %d: %w", pid, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read process %d: %w", pid, err)
	}
	return b, nil
}

// ParseStat parses the contents of /proc/<pid>/stat. The command name is in
// parentheses and may itself contain spaces and parentheses, so the fields
// after it are located from the last ')'.
func ParseStat(b []byte) (Info, error) {
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return Info{}, fmt.Errorf("malformed stat %q", truncate(b))
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return Info{}, fmt.Errorf("malformed stat pid: %w", err)
	}
	// Fields after the comm start at field 3 (state).
	rest := bytes.Fields(b[closing+1:])
	const (
		stateIdx     = 0  // field 3
		ppidIdx      = 1  // field 4
		startTimeIdx = 19 // field 22
	)
	if len(rest) <= startTimeIdx || len(rest[stateIdx]) != 1 {
		return Info{}, fmt.Errorf("malformed stat %q", truncate(b))
	}
	ppid, err := strconv.Atoi(string(rest[ppidIdx]))
	if err != nil {
		return Info{}, fmt.Errorf("malformed stat ppid: %w", err)
	}
	st, err := strconv.ParseUint(string(rest[startTimeIdx]), 10, 64)
	if err != nil {
		return Info{}, fmt.Errorf("malformed stat start time: %w", err)
	}
	return Info{
		PID:       pid,
		PPID:      ppid,
		State:     State(rest[stateIdx][0]),
		StartTime: st,
		Comm:      string(b[open+1 : closing]),
	}, nil
}

func truncate(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// Identity names one process for the life of a boot: a PID alone is reused.
type Identity struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// Self returns the identity of the calling process.
func Self() (Identity, error) {
	info, err := Stat(os.Getpid())
	if err != nil {
		return Identity{}, err
	}
	return Identity{PID: info.PID, StartTime: info.StartTime}, nil
}

// Liveness is the answer to "is the process I recorded still there?".
type Liveness int

// The possible answers. Only Alive means the recorded process still runs.
const (
	// Gone: no process has that PID.
	Gone Liveness = iota
	// Zombie: it exited and waits to be reaped by its parent.
	Zombie
	// Reused: a different process now has the PID (start time differs).
	Reused
	// Alive: the same process (start time matches, or none was recorded).
	Alive
)

func (l Liveness) String() string {
	switch l {
	case Gone:
		return "gone"
	case Zombie:
		return "zombie"
	case Reused:
		return "reused"
	case Alive:
		return "alive"
	}
	return "Liveness(" + strconv.Itoa(int(l)) + ")"
}

// Check tells whether id still names a running process. A zero StartTime
// (a record that did not have one) matches any start time.
func Check(id Identity) (Liveness, Info, error) {
	info, err := Stat(id.PID)
	if errors.Is(err, ErrNotFound) {
		return Gone, Info{}, nil
	}
	if err != nil {
		return Gone, Info{}, err
	}
	if id.StartTime != 0 && info.StartTime != id.StartTime {
		return Reused, info, nil
	}
	if info.State == StateZombie || info.State == StateDead {
		return Zombie, info, nil
	}
	return Alive, info, nil
}

// Exe returns the executable path of pid (the target of /proc/<pid>/exe).
// The kernel appends " (deleted)" when the file was replaced or removed.
func Exe(pid int) (string, error) {
	p, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", fmt.Errorf("read executable of process %d: %w", pid, err)
	}
	return p, nil
}

// bootTime reads the boot time once: it does not change while we run.
var bootTime = sync.OnceValues(func() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			sec, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("parse btime: %w", err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
})

// StartedAt converts a start time in clock ticks after boot to wall time.
func StartedAt(startTicks uint64) time.Time {
	bt, err := bootTime()
	if err != nil {
		return time.Time{}
	}
	// USER_HZ is 100 on every Linux architecture Go supports.
	const userHZ = 100
	return bt.Add(time.Duration(startTicks) * time.Second / userHZ)
}

// Creds are a process's effective user and groups, as the kernel checks
// them for files it opens.
type Creds struct {
	UID int
	// GIDs are the effective group and the supplementary groups.
	GIDs []int
}

// InGroup reports whether gid is one of the process's groups.
func (c Creds) InGroup(gid int) bool {
	for _, g := range c.GIDs {
		if g == gid {
			return true
		}
	}
	return false
}

// ErrHidden means the process exists but /proc does not show it to us: it
// belongs to another user and /proc is mounted with hidepid.
var ErrHidden = errors.New("process exists but /proc hides it (another user's, with hidepid)")

// ReadCreds reads pid's effective uid and groups from /proc/<pid>/status.
// A process that /proc hides from us (hidepid) gives ErrHidden: the kernel
// still answers kill(pid, 0), with EPERM, for another user's process.
func ReadCreds(pid int) (Creds, error) {
	b, err := readProcFile(pid, "status")
	if errors.Is(err, ErrNotFound) && pid > 0 && errors.Is(unix.Kill(pid, 0), unix.EPERM) {
		return Creds{}, fmt.Errorf("read process %d: %w", pid, ErrHidden)
	}
	if err != nil {
		return Creds{}, err
	}
	return ParseCreds(b)
}

// ParseCreds reads the Uid, Gid and Groups lines of a /proc/<pid>/status.
func ParseCreds(b []byte) (Creds, error) {
	c := Creds{UID: -1}
	gid := -1
	for _, line := range bytes.Split(b, []byte("\n")) {
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(val)
		switch string(key) {
		case "Uid", "Gid":
			// real, effective, saved, filesystem: files are checked
			// against the effective (filesystem) ids.
			if len(f) < 2 {
				return Creds{}, fmt.Errorf("parse status: short %s line", key)
			}
			n, err := strconv.Atoi(string(f[1]))
			if err != nil {
				return Creds{}, fmt.Errorf("parse status %s: %w", key, err)
			}
			if string(key) == "Uid" {
				c.UID = n
			} else {
				gid = n
			}
		case "Groups":
			for _, g := range f {
				n, err := strconv.Atoi(string(g))
				if err != nil {
					return Creds{}, fmt.Errorf("parse status Groups: %w", err)
				}
				c.GIDs = append(c.GIDs, n)
			}
		}
	}
	if c.UID < 0 || gid < 0 {
		return Creds{}, errors.New("parse status: no Uid or Gid line")
	}
	c.GIDs = append([]int{gid}, c.GIDs...)
	return c, nil
}
