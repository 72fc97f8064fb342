package tools

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
)

// SnapshotInput names a snapshot of a guest.
type SnapshotInput struct {
	Name string `json:"name" max:"64" jsonschema:"the snapshot's name: letters, digits, '.', '_', '-'"`
	Target
}

// SnapshotInfo is one snapshot as the tools show it.
type SnapshotInfo struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Size    int64     `json:"size" jsonschema:"bytes of disk the machine state takes"`
	// Machine summarises the configuration it needs.
	Machine string   `json:"machine"`
	QEMU    string   `json:"qemu"`
	Drives  []string `json:"drives,omitempty" jsonschema:"qcow2 drives that hold the disk part"`
	// Matches says whether the named guest runs that configuration and
	// the snapshot is whole.
	Matches *bool `json:"matches,omitempty" jsonschema:"the guest runs the machine it was saved on and the snapshot is whole (qemu_snapshot_load works)"`
	// Incomplete says which part is missing; such a snapshot never loads.
	Incomplete string `json:"incomplete,omitempty" jsonschema:"why the snapshot cannot load: a missing part (its image, the state in it, a drive's tag)"`
}

func info(m instance.SnapshotMeta) SnapshotInfo {
	var parts []string
	if k := m.Machine.Kernel; k != nil {
		parts = append(parts, "kernel "+filepath.Base(k.Path))
	}
	if r := m.Machine.Initrd; r != nil {
		parts = append(parts, "initrd "+filepath.Base(r.Path))
	}
	parts = append(parts, "memory "+m.Machine.Memory, fmt.Sprintf("smp %d", m.Machine.SMP))
	if len(m.Machine.Drives) > 0 {
		parts = append(parts, fmt.Sprintf("%d drives", len(m.Machine.Drives)))
	}
	if m.Machine.Network != "" {
		parts = append(parts, "network "+m.Machine.Network)
	}
	return SnapshotInfo{Name: m.Name, Created: m.Created, Size: m.Size, Machine: strings.Join(parts, ", "), QEMU: m.QEMU, Drives: m.Drives}
}

func (s *Server) snapshotSave(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, SnapshotInfo, error) {
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, SnapshotInfo{}, err
	}
	mgr, err := s.manager()
	if err != nil {
		return nil, SnapshotInfo{}, err
	}
	t := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	meta, err := inst.SaveSnapshot(ctx, in.Name)
	if err != nil {
		return nil, SnapshotInfo{}, err
	}
	out := info(meta)
	text := fmt.Sprintf("saved snapshot %q of %q in %d ms: %s (%s)", meta.Name, inst.Name(), time.Since(t).Milliseconds(), size(meta.Size), out.Machine)
	if total, keep := mgr.Snapshots().Store().Total(), mgr.KeepCap(); total > keep {
		text += fmt.Sprintf("; snapshots now take %s, over the %s the server keeps (--max-kept): delete some with qemu_snapshot_delete", size(total), size(keep))
	}
	return textResult(text), out, nil
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// SnapshotLoadOutput is qemu_snapshot_load's result.
type SnapshotLoadOutput struct {
	Name      string `json:"name"`
	PID       int    `json:"pid" jsonschema:"the QEMU now running the guest (the same one after a load in place)"`
	Cursor    int64  `json:"cursor" jsonschema:"serial cursor where output after the restore begins (after the marker line); reads go on from here"`
	ElapsedMS int64  `json:"elapsed_ms"`
	// DiscardedInput counts bytes typed for the old guest that it never
	// read: dropped, not delivered to the restored guest.
	DiscardedInput int `json:"discarded_input,omitempty"`
	// InPlace says the state was loaded into the running QEMU (QEMU 11);
	// otherwise a new QEMU runs the restored guest.
	InPlace bool `json:"in_place"`
	// Note says why a load in place gave way to a new QEMU.
	Note string `json:"note,omitempty"`
}

func (s *Server) snapshotLoad(ctx context.Context, req *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, SnapshotLoadOutput, error) {
	inst, err := s.instance(in.Target)
	if err != nil {
		return nil, SnapshotLoadOutput{}, err
	}
	t := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	meta, r, err := inst.LoadSnapshot(ctx, in.Name)
	if err != nil {
		return nil, SnapshotLoadOutput{}, err
	}
	s.setCursor(req, inst, r.Cursor)
	out := SnapshotLoadOutput{Name: meta.Name, Cursor: r.Cursor, ElapsedMS: time.Since(t).Milliseconds(), DiscardedInput: r.DiscardedInput,
		InPlace: r.InPlace, Note: r.Note, PID: r.PID}
	how := "new qemu"
	if r.InPlace {
		how = "in place, qemu"
	}
	text := fmt.Sprintf("restored %q to snapshot %q in %d ms (%s pid %d); output after the restore starts at cursor %d",
		inst.Name(), meta.Name, out.ElapsedMS, how, out.PID, r.Cursor)
	if r.DiscardedInput > 0 {
		text += fmt.Sprintf("; %d bytes typed for the old guest and not read by it were dropped", r.DiscardedInput)
	}
	if r.Note != "" {
		text += "; " + r.Note
	}
	return textResult(text), out, nil
}

// SnapshotListInput is qemu_snapshot_list's arguments.
type SnapshotListInput struct {
	ProjectRoot string `json:"project_root,omitempty" jsonschema:"the project whose snapshots to list; default the guest's, or the server's working directory"`
	Target
}

