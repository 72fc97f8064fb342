package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"golang.org/x/sys/unix"
)

// The guest's QEMU: started by the boot, replaced under the guest by a
// restore into a new QEMU or a replay that starts over, while the console,
// TAP, drives and debugger stay the guest's.

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

// thenCall runs first and then next before the guest runs; either may be
// nil.
func thenCall(first, next func(ctx context.Context, mch *qemu.Machine) error) func(ctx context.Context, mch *qemu.Machine) error {
	switch {
	case first == nil:
		return next
	case next == nil:
		return first
	}
	return func(ctx context.Context, mch *qemu.Machine) error {
		if err := first(ctx, mch); err != nil {
			return err
		}
		return next(ctx, mch)
	}
}

// lost stops an instance whose QEMU a restore could not replace.
func (i *Instance) lost(err error) error {
	i.mu.Lock()
	i.replacing = false
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
		fd, err := dupCloexec(int(f.Fd()))
		if err != nil {
			qemu.CloseFiles(out)
			return nil, fmt.Errorf("keep %s open: %w", p, err)
		}
		out[p] = os.NewFile(uintptr(fd), f.Name())
	}
	return out, nil
}

func dupCloexec(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

// mark writes a line into the console's output (and transcript) and
// returns the cursor after it.
func (i *Instance) mark(what string) int64 {
	i.mu.Lock()
	con := i.console
	i.mu.Unlock()
	b := con.Buffer()
	_, _ = b.Write([]byte("\r\n[qemu-mcp: " + what + "]\r\n"))
	_ = b.Flush() // a failure was logged; the ring has the marker
	return b.End()
}

func removeIfThere(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
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

// replaceMachine stops old, the guest's QEMU, and starts a new one of the
// guest's machine on its console, TAP, drives and debugger socket. The
// old QEMU's exit meanwhile is not the guest's end (watch). An error
// leaves the guest without a QEMU: the caller ends it (lost).
func (i *Instance) replaceMachine(ctx context.Context, old *qemu.Machine, r replacement) (*qemu.Machine, error) {
	i.setReplacing(true)
	defer i.setReplacing(false)
	if _, err := old.Shutdown(ctx, r.method, r.grace); err != nil {
		i.mgr.log.Warn("stop QEMU to replace it", "instance", i.name, "err", err)
	}
	if err := old.Close(); err != nil {
		i.mgr.log.Warn("clean up after the QEMU replaced", "instance", i.name, "err", err)
	}
	if r.gone != nil {
		r.gone()
	}
	cfg := i.cfg
	files, err := dupFiles(i.files)
	if err != nil {
		return nil, err
	}
	cfg.Files = files
	rt := i.runtime(true)
	if r.prepare != nil {
		r.prepare(&cfg, &rt)
	}
	mch, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return nil, err
	}
	i.mu.Lock()
	i.machine = mch
	i.replacing = false
	i.mu.Unlock()
	i.recordQEMU(mch)
	go i.watch(mch, i.follow(mch))
	return mch, nil
}

func (i *Instance) setReplacing(on bool) {
	i.mu.Lock()
	i.replacing = on
	i.mu.Unlock()
}
