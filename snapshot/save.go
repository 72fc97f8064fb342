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
// host files for the record, by device ("drive0" ...).
//
// The save is a transaction (see the package comment): an older snapshot
// of the name stays whole until the new one is complete and switched to
// in one rename, and is removed only then. On failure what the save wrote
// is removed and the older snapshot is untouched.
func (s Store) Save(ctx context.Context, mon *qmp.Monitor, root string, m Machine, name, qemuVersion string, drivePaths map[string]string) (Meta, error) {
	if err := CheckName(name); err != nil {
		return Meta{}, err
	}
	log := s.logger().With("snapshot", name)
	disks, err := Disks(ctx, mon)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot: list the drives: %w", err)
	}
	var nodes, kept []string
	for _, d := range disks {
		if d.ReadOnly {
			continue
		}
		path := drivePaths[d.Device]
		if path == "" {
			path = d.File
		}
		if d.Format != "qcow2" {
			return Meta{}, fmt.Errorf("save snapshot: %w", &DriveFormatError{Device: d.Device, Path: path, Format: d.Format})
		}
		nodes, kept = append(nodes, d.Node), append(kept, path)
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
	id := newID(s.owner())
	tag := tagFor(name, id)
	image := filepath.Join(dir, imageName(name, id))
	intent := Intent{Name: name, Part: Part{ID: id, Image: filepath.Base(image), Tag: tag}, Drives: kept, Owner: s.owner()}
	if old, err := read(s.recordPath(root, m.Hash(), name)); err == nil {
		intent.Replaces = &Part{ID: old.ID, Image: old.Image, Tag: old.Tag}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("save snapshot %q: read the snapshot it replaces: %w", name, err)
	}
	fail := func(step string, err error) (Meta, error) {
		err = fmt.Errorf("save snapshot %q: %s: %w", name, step, err)
		if free, ok := freeSpace(dir); ok && free < 64<<20 {
			err = fmt.Errorf("%w (%w)", err, &LowSpaceError{Dir: s.Dir, Free: free})
		}
		if intent.Replaces != nil {
			err = fmt.Errorf("%w; the snapshot %q saved before is unchanged", err, name)
		}
		return Meta{}, err
	}
	step := func(what string) { log.Debug("snapshot save", "step", what, "id", id) }
	intentPath, err := writeIntent(dir, intent)
	if err != nil {
		return fail("begin", err)
	}
	step("intent")
	committed, wroteTags := false, false
	defer func() {
		if committed {
			return
		}
		// Undo what this save wrote; the older snapshot was not touched.
		// If that fails too, the intent stays for the reaper.
		var errs []error
		if wroteTags {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			errs = append(errs, deleteTagIfPresent(dctx, mon, tag, nodes))
			cancel()
		}
		if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			log.Warn("undo a failed snapshot save: the reaper finishes it", "id", id, "err", err)
			return
		}
		os.Remove(intentPath)
	}()
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fail("create its image", err)
	}
	f.Close()
	// Detach whatever this save attached, also on failure, and also when
	// ctx has ended: the guest must not keep a node on a removed file.
	var attached []string
	detach := func() error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var errs []error
		for i := len(attached) - 1; i >= 0; i-- {
			if _, err := mon.Execute(dctx, "blockdev-del", map[string]any{"node-name": attached[i]}); err != nil {
				errs = append(errs, err)
			}
		}
		attached = nil
		return errors.Join(errs...)
	}
	defer detach()
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "file", "node-name": saveFileNode, "filename": image}); err != nil {
		return fail("attach its image", err)
	}
	attached = append(attached, saveFileNode)
	if err := mon.RunJob(ctx, "blockdev-create", map[string]any{"options": map[string]any{"driver": "qcow2", "file": saveFileNode, "size": stateImageSize}}); err != nil {
		return fail("format its image", err)
	}
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": saveNode, "file": saveFileNode}); err != nil {
		return fail("open its image", err)
	}
	attached = append(attached, saveNode)
	step("image")
	// QEMU (up to 10.1) does not save the RISC-V timer's offset: the
	// guest is stopped to read mtime where the state is saved (the clock
	// stands still while it is stopped), so that a load can set it back.
	running, err := mon.Running(ctx)
	if err != nil {
		return fail("ask whether the guest runs", err)
	}
	resume := func() {}
	if running {
		if _, err := mon.Execute(ctx, "stop", nil); err != nil {
			return fail("pause the guest", err)
		}
		var once sync.Once
		resume = func() {
			once.Do(func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				_, _ = mon.Execute(cctx, "cont", nil)
			})
		}
		defer resume()
	}
	mtime, err := ReadMtime(ctx, mon)
	if err != nil {
		return fail("read the guest's timer", err)
	}
	wroteTags = len(nodes) > 0
	if err := mon.RunJob(ctx, "snapshot-save", map[string]any{"tag": tag, "vmstate": saveNode, "devices": append([]string{saveNode}, nodes...)}); err != nil {
		return fail("save", err)
	}
	resume() // the rest does not need the guest paused
	step("saved")
	// Closed, synced and checked before it is named: a record never names
	// an image that is not whole.
	if err := detach(); err != nil {
		return fail("close its image", err)
	}
	if err := syncFile(image); err != nil {
		return fail("write its image to disk", err)
	}
	meta := Meta{Name: name, Project: filepath.Clean(root), Machine: m, Tag: tag, Created: time.Now().UTC(), QEMU: qemuVersion,
		Drives: kept, Mtime: mtime, ID: id, Image: filepath.Base(image), Path: image}
	if fi, err := os.Stat(image); err == nil {
		meta.ImageSize = fi.Size()
	}
	if err := Verify(meta); err != nil {
		return fail("check what it wrote", err)
	}
	step("synced")
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fail("record", err)
	}
	recPath := s.recordPath(root, m.Hash(), name)
	if err := writeDurable(recPath, filepath.Join(dir, recordTempName(name, id)), b); err != nil {
		return fail("record", err)
	}
	committed = true
	step("committed")
	// The new snapshot is the name's now; the older one goes.
	if old := intent.Replaces; old != nil {
		var errs []error
		if err := os.Remove(filepath.Join(dir, old.Image)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		step("old image removed")
		if len(nodes) > 0 && old.Tag != tag {
			errs = append(errs, deleteTagIfPresent(ctx, mon, old.Tag, nodes))
		}
		if err := errors.Join(errs...); err != nil {
			// The new snapshot is whole; the intent stays so that the
			// reaper removes the rest.
			log.Warn("remove the snapshot this save replaced: the reaper finishes it", "err", err)
			return read(recPath)
		}
		step("old tag removed")
	}
	if err := os.Remove(intentPath); err != nil {
		log.Warn("remove a finished save's intent", "err", err)
	}
	step("done")
	return read(recPath)
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

func (s Store) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
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

// MtimeAddr is the virt board's ACLINT mtime register.
const MtimeAddr = 0x200bff8

// ReadMtime reads the guest's mtime through HMP (xp), which QMP lacks.
func ReadMtime(ctx context.Context, mon *qmp.Monitor) (uint64, error) {
	raw, err := mon.Execute(ctx, "human-monitor-command", map[string]any{"command-line": fmt.Sprintf("xp /1gx %#x", MtimeAddr)})
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
