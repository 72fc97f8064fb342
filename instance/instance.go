package instance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/cpus"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
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

	mu          sync.Mutex // guards the fields below
	state       State
	machine     *qemu.Machine
	dev         *tap.Device
	capture     *pcap.Capture
	viaQEMU     bool // capture is fed by QEMU (see capture.go)
	lastCapture *pcap.Stats
	transcript  string
	lockPath    string
	cleanups    []cleanup
	ending      *qemu.Ending
	cleanupErr  error
	stoppedAt   time.Time
	keptRemoved []kept.File
	debugger    *debugger.Session
	// console outlives each QEMU of the instance (a restore starts a new
	// one); files are the host files' descriptors kept for that restart,
	// cfg the configuration QEMU was started with (TAP names filled in).
	console *serial.Console
	files   map[string]*os.File
	cfg     qemu.Config
	// replacing is set while a restore swaps QEMU: the exit of the old
	// one is not the guest's end.
	replacing bool
	// guarded counts the debugger's guards on a replay's QEMU (see
	// replayer.Guard): its exit meanwhile is not the guest's end.
	guarded   int
	restoreMu sync.Mutex // one save or restore at a time

	// consoleSem (capacity 1) is held by the call typing on the console;
	// consoleUse (under mu) says which, since when.
	consoleSem chan struct{}
	consoleUse consoleUse
	execSeq    int // the last guest_exec's sequence number (under mu)
	events     eventLog
	// rec is the recording of a guest that records, rep the replay of
	// one that replays (see record.go, replay.go).
	rec *recorder
	rep *replayer
	// exitNoted is closed once the watcher has recorded how QEMU ended.
	exitNoted chan struct{}
}

// KeptRemoved lists the kept files this boot removed to stay under the cap.
func (i *Instance) KeptRemoved() []kept.File {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.keptRemoved
}

type cleanup struct {
	what string
	do   func() error
}

func newInstance(m *Manager, spec Spec, boot int) *Instance {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Instance{
		name: spec.Name, mgr: m, spec: spec, boot: boot, created: time.Now(),
		ctx: ctx, cancel: cancel, booted: make(chan struct{}), done: make(chan struct{}),
		state: Booting, consoleSem: make(chan struct{}, 1), exitNoted: make(chan struct{}),
	}
}

// push adds the undo of a step that just succeeded.
func (i *Instance) push(what string, do func() error) {
	i.mu.Lock()
	i.cleanups = append(i.cleanups, cleanup{what, do})
	i.mu.Unlock()
}

