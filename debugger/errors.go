package debugger

import (
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// ErrNoPhysical is returned for a physical memory read the gdbstub cannot
// make (it lacks Qqemu.PhyMemMode).
var ErrNoPhysical = advice.New("this QEMU's gdbstub cannot read physical memory (Qqemu.PhyMemMode)", advice.Advice{Action: advice.ReadVirtual})

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

// ErrNotReplay is a move back in time (or to an instruction count) asked
// of a guest that does not replay a recording.
var ErrNotReplay = advice.New("going back needs a recording", advice.Advice{Action: advice.RecordThenReplay})

// AtEndError is a forward step that would pass the end of the recording
// the guest replays.
type AtEndError struct {
	// At is where the replay is, End the recording's last instruction.
	At, End uint64
}

func (e *AtEndError) Error() string {
	return fmt.Sprintf("%v: at instruction %d, %d before its end (%d)", ErrAtEnd, e.At, e.End-e.At, e.End)
}

func (e *AtEndError) Is(target error) bool { return target == ErrAtEnd }

// Advice is what a caller can do: set one.
func (e *NoBreakpointError) Advice() advice.Advice {
	if e.Watch {
		return advice.Advice{Action: advice.SetWatchpoint}
	}
	return advice.Advice{Action: advice.SetBreakpoint}
}

// Advice is what a caller can do: remove a watchpoint.
func (e *WatchRefusedError) Advice() advice.Advice {
	return advice.Advice{Action: advice.RemoveWatchpoint}
}

// Advice is what a caller can do: step back.
func (e *AtEndError) Advice() advice.Advice { return advice.Advice{Action: advice.StepBack} }

// NoRootError is a page table root given for a walk on an architecture
// whose walks read several registers (aarch64: a table per half of the
// address space, and their control register), none of which could stand
// for them all.
type NoRootError struct{ Arch string }

func (e *NoRootError) Error() string {
	return fmt.Sprintf("%s walks read their tables from the hart's own registers, so no single root can be given", e.Arch)
}
