package instance

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/tap"
)

// State is where an instance is in its life.
type State string

// The states, in the order an instance goes through them. An instance that
// fails to boot goes from Booting to Stopped.
const (
	Booting  State = "booting"
	Running  State = "running"
	Stopping State = "stopping"
	Stopped  State = "stopped"
)

var (
	// ErrStopped is the cause of an instance's context once a stop began:
	// a boot or a wait that it ends fails with it.
	ErrStopped = errors.New("the guest was stopped")
	// ErrExited is returned for a guest that has exited.
	ErrExited = errors.New("the guest has exited")
)

// Spec is what to boot.
type Spec struct {
	// Name is the instance's name (see names.CheckInstance).
	Name string
	// Root is the project root: it names the repository lock.
	Root string
	// QEMU is the command line. For a TAP, leave Network empty and set TAP:
	// the instance names the device and the guest's MAC itself.
	QEMU qemu.Config
	// TAP, if set, makes a TAP device for the guest before QEMU starts.
	TAP *TAPSpec
	// Capture, if set, captures on the TAP from before QEMU starts, so the
	// guest's first frame is in it.
	Capture *CaptureSpec
	// Restart stops a live instance of the same name first.
	Restart bool
	// Profile, Prompt and Panics come from the boot profile: its name, the
	// prompt later sends wait for by default, and panic patterns added to
	// the defaults.
	Profile string
	Prompt  string
	Panics  []*regexp.Regexp
	// Snapshot, if set, starts the guest from a saved state instead of a
	// boot: the project's snapshot of that name saved on the machine of
	// QEMU.
	Snapshot *SnapshotSpec
	// Debug, if set, starts QEMU's gdbstub and gives the instance a
	// debugger. The instance owns Debug.Symbols from Boot on, failed
	// boots included: it is closed with the instance.
	Debug *DebugSpec
	// Record, if set, records the guest's run (package recording); Replay
	// replays a recording instead of booting (it needs Debug: going back
	// and forth is the debugger's).
	Record *RecordSpec
	Replay *ReplaySpec
}

// DebugSpec is a guest's debugger.
type DebugSpec struct {
	// Symbols are the kernel's symbols and lines; nil for addresses only.
	Symbols *debuginfo.File
}

// TAPSpec says how to make the guest's TAP: a host address, or a bridge to
// join; or names a persistent TAP that exists already.
type TAPSpec struct {
	CIDR   string
	Bridge string
	// Name, if set, is a persistent TAP someone else made (root, for this
	// user) that the guest uses as it is: the instance neither makes,
	// configures nor deletes it (see tap.Existing).
	Name string
}

// CaptureSpec is a capture started at boot.
type CaptureSpec struct {
	Filter string
}

func (s Spec) check() error {
	if s.Capture != nil && s.TAP == nil {
		return errors.New(`a capture at boot needs a TAP (network: "tap")`)
	}
	if s.TAP != nil && s.QEMU.Network != "" && s.QEMU.Network != "tap" {
		return fmt.Errorf("network %q and a TAP: choose one", s.QEMU.Network)
	}
	switch {
	case s.Record != nil && s.Replay != nil:
		return errors.New("record and replay: a guest does one or the other")
	case s.Record != nil:
		return s.checkRecordable(fmt.Sprintf("recording %q", s.Record.Name))
	case s.Replay != nil:
		if s.Debug == nil {
			return errors.New("a replay needs its debugger: the spec gives no Debug")
		}
		return s.checkRecordable(fmt.Sprintf("replay of %q", s.Replay.Name))
	}
	return nil
}

// Instance is one named guest of a server.
type Instance struct {
	name    string
	mgr     *Manager
	net     *Network
	vm      *vm
	spec    Spec
	boot    int // boot number of this name in this server
	created time.Time

	// ctx ends when a stop begins (or the server closes): a boot or wait
	// in progress ends with it at once.
	ctx    context.Context
	cancel context.CancelCauseFunc
	booted chan struct{} // closed when the boot returned, done or not
	done   chan struct{} // closed when every cleanup has run

	teardownOnce sync.Once
	undo         undoStack

	mu          sync.Mutex // guards the fields below
	state       State
	transcript  string
	lockPath    string
	ending      *qemu.Ending
	cleanupErr  error
	stoppedAt   time.Time
	keptRemoved []kept.File
	debugger    *debugger.Session
	// console outlives each QEMU of the instance (a restore starts a new
	// one).
	console   *serial.Console
	restoreMu sync.Mutex // one save or restore at a time

	// consoleSem (capacity 1) is held by the call typing on the console;
	// consoleUse (under mu) says which, since when.
	consoleSem chan struct{}
	consoleUse consoleUse
	execSeq    int // the last guest_exec's sequence number (under mu)
	events     eventLog
	// tt is the recording of a guest that records, or the replay of one
	// that replays (replay.go).
	tt travel
	// exitNoted is closed once the watcher has recorded how QEMU ended.
	exitNoted chan struct{}
}

