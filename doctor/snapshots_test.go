package doctor_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/doctor"
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

// doctor lists what a killed recording start left and a recording whose
// server died while it recorded; --cleanup removes the first and marks the
// second cut.
func TestDoctorRecordingLeftovers(t *testing.T) {
	rt := filepath.Join(t.TempDir(), "rt")
	os.Mkdir(rt, 0o700)
	store := t.TempDir()
	dir := filepath.Join(store, "proj-00000000")
	os.MkdirAll(dir, 0o700)
	// A start killed before its record (no process has pid 4194303),
	// and a recording whose server was killed while it recorded.
	partial := filepath.Join(dir, "a.4194303-7-1")
	os.Mkdir(partial, 0o700)
	os.WriteFile(filepath.Join(dir, ".a.4194303-7-1.intent"), []byte(`{"name":"a","id":"4194303-7-1"}`), 0o600)
	os.Mkdir(filepath.Join(dir, "b.4194303-7-2"), 0o700)
	os.WriteFile(filepath.Join(dir, "b.json"), []byte(`{"name":"b","id":"4194303-7-2","state":"recording","owner":{"pid":4194303,"start_time":7}}`), 0o600)

	var out bytes.Buffer
	if err := doctor.Run(rt, &out, doctor.Options{Recordings: store}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "left by killed recordings and checkpoint saves (doctor --cleanup removes them)") || !strings.Contains(out.String(), partial) {
		t.Fatalf("doctor:\n%s", out.String())
	}
	out.Reset()
	if err := doctor.Run(rt, &out, doctor.Options{Recordings: store, Cleanup: true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "removed") || !strings.Contains(out.String(), "recording b: its server was killed while it recorded; marked cut") {
		t.Fatalf("doctor --cleanup:\n%s", out.String())
	}
	if _, err := os.Stat(partial); err == nil {
		t.Error("--cleanup left the partial recording")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "b.json")); !strings.Contains(string(b), `"state": "cut"`) {
		t.Errorf("b after cleanup: %s", b)
	}
}
