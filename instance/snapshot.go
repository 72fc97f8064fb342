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

	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// SnapshotSpec is a saved state to boot into: the project's snapshot of
// that name saved on the machine the boot gives (Manager.Boot finds it).
type SnapshotSpec struct {
	Name string
	meta snapshot.Meta // found by Boot
}

// Snapshots is the server's snapshot store, the one every instance saves
// into and loads from.
func (m *Manager) Snapshots() snapshot.Store {
	return snapshot.Store{Dir: m.cfg.Snapshots, Owner: m.owner, Logger: m.log}
}

// FindSnapshots returns the project root's snapshots called name (one a
// machine they were saved on), or a *snapshot.NotFoundError.
func (m *Manager) FindSnapshots(root, name string) ([]snapshot.Meta, error) {
	if err := snapshot.CheckName(name); err != nil {
		return nil, err
	}
	metas, err := m.Snapshots().Find(root, name)
	if err != nil {
		return nil, err
	}
	if len(metas) == 0 {
		return nil, &snapshot.NotFoundError{Name: name, Root: root}
	}
	return metas, nil
}

// SnapshotMachine is the machine the project root's snapshot name was
// saved on, as boot arguments, for a boot that gives none (builtin is the
// kernel a boot that names none boots: its path is left out). It is a
// *snapshot.AmbiguousError if several machines have a snapshot of that
// name.
func (m *Manager) SnapshotMachine(root, name string, builtin []byte) (profile.Profile, error) {
	metas, err := m.FindSnapshots(root, name)
	if err != nil {
		return profile.Profile{}, err
	}
	if len(metas) > 1 {
		return profile.Profile{}, &snapshot.AmbiguousError{Name: name, Root: root, N: len(metas)}
	}
	return MachineArgs(metas[0].Machine, builtin), nil
}

// MachineArgs is the machine mach (a snapshot's or a recording's) as boot
// arguments; builtin is the kernel a boot that names none boots, whose
// path is left out.
func MachineArgs(mach snapshot.Machine, builtin []byte) profile.Profile {
	p := profile.Profile{BIOS: mach.BIOS.Path, Memory: mach.Memory, SMP: mach.SMP, Append: mach.Append,
		ExtraArgs: mach.ExtraArgs, GPU: mach.GPU, VirtioModern: mach.VirtioModern, Network: mach.Network}
	if k := mach.Kernel; k != nil && !mach.KernelIs(builtin) {
		p.Kernel = k.Path
	}
	if mach.Initrd != nil {
		p.Initrd = mach.Initrd.Path
	}
	if mach.DTB != nil {
		p.DTB = mach.DTB.Path
	}
	for _, d := range mach.Drives {
		p.Drives = append(p.Drives, qemu.Drive{Path: d.Path, Format: d.Format, ReadOnly: d.ReadOnly, Bus: d.Bus})
	}
	for _, sh := range mach.Shares {
		p.Shares = append(p.Shares, profile.Share{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable})
	}
	return p
}

// findBootSnapshot finds the snapshot spec.Snapshot names among those
// saved on the machine spec.QEMU gives, or says how the machines differ.
func (m *Manager) findBootSnapshot(spec *Spec) error {
	name := spec.Snapshot.Name
	if spec.Snapshot.meta.Path != "" {
		return nil // found already (the package's tests give one)
	}
	metas, err := m.FindSnapshots(spec.Root, name)
	if err != nil {
		return err
	}
	mach, err := snapshot.Describe(spec.QEMU)
	if err != nil {
		return err
	}
	var diffs []string
	for _, meta := range metas {
		if meta.Machine.Hash() == mach.Hash() {
			spec.Snapshot = &SnapshotSpec{Name: name, meta: meta}
			return nil
		}
		diffs = append(diffs, strings.Join(snapshot.Diff(meta.Machine, mach), "; "))
	}
	return &snapshot.MachineError{Name: name, Diffs: diffs}
}

// ListedSnapshot is a snapshot of a list, and whether it can load.
type ListedSnapshot struct {
	snapshot.Meta
	// Incomplete says which part is missing (see snapshot.Verify): such
	// a snapshot never loads.
	Incomplete string
	// Loads, for a list with a guest of the project running, says
	// whether the snapshot loads into it (nil otherwise).
	Loads *bool
}

