package qmp

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is wrapped by every error caused by the monitor being
	// unusable: Disconnect was called, or the connection to QEMU was lost
	// (typically because QEMU exited). Err reports which.
	ErrClosed = errors.New("monitor closed")

	// ErrNotConnected is returned by commands issued before a successful
	// Connect or ConnectContext.
	ErrNotConnected = errors.New("monitor not connected")

	errAlreadyConnected = errors.New("already connected")
)

// Error is a command failure reported by QEMU, as opposed to a failure to
// talk to QEMU. Callers can branch on Class, which QEMU keeps stable, rather
// than on Desc, which is meant for humans.
type Error struct {
	// Command is the name of the command that failed.
	Command string
	// Class is the QMP error class, e.g. "GenericError", "CommandNotFound",
	// "DeviceNotFound".
	Class string
	// Desc is QEMU's human-readable description.
	Desc string
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}