// run performs the boot's steps: reap, lock, drives, TAP, capture, QEMU,
// record. Any failure, an end of ctx, or a stop unwinds what was done.
func (i *Instance) run(ctx context.Context) (rep *reaper.Report, err error) {
	defer close(i.booted)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(i.ctx, func() { cancel(context.Cause(i.ctx)) })
	defer stop()
	defer func() {
		if err == nil {
			return
		}
		if cause := context.Cause(i.ctx); cause != nil {
			err = fmt.Errorf("boot of %q: %w while it started (%v)", i.name, cause, err)
		}
		i.teardown(nil)
	}()

	m := i.mgr
	if d := i.spec.Debug; d != nil && d.Symbols != nil {
		// Closed by the debugger once it exists, else here.
		i.push("symbols", func() error {
			if i.Debugger() != nil {
				return nil
			}
			return d.Symbols.Close()
		})
	}
	t0 := time.Now()
	rep = m.reap()
	tReap := time.Since(t0)

	path, release, err := m.acquireLock(i.spec.Root, i.name)
	if err != nil {
		return rep, err
	}
	i.mu.Lock()
	i.lockPath = path
	i.mu.Unlock()
	i.push("repository lock", release)
	m.recordInstance(i.name, func(r *registry.Instance) { r.Lock = path })
	i.push("lock in record", func() error {
		m.recordInstance(i.name, func(r *registry.Instance) { r.Lock = "" })
		return nil
	})

	releaseDrives, err := m.claimDrives(i.name, i.spec.QEMU.Drives)
	if err != nil {
		return rep, err
	}
	i.push("drive claims", releaseDrives)

	cfg := i.spec.QEMU
	if t := i.spec.TAP; t != nil {
		if err := i.makeTAP(*t); err != nil {
			return rep, err
		}
		cfg.Network, cfg.TAPName, cfg.MAC = "tap", i.dev.Name, i.dev.GuestMAC.String()
		// A capture through QEMU (see capture.go) needs plain frames.
		cfg.TAPPlainFrames = !inProcess()
	}
	// A capture in this process starts before QEMU, so the guest's first
	// frame is in it; one through QEMU starts before the guest runs.
	var captureAtStart func(ctx context.Context, mch *qemu.Machine) error
	if c := i.spec.Capture; c != nil {
		if inProcess() {
			if _, err := i.StartCapture(nil, c.Filter, 0); err != nil {
				return rep, fmt.Errorf("capture at boot: %w", err)
			}
		} else {
			captureAtStart = func(ctx context.Context, mch *qemu.Machine) error {
				cp, err := i.startQEMUCapture(ctx, mch, nil, c.Filter, 0)
				if err != nil {
					return fmt.Errorf("capture at boot: %w", err)
				}
				i.mu.Lock()
				i.capture, i.viaQEMU = cp, true
				i.mu.Unlock()
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return rep, context.Cause(ctx)
	}
	tPrep := time.Since(t0)

	dir := m.cfg.RuntimeDir
	// Every attempt gets its own transcript: a failed start keeps what
	// QEMU printed, and the next attempt must not collide with it. It
	// outlives the server, kept with the captures.
	transcript := filepath.Join(m.cfg.Captures, names.Transcript(m.owner, i.name, i.boot))
	removed := m.enforceCap() // before this boot adds to what is kept
	i.mu.Lock()
	i.transcript = transcript
	i.keptRemoved = removed
	i.mu.Unlock()
	// The console is the instance's, not one QEMU's: a restore starts a
	// new QEMU on it, and output and cursors go on.
	opts := []serial.Option{serial.WithLogger(m.log.With("instance", i.name)), serial.WithTranscript(transcript)}
	if m.cfg.RingSize > 0 {
		opts = append(opts, serial.WithRingSize(m.cfg.RingSize))
	}
	con, err := serial.Create(filepath.Join(dir, names.SerialBase(m.owner, i.name)), opts...)
	if err != nil {
		return rep, fmt.Errorf("boot: %w", err)
	}
	i.mu.Lock()
	i.console = con
	i.mu.Unlock()
	i.push("console", con.Close)
	if i.spec.Record != nil {
		if err := i.beginRecording(ctx, &cfg); err != nil {
			return rep, err
		}
	}
	// Start closes the descriptors it is given; a restore needs them
	// again, so the instance keeps copies.
	files, err := dupFiles(cfg.Files)
	if err != nil {
		return rep, fmt.Errorf("boot: %w", err)
	}
	i.files, i.cfg = files, cfg
	i.cfg.Files = nil
	i.push("host files", func() error { return qemu.CloseFiles(files) })

	// A start from a snapshot needs the stub too (see resumeTimer).
	rt := i.runtime(i.spec.Debug != nil || i.spec.Snapshot != nil)
	var staged string
	if snap := i.spec.Snapshot; snap != nil {
		if err := snapshot.Verify(snap.meta); err != nil {
			return rep, err
		}
		if staged, err = i.stage(m.Snapshots(), snap.meta); err != nil {
			return rep, err
		}
		// The copy is removed once the guest runs (unstage); a boot
		// that fails before removes it here.
		i.push("staged snapshot", func() error {
			if err := os.Remove(staged); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		})
		cfg.LoadVM = &qemu.LoadVM{Path: staged}
		rt.BeforeCont = loadSnapshot(snap.meta, func() {
			i.mark(fmt.Sprintf("booted from snapshot %q (saved %s)", snap.meta.Name, snap.meta.Created.Format(time.RFC3339)))
		})
	}
	rt.BeforeCont = thenCall(rt.BeforeCont, captureAtStart)
	if i.spec.Replay != nil {
		if err := i.prepareReplay(ctx, &cfg, &rt); err != nil {
			return rep, err
		}
		i.cfg.RR, i.cfg.ConsoleFile = cfg.RR, cfg.ConsoleFile
	}
	mch, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return rep, fmt.Errorf("boot: %w", err)
	}
	// The guest's harts get host CPUs; the server's goroutines the rest.
	harts := max(1, cfg.SMP)
	cpus.Add(harts)
	i.push("qemu", func() error {
		defer cpus.Add(-harts)
		if mch := i.Machine(); mch != nil {
			return mch.Close()
		}
		return nil
	})
	i.mu.Lock()
	i.machine = mch
	i.mu.Unlock()
	if i.spec.Record != nil {
		if err := i.commitRecording(ctx, mch); err != nil {
			return rep, err
		}
	}
	if i.spec.Replay != nil {
		if err := i.startReplay(); err != nil {
			return rep, err
		}
	}
	followed := i.follow(mch)
	if i.spec.Debug != nil {
		i.startDebugger()
	}
	i.recordQEMU(mch)
	i.push("qemu in record", func() error {
		m.recordInstance(i.name, func(r *registry.Instance) { r.QEMU = nil })
		return nil
	})
	if snap := i.spec.Snapshot; snap != nil {
		i.unstage(ctx, mch, staged)
	}

	i.mu.Lock()
	stopping := i.state != Booting
	if !stopping {
		i.state = Running
	}
	i.mu.Unlock()
	if stopping {
		// A stop came in as QEMU started: it waits for this boot and
		// then stops the machine itself.
		return rep, ErrStopped
	}
	go i.watch(mch, followed)
	m.probeQEMU(mch.Argv()[0])
	m.log.Debug("booted", "instance", i.name, "reap", tReap, "lock+drives+tap+capture", tPrep-tReap, "qemu", time.Since(t0)-tPrep)
	return rep, nil
}

func (i *Instance) makeTAP(t TAPSpec) error {
	m := i.mgr
	var dev *tap.Device
	var err error
	if t.Name != "" {
		if dev, err = tap.Existing(t.Name, false); err != nil {
			return fmt.Errorf("network tap %s: %w", t.Name, err)
		}
		dev.GuestMAC = names.GuestMAC(m.owner, i.name)
		if !dev.Up {
			m.log.Warn("the guest's TAP is down on the host: frames will not flow until root brings it up", "instance", i.name, "tap", t.Name)
		}
		// Not in the record: it is not ours, and no reaper may delete it.
	} else {
		dev, err = tap.Create(tap.Options{
			Name: names.TAP(m.owner, i.name), GuestMAC: names.GuestMAC(m.owner, i.name),
			CIDR: t.CIDR, Bridge: t.Bridge, UID: os.Getuid(), GID: os.Getgid(),
			// A name is unique to this process and instance, so a link of
			// that name can only be a TAP this instance left at an
			// earlier boot.
			Replace: true,
		})
		if err != nil {
			return fmt.Errorf("network tap: %w", err)
		}
		// Recorded right after it exists, so that if we are killed the
		// next server's reaper deletes it.
		m.recordInstance(i.name, func(r *registry.Instance) { r.TAP = dev.Name })
	}
	i.mu.Lock()
	i.dev = dev
	i.mu.Unlock()
	i.push("tap", func() error {
		// The capture ends with its interface: stop it first, and keep
		// its counts for status.
		i.StopCapture()
		i.mu.Lock()
		i.dev = nil
		i.mu.Unlock()
		if dev.External {
			return nil // someone else's, as it was
		}
		err := dev.Close()
		m.recordInstance(i.name, func(r *registry.Instance) { r.TAP = "" })
		return err
	})
	return nil
}

// startDebugger gives the instance its debugger; it connects to the stub
// of whichever QEMU runs the guest on first use. It is closed (detaching,
// which lets a stopped guest run) before QEMU is stopped.
func (i *Instance) startDebugger() {
	log := i.mgr.log.With("instance", i.name)
	d := debugger.New(debugger.Config{
		Dial: func(ctx context.Context) (*gdb.Client, error) {
			mch, err := i.Running()
			if err != nil {
				return nil, err
			}
			return gdb.Dial(ctx, "unix", mch.Paths().GDBSocket, gdb.WithLogger(log))
		},
		Running: func(ctx context.Context) (bool, error) {
			mch, err := i.Running()
			if err != nil {
				return false, err
			}
			return mch.Monitor().Running(ctx)
		},
		Symbols:  i.spec.Debug.Symbols,
		Timeline: i.debugTimeline(),
		Logger:   log,
	})
	i.mu.Lock()
	i.debugger = d
	i.mu.Unlock()
	i.push("debugger", i.closeDebugger)
}

// closeDebugger detaches from the stub, once.
func (i *Instance) closeDebugger() error {
	i.mu.Lock()
	d := i.debugger
	i.mu.Unlock()
	if d == nil {
		return nil
	}
	return d.Close()
}

// Debugger is the instance's debugger, nil when it was booted without one.
func (i *Instance) Debugger() *debugger.Session {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.debugger
}

// triageTimeout bounds a crash triage: a few hundred stub round trips.
const triageTimeout = 5 * time.Second

// Triage is the debugger's view of the panic the guest is in (see
// debugger.Session.Triage), within a few seconds; nil without a debugger.
func (i *Instance) Triage(ctx context.Context) (*debugger.Triage, error) {
	d := i.Debugger()
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

// DebugStop is where and why the debugger holds the guest stopped, if it
// does.
func (i *Instance) DebugStop(ctx context.Context) (debugger.StopInfo, bool) {
	d := i.Debugger()
	if d == nil {
		return debugger.StopInfo{}, false
	}
	return d.Holding(ctx)
}

// watch undoes everything when QEMU stops by itself (guest poweroff), not
// only when it is stopped.
func (i *Instance) watch(mch *qemu.Machine, followed <-chan struct{}) {
	<-mch.Done()
	i.mu.Lock()
	replaced := i.replacing || i.guarded > 0 || i.machine != mch
	con := i.console
	byItself := i.state == Running
	i.mu.Unlock()
	if replaced {
		return // a restore stopped it and runs the next QEMU
	}
	// What the guest printed last is still in the pipe: keep it, then
	// wake the waiters with the end.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	con.Finish(ctx)
	cancel()
	if byItself {
		// The waits the end woke report the event (see Wait).
		i.exited(mch, followed)
	}
	close(i.exitNoted)
	exit, _ := mch.Exited()
	i.teardown(&qemu.Ending{How: "exited", Exit: exit})
}

// runtime is where every QEMU of the instance keeps its sockets, on the
// instance's console.
func (i *Instance) runtime(withGDB bool) qemu.Runtime {
	m, dir := i.mgr, i.mgr.cfg.RuntimeDir
	rt := qemu.Runtime{
		QMPSocket: filepath.Join(dir, names.Name(names.QMPSocket, m.owner, i.name)),
		Logger:    m.log.With("instance", i.name),
		Console:   i.console,
	}
	if i.spec.QEMU.VNC {
		rt.VNCSocket = filepath.Join(dir, names.Name(names.VNCSocket, m.owner, i.name))
	}
	if withGDB {
		rt.GDBSocket = filepath.Join(dir, names.Name(names.GDBSocket, m.owner, i.name))
		rt.GDBTCP = m.cfg.GDBTCP
	}
	return rt
}

// recordQEMU names the instance's QEMU in the server's record.
func (i *Instance) recordQEMU(mch *qemu.Machine) {
	id := mch.Identity()
	child, err := registry.NewChild(id.PID)
	if err != nil || child.StartTime != id.StartTime {
		// QEMU already exited; the record must still not name a stranger.
		child = registry.Child{PID: id.PID, StartTime: id.StartTime, Executable: mch.Argv()[0]}
	}
	i.mgr.recordInstance(i.name, func(r *registry.Instance) { r.QEMU = &child })
}

// teardown runs the cleanup stack, newest first, exactly once; later
// callers wait until it has run. end says how QEMU stopped, if it ran.
func (i *Instance) teardown(end *qemu.Ending) {
	i.teardownOnce.Do(func() {
		i.mu.Lock()
		if i.state != Stopping {
			i.state = Stopping
		}
		cl := i.cleanups
		i.cleanups = nil
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
	mch := i.Machine()
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
		if derr := i.closeDebugger(); derr != nil {
			i.mgr.log.Debug("detach debugger before stop", "instance", i.name, "err", derr)
		}
		// A recording ends where the stop finds it, and its replay stops
		// there.
		i.pauseRecording(ctx, mch)
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

// Machine is the QEMU process, nil until it started.
func (i *Instance) Machine() *qemu.Machine {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.machine
}

// Running returns the machine if the instance runs, or an error that says
// what to do.
func (i *Instance) Running() (*qemu.Machine, error) {
	i.mu.Lock()
	st, mch := i.state, i.machine
	i.mu.Unlock()
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

// qemuExited reports whether the instance's QEMU has exited.
func (i *Instance) qemuExited() bool {
	mch := i.Machine()
	if mch == nil {
		return false
	}
	_, ok := mch.Exited()
	return ok
}

func (i *Instance) busyError() error {
	i.mu.Lock()
	st, mch := i.state, i.machine
	i.mu.Unlock()
	e := &BusyError{Name: i.name, State: st}
	if mch != nil {
		e.PID, e.Up = mch.PID(), time.Since(mch.Started())
	}
	return e
}

// Console is the serial console, nil until QEMU started.
func (i *Instance) Console() *serial.Console {
	if mch := i.Machine(); mch != nil {
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
	con := i.Console()
	if con == nil {
		return serial.Result{}, nil, fmt.Errorf("guest %q has no console yet", i.name)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(i.ctx, func() { cancel(context.Cause(i.ctx)) })
	defer stop()
	// QEMU stamps events with the host's clock to the microsecond: an
	// event of this wait is one sent after it began.
	began := time.Now().Truncate(time.Microsecond)
	if spec.Stop == nil {
		spec.Stop = i.events.waker()
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
		mch := i.Machine()
		<-mch.Done()
		ev = i.exitEvent(mch, since, began)
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
			i.awaitExit(2 * time.Second)
		}
		if res.Stopped && ev == nil {
			// An older event woke the wait: wait on.
			spec.Stop = i.events.waker()
			if spec.Timeout > 0 {
				spec.Timeout = max(spec.Timeout-time.Since(began), time.Millisecond)
			}
			return i.Wait(ctx, since, spec)
		}
	}
	return res, ev, nil
}

// awaitExit waits at most d for QEMU to exit and the instance's cleanup
// to finish, so that what the caller reports next (exited, the runtime
// files gone) is what the user then finds.
func (i *Instance) awaitExit(d time.Duration) {
	mch := i.Machine()
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
	case <-i.done:
	case <-t.C:
	}
}

// Context ends when a stop of the instance begins.
func (i *Instance) Context() context.Context { return i.ctx }

// TAP is the guest's TAP device while it has one.
func (i *Instance) TAP() *tap.Device {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.dev
}

// StartCapture captures the guest's traffic on its TAP into f, a new empty
// file the caller created (and checked), or with f nil into a new file in
// the captures directory. A capture that fails to start leaves f closed
// and removed.
func (i *Instance) StartCapture(f *os.File, filter string, snaplen int) (*pcap.Capture, error) {
	fail := func(err error) (*pcap.Capture, error) {
		if f != nil {
			f.Close()
			os.Remove(f.Name()) // new, empty and ours
		}
		return nil, err
	}
	i.mu.Lock()
	dev, running := i.dev, i.capture
	i.mu.Unlock()
	if dev == nil {
		return fail(fmt.Errorf("guest %q has %w", i.name, ErrNoTAP))
	}
	if running != nil {
		return fail(&CaptureRunningError{Name: i.name, Path: running.Path()})
	}
	m := i.mgr
	var c *pcap.Capture
	var err error
	viaQEMU := !inProcess()
	if viaQEMU {
		mch, rerr := i.Running()
		if rerr != nil {
			return fail(rerr)
		}
		c, err = i.startQEMUCapture(context.Background(), mch, f, filter, snaplen)
		f = nil // startQEMUCapture closed and removed it on failure
		if err != nil {
			return nil, err
		}
	} else {
		opts := pcap.Options{Dir: m.cfg.Captures,
			Prefix: names.Kept(names.KeptCapture, m.owner, i.name), Boot: i.boot, Snaplen: snaplen, Filter: filter}
		if f != nil {
			opts.File, opts.Path = f, f.Name()
		}
		if c, err = pcap.Start(dev.Name, opts); err != nil {
			return fail(fmt.Errorf("capture on %s: %w", dev.Name, err))
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.dev != dev || i.capture != nil {
		// The guest stopped, or another capture started, meanwhile: do
		// not leave this one running.
		go c.Stop()
		return nil, fmt.Errorf("guest %q changed while the capture started: try again", i.name)
	}
	i.capture, i.viaQEMU = c, viaQEMU
	return c, nil
}

// StopCapture stops the running capture and returns its counts; false if
// none runs.
func (i *Instance) StopCapture() (pcap.Stats, bool) {
	i.mu.Lock()
	c, viaQEMU := i.capture, i.viaQEMU
	i.capture, i.viaQEMU = nil, false
	i.mu.Unlock()
	if c == nil {
		return pcap.Stats{}, false
	}
	if viaQEMU {
		i.stopQEMUCapture()
	}
	st, err := c.Stop()
	if err != nil {
		i.mgr.log.Warn("stop capture", "instance", i.name, "path", st.Path, "err", err)
	}
	i.mu.Lock()
	i.lastCapture = &st
	i.mu.Unlock()
	return st, true
}

// CaptureStats reports the running capture, or else the last one.
func (i *Instance) CaptureStats() (pcap.Stats, bool, bool) {
	i.mu.Lock()
	c, last := i.capture, i.lastCapture
	i.mu.Unlock()
	if c != nil {
		return c.Stats(), true, true
	}
	if last != nil {
		return *last, false, true
	}
	return pcap.Stats{}, false, false
}

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
	mch, dev, c, stoppedAt := i.machine, i.dev, i.capture, i.stoppedAt
	i.mu.Unlock()
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