// ListSnapshots lists the project root's snapshots, newest first, at
// most max of them (more counts the others). With inst running a guest
// of the project, each says whether it loads into it; that asks QEMU
// nothing.
func (m *Manager) ListSnapshots(root string, inst *Instance, max int) (list []ListedSnapshot, more int, err error) {
	metas, err := m.Snapshots().List(root)
	if err != nil {
		return nil, 0, err
	}
	if len(metas) > max {
		more, metas = len(metas)-max, metas[:max]
	}
	running := inst != nil && inst.Machine() != nil && inst.Spec().Root == root
	for _, meta := range metas {
		ls := ListedSnapshot{Meta: meta}
		var inc *snapshot.IncompleteError
		if err := snapshot.Verify(meta); errors.As(err, &inc) {
			ls.Incomplete = inc.Reason()
		}
		if running {
			ok := ls.Incomplete == "" && inst.CheckSnapshot(meta) == nil
			ls.Loads = &ok
		}
		list = append(list, ls)
	}
	return list, more, nil
}

// DeleteSnapshot deletes the project root's snapshots called name (one a
// machine). A snapshot's disk part is removed from its drives through
// inst, if inst runs the machine it was saved on and has the drives
// attached; left names the drives that keep it otherwise.
func (m *Manager) DeleteSnapshot(ctx context.Context, root, name string, inst *Instance) (deleted []snapshot.Meta, left []string, err error) {
	metas, err := m.FindSnapshots(root, name)
	if err != nil {
		return nil, nil, err
	}
	store := m.Snapshots()
	for _, meta := range metas {
		if len(meta.Drives) > 0 {
			// The disk part lives in the drives: a running guest that
			// has them removes it through QEMU.
			if inst == nil || inst.Machine() == nil || inst.CheckSnapshot(meta) != nil || inst.deleteSnapshotTag(ctx, meta.Tag) != nil {
				for _, d := range meta.Drives {
					left = append(left, d+" (tag "+meta.Tag+")")
				}
			}
		}
		if err := store.Delete(meta); err != nil {
			return deleted, left, err
		}
		deleted = append(deleted, meta)
	}
	return deleted, left, nil
}

// describe is the instance's machine, as snapshots know it (its files'
// hashes are cached by snapshot.Describe).
func (i *Instance) describe() (snapshot.Machine, error) {
	cfg := i.cfg
	cfg.Files = i.files
	return snapshot.Describe(cfg)
}