// SnapshotListOutput is qemu_snapshot_list's result.
type SnapshotListOutput struct {
	Project   string         `json:"project"`
	Snapshots []SnapshotInfo `json:"snapshots"`
	// Total is every project's snapshots together, against the cap.
	Total int64 `json:"total" jsonschema:"bytes all snapshots (every project) take"`
	Cap   int64 `json:"cap" jsonschema:"bytes the server keeps of transcripts, captures and snapshots (--max-kept)"`
	// More counts the older snapshots left out (see maxListed).
	More int `json:"more,omitempty" jsonschema:"older snapshots not listed"`
}

// maxListed bounds a list (about 200 characters a snapshot): a result
// stays far inside what a client shows the model.
const maxListed = 50

func (s *Server) snapshotList(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotListInput) (*mcp.CallToolResult, SnapshotListOutput, error) {
	root, inst, mgr, err := s.snapshotProject(in.ProjectRoot, in.Target)
	if err != nil {
		return nil, SnapshotListOutput{}, err
	}
	list, more, err := mgr.Snapshots().List(root, inst, maxListed)
	if err != nil {
		return nil, SnapshotListOutput{}, err
	}
	out := SnapshotListOutput{Project: root, Snapshots: []SnapshotInfo{}, Total: mgr.Snapshots().Store().Total(), Cap: mgr.KeepCap(), More: more}
	for _, ls := range list {
		si := info(ls.Meta)
		si.Incomplete, si.Matches = ls.Incomplete, ls.Loads
		out.Snapshots = append(out.Snapshots, si)
	}
	var names []string
	for _, si := range out.Snapshots {
		n := fmt.Sprintf("%s (%s, %s)", si.Name, size(si.Size), si.Created.Format(time.RFC3339))
		if si.Incomplete != "" {
			n = fmt.Sprintf("%s (INCOMPLETE: %s)", si.Name, si.Incomplete)
		}
		names = append(names, n)
	}
	text := fmt.Sprintf("%d snapshots in %s", len(names)+out.More, root)
	if out.More > 0 {
		text += fmt.Sprintf(" (the %d newest)", len(names))
	}
	if len(names) > 0 {
		text += ": " + strings.Join(names, ", ")
	}
	return textResult(text), out, nil
}

// snapshotProject is the project whose snapshots a call means:
// project_root, else the guest's, else the server's working directory,
// checked by the host-path policy. inst is the named guest, if it exists.
func (s *Server) snapshotProject(projectRoot string, t Target) (root string, inst *instance.Instance, mgr *instance.Manager, err error) {
	if mgr, err = s.manager(); err != nil {
		return "", nil, nil, err
	}
	inst, _ = s.instance(t)
	if root, err = mgr.Project(projectRoot, inst); err != nil {
		return "", nil, nil, err
	}
	return root, inst, mgr, nil
}

// SnapshotDeleteInput is qemu_snapshot_delete's arguments.
type SnapshotDeleteInput struct {
	Name        string `json:"name" max:"64" jsonschema:"the snapshot to delete"`
	ProjectRoot string `json:"project_root,omitempty" jsonschema:"the project it belongs to; default the guest's, or the server's working directory"`
	Target
}

// SnapshotDeleteOutput is qemu_snapshot_delete's result.
type SnapshotDeleteOutput struct {
	Deleted []SnapshotInfo `json:"deleted"`
	// Left names drives that still hold the snapshot's disk part.
	Left []string `json:"left_in_drives,omitempty" jsonschema:"qcow2 drives that still hold the snapshot's disk part (no guest has them attached): qemu-img snapshot -d TAG FILE removes it"`
}

func (s *Server) snapshotDelete(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotDeleteInput) (*mcp.CallToolResult, SnapshotDeleteOutput, error) {
	root, inst, mgr, err := s.snapshotProject(in.ProjectRoot, in.Target)
	if err != nil {
		return nil, SnapshotDeleteOutput{}, err
	}
	deleted, left, err := mgr.Snapshots().Delete(ctx, root, in.Name, inst)
	out := SnapshotDeleteOutput{Left: left}
	for _, m := range deleted {
		out.Deleted = append(out.Deleted, info(m))
	}
	if err != nil {
		return nil, out, err
	}
	text := fmt.Sprintf("deleted snapshot %q (%d)", in.Name, len(out.Deleted))
	if len(out.Left) > 0 {
		text += "; its disk part stays in " + strings.Join(out.Left, ", ")
	}
	return textResult(text), out, nil
}

func (s *Server) registerSnapshots(ms *mcp.Server) {
	add(s, ms, tool("qemu_snapshot_save", "Save snapshot", mutating,
		"Save the running guest's whole state (RAM, devices, and writable qcow2 drives) as a named snapshot of its project, replacing one of that name. The guest pauses briefly and runs on."), s.snapshotSave)
	add(s, ms, tool("qemu_snapshot_load", "Load snapshot", mutating,
		"Put the running guest back into a saved snapshot (in a fraction of a boot). The console goes on: a marker line, then the restored guest's output from the returned cursor."), s.snapshotLoad)
	add(s, ms, tool("qemu_snapshot_list", "List snapshots", reading,
		"List a project's snapshots: name, time, size, the machine each needs, and whether the guest runs it."), s.snapshotList)
	add(s, ms, tool("qemu_snapshot_delete", "Delete snapshot", mutating,
		"Delete a snapshot of a project."), s.snapshotDelete)
}
