package instance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// The errors of instances and managers are typed: each says what is
// wrong, and the layer that serves them (package tools) adds what the
// caller does next, in the names of its own interface. Match them with
// errors.Is against the sentinels below, or errors.As for the details.
var (
	// ErrNotFound is wrapped by a *NotFoundError: no instance of that name.
	ErrNotFound = errors.New("no such guest")
	// ErrBusy is wrapped by a *BusyError: the name is taken by a live guest.
	ErrBusy = errors.New("the guest is busy")
	// ErrTooMany is wrapped by a *TooManyError: the server runs as many
	// guests as it allows.
	ErrTooMany = errors.New("too many guests")
	// ErrNotRunning is wrapped by a *NotRunningError: the guest is not
	// (or not yet, or no more) running.
	ErrNotRunning = errors.New("the guest is not running")
	// ErrNoTAP is wrapped by the error of a capture of a guest that has
	// no TAP.
	ErrNoTAP = advice.New("no TAP to capture on", advice.Advice{Action: advice.BootWithTAP})
	// ErrCaptureRunning is wrapped by a *CaptureRunningError.
	ErrCaptureRunning = errors.New("a capture is already running")
	// ErrGuestLost is wrapped by the error of a restore that left no
	// guest: the instance was stopped.
	ErrGuestLost = advice.New("the guest is stopped", advice.Advice{Action: advice.BootLost})
)

// NotFoundError is a call for an instance name no boot made.
type NotFoundError struct {
	Name string
	// Known are the instances there are, sorted.
	Known []string
}

func (e *NotFoundError) Error() string {
	if len(e.Known) == 0 {
		return fmt.Sprintf("no guest named %q has been booted", e.Name)
	}
	return fmt.Sprintf("no guest named %q has been booted (instances: %s)", e.Name, strings.Join(e.Known, ", "))
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// BusyError is a boot of a name whose guest is live.
type BusyError struct {
	Name  string
	State State
	// PID and Up describe its QEMU; PID is 0 before QEMU started.
	PID int
	Up  time.Duration
}

func (e *BusyError) Error() string {
	if e.PID != 0 {
		return fmt.Sprintf("guest %q is already %s (qemu pid %d, up %s)", e.Name, e.State, e.PID, e.Up.Round(time.Second))
	}
	return fmt.Sprintf("guest %q is already %s", e.Name, e.State)
}

func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// TooManyError is a boot refused because Max guests run.
type TooManyError struct {
	Live []string
	Max  int
}

func (e *TooManyError) Error() string {
	return fmt.Sprintf("%d guests already run (%s), the most this server allows", len(e.Live), strings.Join(e.Live, ", "))
}

func (e *TooManyError) Is(target error) bool { return target == ErrTooMany }

// NotRunningError is a call that needs a running guest, made when the
// guest is booting, stopping, stopped, or its QEMU exited.
type NotRunningError struct {
	Name  string
	State State
	// Exit says how QEMU ended, if it did; the error then wraps ErrExited.
	Exit string
	// NoStart says the boot ended before QEMU started.
	NoStart bool
}

func (e *NotRunningError) Error() string {
	switch {
	case e.Exit != "":
		return fmt.Sprintf("%v: guest %q %s", ErrExited, e.Name, e.Exit)
	case e.State == Booting:
		return fmt.Sprintf("guest %q is still booting", e.Name)
	case e.State == Stopping:
		return fmt.Sprintf("guest %q is stopping", e.Name)
	case e.NoStart:
		return fmt.Sprintf("guest %q did not start", e.Name)
	}
	return fmt.Sprintf("guest %q was stopped", e.Name)
}

func (e *NotRunningError) Is(target error) bool {
	return target == ErrNotRunning || (target == ErrExited && e.Exit != "")
}

// StoppedError is a call that waited on a guest when it was stopped.
type StoppedError struct {
	Name string
	// For is what the call waited for ("" for its output).
	For string
}

func (e *StoppedError) Error() string {
	if e.For != "" {
		return fmt.Sprintf("guest %q: %v while this call waited for %s", e.Name, ErrStopped, e.For)
	}
	return fmt.Sprintf("guest %q: %v while this call waited", e.Name, ErrStopped)
}

func (e *StoppedError) Unwrap() error { return ErrStopped }

// CaptureRunningError is a capture asked for while one runs.
type CaptureRunningError struct {
	Name string
	// Path is the running capture's file.
	Path string
}

func (e *CaptureRunningError) Error() string {
	return fmt.Sprintf("a capture of guest %q is already running into %s", e.Name, e.Path)
}

func (e *CaptureRunningError) Is(target error) bool { return target == ErrCaptureRunning }

// ReplayingError is a change refused to a guest that replays a recording:
// its state is the recording's, moved only through its debugger.
type ReplayingError struct {
	// What was refused ("save a snapshot of").
	What      string
	Name      string
	Recording string
}

func (e *ReplayingError) Error() string {
	return fmt.Sprintf("cannot %s guest %q: it replays recording %q", e.What, e.Name, e.Recording)
}

func (e *ReplayingError) Is(target error) bool { return target == ErrReplay }

// Advice is what a caller can do: boot the guest.
func (e *NotFoundError) Advice() advice.Advice {
	if len(e.Known) == 0 {
		return advice.Advice{Action: advice.BootFirst}
	}
	return advice.Advice{Action: advice.BootFirst, Name: e.Name}
}

// Advice is what a caller can do: shut the guest down, or restart it.
func (e *BusyError) Advice() advice.Advice { return advice.Advice{Action: advice.ShutdownOrRestart} }

// Advice is what a caller can do: stop a guest.
func (e *TooManyError) Advice() advice.Advice { return advice.Advice{Action: advice.TooMany, N: e.Max} }

// Advice is what a caller can do, by how the guest is not running.
func (e *NotRunningError) Advice() advice.Advice {
	switch {
	case e.Exit != "":
		return advice.Advice{Action: advice.BootAgainOutputKept}
	case e.State == Booting:
		return advice.Advice{Action: advice.WaitForBoot}
	case e.State == Stopping:
		return advice.Advice{Action: advice.BootAfterStop}
	case e.NoStart:
		return advice.Advice{Action: advice.BootAgain}
	}
	return advice.Advice{Action: advice.BootToStart}
}

// Advice says what stopped the guest, and that its output stays.
func (e *StoppedError) Advice() advice.Advice {
	if e.For == "" {
		return advice.Advice{Action: advice.StoppedOutputKept}
	}
	return advice.Advice{Action: advice.Stopped}
}

// Advice is what a caller can do: stop the capture.
func (e *CaptureRunningError) Advice() advice.Advice {
	return advice.Advice{Action: advice.StopCapture}
}

// Advice is what a caller can do: move the replay instead.
func (e *ReplayingError) Advice() advice.Advice { return advice.Advice{Action: advice.MoveReplay} }