// SaveSnapshot saves the running guest as the snapshot name of its project
// and machine (see snapshot.Store.Save). The guest pauses for the save and
// runs on.
func (i *Instance) SaveSnapshot(ctx context.Context, name string) (snapshot.Meta, error) {
	if err := snapshot.CheckName(name); err != nil {
		return snapshot.Meta{}, err
	}
	if err := i.notRecorded("save a snapshot of"); err != nil {
		return snapshot.Meta{}, err
	}
	i.restoreMu.Lock()
	defer i.restoreMu.Unlock()
	mch, err := i.Running()
	if err != nil {
		return snapshot.Meta{}, err
	}
	mach, err := i.describe()
	if err != nil {
		return snapshot.Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	shares := map[string]string{}
	for _, sh := range i.cfg.Shares {
		shares[sh.Tag] = sh.Path
	}
	if err := snapshot.CheckSavable(ctx, mch.Monitor(), shares); err != nil {
		return snapshot.Meta{}, fmt.Errorf("save snapshot %q: %w", name, err)
	}
	drives := map[string]string{}
	for k, d := range i.cfg.Drives {
		drives[fmt.Sprintf("drive%d", k)] = d.Path
	}
	meta, err := i.mgr.Snapshots().Save(ctx, mch.Monitor(), i.spec.Root, mach, name, mch.Version(), drives)
	if err != nil {
		return snapshot.Meta{}, err
	}
	i.mgr.enforceCap()
	return meta, nil
}

// CheckSnapshot says why meta cannot be loaded into this instance, or nil.
// It asks QEMU nothing: a snapshot list checks each snapshot with it.
func (i *Instance) CheckSnapshot(meta snapshot.Meta) error {
	mach, err := i.describe()
	if err != nil {
		return err
	}
	if mach.Hash() != meta.Machine.Hash() {
		return &snapshot.MachineError{Name: meta.Name, Guest: i.name, Diffs: []string{strings.Join(snapshot.Diff(meta.Machine, mach), "; ")}}
	}
	if mch := i.Machine(); mch != nil {
		if ver := mch.Version(); ver != meta.QEMU {
			return fmt.Errorf("snapshot %q was saved by QEMU %s, and this is QEMU %s: a saved state loads into the QEMU that saved it", meta.Name, meta.QEMU, ver)
		}
	}
	return nil
}

// Restored is what a restore did.
type Restored struct {
	// Cursor is where the restored guest's output begins (after the
	// marker line).
	Cursor int64
	// DiscardedInput counts the bytes typed for the old guest that it had
	// not read: they are not delivered to the restored one.
	DiscardedInput int
	// InPlace says the state was loaded into the QEMU that ran the guest
	// (same process); otherwise a new QEMU runs the restored guest.
	InPlace bool
	// Note says why a load in place gave way to a new QEMU, if it did.
	Note string
	// PID is the QEMU that runs the restored guest (LoadSnapshot).
	PID int
}

// CheckLoad says why meta cannot be loaded into this instance now, or nil:
// a part of the snapshot missing (snapshot.Verify: the record itself, its
// image, the state in it, each drive's tag), or another machine or QEMU
// version (CheckSnapshot). The parts come first: a damaged record names no
// machine, and is not one of another machine. It touches nothing: every
// way of loading calls it before the running guest is stopped.
func (i *Instance) CheckLoad(meta snapshot.Meta) error {
	if err := snapshot.Verify(meta); err != nil {
		return fmt.Errorf("%w; the guest was left as it was", err)
	}
	return i.CheckSnapshot(meta)
}

// loadsInPlace says whether mch's QEMU was probed (package qemu/caps) to
// load a snapshot into itself with the guest going on, its timer kept:
// QEMU 11 does; QEMU up to 10.1 does not (the timer state is not saved,
// and time runs backwards), and a binary not probed yet takes the safe
// path, a new QEMU.
func loadsInPlace(mch *qemu.Machine) bool {
	c, ok := caps.Known(mch.Argv()[0])
	return ok && c.TimerKept.Yes() && c.InPlaceLoad.Yes()
}

// RestoreSnapshot puts the guest back in the state meta saved. Where its
// QEMU loads a snapshot in place (loadsInPlace), the state is loaded into
// that QEMU; elsewhere the instance starts a new QEMU from the snapshot on
// the same console, TAP, drives and debugger, and stops the old one. The
// kept snapshot is never written: QEMU loads from a copy of its image.
// Output goes on in the same console: a marker line says where the
// restore happened, and output after it begins at the result's Cursor.
// Input goes on too: what was typed for the old guest and not read by it
// is dropped (and counted), and what is typed during the restore waits
// and reaches the restored guest whole. The debugger lets go of the stub
// and connects again on its next use, its breakpoints set again. If every
// part of the snapshot cannot be verified, the guest is left as it was; a
// load in place that fails once the guest is stopped gives way to a new
// QEMU (the result's Note says why); if the new QEMU fails to start, the
// guest is gone and the instance stopped; the error says which.
func (i *Instance) RestoreSnapshot(ctx context.Context, meta snapshot.Meta) (res Restored, err error) {
	if err := i.notRecorded("load a snapshot into"); err != nil {
		return res, err
	}
	i.restoreMu.Lock()
	defer i.restoreMu.Unlock()
	res, err = i.restore(ctx, i.mgr.Snapshots(), meta)
	var gone *lostError
	if errors.As(err, &gone) {
		// After restore let go of the console and the debugger: the
		// instance's cleanup closes them.
		return res, i.lost(gone.err)
	}
	return res, err
}

// LoadSnapshot restores the guest to its project's snapshot name saved on
// the machine it runs (see RestoreSnapshot), and returns that snapshot.
// If none of that name can load, the error says why for each.
func (i *Instance) LoadSnapshot(ctx context.Context, name string) (snapshot.Meta, Restored, error) {
	if _, err := i.Running(); err != nil {
		return snapshot.Meta{}, Restored{}, err
	}
	metas, err := i.mgr.FindSnapshots(i.spec.Root, name)
	if err != nil {
		return snapshot.Meta{}, Restored{}, err
	}
	var errs []error
	for _, meta := range metas {
		err := i.CheckSnapshot(meta)
		if err == nil {
			res, err := i.RestoreSnapshot(ctx, meta)
			if m := i.Machine(); err == nil && m != nil {
				res.PID = m.PID()
			}
			return meta, res, err
		}
		errs = append(errs, err)
	}
	return snapshot.Meta{}, Restored{}, errors.Join(errs...)
}

// lostError is a restore that left no guest: the instance is to stop.
type lostError struct{ err error }

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

func (i *Instance) restore(ctx context.Context, store snapshot.Store, meta snapshot.Meta) (res Restored, err error) {
	old, err := i.Running()
	if err != nil {
		return res, err
	}
	// Every part is checked, and the image copied, before the running
	// guest is touched: a snapshot that cannot load leaves it as it was.
	if err := i.CheckLoad(meta); err != nil {
		return res, err
	}
	// A restore in a new QEMU checks what would keep it from starting
	// while the running guest can still stay.
	if !loadsInPlace(old) {
		if err := i.checkRestart(); err != nil {
			return res, fmt.Errorf("restore snapshot %q: %w; the guest was left as it was", meta.Name, err)
		}
	}
	i.loadStep(meta, "checked")
	staged, err := i.stage(store, meta)
	if err != nil {
		return res, fmt.Errorf("%w; the guest was left as it was", err)
	}
	i.loadStep(meta, "staged")
	i.mu.Lock()
	con := i.console
	i.mu.Unlock()
	// Typing waits until the restored guest runs: nothing reaches the
	// guest being replaced, nor the restored one before its state is
	// loaded.
	release, err := con.HoldInput(ctx)
	if err != nil {
		os.Remove(staged)
		return res, fmt.Errorf("restore snapshot %q: wait for the console's input: %w; the guest was left as it was", meta.Name, err)
	}
	defer release()
	// Neither may the debugger act on the guest meanwhile.
	if d := i.Debugger(); d != nil {
		defer d.Hold()()
	}
	if !loadsInPlace(old) {
		return i.restoreFresh(ctx, old, con, meta, staged, res)
	}
	res, err = i.restoreInPlace(ctx, old, con, meta, staged)
	var failed *inPlaceError
	if !errors.As(err, &failed) {
		return res, err
	}
	// The guest was stopped and its state is not whole: a new QEMU
	// loads it from a copy of its own (the old QEMU holds the first).
	i.mgr.log.Warn("a snapshot load in place failed: restoring in a new QEMU", "instance", i.name, "snapshot", meta.Name, "err", failed.err)
	res.Note = fmt.Sprintf("the load into the running QEMU failed (%v), so a new QEMU was started from the snapshot", failed.err)
	if staged, err = i.stage(store, meta); err != nil {
		return res, &lostError{fmt.Errorf("restore snapshot %q: the load into the running QEMU failed (%v), and %w", meta.Name, failed.err, err)}
	}
	res, err = i.restoreFresh(ctx, old, con, meta, staged, res)
	var gone *lostError
	if errors.As(err, &gone) {
		gone.err = fmt.Errorf("%w; before that, the load into the running QEMU had failed (%v)", gone.err, failed.err)
	}
	return res, err
}

// inPlaceError is a load in place that failed once the guest was
// stopped: the guest's state is not whole.
type inPlaceError struct{ err error }

func (e *inPlaceError) Error() string { return e.err.Error() }
func (e *inPlaceError) Unwrap() error { return e.err }

// loadStep logs a step of a restore (what a test kills the server at).
func (i *Instance) loadStep(meta snapshot.Meta, step string) {
	i.mgr.log.Debug("snapshot load", "step", step, "instance", i.name, "snapshot", meta.Name)
}

// restoreTimeout bounds a restore once the guest was stopped for it: from
// then on it runs to its end even if the caller gives up, so that the
// guest is never left half loaded.
const restoreTimeout = time.Minute

// restoreInPlace loads meta from the copy staged into mch, the QEMU that
// runs the guest: the copy is attached, the guest stopped, its last
// output read and the input typed for it dropped, the state loaded, the
// marker written and the guest resumed. A failure before the guest is
// stopped leaves it as it was; one after is an *inPlaceError.
func (i *Instance) restoreInPlace(ctx context.Context, mch *qemu.Machine, con *serial.Console, meta snapshot.Meta, staged string) (res Restored, err error) {
	mon := mch.Monitor()
	// QEMU opens the image read-write to load from it: the copy, never
	// the kept one.
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": qemu.SnapshotNode,
		"cache": qemu.SnapshotCache, "file": map[string]any{"driver": "file", "filename": staged}}); err != nil {
		os.Remove(staged)
		return res, fmt.Errorf("restore snapshot %q: attach its copy: %w; the guest was left as it was", meta.Name, err)
	}
	i.loadStep(meta, "attached")
	// The copy goes once it is detached, after the answer: the next save
	// or restore waits for it (restoreMu). After a failed load the QEMU
	// goes, and the copy with the next one's.
	defer func() {
		var failed *inPlaceError
		if errors.As(err, &failed) {
			return
		}
		go func() {
			i.restoreMu.Lock()
			defer i.restoreMu.Unlock()
			i.unstage(context.WithoutCancel(ctx), mch, staged)
		}()
	}()
	if _, err := mon.Execute(ctx, "stop", nil); err != nil {
		return res, fmt.Errorf("restore snapshot %q: pause the guest: %w; the guest was left as it was", meta.Name, err)
	}
	i.loadStep(meta, "stopped")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
	defer cancel()
	// The old guest's last words go before the marker.
	if err := con.Sync(ctx); err != nil {
		i.mgr.log.Warn("read the old guest's last output", "instance", i.name, "err", err)
	}
	// What the old guest did not read was typed for it: the restored one
	// must not get it. (QEMU reads no more of it: the UART it would go
	// into is loaded next.)
	if res.DiscardedInput, err = con.DiscardInput(); err != nil {
		i.mgr.log.Warn("drop the old guest's unread input", "instance", i.name, "err", err)
	}
	i.loadStep(meta, "synced")
	if err := snapshot.Load(ctx, mon, qemu.SnapshotNode, meta.Tag); err != nil {
		return res, &inPlaceError{err}
	}
	i.loadStep(meta, "loaded")
	res.Cursor = i.mark(restoredWhat(meta, res.DiscardedInput))
	if _, err := mon.Execute(ctx, "cont", nil); err != nil {
		return res, &inPlaceError{fmt.Errorf("resume the restored guest: %w", err)}
	}
	i.loadStep(meta, "running")
	res.InPlace = true
	return res, nil
}

