package instance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// A restore puts a guest back in the state a snapshot saved: checked,
// staged, then loaded into the running QEMU where it can (loadsInPlace)
// or into a new one (vm.replace).

// restoring is one restore of snapshot meta (from store) into the
// instance, or the load of a boot from a snapshot.
type restoring struct {
	i      *Instance
	store  snapshot.Store
	meta   snapshot.Meta
	con    *serial.Console
	staged string // the copy QEMU loads
	res    Restored
	// held is the guest's debugger, held while the state is replaced
	// under its stub; nil on a guest without one.
	held *debugger.Held
}

// lostError is a restore that left no guest: the instance is to stop.
type lostError struct{ err error }

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// inPlaceError is a load in place that failed once the guest was
// stopped: the guest's state is not whole.
type inPlaceError struct{ err error }

func (e *inPlaceError) Error() string { return e.err.Error() }
func (e *inPlaceError) Unwrap() error { return e.err }

// restoreTimeout bounds a restore once the guest was stopped for it: from
// then on it runs to its end even if the caller gives up, so that the
// guest is never left half loaded.
const restoreTimeout = time.Minute

// run restores: every part is checked, and the image copied, before the
// running guest is touched, so a snapshot that cannot load leaves it as
// it was. A load in place that fails once the guest is stopped gives way
// to a new QEMU.
func (r *restoring) run(ctx context.Context) (Restored, error) {
	i := r.i
	old, err := r.check()
	if err != nil {
		return r.res, err
	}
	r.step("checked")
	if err := r.stage(); err != nil {
		return r.res, fmt.Errorf("%w; the guest was left as it was", err)
	}
	r.step("staged")
	i.mu.Lock()
	r.con = i.console
	i.mu.Unlock()
	// Typing waits until the restored guest runs: nothing reaches the
	// guest being replaced, nor the restored one before its state is
	// loaded.
	release, err := r.con.HoldInput(ctx)
	if err != nil {
		os.Remove(r.staged)
		return r.res, fmt.Errorf("restore snapshot %q: wait for the console's input: %w; the guest was left as it was", r.meta.Name, err)
	}
	defer release()
	// Neither may the debugger act on the guest meanwhile.
	if d := i.Debugger(); d != nil {
		r.held = d.Hold()
		defer r.held.Release()
	}
	if !loadsInPlace(old) {
		return r.fresh(ctx, old)
	}
	err = r.inPlace(ctx, old)
	var failed *inPlaceError
	if !errors.As(err, &failed) {
		return r.res, err
	}
	return r.freshAfter(ctx, old, failed)
}

// check is what run checks before anything is touched: the snapshot's
// parts, and for a restore in a new QEMU what would keep it from starting.
func (r *restoring) check() (*qemu.Process, error) {
	old, err := r.i.Running()
	if err != nil {
		return nil, err
	}
	if err := r.checkParts(); err != nil {
		return nil, err
	}
	if !loadsInPlace(old) {
		if err := r.checkRestart(); err != nil {
			return nil, fmt.Errorf("restore snapshot %q: %w; the guest was left as it was", r.meta.Name, err)
		}
	}
	return old, nil
}

// freshAfter restores in a new QEMU after a load in place failed: the
// guest was stopped and its state is not whole, and the new QEMU loads it
// from a copy of its own (the old QEMU holds the first).
func (r *restoring) freshAfter(ctx context.Context, old *qemu.Process, failed *inPlaceError) (Restored, error) {
	i := r.i
	i.mgr.log.Warn("a snapshot load in place failed: restoring in a new QEMU", "instance", i.name, "snapshot", r.meta.Name, "err", failed.err)
	r.res.Note = fmt.Sprintf("the load into the running QEMU failed (%v), so a new QEMU was started from the snapshot", failed.err)
	if err := r.stage(); err != nil {
		return r.res, &lostError{fmt.Errorf("restore snapshot %q: the load into the running QEMU failed (%v), and %w", r.meta.Name, failed.err, err)}
	}
	res, err := r.fresh(ctx, old)
	var gone *lostError
	if errors.As(err, &gone) {
		gone.err = fmt.Errorf("%w; before that, the load into the running QEMU had failed (%v)", gone.err, failed.err)
	}
	return res, err
}

