package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// What ended a QEMU is the last interrupting event it sent: not a STOP,
// nor the reset of a snapshot load, nor an event of a QEMU before it.
func TestEventEnding(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	events := []Event{
		{Event: "SHUTDOWN", Time: at(-time.Hour)}, // of an earlier QEMU
		{Event: "RESET", Time: at(time.Second), Data: map[string]any{"reason": "guest-reset"}},
		{Event: "RESET", Time: at(2 * time.Second), Data: map[string]any{"reason": "snapshot-load"}},
		{Event: "STOP", Time: at(3 * time.Second)},
		{Event: "SHUTDOWN", Time: at(4 * time.Second), Data: map[string]any{"reason": "guest-shutdown"}},
	}
	var l eventLog
	for _, e := range events {
		l.add(e)
	}
	if e := l.ending(t0); e == nil || e.Reason() != "guest-shutdown" {
		t.Errorf("the end: %+v", e)
	}
	if e := l.ending(at(4 * time.Second)); e == nil || e.Reason() != "guest-shutdown" {
		t.Errorf("the end sent as the wait began: %+v", e)
	}
	if e := l.ending(at(5 * time.Second)); e != nil {
		t.Errorf("after the end: %+v", e)
	}
	var l2 eventLog
	for _, e := range events[:4] {
		l2.add(e)
	}
	if e := l2.ending(t0); e == nil || e.Reason() != "guest-reset" {
		t.Errorf("without a shutdown: %+v", e)
	}
	if e := l2.ending(at(1500 * time.Millisecond)); e != nil {
		t.Errorf("after the reset: %+v", e)
	}
}

// A QEMU's events are all read once its reader is done; one that is not
// followed has nothing to wait for.
func TestReadDone(t *testing.T) {
	var l eventLog
	a, b := &qemu.Process{}, &qemu.Process{}
	read := make(chan struct{})
	l.reading(a, read)
	select {
	case <-l.readDone(a):
		t.Fatal("done while its reader reads")
	case <-l.readDone(b):
	default:
		t.Fatal("a QEMU not followed is not done")
	}
	close(read)
	<-l.readDone(a)
}

// An event is recorded after the output QEMU wrote before it sent the
// event, however late the console's reader is to that output: the event's
// cursor is past it, and a wait the event ends has it.
func TestEventAfterItsOutput(t *testing.T) {
	ctx := testContext(t)
	con, err := serial.Create(filepath.Join(t.TempDir(), "serial-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	out, err := os.OpenFile(con.OutPath(), os.O_WRONLY, 0) // as QEMU does
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var l eventLog
	never := []*regexp.Regexp{regexp.MustCompile("never")}
	for k := range 20 {
		from := con.Buffer().End()
		waited := make(chan serial.Result, 1)
		stop := l.waker()
		go func() {
			res, err := con.Buffer().WaitFor(ctx, from, serial.Spec{Patterns: never, Timeout: 10 * time.Second, Stop: stop})
			if err != nil {
				t.Error(err)
			}
			waited <- res
		}()
		line := fmt.Sprintf("Powering off %d\r\n", k)
		if _, err := out.WriteString(line); err != nil {
			t.Fatal(err)
		}
		l.record(con, Event{Event: "SHUTDOWN", Time: time.Now(), Data: map[string]any{"reason": "guest-shutdown"}})
		evs, _ := l.recent(1)
		if want := from + int64(len(line)); evs[0].Cursor != want {
			t.Errorf("event %d after %q at cursor %d: cursor %d", k, line, want, evs[0].Cursor)
		}
		if res := <-waited; !res.Stopped || string(res.Output) != line {
			t.Fatalf("the wait the event %d ended: stopped %v, output %q, want %q", k, res.Stopped, res.Output, line)
		}
	}
}

// bootTiny boots the tiny kernel as name and waits for its prompt; since
// is past it.
func bootTiny(t *testing.T, ctx context.Context, m *Manager, name string) (*Instance, int64) {
	t.Helper()
	i, _, err := m.Boot(ctx, tinySpec(t, name, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Stop(context.Background(), qemu.Quit, 5*time.Second) })
	var since int64
	expect(t, ctx, i, &since, tinyPrompt)
	return i, since
}

// A wait that sees QEMU exit reports the event QEMU sent before it
// exited (or, where QEMU sends none, the one recorded for the exit), even
// when it began only after QEMU had sent it: its output shows the
// power-off. One that begins past that output does not.
func TestWaitAfterPoweroffReportsShutdown(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, filepath.Join(t.TempDir(), "qemu-mcp.lock"))
	i, since := bootTiny(t, ctx, m, "p")
	typeLine(t, ctx, i, "poweroff")
	<-i.Done()
	never := serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 5 * time.Second}
	res, ev, err := i.Wait(ctx, since, never)
	if err != nil || !res.Finished || ev == nil || ev.Event != "SHUTDOWN" {
		t.Errorf("a wait over the power-off begun after the exit: %+v, %+v, %v", res, ev, err)
	}
	w, err := i.Await(ctx, since, never)
	if err != nil || w.Event == nil || w.Exit == nil || w.Exit.Code != 0 || !strings.Contains(string(w.Tail), "Powering off") {
		t.Errorf("await over the power-off: %+v %v", w, err)
	}
	end := res.Cursor
	if res, ev, err = i.Wait(ctx, end, never); err != nil || !res.Finished || ev != nil {
		t.Errorf("a wait past the power-off: %+v, %+v, %v", res, ev, err)
	}
	if _, err := i.Send(ctx, Input{Data: "echo", Ending: "\r", Timeout: time.Second}); !errors.As(err, new(*NotRunningError)) {
		t.Errorf("a send to the exited guest: %v", err)
	}
}