// restoredWhat is a restore's marker line.
func restoredWhat(meta snapshot.Meta, discarded int) string {
	what := fmt.Sprintf("restored snapshot %q (saved %s)", meta.Name, meta.Created.Format(time.RFC3339))
	if discarded > 0 {
		what += fmt.Sprintf("; %d bytes typed for the old guest and not read by it were dropped", discarded)
	}
	return what
}

// restoreFresh starts a new QEMU that loads meta from the copy staged, on
// the instance's console, TAP, drives and debugger, and stops old first.
// The caller holds the console's input.
func (i *Instance) restoreFresh(ctx context.Context, old *qemu.Machine, con *serial.Console, meta snapshot.Meta, staged string, res Restored) (Restored, error) {
	mch, err := i.replaceMachine(ctx, old, replacement{
		method: qemu.Quit, grace: 5 * time.Second,
		gone: func() {
			i.loadStep(meta, "stopped")
			// What the old guest printed last goes before the marker;
			// what it did not read was typed for it: the restored one
			// must not get it.
			if err := con.Sync(ctx); err != nil {
				i.mgr.log.Warn("read the old guest's last output", "instance", i.name, "err", err)
			}
			n, err := con.DiscardInput()
			if err != nil {
				i.mgr.log.Warn("drop the old guest's unread input", "instance", i.name, "err", err)
			}
			res.DiscardedInput += n
		},
		prepare: func(cfg *qemu.Config, rt *qemu.Runtime) {
			cfg.LoadVM = &qemu.LoadVM{Path: staged}
			rt.BeforeCont = loadSnapshot(meta, func() {
				i.loadStep(meta, "loaded")
				res.Cursor = i.mark(restoredWhat(meta, res.DiscardedInput))
			})
			rt.BeforeCont = thenCall(rt.BeforeCont, i.continueCapture())
		},
	})
	if err != nil {
		os.Remove(staged)
		return res, &lostError{fmt.Errorf("restore snapshot %q: %w", meta.Name, err)}
	}
	i.loadStep(meta, "running")
	// The copy goes once QEMU lets go of it, after the answer: the next
	// save or restore waits for it (restoreMu).
	go func() {
		i.restoreMu.Lock()
		defer i.restoreMu.Unlock()
		i.unstage(context.WithoutCancel(ctx), mch, staged)
	}()
	return res, nil
}

