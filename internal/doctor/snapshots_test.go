package doctor_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/doctor"
)

// doctor lists what killed snapshot saves left, and --cleanup removes it;
// a complete snapshot is never touched.
func TestDoctorSnapshotLeftovers(t *testing.T) {
	rt := filepath.Join(t.TempDir(), "rt")
	os.Mkdir(rt, 0o700)
	store := t.TempDir()
	dir := filepath.Join(store, "proj-00000000", "m1")
	os.MkdirAll(dir, 0o700)
	// A partial image of a save whose server (no process has this pid)
	// was killed, and the first version's partial image, an hour old.
	partial := filepath.Join(dir, "a.4194304-7-1.qcow2")
	os.WriteFile(partial, []byte("partial"), 0o600)
	os.WriteFile(filepath.Join(dir, "a.json"), []byte(`{"name":"a","tag":"qemu-mcp-a","image":"a.qcow2"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "a.qcow2"), []byte("whole"), 0o600)

	var out bytes.Buffer
	if err := doctor.Run(rt, &out, doctor.Options{Snapshots: store}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "left by killed snapshot saves (doctor --cleanup removes them)") || !strings.Contains(out.String(), partial) {
		t.Fatalf("doctor:\n%s", out.String())
	}
	if _, err := os.Stat(partial); err != nil {
		t.Fatal("listing removed it")
	}
	out.Reset()
	if err := doctor.Run(rt, &out, doctor.Options{Snapshots: store, Cleanup: true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "left by killed snapshot saves, removed") {
		t.Fatalf("doctor --cleanup:\n%s", out.String())
	}
	if _, err := os.Stat(partial); err == nil {
		t.Error("--cleanup left the partial image")
	}
	for _, keep := range []string{"a.json", "a.qcow2"} {
		if _, err := os.Stat(filepath.Join(dir, keep)); err != nil {
			t.Errorf("--cleanup removed %s", keep)
		}
	}
}
