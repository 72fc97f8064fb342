package instance

import (
	"context"
	"log/slog"
	"sync"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// Event is a QMP event that says what happened to the guest.
type Event struct {
	Event string `json:"event"`
	// Time is when QEMU sent it.
	Time time.Time `json:"time"`
	// Data is the event's data (reason, guest, device, action ...).
	Data map[string]any `json:"data,omitempty"`
	// Cursor is the console's end when the event arrived: output before
	// it was printed before the event.
	Cursor int64 `json:"cursor"`
}

// Reason is the event's "reason", if it has one.
func (e Event) Reason() string {
	r, _ := e.Data["reason"].(string)
	return r
}

// guestEvents are the events kept for qemu_status: what happened to the
// guest, not the server's own traffic (jobs, device plumbing).
var guestEvents = map[string]bool{
	"RESET": true, "SHUTDOWN": true, "POWERDOWN": true, "STOP": true, "RESUME": true,
	"SUSPEND": true, "SUSPEND_DISK": true, "WAKEUP": true,
	"BLOCK_IO_ERROR": true, "GUEST_PANICKED": true, "GUEST_CRASHLOADED": true, "WATCHDOG": true,
}

// interrupts are the events that end a console wait: the guest is gone or
// starts over, so what it waited for will not come.
var interrupts = map[string]bool{"RESET": true, "SHUTDOWN": true, "GUEST_PANICKED": true}

// maxEvents bounds the events an instance keeps.
const maxEvents = 64

// eventLog is an instance's recent guest events, across the QEMUs it runs
// (a restore starts another).
type eventLog struct {
	mu     sync.Mutex
	events []Event
	total  int
	// wake is closed, and replaced, when an interrupting event arrives.
	wake chan struct{}
	// reader is the QEMU whose events are being recorded, and read is
	// closed once all it sent is (see follow).
	reader *qemu.Process
	read   <-chan struct{}
}

// interrupting reports whether e ends a console wait.
func interrupting(e Event) bool {
	return interrupts[e.Event] && e.Reason() != "snapshot-load"
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) == maxEvents {
		copy(l.events, l.events[1:])
		l.events = l.events[:maxEvents-1]
	}
	l.events = append(l.events, e)
	l.total++
	if interrupting(e) && l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// waker is a channel closed by the next interrupting event.
func (l *eventLog) waker() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wake == nil {
		l.wake = make(chan struct{})
	}
	return l.wake
}

// since returns the first interrupting event sent at or after t.
func (l *eventLog) since(t time.Time) *Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.events {
		e := l.events[k]
		if interrupting(e) && !e.Time.Before(t) {
			return &e
		}
	}
	return nil
}

// ending returns the last interrupting event sent at or after t: of a
// QEMU that exited, what ended it.
func (l *eventLog) ending(t time.Time) *Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := len(l.events) - 1; k >= 0; k-- {
		if e := l.events[k]; interrupting(e) && !e.Time.Before(t) {
			return &e
		}
	}
	return nil
}

// reading records that follow records mch's events until read closes.
func (l *eventLog) reading(mch *qemu.Process, read <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reader, l.read = mch, read
}

// readDone is closed once every event mch sent is recorded; at once for
// a QEMU whose events are not followed (any more).
func (l *eventLog) readDone(mch *qemu.Process) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reader == mch && l.read != nil {
		return l.read
	}
	done := make(chan struct{})
	close(done)
	return done
}

// exitWait bounds how long a wait that saw QEMU exit waits for the last
// events QEMU sent: they are read from its socket after the exit, and a
// busy host may take a while to.
const exitWait = 5 * time.Second

