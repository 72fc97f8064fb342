package instance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// vm is the guest's QEMU of the moment: the one the boot started, then
// each that replaced it (a restore into a new QEMU, a replay that starts
// over), while the console, TAP, drives and debugger stay the guest's.
type vm struct {
	i *Instance
	// cfg is the configuration QEMU was started with (TAP names filled
	// in), files the host files' descriptors kept to start another: set
	// by the boot before QEMU starts, read-only after.
	cfg   qemu.Config
	files map[string]*os.File

	mu      sync.Mutex
	machine *qemu.Process
	// replacing is set while a new QEMU takes over: the exit of the old
	// one is not the guest's end.
	replacing bool
	// guarded counts holds on the QEMU's exit (holdExit): its exit
	// meanwhile is not the guest's end either.
	guarded int
}

// current is the guest's QEMU, nil until one started.
func (v *vm) current() *qemu.Process {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.machine
}

func (v *vm) set(mch *qemu.Process) {
	v.mu.Lock()
	v.machine, v.replacing = mch, false
	v.mu.Unlock()
}

func (v *vm) setReplacing(on bool) {
	v.mu.Lock()
	v.replacing = on
	v.mu.Unlock()
}

// exited reports whether the guest's QEMU has exited.
func (v *vm) exited() bool {
	mch := v.current()
	if mch == nil {
		return false
	}
	_, ok := mch.Exited()
	return ok
}

// superseded says mch is not the guest's QEMU any more, or is being
// replaced or held: its exit is not the guest's end.
func (v *vm) superseded(mch *qemu.Process) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.replacing || v.guarded > 0 || v.machine != mch
}

// watch undoes everything when QEMU stops by itself (guest poweroff), not
// only when it is stopped.
func (v *vm) watch(mch *qemu.Process, followed <-chan struct{}) {
	<-mch.Done()
	if v.superseded(mch) {
		return // a restore stopped it and runs the next QEMU
	}
	i := v.i
	i.mu.Lock()
	con := i.console
	byItself := i.state == Running
	i.mu.Unlock()
	// What the guest printed last is still in the pipe: keep it, then
	// wake the waiters with the end.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	con.Finish(ctx)
	cancel()
	if byItself {
		// The waits the end woke report the event (see Wait).
		i.events.exited(mch, followed)
	}
	close(i.exitNoted)
	exit, _ := mch.Exited()
	i.teardown(&qemu.Ending{How: "exited", Exit: exit})
}

// runtime is where every QEMU of the instance keeps its sockets, on the
// instance's console.
func (v *vm) runtime(withGDB bool) qemu.Runtime {
	i := v.i
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

// record names the guest's QEMU in the server's record.
func (v *vm) record(mch *qemu.Process) {
	id := mch.Identity()
	child, err := registry.NewChild(id.PID)
	if err != nil || child.StartTime != id.StartTime {
		// QEMU already exited; the record must still not name a stranger.
		child = registry.Child{PID: id.PID, StartTime: id.StartTime, Executable: mch.Argv()[0]}
	}
	v.i.mgr.recordInstance(v.i.name, func(r *registry.Instance) { r.QEMU = &child })
}

// replacement is how a new QEMU takes the guest over from the old one.
type replacement struct {
	// method and grace are how the old QEMU goes.
	method qemu.Method
	grace  time.Duration
	// gone runs once the old QEMU has exited, before the new one starts.
	gone func()
	// prepare adjusts the new QEMU's configuration and runtime (a state
	// to load, halted or not).
	prepare func(cfg *qemu.Config, rt *qemu.Runtime)
}

// replace stops old, the guest's QEMU, and starts a new one of the
// guest's machine on its console, TAP, drives and debugger socket. The
// old QEMU's exit meanwhile is not the guest's end (watch). An error
// leaves the guest without a QEMU: the caller ends it (Instance.lost).
func (v *vm) replace(ctx context.Context, old *qemu.Process, r replacement) (*qemu.Process, error) {
	log := v.i.mgr.log.With("instance", v.i.name)
	v.setReplacing(true)
	defer v.setReplacing(false)
	if _, err := old.Shutdown(ctx, r.method, r.grace); err != nil {
		log.Warn("stop QEMU to replace it", "err", err)
	}
	if err := old.Close(); err != nil {
		log.Warn("clean up after the QEMU replaced", "err", err)
	}
	if r.gone != nil {
		r.gone()
	}
	cfg := v.cfg
	files, err := dupFiles(v.files)
	if err != nil {
		return nil, err
	}
	cfg.Files = files
	rt := v.runtime(true)
	if r.prepare != nil {
		r.prepare(&cfg, &rt)
	}
	mch, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return nil, err
	}
	v.set(mch)
	v.record(mch)
	go v.watch(mch, v.i.events.follow(mch, log))
	return mch, nil
}

// holdExit keeps the QEMU's exit from ending the guest until release; a
// QEMU that died under the hold and was not replaced ends the guest
// (lost) when the hold is released.
func (v *vm) holdExit(why string) (release func()) {
	v.mu.Lock()
	mch := v.machine
	v.guarded++
	v.mu.Unlock()
	return func() {
		v.mu.Lock()
		v.guarded--
		dead := v.guarded == 0 && !v.replacing && v.machine == mch && mch != nil
		v.mu.Unlock()
		if !dead {
			return
		}
		if exit, ok := mch.Exited(); ok {
			v.i.lost(fmt.Errorf("QEMU %s %s", exit, why))
		}
	}
}

// held is the guest's QEMU, and whether a hold (holdExit) is on it.
func (v *vm) held() (*qemu.Process, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.machine, v.guarded > 0
}

// config is the guest's machine with its host files, as snapshots
// describe it.
func (v *vm) config() qemu.Config {
	cfg := v.cfg
	cfg.Files = v.files
	return cfg
}

// thenCall runs first and then next before the guest runs; either may be
// nil.
func thenCall(first, next func(ctx context.Context, mch *qemu.Process) error) func(ctx context.Context, mch *qemu.Process) error {
	switch {
	case first == nil:
		return next
	case next == nil:
		return first
	}
	return func(ctx context.Context, mch *qemu.Process) error {
		if err := first(ctx, mch); err != nil {
			return err
		}
		return next(ctx, mch)
	}
}

// lost stops an instance whose QEMU a restore could not replace.
func (i *Instance) lost(err error) error {
	i.vm.setReplacing(false)
	i.mu.Lock()
	if i.ending == nil {
		i.ending = &qemu.Ending{How: "restore failed"}
	}
	con := i.console
	i.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	con.Finish(ctx)
	cancel()
	i.teardown(nil)
	return fmt.Errorf("%w; %w", err, ErrGuestLost)
}

func dupFiles(files map[string]*os.File) (map[string]*os.File, error) {
	out := make(map[string]*os.File, len(files))
	for p, f := range files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			qemu.CloseFiles(out)
			return nil, fmt.Errorf("keep %s open: %w", p, err)
		}
		out[p] = os.NewFile(uintptr(fd), f.Name())
	}
	return out, nil
}

// markConsole writes the line what into con's output and returns the
// cursor after it.
func markConsole(con *serial.Console, what string) int64 {
	b := con.Buffer()
	_, _ = b.Write([]byte("\r\n[qemu-mcp: " + what + "]\r\n"))
	_ = b.Flush() // a failure was logged; the ring has the marker
	return b.End()
}

// describe is the guest's machine, as snapshots know it (its files'
// hashes are cached by snapshot.Describe).
func (v *vm) describe() (snapshot.Machine, error) { return snapshot.Describe(v.config()) }
