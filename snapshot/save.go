package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
		out = append(out, Disk{Device: b.Device, Node: b.Inserted.NodeName, File: b.Inserted.File, Format: b.Inserted.Drv, ReadOnly: b.Inserted.RO})
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
	nodes := driveNodes(disks)
	if len(nodes) == 0 {
		return nil
	}
	return mon.RunJob(ctx, "snapshot-delete", map[string]any{"tag": tag, "devices": nodes})
}

// Save saves the running guest behind mon as the snapshot name of the
// project root and machine m: its machine state into a new image of the
// store, and the writable qcow2 drives' contents into those drives under
// the same tag. A writable drive of another format cannot hold a snapshot
// and fails the save before anything is written. The guest is paused for
// the save and runs on afterwards. drivePaths names the drives' host files
// for the record, by device ("drive0" ...). An older snapshot of the name
// is replaced only once the new one is complete.
func (s Store) Save(ctx context.Context, mon *qmp.Monitor, root string, m Machine, name, qemuVersion string, drivePaths map[string]string) (Meta, error) {
	if err := CheckName(name); err != nil {
		return Meta{}, err
	}
	disks, err := Disks(ctx, mon)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot: list the drives: %w", err)
	}
	tag := TagPrefix + name
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
			return Meta{}, fmt.Errorf("save snapshot: drive %s (%s) is writable %s, which cannot hold a snapshot of its contents: attach it with readonly: true, or convert it to qcow2 (qemu-img convert -O qcow2) and attach that", d.Device, path, d.Format)
		}
		nodes, kept = append(nodes, d.Node), append(kept, path)
	}
	dir := s.dir(root, m.Hash())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	tmp := filepath.Join(dir, "."+name+".qcow2.tmp-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Meta{}, fmt.Errorf("save snapshot: %w", err)
	}
	f.Close()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
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
	fail := func(step string, err error) (Meta, error) {
		return Meta{}, fmt.Errorf("save snapshot %q: %s: %w", name, step, err)
	}
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "file", "node-name": saveFileNode, "filename": tmp}); err != nil {
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
	if len(nodes) > 0 {
		// A drive may hold the tag from an older save of the name.
		err := mon.RunJob(ctx, "snapshot-delete", map[string]any{"tag": tag, "devices": nodes})
		var je *qmp.JobError
		if err != nil && !(errors.As(err, &je) && strings.Contains(je.Msg, "not")) {
			return fail("remove the older snapshot from the drives", err)
		}
	}
	// QEMU (up to 10.1) does not save the RISC-V timer's offset: the
	// guest is stopped to read mtime where the state is saved (the clock
	// stands still while it is stopped), so that a load can set it back.
	running, err := mon.Running(ctx)
	if err != nil {
		return fail("ask whether the guest runs", err)
	}
	if running {
		if _, err := mon.Execute(ctx, "stop", nil); err != nil {
			return fail("pause the guest", err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_, _ = mon.Execute(cctx, "cont", nil)
		}()
	}
	mtime, err := ReadMtime(ctx, mon)
	if err != nil {
		return fail("read the guest's timer", err)
	}
	if err := mon.RunJob(ctx, "snapshot-save", map[string]any{"tag": tag, "vmstate": saveNode, "devices": append([]string{saveNode}, nodes...)}); err != nil {
		return fail("save", err)
	}
	// Closed before it is kept: a load copies only a complete image.
	if err := detach(); err != nil {
		return fail("close its image", err)
	}
	meta, err := s.commit(Meta{Name: name, Project: root, Machine: m, Tag: tag, Created: time.Now().UTC(), QEMU: qemuVersion, Drives: kept, Mtime: mtime}, tmp)
	if err != nil {
		return Meta{}, err
	}
	ok = true
	return meta, nil
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