// cleanup is the undo of one step, under the step's name.
type cleanup struct {
	what string
	do   func() error
}

// undoStack is what undoes a guest's steps, newest last.
type undoStack struct {
	mu    sync.Mutex
	items []cleanup
}

func (u *undoStack) push(what string, do func() error) {
	u.mu.Lock()
	u.items = append(u.items, cleanup{what, do})
	u.mu.Unlock()
}

// take empties the stack and returns what it held.
func (u *undoStack) take() []cleanup {
	u.mu.Lock()
	defer u.mu.Unlock()
	cl := u.items
	u.items = nil
	return cl
}

// len is how many undos the stack holds.
func (u *undoStack) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.items)
}

func newInstance(m *Manager, spec Spec, boot int) *Instance {
	ctx, cancel := context.WithCancelCause(context.Background())
	i := &Instance{
		name: spec.Name, mgr: m, spec: spec, boot: boot, created: time.Now(),
		ctx: ctx, cancel: cancel, booted: make(chan struct{}), done: make(chan struct{}),
		state: Booting, consoleSem: make(chan struct{}, 1), exitNoted: make(chan struct{}),
	}
	i.net = &Network{i: i}
	i.vm = &vm{i: i}
	return i
}

// Network is the guest's TAP and capture.
func (i *Instance) Network() *Network { return i.net }

// TAP is the guest's TAP device while it has one.
func (i *Instance) TAP() *tap.Device { return i.net.TAP() }

// push adds the undo of a step that just succeeded.
func (i *Instance) push(what string, do func() error) { i.undo.push(what, do) }

// hold keeps a part the boot made (set stores it, under i.mu) and pushes
// what releases it.
func (i *Instance) hold(what string, set func(), release func() error) {
	i.mu.Lock()
	set()
	i.mu.Unlock()
	i.push(what, release)
}

// detachDebugger detaches the debugger from the stub, if there is one.
func (i *Instance) detachDebugger() error {
	if d := i.Debugger(); d != nil {
		return d.Close()
	}
	return nil
}

// Debugger is the instance's debugger, nil when it was booted without one.
func (i *Instance) Debugger() *debugger.Session {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.debugger
}

// triageTimeout bounds a crash triage: a few hundred stub round trips.
const triageTimeout = 5 * time.Second

// triage is the debugger d's view of the panic the guest is in (see
// debugger.Session.Triage), within a few seconds; nil without a debugger.
func triage(ctx context.Context, d *debugger.Session) (*debugger.Triage, error) {
	if d == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, triageTimeout)
	defer cancel()
	t, err := d.Triage(ctx)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// debugStop is where and why the debugger d holds the guest stopped, if it
// does.
func debugStop(ctx context.Context, d *debugger.Session) (debugger.StopInfo, bool) {
	if d == nil {
		return debugger.StopInfo{}, false
	}
	return d.Holding(ctx)
}

// teardown runs the cleanup stack, newest first, exactly once; later
// callers wait until it has run. end says how QEMU stopped, if it ran.
func (i *Instance) teardown(end *qemu.Ending) {
	i.teardownOnce.Do(func() {
		i.mu.Lock()
		if i.state != Stopping {
			i.state = Stopping
		}
		cl := i.undo.take()
		if i.ending == nil {
			i.ending = end
		}
		i.mu.Unlock()
		var errs []error
		for k := len(cl) - 1; k >= 0; k-- {
			if err := cl[k].do(); err != nil {
				i.mgr.log.Warn("cleanup", "instance", i.name, "step", cl[k].what, "err", err)
				errs = append(errs, fmt.Errorf("%s: %w", cl[k].what, err))
			}
		}
		i.mu.Lock()
		i.state = Stopped
		i.stoppedAt = time.Now()
		i.cleanupErr = errors.Join(errs...)
		i.mu.Unlock()
		close(i.done)
	})
}

