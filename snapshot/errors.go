package snapshot

import (
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// ErrNotFound is a snapshot name the project does not have (a
// *NotFoundError wraps it).
var ErrNotFound = errors.New("no such snapshot")

// NotFoundError is a snapshot name a project does not have.
type NotFoundError struct {
	Name, Root string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no snapshot %q in project %s", e.Name, e.Root)
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// AmbiguousError is a snapshot name saved on several machines, for a boot
// that does not say which.
type AmbiguousError struct {
	Name, Root string
	// N is how many machines have one.
	N int
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("project %s has %d snapshots called %q, of different machines", e.Root, e.N, e.Name)
}

// DriveFormatError is a writable drive whose format cannot hold a
// snapshot of its contents (only qcow2 can).
type DriveFormatError struct {
	Device, Path, Format string
}

func (e *DriveFormatError) Error() string {
	return fmt.Sprintf("drive %s (%s) is writable %s, which cannot hold a snapshot of its contents", e.Device, e.Path, e.Format)
}

// LowSpaceError says a failed save's store is short of space.
type LowSpaceError struct {
	Dir string
	// Free is the bytes free.
	Free int64
}

func (e *LowSpaceError) Error() string {
	return fmt.Sprintf("the snapshot store %s has %d KiB free: free some space", e.Dir, e.Free>>10)
}

// MachineError is a snapshot saved on another machine than the one it is
// to load into.
type MachineError struct {
	Name string
	// Guest is the instance it was to load into; empty for a boot's
	// arguments.
	Guest string
	// Diffs say how the machines differ (see Diff), one entry a
	// candidate snapshot of the name.
	Diffs []string
}

func (e *MachineError) Error() string {
	if e.Guest == "" {
		return fmt.Sprintf("snapshot %q was saved on another machine than these arguments give: %s", e.Name, strings.Join(e.Diffs, " | "))
	}
	return fmt.Sprintf("snapshot %q was saved on another machine than guest %q runs: %s", e.Name, e.Guest, strings.Join(e.Diffs, " | "))
}

// Advice is what a caller can do: list the snapshots.
func (e *NotFoundError) Advice() advice.Advice { return advice.Advice{Action: advice.ListSnapshots} }

// Advice is what a caller can do: give the machine.
func (e *AmbiguousError) Advice() advice.Advice { return advice.Advice{Action: advice.GiveMachine} }

// Advice is what a caller can do: attach the drive read-only, or as qcow2.
func (e *DriveFormatError) Advice() advice.Advice {
	return advice.Advice{Action: advice.ReadOnlyOrQcow2}
}

// Advice is what a caller can do: delete older snapshots.
func (e *LowSpaceError) Advice() advice.Advice { return advice.Advice{Action: advice.DeleteSnapshots} }

// Advice is what a caller can do: boot the snapshot's own machine.
func (e *MachineError) Advice() advice.Advice {
	if e.Guest == "" {
		return advice.Advice{Action: advice.BootSnapshotMachine}
	}
	return advice.Advice{Action: advice.BootFromSnapshot, Name: e.Name}
}