// restore puts the guest back in the state the snapshot saved. Where its
// QEMU loads a snapshot in place (loadsInPlace), the state is loaded into
// that QEMU; elsewhere the instance starts a new QEMU from the snapshot on
// the same console, TAP, drives and debugger, and stops the old one. The
// kept snapshot is never written: QEMU loads from a copy of its image.
// Output goes on in the same console: a marker line says where the
// restore happened, and output after it begins at the result's Cursor.
// Input goes on too: what was typed for the old guest and not read by it
// is dropped (and counted), and what is typed during the restore waits
// and reaches the restored guest whole. The debugger lets go of the stub
// while the state is replaced, and sets its breakpoints again before the
// restored guest runs its first instruction. If every
// part of the snapshot cannot be verified, the guest is left as it was; a
// load in place that fails once the guest is stopped gives way to a new
// QEMU (the result's Note says why); if the new QEMU fails to start, the
// guest is gone and the instance stopped; the error says which.
func (r *restoring) restore(ctx context.Context) (res Restored, err error) {
	i := r.i
	if err := i.notRecorded("load a snapshot into"); err != nil {
		return res, err
	}
	i.restoreMu.Lock()
	defer i.restoreMu.Unlock()
	res, err = r.run(ctx)
	var gone *lostError
	if errors.As(err, &gone) {
		// After restore let go of the console and the debugger: the
		// instance's cleanup closes them.
		return res, i.lost(gone.err)
	}
	return res, err
}

// checkParts says why the snapshot cannot be loaded into this instance now, or nil:
// a part of the snapshot missing (snapshot.Verify: the record itself, its
// image, the state in it, each drive's tag), or another machine or QEMU
// version (checkMachine). The parts come first: a damaged record names no
// machine, and is not one of another machine. It touches nothing: every
// way of loading calls it before the running guest is stopped.
func (r *restoring) checkParts() error {
	meta := r.meta
	if err := snapshot.Verify(meta); err != nil {
		return fmt.Errorf("%w; the guest was left as it was", err)
	}
	return r.checkMachine()
}

// checkMachine says why the snapshot cannot be loaded into this instance
// (another machine, another QEMU), or nil.
// It asks QEMU nothing: a snapshot list checks each snapshot with it.
func (r *restoring) checkMachine() error {
	i, meta := r.i, r.meta
	mach, err := i.vm.describe()
	if err != nil {
		return err
	}
	if mach.Hash() != meta.Machine.Hash() {
		return &snapshot.MachineError{Name: meta.Name, Guest: i.name, Diffs: []string{strings.Join(snapshot.Diff(meta.Machine, mach), "; ")}}
	}
	if mch := i.Process(); mch != nil {
		if ver := mch.Version(); ver != meta.QEMU {
			return fmt.Errorf("snapshot %q was saved by QEMU %s, and this is QEMU %s: a saved state loads into the QEMU that saved it", meta.Name, meta.QEMU, ver)
		}
	}
	return nil
}

// step logs a step of a restore (what a test kills the server at).
func (r *restoring) step(step string) {
	r.i.mgr.log.Debug("snapshot load", "step", step, "instance", r.i.name, "snapshot", r.meta.Name)
}

// inPlace loads the snapshot from the copy staged into mch, the QEMU
// that runs the guest: the copy is attached, the guest stopped, its last
// output read and the input typed for it dropped, the state loaded, the
// marker written and the guest resumed. A failure before the guest is
// stopped leaves it as it was; one after is an *inPlaceError.
func (r *restoring) inPlace(ctx context.Context, mch *qemu.Process) (err error) {
	meta := r.meta
	mon := mch.Monitor()
	// QEMU opens the image read-write to load from it: the copy, never
	// the kept one.
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": qemu.SnapshotNode,
		"cache": qemu.SnapshotCache, "file": map[string]any{"driver": "file", "filename": r.staged}}); err != nil {
		os.Remove(r.staged)
		return fmt.Errorf("restore snapshot %q: attach its copy: %w; the guest was left as it was", meta.Name, err)
	}
	r.step("attached")
	// The copy goes once it is detached, after the answer. After a failed
	// load the QEMU goes, and the copy with the next one's.
	defer func() {
		var failed *inPlaceError
		if !errors.As(err, &failed) {
			r.unstageLater(ctx, mch)
		}
	}()
	if _, err := mon.Execute(ctx, "stop", nil); err != nil {
		return fmt.Errorf("restore snapshot %q: pause the guest: %w; the guest was left as it was", meta.Name, err)
	}
	r.step("stopped")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
	defer cancel()
	// The old guest's last words go before the marker; what it did not
	// read was typed for it (QEMU reads no more of it: the UART it would
	// go into is loaded next).
	r.res.DiscardedInput = r.lastWords(ctx)
	r.step("synced")
	if err := snapshot.Load(ctx, mon, qemu.SnapshotNode, meta.Tag); err != nil {
		return &inPlaceError{err}
	}
	r.step("loaded")
	r.res.Cursor = markConsole(r.con, restoredWhat(meta, r.res.DiscardedInput))
	r.armDebugger(ctx, mch)
	if _, err := mon.Execute(ctx, "cont", nil); err != nil {
		return &inPlaceError{fmt.Errorf("resume the restored guest: %w", err)}
	}
	r.step("running")
	r.res.InPlace = true
	return nil
}