// Stop stops the instance: it ends a boot or wait in progress at once, asks
// QEMU to stop (method, within wait, then SIGTERM and SIGKILL of the exact
// process), and undoes every step of the boot. Stopping a stopped instance
// reports how it ended. Concurrent stops wait for the first.
func (i *Instance) Stop(ctx context.Context, method qemu.Method, wait time.Duration) (qemu.Ending, error) {
	i.mu.Lock()
	first := i.state == Booting || i.state == Running
	if first {
		i.state = Stopping
	}
	i.mu.Unlock()
	if !first {
		select {
		case <-i.done:
			return i.result()
		case <-ctx.Done():
			return qemu.Ending{}, fmt.Errorf("stop %q: %w", i.name, ctx.Err())
		}
	}
	i.cancel(ErrStopped)
	select {
	case <-i.booted:
	case <-ctx.Done():
		return qemu.Ending{}, fmt.Errorf("stop %q while it booted: %w", i.name, ctx.Err())
	}
	mch := i.Process()
	end := qemu.Ending{How: "stopped-while-booting"}
	var err error
	if i.State() == Stopped {
		// The boot unwound itself (it kills a QEMU that had started).
		if mch != nil {
			end.Exit, _ = mch.Exited()
		}
	} else if mch != nil {
		// A guest the debugger holds stopped could not shut down by
		// itself: detaching lets it run.
		if derr := i.detachDebugger(); derr != nil {
			i.mgr.log.Debug("detach debugger before stop", "instance", i.name, "err", derr)
		}
		// A recording ends where the stop finds it, and its replay stops
		// there.
		if r := i.tt.recorder(); r != nil {
			r.Pause(ctx, mch)
		}
		end, err = mch.Shutdown(ctx, method, wait)
	}
	i.mu.Lock()
	if i.ending == nil || i.ending.How == "exited" || i.ending.How == "" {
		// A shutdown's own account says more than the watcher's.
		e := end
		i.ending = &e
	}
	i.mu.Unlock()
	i.teardown(nil)
	got, cerr := i.result()
	return got, errors.Join(err, cerr)
}

func (i *Instance) result() (qemu.Ending, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var e qemu.Ending
	if i.ending != nil {
		e = *i.ending
	}
	return e, i.cleanupErr
}

// Name is the instance's name.
func (i *Instance) Name() string { return i.name }

// Spec is what the instance was booted with.
func (i *Instance) Spec() Spec { return i.spec }

// Boot is the instance's boot number in this server (1 for its first).
func (i *Instance) Boot() int { return i.boot }

// State is where the instance is in its life.
func (i *Instance) State() State {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.state
}

// Process is the guest's QEMU process, nil until it started.
func (i *Instance) Process() *qemu.Process { return i.vm.current() }

// Running returns the machine if the instance runs, or an error that says
// what to do.
func (i *Instance) Running() (*qemu.Process, error) {
	st, mch := i.State(), i.vm.current()
	// How QEMU ended says more than the cleanup that is still running.
	if mch != nil {
		if exit, ok := mch.Exited(); ok {
			return nil, &NotRunningError{Name: i.name, State: st, Exit: exit.String()}
		}
	}
	if st != Running || mch == nil {
		return nil, &NotRunningError{Name: i.name, State: st, NoStart: mch == nil}
	}
	return mch, nil
}

// busyError says the guest is there already, and since when its QEMU runs.
func busyError(i *Instance) error {
	st, mch := i.State(), i.vm.current()
	e := &BusyError{Name: i.name, State: st}
	if mch != nil {
		e.PID, e.Up = mch.PID(), time.Since(mch.Started())
	}
	return e
}

// Console is the serial console, nil until QEMU started.
func (i *Instance) Console() *serial.Console {
	if mch := i.Process(); mch != nil {
		return mch.Console()
	}
	return nil
}

// Transcript is the file holding the complete console output of this boot.
func (i *Instance) Transcript() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.transcript
}

// LockPath is the repository lock held for the instance.
func (i *Instance) LockPath() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.lockPath
}

// Done is closed once the instance is stopped and every cleanup has run.
func (i *Instance) Done() <-chan struct{} { return i.done }

// Wait runs a console wait from since. It ends at once, with an error
// wrapping ErrStopped, when the instance is stopped meanwhile, and early
// (res.Stopped) when the guest resets, shuts down or panics: ev is that
// QMP event.
func (i *Instance) Wait(ctx context.Context, since int64, spec serial.Spec) (res serial.Result, ev *Event, err error) {
	// QEMU stamps events with the host's clock to the microsecond: an
	// event of this wait is one sent after it began.
	return i.waitSince(ctx, since, spec, time.Now().Truncate(time.Microsecond), false)
}

