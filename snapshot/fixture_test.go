package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

// testdata/store is a snapshot store as the code of the format's
// definition wrote it (fixture_gen_test.go at the commit that added it),
// and testdata/store.golden what that code read from it: stores outlive
// the code that wrote them, so this code must read them the same.

const fixtureRoot = "/src/os"

var (
	// fixtureDead is the saving server: no process has its PID.
	fixtureDead = names.Owner{PID: names.MaxPID, StartTime: 1}
	fixtureTime = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

func fixtureMachine(memory string) Machine {
	return Machine{Machine: "virt", BIOS: File{Path: "default"},
		Kernel: &File{Path: "/src/os/build/Image", SHA256: strings.Repeat("ab", 32)},
		Initrd: &File{Path: "/src/os/build/initrd", SHA256: strings.Repeat("cd", 32)},
		Memory: memory, SMP: 2, Append: "console=ttyS0",
		Drives:  []Drive{{Path: "/srv/disks/root.qcow2", Format: "qcow2", Bus: "virtio"}, {Path: "/srv/disks/ro.img", Format: "raw", ReadOnly: true}},
		Network: "user", VirtioModern: true, ExtraArgs: []string{"-rtc", "base=utc"},
		Shares: []Share{{Path: "/src/os/share", Tag: "src", Writable: true}}}
}

// fixtureMeta is what the store says of one snapshot, its fields not
// stored included, with the store's directory as $STORE.
type fixtureMeta struct {
	Meta       Meta   `json:"meta"`
	Path       string `json:"path"`
	Record     string `json:"record"`
	Sized      bool   `json:"sized"`
	Unreadable string `json:"unreadable,omitempty"`
	Verify     string `json:"verify,omitempty"`
}

// fixtureView is everything the store reads from the fixture.
func fixtureView(t *testing.T, st Store) []byte {
	t.Helper()
	list, err := st.List(fixtureRoot)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		List      []fixtureMeta  `json:"list"`
		Get       []fixtureMeta  `json:"get"`
		Find      map[string]int `json:"find"`
		Total     bool           `json:"total"`
		Leftovers ReapReport     `json:"leftovers"`
	}
	view := func(m Meta) fixtureMeta {
		fm := fixtureMeta{Meta: m, Path: m.Path, Record: m.record, Sized: m.Size > 0, Unreadable: m.unreadable}
		fm.Meta.Size = 0 // what the file system allocated
		if err := Verify(m); err != nil {
			fm.Verify = err.Error()
		}
		return fm
	}
	v.Find = map[string]int{}
	for _, m := range list {
		v.List = append(v.List, view(m))
		found, err := st.Find(fixtureRoot, m.Name)
		if err != nil {
			t.Fatal(err)
		}
		v.Find[m.Name] = len(found)
		if m.unreadable != "" {
			continue
		}
		got, err := st.Get(fixtureRoot, m.Machine.Hash(), m.Name)
		if err != nil {
			t.Fatal(err)
		}
		v.Get = append(v.Get, view(got))
	}
	v.Total = st.Total() > 0
	if v.Leftovers, err = st.Leftovers(); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(bytes.ReplaceAll(b, []byte(st.Dir), []byte("$STORE")), '\n')
}

