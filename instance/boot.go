package instance

// A boot is a list of named steps (bootSteps). Each step that does
// something pushes its undo on the instance's cleanup stack at once, so a
// failure at any step, a stop, or the end of the caller's context unwinds
// exactly what was done, newest first.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/cpus"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// bootStep is one step of a boot.
type bootStep struct {
	name string
	do   func(b *booting, ctx context.Context) error
}

// booting is what a boot's steps hand on to the next.
type booting struct {
	i      *Instance
	reaped *reaper.Report
	cfg    qemu.Config
	rt     qemu.Runtime
	// captureAtStart starts a capture through QEMU before the guest runs.
	captureAtStart func(ctx context.Context, mch *qemu.Process) error
	restore        *restoring // the load of a boot from a snapshot
	mch            *qemu.Process
	followed       <-chan struct{}
	times          []any // step name, duration: for the log
}

// bootSteps are a boot's steps, in order.
func bootSteps() []bootStep {
	return []bootStep{
		{"symbols", (*booting).ownSymbols},
		{"reap", (*booting).reapLeftovers},
		{"lock", (*booting).lockRepository},
		{"drives", (*booting).claimDrives},
		{"tap", (*booting).attachTAP},
		{"capture", (*booting).captureFromStart},
		{"console", (*booting).createConsole},
		{"record", (*booting).beginRecording},
		{"host files", (*booting).keepHostFiles},
		{"snapshot", (*booting).stageBootSnapshot},
		{"replay", (*booting).prepareReplay},
		{"qemu", (*booting).startQEMU},
		{"recording", (*booting).commitRecordingStep},
		{"replay console", (*booting).startReplayStep},
		{"debugger", (*booting).attachDebugger},
		{"record qemu", (*booting).recordQEMUStep},
		{"unstage", (*booting).unstageBootSnapshot},
		{"running", (*booting).markRunning},
	}
}

// run performs the boot's steps. Any failure, an end of ctx, or a stop
// unwinds what was done.
func (i *Instance) run(ctx context.Context) (reaped *reaper.Report, err error) {
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
	b := &booting{i: i}
	steps := bootSteps()
	if i.mgr.steps != nil {
		steps = i.mgr.steps(steps)
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return b.reaped, context.Cause(ctx)
		}
		t := time.Now()
		if err := s.do(b, ctx); err != nil {
			return b.reaped, err
		}
		b.times = append(b.times, s.name, time.Since(t))
	}
	go i.vm.watch(b.mch, b.followed)
	i.mgr.probeQEMU(b.cfg.Arch, b.mch.Argv()[0])
	i.mgr.log.Debug("booted", append([]any{"instance", i.name}, b.times...)...)
	return b.reaped, nil
}

// ownSymbols closes the kernel's symbols at the end, unless a debugger
// took them (it closes them itself).
func (b *booting) ownSymbols(_ context.Context) error {
	i := b.i
	if d := i.spec.Debug; d != nil && d.Symbols != nil {
		i.push("symbols", func() error {
			if i.Debugger() != nil {
				return nil
			}
			return d.Symbols.Close()
		})
	}
	return nil
}

// reapLeftovers removes what dead servers left, before this boot makes
// anything of its own.
func (b *booting) reapLeftovers(_ context.Context) error {
	i := b.i
	b.reaped = i.mgr.reap()
	return nil
}

func (b *booting) lockRepository(_ context.Context) error {
	i := b.i
	m := i.mgr
	path, release, err := m.locks.acquire(i.spec.Root, i.name)
	if err != nil {
		return err
	}
	i.hold("repository lock", func() { i.lockPath = path }, release)
	m.recordInstance(i.name, func(r *registry.Instance) { r.Lock = path })
	i.push("lock in record", func() error {
		m.recordInstance(i.name, func(r *registry.Instance) { r.Lock = "" })
		return nil
	})
	return nil
}

