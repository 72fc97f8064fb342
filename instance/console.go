package instance

import (
	"context"
	"errors"
	"fmt"
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

// Exec runs req.Command at the shell on the guest's console (package
// shell), after any other call on the console. Its waits end like any
// wait of the instance: at a stop, a panic, or a guest reset or shutdown
// (ev).
func (i *Instance) Exec(ctx context.Context, req shell.Request) (res shell.Result, ev *Event, err error) {
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
	req.Wait = func(ctx context.Context, since int64, spec serial.Spec) (serial.Result, error) {
		r, e, err := i.Wait(ctx, since, spec)
		if e != nil {
			ev = e
		}
		return r, err
	}
	res, err = shell.Run(ctx, typist{i, mch.Console()}, req)
	return res, ev, err
}
