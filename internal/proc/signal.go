package proc

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotSame means the PID no longer names the recorded process, so it was
// not signalled.
var ErrNotSame = errors.New("pid no longer names the recorded process")

// Signal sends sig to the process named by id, and only to it. A pidfd is
// opened first and the start time checked afterwards: if the PID was reused
// in between, the check sees the new process and refuses, and if it was not,
// the pidfd pins the process we checked, so the signal cannot reach a newcomer.
// A zero StartTime is refused: a bare PID is not enough to signal.
func Signal(id Identity, sig unix.Signal) error {
	if id.StartTime == 0 {
		return fmt.Errorf("signal %d: no start time recorded: %w", id.PID, ErrNotSame)
	}
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", id.PID, ErrNotFound)
		}
		return fmt.Errorf("signal %d: pidfd_open: %w", id.PID, err)
	}
	defer unix.Close(fd)
	live, _, err := Check(id)
	if err != nil {
		return fmt.Errorf("signal %d: %w", id.PID, err)
	}
	switch live {
	case Gone:
		return fmt.Errorf("signal %d: %w", id.PID, ErrNotFound)
	case Reused:
		return fmt.Errorf("signal %d: %w", id.PID, ErrNotSame)
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", id.PID, ErrNotFound)
		}
		return fmt.Errorf("signal %d: %w", id.PID, os.NewSyscallError("pidfd_send_signal", err))
	}
	return nil
}