// The fixture store reads as it was written: every field of every record,
// the snapshots of the first version, what killed saves left, and the
// reap of it.
func TestFixtureStore(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/store")); err != nil {
		t.Fatal(err)
	}
	st := Store{Dir: dir}
	m1, m2 := fixtureMachine("256M"), fixtureMachine("512M")
	dir1, dir2 := st.dir(fixtureRoot, m1.Hash()), st.dir(fixtureRoot, m2.Hash())
	id := func(n string) string { return fixtureDead.Tag() + "-" + n }
	want := func(dir string, m Machine, name, id string, created time.Time, drives []string) Meta {
		image := imageName(name, id)
		fi, err := os.Stat(filepath.Join(dir, image))
		if err != nil {
			t.Fatal(err)
		}
		return Meta{Name: name, Project: fixtureRoot, Machine: m, Tag: tagFor(name, id), Created: created, QEMU: "10.1.0", Mtime: 0x1234567,
			Drives: drives, ID: id, Image: image, ImageSize: fi.Size(), Path: filepath.Join(dir, image), record: filepath.Join(dir, name+".json")}
	}
	old := Meta{Name: "old", Project: fixtureRoot, Machine: m1, Tag: "qemu-mcp-old", Created: fixtureTime.Add(-time.Hour), QEMU: "9.2.0", Mtime: 42,
		Image: "old.qcow2", Path: filepath.Join(dir1, "old.qcow2"), record: filepath.Join(dir1, "old.json")}
	wants := []Meta{
		want(dir1, m1, "r", id("r2"), fixtureTime.Add(2*time.Hour), nil),
		want(dir2, m2, "a", id("a2"), fixtureTime.Add(time.Hour), nil),
		want(dir1, m1, "a", id("a1"), fixtureTime, []string{"/srv/disks/root.qcow2"}),
		old,
	}

	list, err := st.List(fixtureRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(wants)+1 {
		t.Fatalf("listed %d snapshots, want %d: %+v", len(list), len(wants)+1, list)
	}
	for k, w := range wants {
		got := list[k]
		if got.Size <= 0 {
			t.Errorf("%s: size %d", got.Name, got.Size)
		}
		if !got.Created.Equal(w.Created) {
			t.Errorf("%s: created %v, want %v", got.Name, got.Created, w.Created)
		}
		got.Size, got.Created = 0, w.Created
		if !reflect.DeepEqual(got, w) {
			t.Errorf("snapshot %d:\n got %+v\nwant %+v", k, got, w)
		}
	}
	bad := list[len(wants)]
	if bad.Name != "bad" || !strings.Contains(bad.unreadable, "unexpected end of JSON input") || bad.record != filepath.Join(dir1, "bad.json") {
		t.Errorf("the damaged record: %+v", bad)
	}
	for _, m := range list {
		err := Verify(m)
		var inc *IncompleteError
		switch m.Name + "." + m.ID {
		case "a." + id("a1"):
			if !errors.As(err, &inc) || len(inc.Parts) != 1 || !strings.Contains(inc.Parts[0], "drive /srv/disks/root.qcow2") {
				t.Errorf("verify a, whose drive is not here: %v", err)
			}
		case "bad.":
			if !errors.As(err, &inc) || !strings.Contains(err.Error(), "its record is unreadable") {
				t.Errorf("verify bad: %v", err)
			}
		default:
			if err != nil {
				t.Errorf("verify %s: %v", m.Name, err)
			}
		}
	}

	rep, err := st.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, l := range rep.Removed {
		found = append(found, l.What+" "+filepath.Base(l.Path))
		if l.What != "replaced image" && (l.Owner == nil || *l.Owner != fixtureDead) {
			t.Errorf("%s: owner %v", l, l.Owner)
		}
	}
	wantFound := []string{
		"intent " + intentName("c", id("c1")),
		"intent " + intentName("r", id("r2")),
		"partial image " + imageName("c", id("c1")),
		"record being written " + recordTempName("c", id("c1")),
		"replaced image " + imageName("r", id("r1")),
	}
	slices.Sort(found)
	if !slices.Equal(found, wantFound) {
		t.Errorf("leftovers:\n got %q\nwant %q", found, wantFound)
	}
	if len(rep.Broken) != 1 || !strings.HasPrefix(rep.Broken[0], "bad: its record is unreadable") || len(rep.Errors)+len(rep.Left) > 0 {
		t.Errorf("report: %+v", rep)
	}

	if golden, err := os.ReadFile("testdata/store.golden"); err != nil {
		t.Fatal(err)
	} else if got := fixtureView(t, st); !bytes.Equal(got, golden) {
		t.Errorf("the store reads otherwise than when it was written:\n%s\nwant (testdata/store.golden):\n%s", got, golden)
	}

	if _, err := st.Reap(); err != nil {
		t.Fatal(err)
	}
	left := []string{"a.json", imageName("a", id("a1")), "bad.json", "old.json", "old.qcow2", "r.json", imageName("r", id("r2"))}
	slices.Sort(left)
	if got := files(t, dir1); !slices.Equal(got, left) {
		t.Errorf("after the reap:\n got %q\nwant %q", got, left)
	}
	if got := files(t, dir2); !slices.Equal(got, []string{imageName("a", id("a2")), "a.json"}) {
		t.Errorf("the other machine's after the reap: %q", got)
	}
}
