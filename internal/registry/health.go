package registry

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

// deletedSuffix is what the kernel appends to /proc/<pid>/exe when the file
// the process runs was removed or replaced.
const deletedSuffix = " (deleted)"

// Match is a three-way answer: a check could fail for lack of information.
type Match int

// The answers.
const (
	Unknown Match = iota
	Yes
	No
)

func (m Match) String() string {
	switch m {
	case Yes:
		return "yes"
	case No:
		return "no"
	}
	return "unknown"
}

// MarshalText makes a Match read "yes", "no" or "unknown" in JSON.
func (m Match) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads what MarshalText wrote; anything else is Unknown.
func (m *Match) UnmarshalText(b []byte) error {
	switch string(b) {
	case "yes":
		*m = Yes
	case "no":
		*m = No
	default:
		*m = Unknown
	}
	return nil
}

// Health is what Assess finds out about a recorded server now.
type Health struct {
	// Liveness of the server itself (PID and start time).
	Liveness proc.Liveness `json:"-"`
	State    string        `json:"state"`
	Alive    bool          `json:"alive"`
	// ExeMatch tells whether the server runs the current binary: the file
	// at Record.Executable still has the identity recorded at start and,
	// if the server is alive, /proc/<pid>/exe is not "(deleted)". No means
	// the binary was replaced: the server serves stale code.
	ExeMatch  Match  `json:"exe_match"`
	ExeDetail string `json:"exe_detail,omitempty"`
	// ImageMatch tells (for a live server) whether the process with that
	// PID runs the recorded executable: the inode behind /proc/<pid>/exe is
	// the recorded one (or, without a recorded identity, the path is). It
	// stays Yes when the file on disk was replaced since: it answers "is
	// this the recorded process", not "is its code current".
	ImageMatch Match `json:"image_match"`
	// ParentNow is the current parent PID of a live server.
	ParentNow int `json:"parent_now,omitempty"`
	// ParentAlive tells whether the parent recorded at start still runs
	// (PID and start time). Unknown when no parent was recorded.
	ParentAlive Match `json:"parent_alive"`
	// Orphaned is set for a live stdio server whose client is gone: the
	// recorded parent no longer runs, or the server was reparented.
	Orphaned bool `json:"orphaned"`
	// QEMU is the state of each recorded QEMU child, in the order of
	// Record.Children.
	QEMU []ChildHealth `json:"qemu,omitempty"`
}

// Verified tells whether the record verifiably names a running process:
// alive by PID and start time, and running the recorded executable. Only
// then may the doctor signal it.
func (h Health) Verified() bool { return h.Alive && h.ImageMatch == Yes }

// ChildHealth is the state of a recorded child process.
type ChildHealth struct {
	Liveness proc.Liveness `json:"-"`
	State    string        `json:"state"`
	Alive    bool          `json:"alive"`
	// ExeMatch: /proc/<pid>/exe names the recorded executable (a
	// " (deleted)" suffix is tolerated: an upgraded QEMU is still QEMU).
	ExeMatch Match `json:"exe_match"`
}

// Assess looks at the processes a record names, reading /proc only.
func Assess(rec Record) Health {
	var h Health
	live, info, err := proc.Check(rec.Identity())
	if err != nil {
		live = proc.Gone
	}
	h.Liveness, h.State, h.Alive = live, live.String(), live == proc.Alive
	if err != nil {
		h.State = "unknown: " + err.Error()
	}
	if h.Alive {
		h.ParentNow = info.PPID
		h.ImageMatch = imageMatch(rec)
	}
	h.ExeMatch, h.ExeDetail = exeMatch(rec, h.Alive)
	if rec.PPID > 0 {
		if pl, _, err := proc.Check(proc.Identity{PID: rec.PPID, StartTime: rec.ParentStartTime}); err == nil {
			if pl == proc.Alive {
				h.ParentAlive = Yes
			} else {
				h.ParentAlive = No
			}
		}
	}
	h.Orphaned = h.Alive && rec.Transport == TransportStdio && rec.PPID > 0 &&
		(h.ParentAlive == No || h.ParentNow != rec.PPID)
	for _, c := range rec.Children() {
		h.QEMU = append(h.QEMU, AssessChild(c))
	}
	return h
}

// AssessChild checks a recorded child: alive by PID and start time, and
// running the recorded executable.
func AssessChild(c Child) ChildHealth {
	live, _, err := proc.Check(c.Identity())
	if err != nil {
		live = proc.Gone
	}
	ch := ChildHealth{Liveness: live, State: live.String(), Alive: live == proc.Alive}
	if err != nil {
		ch.State = "unknown: " + err.Error()
	}
	if ch.Alive {
		ch.ExeMatch = ExeIs(c.PID, c.Executable)
	}
	return ch
}

// ExeIs tells whether /proc/<pid>/exe names path, tolerating the kernel's
// " (deleted)" suffix. Unknown if the link cannot be read.
func ExeIs(pid int, path string) Match {
	if path == "" {
		return Unknown
	}
	exe, err := proc.Exe(pid)
	if err != nil {
		return Unknown
	}
	if strings.TrimSuffix(exe, deletedSuffix) == path {
		return Yes
	}
	return No
}

func imageMatch(rec Record) Match {
	if rec.ExeIdentity != nil {
		id, err := statIdentity("/proc/" + strconv.Itoa(rec.PID) + "/exe")
		if err != nil {
			return Unknown
		}
		if id.Dev == rec.ExeIdentity.Dev && id.Inode == rec.ExeIdentity.Inode {
			return Yes
		}
		return No
	}
	return ExeIs(rec.PID, rec.Executable)
}

func exeMatch(rec Record, alive bool) (Match, string) {
	if alive {
		if exe, err := proc.Exe(rec.PID); err == nil && strings.HasSuffix(exe, deletedSuffix) {
			return No, "running a deleted or replaced binary: " + exe
		}
	}
	if rec.Executable == "" {
		return Unknown, "no executable recorded"
	}
	var st unix.Stat_t
	if err := unix.Stat(rec.Executable, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return No, rec.Executable + " no longer exists"
		}
		return Unknown, (&os.PathError{Op: "stat", Path: rec.Executable, Err: err}).Error()
	}
	if rec.ExeIdentity == nil {
		return Unknown, "no executable identity recorded"
	}
	if identityOf(&st) != *rec.ExeIdentity {
		return No, rec.Executable + " was replaced since the server started (stale code)"
	}
	return Yes, ""
}