func (b *booting) claimDrives(_ context.Context) error {
	i := b.i
	release, err := i.mgr.claimDrives(i.name, i.spec.QEMU.Drives)
	if err != nil {
		return err
	}
	i.push("drive claims", release)
	b.cfg = i.spec.QEMU
	return nil
}

func (b *booting) attachTAP(_ context.Context) error {
	i := b.i
	t := i.spec.TAP
	if t == nil {
		return nil
	}
	if err := i.net.makeTAP(*t); err != nil {
		return err
	}
	b.cfg.Network, b.cfg.TAPName, b.cfg.MAC = "tap", i.TAP().Name, i.TAP().GuestMAC.String()
	// A capture through QEMU (see network.go) needs plain frames.
	b.cfg.TAPPlainFrames = !inProcess()
	return nil
}

// captureFromStart starts the capture a boot asks for: one in this
// process before QEMU, so the guest's first frame is in it; one through
// QEMU before the guest runs.
func (b *booting) captureFromStart(_ context.Context) error {
	i := b.i
	c := i.spec.Capture
	switch {
	case c == nil:
		return nil
	case inProcess():
		if _, err := i.net.StartCapture(nil, c.Filter, 0); err != nil {
			return fmt.Errorf("capture at boot: %w", err)
		}
		return nil
	}
	b.captureAtStart = func(ctx context.Context, mch *qemu.Process) error {
		cp, err := i.net.startQEMUCapture(ctx, mch, nil, c.Filter, 0)
		if err != nil {
			return fmt.Errorf("capture at boot: %w", err)
		}
		i.net.mu.Lock()
		i.net.capture, i.net.viaQEMU = cp, true
		i.net.mu.Unlock()
		return nil
	}
	return nil
}

// createConsole makes the instance's console. It is the instance's, not
// one QEMU's: a restore starts a new QEMU on it, and output and cursors go
// on. Every attempt gets its own transcript: a failed start keeps what
// QEMU printed, and the next attempt must not collide with it. It outlives
// the server, kept with the captures.
func (b *booting) createConsole(_ context.Context) error {
	i := b.i
	m := i.mgr
	transcript := filepath.Join(m.cfg.Captures, names.Transcript(m.owner, i.name, i.boot))
	removed := m.enforceCap() // before this boot adds to what is kept
	i.mu.Lock()
	i.transcript = transcript
	i.keptRemoved = removed
	i.mu.Unlock()
	opts := []serial.Option{serial.WithLogger(m.log.With("instance", i.name)), serial.WithTranscript(transcript)}
	if m.cfg.RingSize > 0 {
		opts = append(opts, serial.WithRingSize(m.cfg.RingSize))
	}
	con, err := serial.Create(filepath.Join(m.cfg.RuntimeDir, names.SerialBase(m.owner, i.name)), opts...)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	i.hold("console", func() { i.console = con }, con.Close)
	return nil
}

// keepHostFiles keeps copies of the host files' descriptors: Start closes
// the descriptors it is given, and a restore needs them again.
func (b *booting) keepHostFiles(_ context.Context) error {
	i := b.i
	files, err := dupFiles(b.cfg.Files)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	i.vm.files, i.vm.cfg = files, b.cfg
	i.vm.cfg.Files = nil
	i.push("host files", func() error { return qemu.CloseFiles(files) })
	// A start from a snapshot needs the stub too (see resumeTimer).
	b.rt = i.vm.runtime(i.spec.Debug != nil || i.spec.Snapshot != nil)
	return nil
}

// stageBootSnapshot has QEMU load the snapshot a boot starts from before
// the guest runs, and chains the capture through QEMU after it.
func (b *booting) stageBootSnapshot(_ context.Context) error {
	i := b.i
	if snap := i.spec.Snapshot; snap != nil {
		if err := snapshot.Verify(snap.meta); err != nil {
			return err
		}
		r := &restoring{i: i, store: i.mgr.Snapshots().Store(), meta: snap.meta}
		if err := r.stage(); err != nil {
			return err
		}
		b.restore = r
		staged := r.staged
		// The copy is removed once the guest runs (unstage); a boot
		// that fails before removes it here.
		i.push("staged snapshot", func() error {
			if err := os.Remove(staged); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		})
		b.cfg.LoadVM = &qemu.LoadVM{Path: staged}
		con := b.rt.Console
		b.rt.BeforeCont = loadSnapshot(snap.meta, func() {
			markConsole(con, fmt.Sprintf("booted from snapshot %q (saved %s)", snap.meta.Name, snap.meta.Created.Format(time.RFC3339)))
		})
	}
	b.rt.BeforeCont = thenCall(b.rt.BeforeCont, b.captureAtStart)
	return nil
}

