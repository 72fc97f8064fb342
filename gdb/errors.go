package gdb

import (
	"errors"
	"fmt"
	"strconv"
)

var (
	// ErrClosed is wrapped by every error caused by the connection being
	// unusable: Close was called, or the stub went away (QEMU exited).
	ErrClosed = errors.New("gdb connection closed")

	// ErrRunning is returned by commands issued while the target runs:
	// QEMU's stub cannot answer them then (a byte it receives while the
	// guest runs stops the guest and is dropped).
	ErrRunning = errors.New("target is running: interrupt it first")

	// ErrNotRunning is returned by Wait when the target is stopped and its
	// stop has already been reported.
	ErrNotRunning = errors.New("target is not running")

	// ErrExited is returned by commands once the target has exited.
	ErrExited = errors.New("target has exited")

	// ErrUnsupported means the stub answered with an empty packet, the
	// protocol's "I do not know this command".
	ErrUnsupported = errors.New("not supported by the stub")
)

// StubError is an error reply ("Enn" or "E.text") from the stub, as opposed
// to a failure to talk to it. QEMU's codes are not documented beyond "E14"
// for memory it cannot access and "E22" for bad arguments.
type StubError struct {
	// Command is the packet that failed, shortened.
	Command string
	// Code is the number in "Enn"; -1 for the textual form.
	Code int
	// Reply is the reply as received.
	Reply string
}

func (e *StubError) Error() string {
	return fmt.Sprintf("%s: stub replied %s", e.Command, e.Reply)
}

// MemoryError is a memory access that failed part way. Addr is where the
// failing request started; the Done bytes before it were transferred.
type MemoryError struct {
	Op   string // "read" or "write"
	Addr uint64
	Done int
	Err  error
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("%s memory failed at 0x%x (after %d bytes): %v", e.Op, e.Addr, e.Done, e.Err)
}

func (e *MemoryError) Unwrap() error { return e.Err }

// replyError turns an error or empty reply into an error, or returns nil.
func replyError(cmd []byte, reply []byte) error {
	if len(reply) == 0 {
		return fmt.Errorf("%s: %w", shorten(cmd), ErrUnsupported)
	}
	if reply[0] != 'E' {
		return nil
	}
	if len(reply) == 3 && isHex(reply[1:]) {
		n, _ := strconv.ParseUint(string(reply[1:]), 16, 8)
		return &StubError{Command: shorten(cmd), Code: int(n), Reply: string(reply)}
	}
	if len(reply) >= 2 && reply[1] == '.' {
		return &StubError{Command: shorten(cmd), Code: -1, Reply: string(reply)}
	}
	return nil
}

// shorten keeps error messages readable when the packet carries data.
func shorten(b []byte) string {
	const limit = 48
	if len(b) <= limit {
		return string(b)
	}
	return string(b[:limit]) + "..."
}