// armDebugger sets the held debugger's breakpoints in mch's stub, the
// restored guest stopped and about to run (debugger.Held.Arm), so that
// a command typed right after the restore meets them. A failure costs
// only that: it is logged, and the debugger sets them when next used.
func (r *restoring) armDebugger(ctx context.Context, mch *qemu.Process) {
	if r.held == nil {
		return
	}
	c, err := r.i.dialStub(ctx, mch)
	if err == nil {
		err = r.held.Arm(ctx, c)
	}
	if err != nil {
		r.i.mgr.log.Warn("set the breakpoints in the restored guest", "instance", r.i.name, "err", err)
	}
}

// lastWords reads what the old guest printed last, so that it goes before
// the marker, and drops what it did not read: that was typed for it, and
// the restored guest must not get it. It returns how many bytes it
// dropped.
func (r *restoring) lastWords(ctx context.Context) int {
	i := r.i
	if err := r.con.Sync(ctx); err != nil {
		i.mgr.log.Warn("read the old guest's last output", "instance", i.name, "err", err)
	}
	n, err := r.con.DiscardInput()
	if err != nil {
		i.mgr.log.Warn("drop the old guest's unread input", "instance", i.name, "err", err)
	}
	return n
}

// restoredWhat is a restore's marker line.
func restoredWhat(meta snapshot.Meta, discarded int) string {
	what := fmt.Sprintf("restored snapshot %q (saved %s)", meta.Name, meta.Created.Format(time.RFC3339))
	if discarded > 0 {
		what += fmt.Sprintf("; %d bytes typed for the old guest and not read by it were dropped", discarded)
	}
	return what
}

// fresh starts a new QEMU that loads the snapshot from the copy staged,
// on the instance's console, TAP, drives and debugger, and stops old
// first. The caller holds the console's input.
func (r *restoring) fresh(ctx context.Context, old *qemu.Process) (Restored, error) {
	i, meta := r.i, r.meta
	mch, err := i.vm.replace(ctx, old, replacement{
		method: qemu.Quit, grace: 5 * time.Second,
		gone: func() {
			r.step("stopped")
			r.res.DiscardedInput += r.lastWords(ctx)
		},
		prepare: func(cfg *qemu.Config, rt *qemu.Runtime) {
			cfg.LoadVM = &qemu.LoadVM{Path: r.staged}
			rt.BeforeCont = loadSnapshot(meta, func() {
				r.step("loaded")
				r.res.Cursor = markConsole(r.con, restoredWhat(meta, r.res.DiscardedInput))
			})
			rt.BeforeCont = thenCall(rt.BeforeCont, i.net.continueCapture())
			rt.BeforeCont = thenCall(rt.BeforeCont, func(ctx context.Context, mch *qemu.Process) error {
				r.armDebugger(ctx, mch)
				return nil
			})
		},
	})
	if err != nil {
		os.Remove(r.staged)
		return r.res, &lostError{fmt.Errorf("restore snapshot %q: %w", meta.Name, err)}
	}
	r.step("running")
	r.unstageLater(ctx, mch)
	return r.res, nil
}

// checkRestart says what would keep a new QEMU of the instance's
// configuration from starting (its binary or a drive gone since the boot),
// while the running one can still stay.
func (r *restoring) checkRestart() error {
	cfg := r.i.vm.config()
	if err := cfg.Validate(); err != nil {
		return err
	}
	bin := cfg.BinaryName()
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("qemu binary %s: %w", bin, err)
	}
	return nil
}