// startQEMU starts the guest's QEMU. The guest's harts get host CPUs; the
// server's goroutines the rest.
func (b *booting) startQEMU(ctx context.Context) error {
	i := b.i
	mch, err := qemu.Start(ctx, b.rt, b.cfg)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	harts := max(1, b.cfg.SMP)
	cpus.Add(harts)
	i.push("qemu", func() error {
		defer cpus.Add(-harts)
		if mch := i.Process(); mch != nil {
			return mch.Close()
		}
		return nil
	})
	i.vm.set(mch)
	b.mch = mch
	return nil
}

func (b *booting) commitRecordingStep(ctx context.Context) error {
	i := b.i
	if i.spec.Record == nil {
		return nil
	}
	return i.tt.recorder().Commit(b.mch)
}

func (b *booting) startReplayStep(_ context.Context) error {
	i := b.i
	if i.spec.Replay == nil {
		return nil
	}
	return i.tt.replayer().Start(b.mch, i.console.Buffer(), i.push)
}

// attachDebugger follows QEMU's events and, if the boot asks for one,
// gives the guest its debugger. The debugger connects to the stub of
// whichever QEMU runs the guest on first use; it is closed (detaching,
// which lets a stopped guest run) before QEMU is stopped.
func (b *booting) attachDebugger(_ context.Context) error {
	i := b.i
	b.followed = i.events.follow(b.mch, i.mgr.log.With("instance", i.name))
	if i.spec.Debug == nil {
		return nil
	}
	log := i.mgr.log.With("instance", i.name)
	d := debugger.New(debugger.Config{
		Arch: b.cfg.Arch,
		Dial: func(ctx context.Context) (*gdb.Client, error) {
			mch, err := i.Running()
			if err != nil {
				return nil, err
			}
			return i.dialStub(ctx, mch)
		},
		Running: func(ctx context.Context) (bool, error) {
			mch, err := i.Running()
			if err != nil {
				return false, err
			}
			return mch.Monitor().Running(ctx)
		},
		Symbols:  i.spec.Debug.Symbols,
		Timeline: i.tt.timeline(),
		Logger:   log,
	})
	i.hold("debugger", func() { i.debugger = d }, d.Close)
	return nil
}

// dialStub connects to the gdbstub of mch, a QEMU of the instance.
func (i *Instance) dialStub(ctx context.Context, mch *qemu.Process) (*gdb.Client, error) {
	return gdb.Dial(ctx, "unix", mch.Paths().GDBSocket, gdb.WithLogger(i.mgr.log.With("instance", i.name)), gdb.WithArch(i.vm.config().Arch))
}

func (b *booting) recordQEMUStep(_ context.Context) error {
	i := b.i
	i.vm.record(b.mch)
	i.push("qemu in record", func() error {
		i.mgr.recordInstance(i.name, func(r *registry.Instance) { r.QEMU = nil })
		return nil
	})
	return nil
}

func (b *booting) unstageBootSnapshot(ctx context.Context) error {
	i := b.i
	if i.spec.Snapshot != nil {
		b.restore.unstage(ctx, b.mch)
	}
	return nil
}

// markRunning makes the guest running, unless a stop came in as QEMU
// started: that stop waits for this boot and then stops the machine
// itself.
func (b *booting) markRunning(_ context.Context) error {
	i := b.i
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.state != Booting {
		return ErrStopped
	}
	i.state = Running
	return nil
}
