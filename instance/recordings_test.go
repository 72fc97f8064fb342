package instance

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
)

// The Manager owns the recordings: a recording guest's recording is
// listed, refused deletion while it records, ended as stopped, matched to
// the machine a replay gives, its machine given back as boot arguments,
// and deleted.
func TestRecordingsOwnedByManager(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, "", func(c *Config) { c.Recordings = filepath.Join(t.TempDir(), "recordings") })
	root := t.TempDir()

	if _, err := m.recs.Find(root, "run"); !errors.Is(err, recording.ErrNotFound) {
		t.Fatalf("find before any recording: %v", err)
	}
	spec := tinySpec(t, "a", root)
	spec.Record = &RecordSpec{Name: "run"}
	i, _, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var since int64
	expect(t, ctx, i, &since, tinyPrompt)
	list, err := m.recs.List(root)
	if err != nil || len(list.Recordings) != 1 || list.Recordings[0].Name != "run" || list.Total <= 0 || list.Cap != m.KeepCap() {
		t.Fatalf("list while it records: %+v %v", list, err)
	}
	var inUse *RecordingInUseError
	if _, err := m.recs.Delete(root, "run"); !errors.As(err, &inUse) || inUse.Guest != "a" || inUse.Replayed {
		t.Fatalf("delete while it records: %v", err)
	}
	if _, err := i.Stop(ctx, qemu.Quit, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	meta, err := m.recs.Find(root, "run")
	if err != nil || meta.Status() != recording.Complete || meta.Ended != recording.EndedStopped {
		t.Fatalf("after the stop: %+v %v", meta, err)
	}

	args, err := m.recs.Machine(root, "run")
	if err != nil || args.Kernel == "" || args.Memory != meta.Machine.Memory {
		t.Errorf("the recording's machine as arguments: %+v %v", args, err)
	}
	other := tinySpec(t, "b", root, qemu.WithMemory("256M"))
	other.Replay = &ReplaySpec{Name: "run"}
	var differs *recording.MachineError
	if err := m.recs.findReplay(&other); !errors.As(err, &differs) || len(differs.Diffs) == 0 {
		t.Errorf("a replay on another machine: %v", err)
	}
	same := tinySpec(t, "b", root)
	same.Replay = &ReplaySpec{Name: "run"}
	if err := m.recs.findReplay(&same); err != nil || same.Replay.Meta.Dir != meta.Dir {
		t.Errorf("a replay on the recording's machine: %+v %v", same.Replay, err)
	}

	release, err := m.recs.claim(meta, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.recs.Delete(root, "run"); !errors.As(err, &inUse) || inUse.Guest != "b" || !inUse.Replayed {
		t.Errorf("delete while it is replayed: %v", err)
	}
	release()
	if _, err := m.recs.Delete(root, "run"); err != nil {
		t.Fatal(err)
	}
	if list, _ := m.recs.List(root); len(list.Recordings) != 0 {
		t.Errorf("listed after the delete: %+v", list.Recordings)
	}
}
