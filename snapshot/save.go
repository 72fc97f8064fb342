package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// Node names of the image a save writes, while it is attached.
const (
	saveFileNode = "qmcp-save-file"
	saveNode     = "qmcp-save"
)

// stateImageSize is the qcow2's virtual size. The machine state is stored
// past the virtual disk, whatever its size; the disk itself stays empty.
const stateImageSize = 64 << 20

// Disk is a block device of the running guest, as query-block sees it.
type Disk struct {
	Device, Node, File, Format string
	ReadOnly                   bool
	// Tags are the internal snapshots the image holds now.
	Tags []string
}

// Disks lists the guest's block devices (not the snapshot's own node).
func Disks(ctx context.Context, mon *qmp.Monitor) ([]Disk, error) {
	raw, err := mon.Execute(ctx, "query-block", nil)
	if err != nil {
		return nil, err
	}
	var blocks []struct {
		Device   string `json:"device"`
		Inserted *struct {
			NodeName string `json:"node-name"`
			File     string `json:"file"`
			Drv      string `json:"drv"`
			RO       bool   `json:"ro"`
			Image    struct {
				Snapshots []struct {
					Name string `json:"name"`
				} `json:"snapshots"`
			} `json:"image"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, fmt.Errorf("query-block: %w", err)
	}
	var out []Disk
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		d := Disk{Device: b.Device, Node: b.Inserted.NodeName, File: b.Inserted.File, Format: b.Inserted.Drv, ReadOnly: b.Inserted.RO}
		for _, sn := range b.Inserted.Image.Snapshots {
			d.Tags = append(d.Tags, sn.Name)
		}
		out = append(out, d)
	}
	return out, nil
}

// driveNodes are the nodes of the guest's writable qcow2 drives: the ones
// that hold their part of a snapshot.
func driveNodes(disks []Disk) []string {
	var nodes []string
	for _, d := range disks {
		if !d.ReadOnly && d.Format == "qcow2" {
			nodes = append(nodes, d.Node)
		}
	}
	return nodes
}

// DeleteTag removes tag from the guest's writable qcow2 drives.
func DeleteTag(ctx context.Context, mon *qmp.Monitor, tag string) error {
	disks, err := Disks(ctx, mon)
	if err != nil {
		return err
	}
	return deleteTagFrom(ctx, mon, tag, disks, driveNodes(disks))
}

// deleteTagFrom removes tag from those of nodes whose image holds it, as
// disks say: QEMU fails a whole snapshot-delete for one node without the
// tag, and says so only in words.
func deleteTagFrom(ctx context.Context, mon *qmp.Monitor, tag string, disks []Disk, nodes []string) error {
	var holding []string
	for _, d := range disks {
		if slices.Contains(nodes, d.Node) && slices.Contains(d.Tags, tag) {
			holding = append(holding, d.Node)
		}
	}
	if len(holding) == 0 {
		return nil
	}
	return mon.RunJob(ctx, "snapshot-delete", map[string]any{"tag": tag, "devices": holding})
}

// Save saves the running guest behind mon as the snapshot name of the
// project root and machine m: its machine state into a new image of the
// store, and the writable qcow2 drives' contents into those drives under
// the save's own tag. A writable drive of another format cannot hold a
// snapshot and fails the save before anything is written. The guest is
// paused for the save and runs on afterwards. drivePaths names the drives'
// host files for the record, by device ("drive0" ...). pause, if not
// nil, runs the pause around the save of the state: a guest under a
// debugger is paused through it (debugger.Session.Paused), where a pause
// by QMP would tell the debugger of a stop it did not make.
//
// The save is a transaction (see the package comment): an older snapshot
// of the name stays whole until the new one is complete and switched to
// in one rename, and is removed only then. On failure what the save wrote
// is removed and the older snapshot is untouched.
func (s Store) Save(ctx context.Context, mon *qmp.Monitor, root string, m Machine, name, qemuVersion string, drivePaths map[string]string, pause func(ctx context.Context, f func() error) error) (Meta, error) {
	if err := CheckName(name); err != nil {
		return Meta{}, err
	}
	disks, err := Disks(ctx, mon)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot: list the drives: %w", err)
	}
	nodes, kept, err := writableDrives(disks, drivePaths)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	dir := s.dir(root, m.Hash())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	unlock, err := lockSaves(ctx, dir)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot %q: wait for another save of this machine: %w", name, err)
	}
	defer unlock()
	sv, err := s.beginSave(ctx, mon, dir, s.recordPath(root, m.Hash(), name), name, nodes, kept)
	if err != nil {
		return Meta{}, err
	}
	sv.timer = m.Timer()
	defer sv.undo()
	defer sv.detach()
	if err := sv.createImage(); err != nil {
		return Meta{}, err
	}
	var mtime uint64
	saveState := func() error {
		mtime, err = sv.saveState()
		return err
	}
	if pause != nil {
		err = pause(ctx, saveState)
	} else {
		err = saveState()
	}
	if err != nil {
		return Meta{}, err
	}
	meta := Meta{Name: name, Project: filepath.Clean(root), Machine: m, Tag: sv.intent.Tag, QEMU: qemuVersion, Drives: kept, Mtime: mtime,
		ID: sv.intent.ID, Image: sv.intent.Image, Path: sv.image}
	if err := sv.commit(meta); err != nil {
		return Meta{}, err
	}
	return sv.finish()
}

// save is one save's transaction (see Save): what it wrote so far, for
// the steps that follow and for the undo of a failure.
type save struct {
	s   Store
	ctx context.Context
	mon *qmp.Monitor
	log *slog.Logger
	// dir is the machine directory, record the name's record there,
	// image the new image's path.
	dir, record, image string
	// nodes are the writable drives' nodes, which get the save's tag.
	nodes []string
	// timer is the board timer whose count the snapshot keeps.
	timer      *arch.Timer
	intent     Intent
	intentPath string
	// attached are the nodes of the image attached to the guest.
	attached []string
	// wroteTags: the drives may hold the save's tag; committed: the
	// record names the new snapshot, which is the name's from then on.
	wroteTags, committed bool
}

// writableDrives are the nodes and host files (by drivePaths, else as
// QEMU names them) of the guest's writable drives, which all must be
// qcow2 to hold their part of a snapshot.
func writableDrives(disks []Disk, drivePaths map[string]string) (nodes, paths []string, err error) {
	for _, d := range disks {
		if d.ReadOnly {
			continue
		}
		path := drivePaths[d.Device]
		if path == "" {
			path = d.File
		}
		if d.Format != "qcow2" {
			return nil, nil, &DriveFormatError{Device: d.Device, Path: path, Format: d.Format}
		}
		nodes, paths = append(nodes, d.Node), append(paths, path)
	}
	return nodes, paths, nil
}

// beginSave names the save's parts and writes its intent, which names
// them and the snapshot of the name it replaces (its record at record).
func (s Store) beginSave(ctx context.Context, mon *qmp.Monitor, dir, record, name string, nodes, drives []string) (*save, error) {
	id := store.NewID(s.owner())
	sv := &save{s: s, ctx: ctx, mon: mon, log: store.Logger(s.Logger).With("snapshot", name), dir: dir, record: record,
		image: filepath.Join(dir, imageName(name, id)), nodes: nodes}
	sv.intent = Intent{Name: name, Part: Part{ID: id, Image: imageName(name, id), Tag: tagFor(name, id)}, Drives: drives, Owner: s.owner()}
	if old, err := read(record); err == nil {
		sv.intent.Replaces = &Part{ID: old.ID, Image: old.Image, Tag: old.Tag}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("save snapshot %q: read the snapshot it replaces: %w", name, err)
	}
	var err error
	if sv.intentPath, err = writeIntent(dir, sv.intent); err != nil {
		return nil, sv.fail("begin", err)
	}
	sv.step("intent")
	return sv, nil
}

// fail is the error of the failed step; it says when the store is short
// of space, and that the older snapshot is unchanged.
func (sv *save) fail(step string, err error) error {
	name := sv.intent.Name
	err = fmt.Errorf("save snapshot %q: %s: %w", name, step, err)
	if free, ok := freeSpace(sv.dir); ok && free < 64<<20 {
		err = fmt.Errorf("%w (%w)", err, &LowSpaceError{Dir: sv.s.Dir, Free: free})
	}
	if sv.intent.Replaces != nil {
		err = fmt.Errorf("%w; the snapshot %q saved before is unchanged", err, name)
	}
	return err
}

// step logs a step done (a test kills the save at each).
func (sv *save) step(what string) { sv.log.Debug("snapshot save", "step", what, "id", sv.intent.ID) }

// undo removes what an uncommitted save wrote; the older snapshot was not
// touched. If that fails too, the intent stays for the reaper.
func (sv *save) undo() {
	if sv.committed {
		return
	}
	var errs []error
	if sv.wroteTags {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(sv.ctx), 30*time.Second)
		errs = append(errs, deleteTagIfPresent(dctx, sv.mon, sv.intent.Tag, sv.nodes))
		cancel()
	}
	errs = append(errs, store.Remove(sv.image))
	if err := errors.Join(errs...); err != nil {
		sv.log.Warn("undo a failed snapshot save: the reaper finishes it", "id", sv.intent.ID, "err", err)
		return
	}
	os.Remove(sv.intentPath)
}

// createImage creates the image and has QEMU format and open it.
func (sv *save) createImage() error {
	f, err := os.OpenFile(sv.image, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return sv.fail("create its image", err)
	}
	f.Close()
	if _, err := sv.mon.Execute(sv.ctx, "blockdev-add", map[string]any{"driver": "file", "node-name": saveFileNode, "filename": sv.image}); err != nil {
		return sv.fail("attach its image", err)
	}
	sv.attached = append(sv.attached, saveFileNode)
	if err := sv.mon.RunJob(sv.ctx, "blockdev-create", map[string]any{"options": map[string]any{"driver": "qcow2", "file": saveFileNode, "size": stateImageSize}}); err != nil {
		return sv.fail("format its image", err)
	}
	if _, err := sv.mon.Execute(sv.ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": saveNode, "file": saveFileNode}); err != nil {
		return sv.fail("open its image", err)
	}
	sv.attached = append(sv.attached, saveNode)
	sv.step("image")
	return nil
}

// detach detaches whatever the save attached, also on failure, and also
// when its context has ended: the guest must not keep a node on a removed
// file.
func (sv *save) detach() error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(sv.ctx), 10*time.Second)
	defer cancel()
	var errs []error
	for i := len(sv.attached) - 1; i >= 0; i-- {
		if _, err := sv.mon.Execute(dctx, "blockdev-del", map[string]any{"node-name": sv.attached[i]}); err != nil {
			errs = append(errs, err)
		}
	}
	sv.attached = nil
	return errors.Join(errs...)
}

// saveState saves the machine state into the image and the drives'
// contents under the save's tag, and returns the guest's mtime at the
// save. QEMU (up to 10.1) does not save the RISC-V timer's offset: the
// guest is stopped to read mtime where the state is saved (the clock
// stands still while it is stopped), so that a load can set it back; it
// runs on afterwards, whatever happened.
func (sv *save) saveState() (uint64, error) {
	running, err := sv.mon.Running(sv.ctx)
	if err != nil {
		return 0, sv.fail("ask whether the guest runs", err)
	}
	resume := func() {}
	if running {
		if _, err := sv.mon.Execute(sv.ctx, "stop", nil); err != nil {
			return 0, sv.fail("pause the guest", err)
		}
		var once sync.Once
		resume = func() {
			once.Do(func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(sv.ctx), 10*time.Second)
				defer cancel()
				_, _ = sv.mon.Execute(cctx, "cont", nil)
			})
		}
		defer resume()
	}
	mtime, err := ReadTimer(sv.ctx, sv.mon, sv.timer)
	if err != nil {
		return 0, sv.fail("read the guest's timer", err)
	}
	sv.wroteTags = len(sv.nodes) > 0
	if err := sv.mon.RunJob(sv.ctx, "snapshot-save", map[string]any{"tag": sv.intent.Tag, "vmstate": saveNode, "devices": append([]string{saveNode}, sv.nodes...)}); err != nil {
		return 0, sv.fail("save", err)
	}
	resume() // the rest does not need the guest paused
	sv.step("saved")
	return mtime, nil
}

// commit closes, syncs and checks the image, then writes the record meta:
// a record never names an image that is not whole, and from the record's
// rename on the snapshot is the name's.
func (sv *save) commit(meta Meta) error {
	if err := sv.detach(); err != nil {
		return sv.fail("close its image", err)
	}
	if err := store.SyncFile(sv.image); err != nil {
		return sv.fail("write its image to disk", err)
	}
	meta.Created = time.Now().UTC()
	if fi, err := os.Stat(sv.image); err == nil {
		meta.ImageSize = fi.Size()
	}
	if err := Verify(meta); err != nil {
		return sv.fail("check what it wrote", err)
	}
	sv.step("synced")
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return sv.fail("record", err)
	}
	if err := store.WriteRecord(sv.dir, meta.Name, meta.ID, b, true); err != nil {
		return sv.fail("record", err)
	}
	sv.committed = true
	sv.step("committed")
	return nil
}

// finish removes the snapshot the save replaced, its image and its tag in
// the drives, then the intent, and returns the new snapshot. What it
// cannot remove, the intent left names for the reaper.
func (sv *save) finish() (Meta, error) {
	if old := sv.intent.Replaces; old != nil {
		errs := []error{store.Remove(filepath.Join(sv.dir, old.Image))}
		sv.step("old image removed")
		if len(sv.nodes) > 0 && old.Tag != sv.intent.Tag {
			errs = append(errs, deleteTagIfPresent(sv.ctx, sv.mon, old.Tag, sv.nodes))
		}
		if err := errors.Join(errs...); err != nil {
			sv.log.Warn("remove the snapshot this save replaced: the reaper finishes it", "err", err)
			return read(sv.record)
		}
		sv.step("old tag removed")
	}
	if err := os.Remove(sv.intentPath); err != nil {
		sv.log.Warn("remove a finished save's intent", "err", err)
	}
	sv.step("done")
	return read(sv.record)
}

// saving holds a token per machine directory while a save into it runs.
// Two saves of one name at once would each replace the snapshot the other
// read, and the image of the first to commit would be left with no record
// naming it. Saves of this process are serialised here; another server
// cannot save into the project meanwhile, since the repository lock lets
// only one server run its guests.
var saving sync.Map // machine directory -> chan struct{} (capacity 1)

func lockSaves(ctx context.Context, dir string) (func(), error) {
	v, _ := saving.LoadOrStore(dir, make(chan struct{}, 1))
	sem := v.(chan struct{})
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// freeSpace is what the file system of dir has free.
func freeSpace(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * st.Bsize, true
}

// deleteTagIfPresent removes tag from the drive nodes that hold it.
func deleteTagIfPresent(ctx context.Context, mon *qmp.Monitor, tag string, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	disks, err := Disks(ctx, mon)
	if err != nil {
		return err
	}
	return deleteTagFrom(ctx, mon, tag, disks, nodes)
}

// Load loads the snapshot tag into the stopped guest behind mon: the
// machine state from the image attached as node (qemu.SnapshotNode), the
// writable qcow2 drives' contents from their own snapshot of tag.
func Load(ctx context.Context, mon *qmp.Monitor, node, tag string) error {
	disks, err := Disks(ctx, mon)
	if err != nil {
		return fmt.Errorf("load snapshot: list the drives: %w", err)
	}
	devices := append([]string{node}, driveNodes(disks)...)
	if err := mon.RunJob(ctx, "snapshot-load", map[string]any{"tag": tag, "vmstate": node, "devices": devices}); err != nil {
		return fmt.Errorf("load snapshot: %w", err)
	}
	return nil
}

// ReadTimer reads the count of the guest's board timer t through HMP (xp),
// which QMP lacks; 0 without one (its QEMU keeps the timer).
func ReadTimer(ctx context.Context, mon *qmp.Monitor, t *arch.Timer) (uint64, error) {
	if t == nil {
		return 0, nil
	}
	raw, err := mon.Execute(ctx, "human-monitor-command", map[string]any{"command-line": fmt.Sprintf("xp /1gx %#x", t.Counter)})
	if err != nil {
		return 0, err
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, fmt.Errorf("xp: %w", err)
	}
	// "000000000200bff8: 0x0000000001a3b4c5"
	_, v, ok := strings.Cut(strings.TrimSpace(out), ": ")
	if !ok {
		return 0, fmt.Errorf("xp answered %q", out)
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(v), "0x"), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("xp answered %q", out)
	}
	return n, nil
}
