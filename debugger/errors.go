package debugger

import (
	"errors"
	"fmt"
)

// ErrNoPhysical is returned for a physical memory read the gdbstub cannot
// make (it lacks Qqemu.PhyMemMode).
var ErrNoPhysical = errors.New("this QEMU's gdbstub cannot read physical memory (Qqemu.PhyMemMode)")

// NoBreakpointError is the removal of a breakpoint or watchpoint that is
// not set.
type NoBreakpointError struct {
	Where string
	// Watch says it was a watchpoint.
	Watch bool
}

func (e *NoBreakpointError) Error() string {
	if e.Watch {
		return "no watchpoint at " + e.Where
	}
	return "no breakpoint at " + e.Where
}

// WatchRefusedError is a watchpoint QEMU did not set: it has as many as it
// allows, or none of the kind.
type WatchRefusedError struct {
	// N is the watchpoint's number, counting those set.
	N     int
	Where string
	Err   error
}

func (e *WatchRefusedError) Error() string {
	return fmt.Sprintf("QEMU refused watchpoint %d at %s (%v): it has as many as it allows, or none of this kind", e.N, e.Where, e.Err)
}

func (e *WatchRefusedError) Unwrap() error { return e.Err }