// checkRestart says what would keep a new QEMU of the instance's
// configuration from starting (its binary or a drive gone since the boot),
// while the running one can still stay.
func (i *Instance) checkRestart() error {
	cfg := i.cfg
	cfg.Files = i.files
	if err := cfg.Validate(); err != nil {
		return err
	}
	bin := cfg.Binary
	if bin == "" {
		bin = qemu.DefaultBinary
	}
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("qemu binary %s: %w", bin, err)
	}
	return nil
}

// stage copies meta's image to the runtime directory for QEMU to load.
func (i *Instance) stage(store snapshot.Store, meta snapshot.Meta) (string, error) {
	p := filepath.Join(i.mgr.cfg.RuntimeDir, names.Name(names.SnapshotStage, i.mgr.owner, i.name))
	// A copy an earlier start of this instance could not remove.
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("stage snapshot: %w", err)
	}
	if err := store.Stage(meta, p); err != nil {
		return "", err
	}
	return p, nil
}

// unstage detaches the loaded image from QEMU and removes the copy; if
// QEMU keeps it, it goes when the instance stops.
func (i *Instance) unstage(ctx context.Context, mch *qemu.Machine, staged string) {
	if _, err := mch.Monitor().Execute(ctx, "blockdev-del", map[string]any{"node-name": qemu.SnapshotNode}); err != nil {
		i.mgr.log.Warn("detach the loaded snapshot", "instance", i.name, "err", err)
		i.push("staged snapshot", func() error { return os.Remove(staged) })
		return
	}
	if err := os.Remove(staged); err != nil {
		i.mgr.log.Warn("remove the loaded snapshot's copy", "path", staged, "err", err)
	}
}

