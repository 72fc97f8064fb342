package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/storetest"
)

// An id carries its server, so that what a killed server left says by its
// name alone whether its work may still run.
func TestIDs(t *testing.T) {
	o := names.Owner{PID: 1234, StartTime: 5678}
	id := NewID(o)
	if got, ok := ParseID(id); !ok || got != o {
		t.Fatalf("ParseID(NewID(%v)) = %+v %v", o, got, ok)
	}
	for _, bad := range []string{"", "1-2", "0-1-a", "01-2-a", "1-0-a", "1-2-", "1-2-!", "x-2-a", "1-2-3-4", "4194305-1-a"} {
		if _, ok := ParseID(bad); ok {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
	for _, c := range []struct {
		file, suffix, name string
	}{
		{"my.snap.1234-5678-abc.qcow2", ".qcow2", "my.snap"},
		{IntentName("a", "1234-5678-abc"), ".intent", "a"},
		{RecordTemp("a", "1234-5678-abc"), ".json.tmp", "a"},
		{"run.1234-5678-abc", "", "run"},
	} {
		name, gotID, got, ok := SplitName(c.file, c.suffix)
		if !ok || name != c.name || gotID != "1234-5678-abc" || got != o {
			t.Errorf("SplitName(%q) = %q %q %+v %v", c.file, name, gotID, got, ok)
		}
	}
	for _, bad := range []string{"a.qcow2", "a.b.qcow2", ".1234-5678-abc.qcow2", "-a.1234-5678-abc.qcow2", "a.1234-5678-abc.json"} {
		if _, _, _, ok := SplitName(bad, ".qcow2"); ok {
			t.Errorf("SplitName(%q) accepted", bad)
		}
	}
	if got, ok := TempOwner(RecordTemp("a", "1234-5678-abc")); !ok || got != o {
		t.Errorf("TempOwner of a record being written: %+v %v", got, ok)
	}
	if got, ok := TempOwner(IntentName("a", "1234-5678-abc") + ".tmp"); !ok || got != o {
		t.Errorf("TempOwner of an intent being written: %+v %v", got, ok)
	}
	if _, ok := TempOwner("a.1234-5678-abc.json.tmp"); ok {
		t.Errorf("TempOwner accepted a file that is not hidden")
	}
}

func TestCheckName(t *testing.T) {
	k := Kind("snapshot")
	for _, ok := range []string{"a", "boot-1", "v1.2_rc", strings.Repeat("x", 64)} {
		if err := k.CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "../a", "a b", strings.Repeat("x", 65), "é"} {
		if err := k.CheckName(bad); err == nil || !strings.HasPrefix(err.Error(), "snapshot name ") || !strings.Contains(err.Error(), "1 to 64 letters") {
			t.Errorf("CheckName(%q) = %v", bad, err)
		}
	}
}

// A record written once fails on a temporary file already there; one
// rewritten overwrites what a killed update left. Intents are written once.
func TestWrites(t *testing.T) {
	dir := t.TempDir()
	if err := WriteRecord(dir, "a", "1-2-3", []byte(`{"v":1}`), true); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, RecordTemp("a", "1-2-4")), []byte("{"), 0o600)
	if err := WriteRecord(dir, "a", "1-2-4", []byte(`{"v":2}`), true); err == nil {
		t.Error("a record written once overwrote a temporary file it does not own")
	}
	if err := WriteRecord(dir, "a", "1-2-4", []byte(`{"v":3}`), false); err != nil {
		t.Fatal(err)
	}
	var v struct{ V int }
	if err := Kind("recording").ReadRecord(filepath.Join(dir, RecordName("a")), &v); err != nil || v.V != 3 {
		t.Errorf("the record: %+v %v", v, err)
	}
	p, err := WriteIntent(dir, "a", "1-2-5", []byte("{}"))
	if err != nil || p != filepath.Join(dir, ".a.1-2-5.intent") {
		t.Fatalf("intent %q %v", p, err)
	}
	os.WriteFile(filepath.Join(dir, IntentName("a", "1-2-6")+".tmp"), nil, 0o600)
	if _, err := WriteIntent(dir, "a", "1-2-6", []byte("{}")); err == nil {
		t.Error("an intent overwrote a temporary file it does not own")
	}
	want := []string{".a.1-2-5.intent", ".a.1-2-6.intent.tmp", "a.json"}
	if got := storetest.Files(t, dir); !slices.Equal(got, want) {
		t.Errorf("files: %q, want %q", got, want)
	}
	os.WriteFile(filepath.Join(dir, "c.json"), []byte("{"), 0o600)
	err = Kind("recording").ReadRecord(filepath.Join(dir, "c.json"), &v)
	if err == nil || !strings.HasPrefix(err.Error(), "recording record ") {
		t.Errorf("a damaged record: %v", err)
	}
	if err := Kind("recording").ReadRecord(filepath.Join(dir, "b.json"), &v); !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read recording record: ") {
		t.Errorf("a missing record: %v", err)
	}
}

type entry struct {
	Name       string `json:"name"`
	unreadable string
}

