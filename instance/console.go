package instance

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/shell"
)

// ErrConsoleBusy is returned when another call kept the console past a
// call's timeout.
var ErrConsoleBusy = errors.New("the console is busy")

// consoleUse is who holds the console.
type consoleUse struct {
	what  string
	since time.Time
}

// AcquireConsole makes calls that type on the guest's console (a command,
// a send and its wait) run one after another, so that neither's input nor
// output mixes with the other's. It waits up to wait (and ctx) for the
// call before it; release ends the use. what names the call in the error
// another call gets meanwhile.
func (i *Instance) AcquireConsole(ctx context.Context, what string, wait time.Duration) (release func(), err error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case i.consoleSem <- struct{}{}:
	case <-t.C:
		i.mu.Lock()
		use := i.consoleUse
		i.mu.Unlock()
		return nil, fmt.Errorf("guest %q: %w: %s has used it for %s, longer than this call's timeout of %v; calls on one console run one after another: try again when it returns",
			i.name, ErrConsoleBusy, use.what, time.Since(use.since).Round(time.Millisecond), wait)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-i.ctx.Done():
		return nil, &StoppedError{Name: i.name, For: "the console"}
	}
	i.mu.Lock()
	i.consoleUse = consoleUse{what: what, since: time.Now()}
	i.mu.Unlock()
	return func() { <-i.consoleSem }, nil
}

// Command is a shell command to run at the guest's console shell.
type Command struct {
	Line string
	// Timeout bounds the run; past it the command gets Ctrl-C.
	Timeout time.Duration
	// MaxOutput bounds the output's excerpt; longer output keeps its end,
	// and with KeepHead its start too, the middle elided.
	MaxOutput int
	KeepHead  bool
}

// Ran is how a command ran, and its output.
type Ran struct {
	ShellResult
	// NoShell says no shell answered at the console.
	NoShell bool
	// Output is the command's output [OutputStart, OutputEnd), without
	// the kernel's messages, once a shell answered; Output.Exit is QEMU's
	// exit either way.
	Output Excerpt
	// Event is the guest's reset or shutdown that ended a wait of the run.
	Event *Event
}

// promptGrace is how long a command's result waits for the boot
// profile's prompt after the end marker, so that the next call's output
// starts after it.
const promptGrace = 200 * time.Millisecond

// Exec runs cmd.Line at the shell on the guest's console (package shell),
// after any other call on the console, with the boot profile's panic
// patterns. Its waits end like any wait of the instance: at a stop, a
// panic, or a guest reset or shutdown (Ran.Event). Past the end marker,
// Ran.Cursor is past the shell's prompt too when the profile names it and
// it comes at once, so that the next call's output is its own.
func (i *Instance) Exec(ctx context.Context, cmd Command) (Ran, error) {
	req := shell.Request{Command: cmd.Line, Timeout: cmd.Timeout}
	if len(i.spec.Panics) > 0 {
		req.Panic = append(serial.DefaultPanicPatterns(), i.spec.Panics...)
	}
	res, ev, err := i.runCommand(ctx, req)
	if err != nil {
		return Ran{}, err
	}
	mch := i.Process()
	buf := mch.Console().Buffer()
	ran := Ran{ShellResult: res, Event: ev, NoShell: !res.Started && (res.Wait == nil || res.Wait.TimedOut)}
	ran.Output = Excerpt{Since: res.OutputStart, Start: res.OutputStart, End: res.OutputEnd}
	if res.Started {
		if ran.Output, err = commandOutput(buf, res.OutputStart, res.OutputEnd, res.Uptime, cmd.MaxOutput, cmd.KeepHead); err != nil {
			return Ran{}, err
		}
	}
	ran.Output.Exit = exitOf(mch)
	if res.Completed && i.spec.Prompt != "" {
		if re, err := regexp.Compile(i.spec.Prompt); err == nil {
			if w, _, err := i.Wait(ctx, ran.Cursor, serial.Spec{Patterns: []*regexp.Regexp{re}, Timeout: promptGrace, Panic: []*regexp.Regexp{}, MaxOutput: 1}); err == nil && w.Matched {
				ran.Cursor = w.End
			}
		}
	}
	return ran, nil
}

// runCommand runs req at the shell holding the console. A QEMU that exited
// meanwhile outside the run's waits has its last event reported too.
func (i *Instance) runCommand(ctx context.Context, req shell.Request) (res shell.Result, ev *Event, err error) {
	mch, err := i.Running()
	if err != nil {
		return shell.Result{}, nil, err
	}
	if err := i.Input(); err != nil {
		return shell.Result{}, nil, err
	}
	release, err := i.AcquireConsole(ctx, "a shell command", req.Timeout)
	if err != nil {
		return shell.Result{}, nil, err
	}
	defer release()
	i.mu.Lock()
	i.execSeq = 10 + (i.execSeq+1)%90
	req.Seq = i.execSeq
	i.mu.Unlock()
	began := time.Now().Truncate(time.Microsecond)
	from := mch.Console().Buffer().End()
	req.Wait = func(ctx context.Context, since int64, spec serial.Spec) (serial.Result, error) {
		r, e, err := i.waitSince(ctx, since, spec, began, false)
		if e != nil {
			ev = e
		}
		return r, err
	}
	res, err = shell.Run(ctx, typist{i, mch.Console()}, req)
	if ev == nil && exitOf(mch) != nil {
		ev = i.events.exitEvent(mch, from, began, i.exitNoted)
	}
	return res, ev, err
}
