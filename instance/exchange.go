package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// Waited is how a console wait ended, and the output it waited through.
type Waited struct {
	Excerpt
	// EchoEnd is where the guest's echo of the line typed ended, when it
	// echoed: the wait searched from there. 0 otherwise.
	EchoEnd int64
	// Matched says Patterns[Index] matched Match, which begins at
	// MatchStart; Groups are its capture groups.
	Matched    bool
	Index      int
	Match      []byte
	MatchStart int64
	Groups     []string
	// TimedOut and Idle say the timeout, or the quiet, ended the wait.
	TimedOut, Idle bool
	// Panicked says a panic pattern matched PanicMatch: the guest crashed.
	Panicked   bool
	PanicMatch string
	// Event is the guest's reset or shutdown that ended the wait.
	Event *Event
	// Triage is the debugger's view of the panic, on a guest booted with
	// one; TriageErr says why there is none.
	Triage    *debugger.Triage
	TriageErr error
	// DebugStop is where and why the debugger holds the guest stopped,
	// when it does at the end of a wait that found nothing: why the
	// console stayed quiet (and why the wait ended before its timeout).
	DebugStop *debugger.StopInfo
}

// Await runs a console wait from since (see Wait) and returns the output
// it waited through and how it ended, with what the guest's state tells
// of that end: the crash of a panic (on a guest with a debugger), the
// debugger holding the guest, QEMU's exit and the event before it, and
// the test results the output holds. Unlike Wait, it also ends as soon as
// the debugger holds the guest stopped: nothing more comes until it is
// resumed.
func (i *Instance) Await(ctx context.Context, since int64, spec serial.Spec) (Waited, error) {
	res, ev, err := i.waitSince(ctx, since, spec, time.Now().Truncate(time.Microsecond), true)
	if err != nil {
		return Waited{}, err
	}
	w := Waited{
		Excerpt: waited(i.Console().Buffer(), res),
		Matched: res.Matched, Groups: res.Groups, TimedOut: res.TimedOut, Idle: res.Idle,
		Panicked: res.Panicked, PanicMatch: res.PanicMatch, Event: ev,
	}
	if res.EchoEnd > res.Since {
		w.EchoEnd = res.EchoEnd
	}
	if res.Matched {
		w.Index, w.Match, w.MatchStart = res.Index, res.Match, res.Start
	}
	w.Exit = exitOf(i.Process())
	switch {
	case w.Exit != nil:
	case w.Panicked:
		// The crashing function, without anyone asking.
		w.Triage, w.TriageErr = triage(ctx, i.Debugger())
	case !w.Matched:
		if st, ok := debugStop(ctx, i.Debugger()); ok {
			w.DebugStop = &st
		}
	}
	return w, nil
}

// Read returns up to size bytes of console output from since on, without
// waiting; whole ends it, when more follows, where an escape or UTF-8
// sequence is complete, so that the next read has the rest of it whole.
func (i *Instance) Read(since int64, size int, whole bool) (Excerpt, error) {
	con := i.Console()
	if con == nil {
		return Excerpt{}, fmt.Errorf("guest %q has no console yet", i.name)
	}
	ex, err := pageOf(con.Buffer(), since, size, whole)
	if err != nil {
		return Excerpt{}, err
	}
	ex.Exit = exitOf(i.Process())
	return ex, nil
}

// Input is text to type on the guest's console, and what to wait for
// after it.
type Input struct {
	// Data is typed line by line, each line ended with Ending, the last
	// one too ("\r" is the Enter key; "" types Data as it is).
	Data   string
	Ending string
	// CharDelay, if > 0, types a byte at a time, for guests without a
	// UART FIFO that drop fast input.
	CharDelay time.Duration
	// Timeout bounds the wait for the console (another call may type on
	// it) and the typing: a guest that does not read its console must not
	// hold the call.
	Timeout time.Duration
	// Who names the call in the error another call gets while this one
	// holds the console.
	Who string
	// Wait, if set, is what to wait for after typing, from the end of the
	// output before it. Unless MatchEcho, the search starts after the
	// guest's echo of the first line typed: the echo is not its answer.
	Wait      *serial.Spec
	MatchEcho bool
}