var entries = Reader[entry]{Kind: "entry",
	Read: func(path string) (entry, error) {
		var e entry
		return e, Kind("entry").ReadRecord(path, &e)
	},
	Name:       func(e entry) string { return e.Name },
	Unreadable: func(name, _ string, err error) entry { return entry{Name: name, unreadable: err.Error()} },
}

// The records of a directory: the readable ones, and the damaged ones by
// name; not temporaries, hidden files, or a record naming another entry.
func TestRecords(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"a.json": `{"name":"a"}`, "b.json": "{", "c.json": `{"name":"x"}`,
		".d.json": `{"name":"d"}`, ".a.1-2-3.json.tmp": `{"name":"a"}`, "e.txt": `{"name":"e"}`} {
		os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600)
	}
	os.Mkdir(filepath.Join(dir, "f.json"), 0o700)
	got, err := entries.In(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b entry) int { return strings.Compare(a.Name, b.Name) })
	if len(got) != 2 || got[0] != (entry{Name: "a"}) || got[1].Name != "b" || !strings.Contains(got[1].unreadable, "unexpected end of JSON input") {
		t.Errorf("records: %+v", got)
	}
	if got, err := entries.In(filepath.Join(dir, "none")); err != nil || got != nil {
		t.Errorf("a directory that does not exist: %+v %v", got, err)
	}
}

// A sweep visits the directories at its depth; it lists what it finds,
// and removes it only when it acts.
func TestSweep(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"p1/m1", "p1/m2", "p2/m1"} {
		os.MkdirAll(filepath.Join(root, d), 0o700)
		os.WriteFile(filepath.Join(root, d, "file"), nil, 0o600)
	}
	os.WriteFile(filepath.Join(root, "p3"), nil, 0o600) // not a directory
	os.MkdirAll(filepath.Join(root, "p1/m1/tree/sub"), 0o700)
	sweep := func(act bool) Report {
		r, err := SweepDirs(Kind("test"), root, 2, act, func(dir string, sw *Sweep) {
			rel, _ := filepath.Rel(root, dir)
			sw.Remove(filepath.Join(dir, "file"), Leftover{Path: rel + "/file"})
			if rel == "p1/m1" {
				sw.RemoveTree(filepath.Join(dir, "tree"), Leftover{Path: rel + "/tree"})
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	paths := func(ls []Leftover) (out []string) {
		for _, l := range ls {
			out = append(out, l.Path)
		}
		return out
	}
	want := []string{"p1/m1/file", "p1/m1/tree", "p1/m2/file", "p2/m1/file"}
	if sw := sweep(false); !slices.Equal(paths(sw.Removed), want) || len(sw.Errors) > 0 {
		t.Errorf("listed %q %q, want %q", paths(sw.Removed), sw.Errors, want)
	}
	if _, err := os.Stat(filepath.Join(root, "p1/m1/tree/sub")); err != nil {
		t.Fatalf("a listing removed: %v", err)
	}
	if sw := sweep(true); !slices.Equal(paths(sw.Removed), want) || len(sw.Errors) > 0 {
		t.Errorf("removed %q %q, want %q", paths(sw.Removed), sw.Errors, want)
	}
	for _, p := range []string{"p1/m1/file", "p1/m1/tree", "p2/m1/file"} {
		if _, err := os.Stat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after the sweep: %v", p, err)
		}
	}
	// What is gone meanwhile (another server's reap) counts as removed.
	if sw := sweep(true); !slices.Equal(paths(sw.Removed), want) || len(sw.Errors) > 0 {
		t.Errorf("again: %q %q", paths(sw.Removed), sw.Errors)
	}
	if sw, err := SweepDirs(Kind("test"), filepath.Join(root, "none"), 2, true, func(string, *Sweep) {
		t.Error("a store that does not exist has a directory")
	}); err != nil || len(sw.Removed) > 0 {
		t.Errorf("a store that does not exist: %+v %v", sw, err)
	}
	if _, err := SweepDirs(Kind("test"), filepath.Join(root, "p3"), 1, false, func(string, *Sweep) {}); err == nil || !strings.HasPrefix(err.Error(), "test store: ") {
		t.Errorf("a store that is a file: %v", err)
	}
}

// Remove removes what is there, passes over what is gone already, and
// reports what it could not remove without stopping at it.
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	a, gone, full, b := filepath.Join(dir, "a"), filepath.Join(dir, "gone"), filepath.Join(dir, "full"), filepath.Join(dir, "b")
	for _, p := range []string{a, b, filepath.Join(full, "x")} {
		os.MkdirAll(filepath.Dir(p), 0o700)
		os.WriteFile(p, nil, 0o600)
	}
	if err := Remove(a, gone); err != nil {
		t.Errorf("Remove of a file and of one gone: %v", err)
	}
	err := Remove(full, b)
	if err == nil || !strings.Contains(err.Error(), full) {
		t.Errorf("Remove of a full directory: %v, want it named", err)
	}
	for _, p := range []string{a, b} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after Remove: %v", p, err)
		}
	}
}