// waitSince is Wait for a caller that began at began, before the wait
// itself (a command typed, then waited for): an event sent since then ends
// the wait at once, though it came before the wait began. With
// untilDebugStop, the guest stopping under the debugger ends it too: a
// stopped guest prints nothing more.
func (i *Instance) waitSince(ctx context.Context, since int64, spec serial.Spec, began time.Time, untilDebugStop bool) (res serial.Result, ev *Event, err error) {
	con := i.Console()
	if con == nil {
		return serial.Result{}, nil, fmt.Errorf("guest %q has no console yet", i.name)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(i.ctx, func() { cancel(context.Cause(i.ctx)) })
	defer stop()
	if spec.Stop == nil {
		spec.Stop = i.events.waker()
		if i.events.since(began) != nil {
			spec.Stop = closedChan
		}
		if untilDebugStop {
			spec.Stop = i.orDebugStop(ctx, spec.Stop)
		}
	}
	res, err = con.Buffer().WaitFor(ctx, since, spec)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrStopped) {
			return res, nil, &StoppedError{Name: i.name}
		}
		return res, nil, err
	}
	if !res.Matched && errors.Is(context.Cause(i.ctx), ErrStopped) {
		// A stop began: the event that ended the wait (QEMU 9 and later
		// announce its quit, host-qmp-quit) is the stop's, and may have
		// come before the stop's cancellation reached ctx.
		return res, nil, &StoppedError{Name: i.name}
	}
	if !res.Matched && res.Finished {
		// The buffer is finished just before the machine's Done closes.
		// What ended QEMU is the last event it sent, which may still be
		// on its way, or the one the watcher records for an exit without
		// one.
		mch := i.Process()
		<-mch.Done()
		ev = i.events.exitEvent(mch, since, began, i.exitNoted)
	} else if !res.Matched {
		ev = i.events.since(began)
	}
	if !res.Matched {
		if res.Finished || ev != nil && ev.Event == "SHUTDOWN" {
			// QEMU 9 and later announce the guest's power-off before
			// QEMU exits (unless told -no-shutdown): report the exit
			// with it, as when QEMU exits without a word. Either way the
			// end is reported once the instance is torn down, so that a
			// caller told "exited" finds its files gone.
			awaitExit(i.Process(), i.done, 2*time.Second)
		}
		if res.Stopped && ev == nil {
			if untilDebugStop {
				if d := i.Debugger(); d != nil && d.HoldsStopped() {
					return res, nil, nil
				}
				// A debugger call in progress stops the guest for a
				// moment: let it end before looking again.
				time.Sleep(debugSettle)
			}
			// An older event woke the wait: wait on.
			spec.Stop = i.events.waker()
			if untilDebugStop {
				spec.Stop = i.orDebugStop(ctx, spec.Stop)
			}
			if spec.Timeout > 0 {
				spec.Timeout = max(spec.Timeout-time.Since(began), time.Millisecond)
			}
			return i.waitSince(ctx, since, spec, began, untilDebugStop)
		}
	}
	return res, ev, nil
}

// debugSettle is how long a wait lets a debugger call that stopped the
// guest end before it waits on.
const debugSettle = 25 * time.Millisecond

// orDebugStop is a channel closed when stop is, or when the guest stops
// under its debugger (debugger.Session.Stops), until ctx ends.
func (i *Instance) orDebugStop(ctx context.Context, stop <-chan struct{}) <-chan struct{} {
	d := i.Debugger()
	if d == nil {
		return stop
	}
	stops := d.Stops(ctx)
	if stops == nil {
		return stop
	}
	ch := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-stops:
		case <-ctx.Done():
			return
		}
		close(ch)
	}()
	return ch
}

// closedChan is a Stop that has fired.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// awaitExit waits at most d for QEMU to exit and the instance's cleanup
// to finish, so that what the caller reports next (exited, the runtime
// files gone) is what the user then finds.
func awaitExit(mch *qemu.Process, done <-chan struct{}, d time.Duration) {
	if mch == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-mch.Done():
	case <-t.C:
		return
	}
	select {
	case <-done:
	case <-t.C:
	}
}

// Context ends when a stop of the instance begins.
func (i *Instance) Context() context.Context { return i.ctx }

// Info is a snapshot of an instance for listings.
type Info struct {
	Name        string
	State       State
	PID         int
	Started     time.Time
	Uptime      time.Duration
	Kernel      string
	TAP         string
	Capture     string
	SerialBytes int64
	Exit        *qemu.Exit
}

// Info takes a snapshot of the instance.
func (i *Instance) Info() Info {
	i.mu.Lock()
	in := Info{Name: i.name, State: i.state, Kernel: i.spec.QEMU.Kernel}
	stoppedAt := i.stoppedAt
	i.mu.Unlock()
	mch := i.vm.current()
	i.net.mu.Lock()
	dev, c := i.net.dev, i.net.capture
	i.net.mu.Unlock()
	if dev != nil {
		in.TAP = dev.Name
	}
	if c != nil {
		in.Capture = c.Path()
	}
	if mch == nil {
		return in
	}
	in.PID, in.Started = mch.PID(), mch.Started()
	in.SerialBytes = mch.Console().Buffer().End()
	if exit, ok := mch.Exited(); ok {
		in.Exit = &exit
		in.Uptime = exit.At.Sub(in.Started)
	} else if !stoppedAt.IsZero() {
		in.Uptime = stoppedAt.Sub(in.Started)
	} else {
		in.Uptime = time.Since(in.Started)
	}
	return in
}