// stage copies the snapshot's image to the runtime directory for QEMU to
// load.
func (r *restoring) stage() error {
	i := r.i
	p := filepath.Join(i.mgr.cfg.RuntimeDir, names.Name(names.SnapshotStage, i.mgr.owner, i.name))
	// A copy an earlier start of this instance could not remove.
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stage snapshot: %w", err)
	}
	if err := r.store.Stage(r.meta, p); err != nil {
		return err
	}
	r.staged = p
	return nil
}

// unstage detaches the loaded image from QEMU and removes the copy; if
// QEMU keeps it, it goes when the instance stops.
func (r *restoring) unstage(ctx context.Context, mch *qemu.Process) {
	i, staged := r.i, r.staged
	if _, err := mch.Monitor().Execute(ctx, "blockdev-del", map[string]any{"node-name": qemu.SnapshotNode}); err != nil {
		i.mgr.log.Warn("detach the loaded snapshot", "instance", i.name, "err", err)
		i.push("staged snapshot", func() error { return os.Remove(staged) })
		return
	}
	if err := os.Remove(staged); err != nil {
		i.mgr.log.Warn("remove the loaded snapshot's copy", "path", staged, "err", err)
	}
}

// unstageLater unstages once QEMU lets go of the copy, after the answer:
// the next save or restore waits for it (restoreMu).
func (r *restoring) unstageLater(ctx context.Context, mch *qemu.Process) {
	go func() {
		r.i.restoreMu.Lock()
		defer r.i.restoreMu.Unlock()
		r.unstage(context.WithoutCancel(ctx), mch)
	}()
}

// loadSnapshot loads the attached snapshot before the guest first runs,
// then re-arms its timer; then runs last, while the guest has not yet run: a marker written there
// comes before anything the restored guest prints.
func loadSnapshot(meta snapshot.Meta, then func()) func(ctx context.Context, mch *qemu.Process) error {
	return func(ctx context.Context, mch *qemu.Process) error {
		if err := snapshot.Load(ctx, mch.Monitor(), qemu.SnapshotNode, meta.Tag); err != nil {
			return err
		}
		if err := resumeTimer(ctx, mch, meta.Machine.Timer(), meta.Mtime); err != nil {
			return err
		}
		then()
		return nil
	}
}

// resumeTimer gives a loaded guest its board timer t back where its QEMU
// may have lost it (arch.Timer): the count set back to what the save
// read, and the timer's interrupt raised before the guest runs.
func resumeTimer(ctx context.Context, mch *qemu.Process, t *arch.Timer, count uint64) error {
	if t == nil || caps.TimerKept(mch.Argv()[0]) {
		return nil // the QEMU saves and restores the timer (probed)
	}
	addr := mch.Paths().GDBSocket
	if addr == "" {
		return errors.New("no gdbstub to re-arm the guest's timer")
	}
	c, err := gdb.Dial(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	// Not Close: its detach would start the guest now, before the
	// restore's marker and the capture.
	defer c.Leave()
	if count != 0 {
		// The count runs from this QEMU's start, behind the saved
		// guest's time: a write sets it back where the save left it.
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], count)
		if err := c.SetPhysicalMemory(ctx, true); err != nil {
			return fmt.Errorf("set the guest's timer: %w", err)
		}
		err := c.WriteMemory(ctx, t.Counter, b[:])
		if perr := c.SetPhysicalMemory(ctx, false); err == nil {
			err = perr
		}
		if err != nil {
			return fmt.Errorf("set the guest's timer: %w", err)
		}
	}
	pending, err := c.ReadRegister(ctx, t.PendingReg)
	if err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	if err := c.WriteRegister(ctx, t.PendingReg, pending|t.PendingBit); err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	return nil
}

// loadsInPlace says whether mch's QEMU was probed (package qemu/caps) to
// load a snapshot into itself with the guest going on, its timer kept:
// QEMU 11 does; QEMU up to 10.1 does not (the timer state is not saved,
// and time runs backwards), and a binary not probed yet takes the safe
// path, a new QEMU.
func loadsInPlace(mch *qemu.Process) bool {
	c, ok := caps.Known(mch.Argv()[0])
	return ok && c.TimerKept.Yes() && c.InPlaceLoad.Yes()
}
