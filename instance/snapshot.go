package instance

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// SnapshotSpec is a saved state to boot into: the project's snapshot of
// that name saved on the machine the boot gives (Manager.Boot finds it).
type SnapshotSpec struct {
	Name string
	meta snapshot.Meta // found by Boot
}

// Snapshots are the server's saved states: one store every instance saves
// into and loads from, found by project, name and machine.
type Snapshots struct{ m *Manager }

// Snapshots are the server's saved states.
func (m *Manager) Snapshots() Snapshots { return Snapshots{m} }

// Store is the snapshot store.
func (s Snapshots) Store() snapshot.Store {
	return snapshot.Store{Dir: s.m.cfg.Snapshots, Owner: s.m.owner, Logger: s.m.log}
}

// Find returns the project root's snapshots called name (one a
// machine they were saved on), or a *snapshot.NotFoundError.
func (s Snapshots) Find(root, name string) ([]snapshot.Meta, error) {
	if err := snapshot.CheckName(name); err != nil {
		return nil, err
	}
	metas, err := s.Store().Find(root, name)
	if err != nil {
		return nil, err
	}
	if len(metas) == 0 {
		return nil, &snapshot.NotFoundError{Name: name, Root: root}
	}
	return metas, nil
}

// Machine is the machine the project root's snapshot name was
// saved on, as boot arguments, for a boot that gives none. It is a
// *snapshot.AmbiguousError if several machines have a snapshot of that
// name.
func (s Snapshots) Machine(root, name string) (profile.Profile, error) {
	metas, err := s.Find(root, name)
	if err != nil {
		return profile.Profile{}, err
	}
	if len(metas) > 1 {
		return profile.Profile{}, &snapshot.AmbiguousError{Name: name, Root: root, N: len(metas)}
	}
	return s.m.machineArgs(metas[0].Machine), nil
}

// machineArgs is the machine mach (a snapshot's or a recording's) as boot
// arguments; the path of its architecture's built-in kernel, which a boot
// that names none boots, is left out.
func (m *Manager) machineArgs(mach snapshot.Machine) profile.Profile {
	p := profile.Profile{Arch: mach.Arch, BIOS: mach.BIOS.Path, Memory: mach.Memory, SMP: mach.SMP, Append: mach.Append,
		ExtraArgs: mach.ExtraArgs, GPU: mach.GPU, VirtioModern: mach.VirtioModern, Network: mach.Network}
	// An architecture this server does not know (a later server's
	// record) has no built-in kernel here: the path is kept.
	a, err := archs.Lookup(mach.Arch)
	if k := mach.Kernel; k != nil && (err != nil || !mach.KernelIs(m.platform(a).Kernel)) {
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
		p.Shares = append(p.Shares, qemu.Share{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable})
	}
	return p
}

// findBoot finds the snapshot spec.Snapshot names among those
// saved on the machine spec.QEMU gives, or says how the machines differ.
func (s Snapshots) findBoot(spec *Spec) error {
	name := spec.Snapshot.Name
	if spec.Snapshot.meta.Path != "" {
		return nil // found already (the package's tests give one)
	}
	metas, err := s.Find(spec.Root, name)
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

// List lists the project root's snapshots, newest first, at
// most max of them (more counts the others). With inst running a guest
// of the project, each says whether it loads into it; that asks QEMU
// nothing.
func (s Snapshots) List(root string, inst *Instance, max int) (list []ListedSnapshot, more int, err error) {
	metas, err := s.Store().List(root)
	if err != nil {
		return nil, 0, err
	}
	if len(metas) > max {
		more, metas = len(metas)-max, metas[:max]
	}
	running := inst != nil && inst.Process() != nil && inst.Spec().Root == root
	for _, meta := range metas {
		ls := ListedSnapshot{Meta: meta}
		var inc *snapshot.IncompleteError
		if err := snapshot.Verify(meta); errors.As(err, &inc) {
			ls.Incomplete = inc.Reason()
		}
		if running {
			ok := ls.Incomplete == "" && (&restoring{i: inst, meta: meta}).checkMachine() == nil
			ls.Loads = &ok
		}
		list = append(list, ls)
	}
	return list, more, nil
}

// Delete deletes the project root's snapshots called name (one a
// machine). A snapshot's disk part is removed from its drives through
// inst, if inst runs the machine it was saved on and has the drives
// attached; left names the drives that keep it otherwise.
func (s Snapshots) Delete(ctx context.Context, root, name string, inst *Instance) (deleted []snapshot.Meta, left []string, err error) {
	metas, err := s.Find(root, name)
	if err != nil {
		return nil, nil, err
	}
	store := s.Store()
	for _, meta := range metas {
		if len(meta.Drives) > 0 {
			// The disk part lives in the drives: a running guest that
			// has them removes it through QEMU.
			if inst == nil || inst.Process() == nil || (&restoring{i: inst, meta: meta}).checkMachine() != nil || deleteTag(ctx, inst, meta.Tag) != nil {
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
	mach, err := i.vm.describe()
	if err != nil {
		return snapshot.Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	shares := map[string]string{}
	for _, sh := range i.vm.cfg.Shares {
		shares[sh.Tag] = sh.Path
	}
	if err := snapshot.CheckSavable(ctx, mch.Monitor(), shares); err != nil {
		return snapshot.Meta{}, fmt.Errorf("save snapshot %q: %w", name, err)
	}
	drives := map[string]string{}
	for k, d := range i.vm.cfg.Drives {
		drives[fmt.Sprintf("drive%d", k)] = d.Path
	}
	var pause func(ctx context.Context, f func() error) error
	if d := i.Debugger(); d != nil {
		pause = d.Paused
	}
	meta, err := i.mgr.Snapshots().Store().Save(ctx, mch.Monitor(), i.spec.Root, mach, name, mch.Version(), drives, pause)
	if err != nil {
		return snapshot.Meta{}, err
	}
	i.mgr.enforceCap()
	return meta, nil
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

// LoadSnapshot restores the guest to its project's snapshot name saved on
// the machine it runs (see restoring.restore), and returns that snapshot.
// If none of that name can load, the error says why for each.
func (i *Instance) LoadSnapshot(ctx context.Context, name string) (snapshot.Meta, Restored, error) {
	if _, err := i.Running(); err != nil {
		return snapshot.Meta{}, Restored{}, err
	}
	metas, err := i.mgr.Snapshots().Find(i.spec.Root, name)
	if err != nil {
		return snapshot.Meta{}, Restored{}, err
	}
	var errs []error
	for _, meta := range metas {
		r := &restoring{i: i, store: i.mgr.Snapshots().Store(), meta: meta}
		err := r.checkMachine()
		if err == nil {
			res, err := r.restore(ctx)
			if m := i.Process(); err == nil && m != nil {
				res.PID = m.PID()
			}
			return meta, res, err
		}
		errs = append(errs, err)
	}
	return snapshot.Meta{}, Restored{}, errors.Join(errs...)
}

// deleteTag removes a snapshot's part from the guest's writable
// qcow2 drives.
func deleteTag(ctx context.Context, i *Instance, tag string) error {
	mch, err := i.Running()
	if err != nil {
		return err
	}
	return snapshot.DeleteTag(ctx, mch.Monitor(), tag)
}