// Sent is what typing took, and the wait after it; without a wait, an
// empty excerpt where the guest's answer will begin.
type Sent struct {
	// Written is how many bytes the guest was given (or, recording, took).
	Written int
	// Paced says they went a few at a time, each after the guest echoed
	// the last: the guest records, and only what it echoed was typed.
	Paced bool
	Waited
}

// lines ends each line of data with ending, the way a person at the
// console types "a\nb": two lines, each with the Enter key.
func lines(data, ending string) string {
	if ending != "\n" {
		data = strings.ReplaceAll(strings.ReplaceAll(data, "\r\n", "\n"), "\n", ending)
	}
	return data + ending
}

// firstLine is the first line of data, the one a guest echoes before it
// answers.
func firstLine(data string) string {
	line, _, _ := strings.Cut(strings.ReplaceAll(data, "\r\n", "\n"), "\n")
	return line
}

// Send types in.Data on the guest's console after any other call on it,
// and, with in.Wait, waits for the guest's answer while it still holds
// the console. A typing that fails is a *WriteError, a wait that fails a
// *WaitError.
func (i *Instance) Send(ctx context.Context, in Input) (Sent, error) {
	mch, err := i.Running()
	if err != nil {
		return Sent{}, err
	}
	if err := i.Input(); err != nil {
		return Sent{}, err
	}
	data := lines(in.Data, in.Ending)
	release, err := i.AcquireConsole(ctx, in.Who, in.Timeout)
	if err != nil {
		return Sent{}, err
	}
	defer release()
	from := mch.Console().Buffer().End()
	wctx, cancel := context.WithTimeout(ctx, in.Timeout)
	defer cancel()
	n, err := i.Type(wctx, []byte(data), in.CharDelay)
	if err != nil {
		e := &WriteError{Took: n, Of: len(data), From: from, Err: err}
		if ctx.Err() == nil && (wctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) {
			e.Timeout = in.Timeout
		}
		return Sent{}, e
	}
	_, recording := i.Recording()
	sent := Sent{Written: n, Paced: recording && in.CharDelay == 0}
	if in.Wait == nil {
		sent.Excerpt = Excerpt{Since: from, Start: from, End: from, Exit: exitOf(mch)}
		return sent, nil
	}
	spec := *in.Wait
	if line := firstLine(in.Data); !in.MatchEcho && line != "" {
		spec.Echo = []byte(line)
	}
	if sent.Waited, err = i.Await(ctx, from, spec); err != nil {
		return Sent{}, &WaitError{Err: err}
	}
	return sent, nil
}

// WriteError is typing on the console that failed: the guest took Took
// of Of bytes, and its output from From shows what it did with them.
type WriteError struct {
	Took, Of int
	From     int64
	// Timeout is set when the guest did not take the bytes within it: it
	// does not read its console fast enough.
	Timeout time.Duration
	Err     error
}

func (e *WriteError) Error() string {
	switch {
	case errors.Is(e.Err, ErrNoEcho):
		return fmt.Sprintf("write to serial console: the guest took %d of %d bytes: %v; output from cursor %d on shows what it did with them", e.Took, e.Of, e.Err, e.From)
	case e.Timeout > 0:
		return fmt.Sprintf("write to serial console: the guest took %d of %d bytes within the timeout of %v (it is not reading its console fast enough); output from cursor %d on shows what it did with them", e.Took, e.Of, e.Timeout, e.From)
	}
	return fmt.Sprintf("write to serial console: %v (wrote %d of %d bytes)", e.Err, e.Took, e.Of)
}

func (e *WriteError) Unwrap() error { return e.Err }

// WaitError is a wait after typing that failed; the typing itself went
// through.
type WaitError struct{ Err error }

func (e *WaitError) Error() string { return e.Err.Error() }
func (e *WaitError) Unwrap() error { return e.Err }
