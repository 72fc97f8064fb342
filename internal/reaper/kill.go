package reaper

import (
	"errors"
	"fmt"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"golang.org/x/sys/unix"
)

// qemuGone makes sure the QEMU a dead server recorded no longer runs,
// killing it if the record verifiably names it: same PID, same start time,
// same executable. It reports false when that QEMU may still run.
func (r *reaper) qemuGone(server int, c registry.Child) bool {
	what := fmt.Sprintf("qemu:%d", c.PID)
	id := c.Identity()
	// Hold the process with a pidfd before checking it, so that the wait
	// below watches the very process that was checked and signalled.
	pfd, perr := unix.PidfdOpen(c.PID, 0)
	if perr == nil {
		defer unix.Close(pfd)
	} else {
		pfd = -1
	}
	live, _, err := proc.Check(id)
	if err != nil {
		r.fail("QEMU %d of dead server %d: %v", c.PID, server, err)
		return false
	}
	switch live {
	case proc.Gone, proc.Zombie:
		return true
	case proc.Reused:
		r.skip(what, fmt.Sprintf("pid %d now names another process (start time differs from the record): not signalled", c.PID))
		return true
	}
	if c.StartTime == 0 {
		r.skip(what, "no start time recorded: cannot verify the process, not signalled")
		return true
	}
	switch registry.ExeIs(c.PID, c.Executable) {
	case registry.No:
		exe, _ := proc.Exe(c.PID)
		r.skip(what, fmt.Sprintf("pid %d runs %q, not the recorded %q: not signalled", c.PID, exe, c.Executable))
		return true
	case registry.Unknown:
		r.fail("QEMU %d of dead server %d: cannot read its executable, not signalled", c.PID, server)
		return false
	}
	if err := proc.Signal(id, unix.SIGKILL); err != nil {
		switch {
		case errors.Is(err, proc.ErrNotFound):
			return true
		case errors.Is(err, proc.ErrNotSame):
			r.skip(what, "pid reused before the signal: not signalled")
			return true
		}
		r.fail("kill QEMU %d of dead server %d: %v", c.PID, server, err)
		return false
	}
	r.log.Info("reaper: killed QEMU of dead server", "pid", c.PID, "server", server)
	if !waitGone(pfd, id, r.opts.killWait()) {
		r.fail("QEMU %d of dead server %d still runs %v after SIGKILL", c.PID, server, r.opts.killWait())
		return false
	}
	r.rep.KilledQEMU = append(r.rep.KilledQEMU, Killed{
		ServerPID: server, PID: c.PID, StartTime: c.StartTime, Executable: c.Executable,
	})
	return true
}

func (o Options) killWait() time.Duration {
	if o.KillWait > 0 {
		return o.KillWait
	}
	return 2 * time.Second
}

// waitGone waits up to d for the process to exit. It is not our child, so
// it cannot be waited for: the pidfd becomes readable when it exits; without
// one, /proc is polled.
func waitGone(pfd int, id proc.Identity, d time.Duration) bool {
	deadline := time.Now().Add(d)
	gone := func() bool {
		live, _, err := proc.Check(id)
		return err == nil && live != proc.Alive
	}
	if pfd >= 0 {
		for {
			left := time.Until(deadline)
			if left < 0 {
				left = 0
			}
			fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, int(left.Milliseconds())+1)
			if errors.Is(err, unix.EINTR) && time.Now().Before(deadline) {
				continue
			}
			if err == nil && n > 0 {
				return true
			}
			break
		}
		return gone()
	}
	for {
		if gone() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitGone waits up to d for the process named by id to exit (or to be
// found gone already). It works for processes that are not our children.
func WaitGone(id proc.Identity, d time.Duration) bool {
	pfd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		pfd = -1
	} else {
		defer unix.Close(pfd)
	}
	// Checked after the pidfd was opened: if it still names id now, the
	// pidfd holds that very process.
	if live, _, err := proc.Check(id); err == nil && live != proc.Alive {
		return true
	}
	return waitGone(pfd, id, d)
}