// exitEvent is the event that ended mch, once it exited, for a wait from
// since begun at began that saw the exit: one that was waiting when QEMU
// exited, or that reads output from before the end. Such a wait may have
// begun only after QEMU sent the event (a guest powering off at once),
// and the event is recorded with the console's end when it came, which
// can be before the last output is. A wait that began after the exit
// and reads nothing saw none of it.
//
// It waits, at most exitWait, until the events mch sent before it exited
// are recorded, and if none is the one, until the watcher has recorded
// how it ended (a SHUTDOWN of its own for an exit without one).
func (l *eventLog) exitEvent(mch *qemu.Process, since int64, began time.Time, noted <-chan struct{}) *Event {
	after := began
	if exit, _ := mch.Exited(); began.Before(exit.At) || since < mch.Console().Buffer().End() {
		after = mch.Started()
	}
	t := time.NewTimer(exitWait)
	defer t.Stop()
	select {
	case <-l.readDone(mch):
	case <-t.C:
	}
	if ev := l.ending(after); ev != nil {
		return ev
	}
	select {
	case <-noted:
	case <-t.C:
	}
	return l.ending(after)
}

// Events returns the guest's most recent events (at most n, oldest first)
// and how many there were in all.
func (i *Instance) Events(n int) ([]Event, int) { return i.events.recent(n) }

// recent is the most recent events (at most n, oldest first) and how many
// there were in all.
func (l *eventLog) recent(n int) ([]Event, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events
	if len(ev) > n {
		ev = ev[len(ev)-n:]
	}
	return append([]Event(nil), ev...), l.total
}

// follow records mch's guest events until its monitor closes; the channel
// it returns is closed then. Events QEMU sent before the subscription are
// replayed by the monitor.
func (l *eventLog) follow(mch *qemu.Process, log *slog.Logger) <-chan struct{} {
	done := make(chan struct{})
	ch, err := mch.Monitor().Events(context.Background())
	if err != nil {
		log.Debug("follow QMP events", "err", err)
		close(done)
		return done
	}
	l.reading(mch, done)
	go func() {
		defer close(done)
		for ev := range ch {
			if !guestEvents[ev.Event] {
				continue
			}
			l.record(mch.Console(), Event{Event: ev.Event, Time: eventTime(ev), Data: ev.Data})
		}
	}()
	return done
}

// eventSync bounds how long recording an event waits for the console to
// take in the output before it.
const eventSync = time.Second

// record adds ev once con holds all that QEMU wrote to it before it sent
// ev, and stamps ev with con's end then. QEMU writes the guest's output
// (the power-off message) before it sends the event that follows it
// (SHUTDOWN), but on other channels: the console's reader may not have
// read the output yet when the event arrives. A wait the event ends looks
// at the console a last time, and must find that output there.
func (l *eventLog) record(con *serial.Console, ev Event) {
	ctx, cancel := context.WithTimeout(context.Background(), eventSync)
	// On an error (a reader slower than eventSync) the event is stamped
	// with the end as it is.
	con.Sync(ctx)
	cancel()
	ev.Cursor = con.Buffer().End()
	l.add(ev)
}

// exited records QEMU's own exit (not a stop) as a SHUTDOWN event when
// QEMU sent none: up to QEMU 8.x the virt board's test finisher, which
// Linux powers off through, exits the process at once, without one.
func (l *eventLog) exited(mch *qemu.Process, followed <-chan struct{}) {
	t := time.NewTimer(time.Second)
	select {
	case <-followed:
	case <-t.C:
	}
	t.Stop()
	exit, _ := mch.Exited()
	l.mu.Lock()
	for k := len(l.events) - 1; k >= 0; k-- {
		if l.events[k].Event == "SHUTDOWN" && !l.events[k].Time.Before(mch.Started()) {
			l.mu.Unlock()
			return
		}
	}
	l.mu.Unlock()
	reason := "guest-shutdown"
	switch {
	case exit.Signal != "":
		reason = "qemu-killed"
	case exit.Code != 0:
		reason = "guest-exit-failure"
	}
	l.add(Event{Event: "SHUTDOWN", Time: exit.At, Cursor: mch.Console().Buffer().End(), Data: map[string]any{
		"reason": reason, "exit_status": exit.Code,
		"note": "recorded by qemu-mcp: QEMU " + exit.String() + " without a SHUTDOWN event",
	}})
}

func eventTime(ev goqmp.Event) time.Time {
	if ev.Timestamp.Seconds == 0 {
		return time.Now()
	}
	return time.Unix(ev.Timestamp.Seconds, ev.Timestamp.Microseconds*1000)
}