// loadSnapshot loads the attached snapshot before the guest first runs,
// then re-arms its timer.
// then runs last, while the guest has not yet run: a marker written there
// comes before anything the restored guest prints.
func loadSnapshot(meta snapshot.Meta, then func()) func(ctx context.Context, mch *qemu.Machine) error {
	return func(ctx context.Context, mch *qemu.Machine) error {
		if err := snapshot.Load(ctx, mch.Monitor(), qemu.SnapshotNode, meta.Tag); err != nil {
			return err
		}
		if err := resumeTimer(ctx, mch, meta.Mtime); err != nil {
			return err
		}
		then()
		return nil
	}
}

// stipBit is mip.STIP, the supervisor timer interrupt pending bit.
const stipBit = 1 << 5

// resumeTimer works around QEMU's lost RISC-V timer (up to 10.1): a
// loaded state does not re-arm the supervisor timer, and about half of all
// restores leave a Linux guest whose sleeps never end. Raising mip.STIP
// through the gdbstub before the guest runs makes the kernel take a timer
// interrupt and program the next one.
func resumeTimer(ctx context.Context, mch *qemu.Machine, mtime uint64) error {
	if caps.TimerKept(mch.Argv()[0]) {
		return nil // probed: this QEMU saves and restores the timer
	}
	addr := mch.Paths().GDBSocket
	if addr == "" {
		return errors.New("no gdbstub to re-arm the guest's timer")
	}
	c, err := gdb.Dial(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	defer c.Close()
	if mtime != 0 {
		// mtime counts from this QEMU's start, behind the saved guest's
		// time: a write to it sets it back where the save left it.
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], mtime)
		if err := c.SetPhysicalMemory(ctx, true); err != nil {
			return fmt.Errorf("set the guest's timer: %w", err)
		}
		err := c.WriteMemory(ctx, snapshot.MtimeAddr, b[:])
		if perr := c.SetPhysicalMemory(ctx, false); err == nil {
			err = perr
		}
		if err != nil {
			return fmt.Errorf("set the guest's timer: %w", err)
		}
	}
	mip, err := c.ReadRegister(ctx, "mip")
	if err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	if err := c.WriteRegister(ctx, "mip", mip|stipBit); err != nil {
		return fmt.Errorf("re-arm the guest's timer: %w", err)
	}
	return nil
}

// deleteSnapshotTag removes a snapshot's part from the guest's writable
// qcow2 drives.
func (i *Instance) deleteSnapshotTag(ctx context.Context, tag string) error {
	mch, err := i.Running()
	if err != nil {
		return err
	}
	return snapshot.DeleteTag(ctx, mch.Monitor(), tag)
}
