//go:build fixturegen

package snapshot

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestWriteFixture writes testdata/store through this code's own writers,
// as a save writes its record and intent, and testdata/store.golden, what
// this code reads from it. Run it once, where the format is defined:
//
//	go test -tags fixturegen -run TestWriteFixture ./snapshot/
func TestWriteFixture(t *testing.T) {
	store := "testdata/store"
	if err := os.RemoveAll(store); err != nil {
		t.Fatal(err)
	}
	st := Store{Dir: store}
	t0 := fixtureTime
	m1, m2 := fixtureMachine("256M"), fixtureMachine("512M")
	dir1 := st.dir(fixtureRoot, m1.Hash())
	dir2 := st.dir(fixtureRoot, m2.Hash())
	for _, d := range []string{dir1, dir2} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	id := func(n string) string { return fixtureDead.Tag() + "-" + n }

	// Complete snapshots, written as Save writes them.
	saved := func(dir string, m Machine, name, id string, created time.Time, drives []string) {
		tag := tagFor(name, id)
		image := filepath.Join(dir, imageName(name, id))
		fixtureImage(t, image, tag)
		meta := Meta{Name: name, Project: filepath.Clean(fixtureRoot), Machine: m, Tag: tag, Created: created, QEMU: "10.1.0",
			Drives: drives, Mtime: 0x1234567, ID: id, Image: filepath.Base(image), Path: image}
		if fi, err := os.Stat(image); err == nil {
			meta.ImageSize = fi.Size()
		}
		b, err := json.MarshalIndent(meta, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := writeDurable(st.recordPath(fixtureRoot, m.Hash(), name), filepath.Join(dir, recordTempName(name, id)), b); err != nil {
			t.Fatal(err)
		}
	}
	saved(dir1, m1, "a", id("a1"), t0, []string{"/srv/disks/root.qcow2"})
	saved(dir2, m2, "a", id("a2"), t0.Add(time.Hour), nil)
	// "r": a save replaced it and was killed before removing the old
	// image: the old image, the new record, the intent.
	idOld, idNew := id("r1"), id("r2")
	fixtureImage(t, filepath.Join(dir1, imageName("r", idOld)), tagFor("r", idOld))
	saved(dir1, m1, "r", idNew, t0.Add(2*time.Hour), nil)
	if _, err := writeIntent(dir1, Intent{Name: "r", Part: Part{ID: idNew, Image: imageName("r", idNew), Tag: tagFor("r", idNew)},
		Replaces: &Part{ID: idOld, Image: imageName("r", idOld), Tag: tagFor("r", idOld)}, Owner: fixtureDead}); err != nil {
		t.Fatal(err)
	}

	// A record of the first version: no id, the image NAME.qcow2.
	fixtureImage(t, filepath.Join(dir1, "old.qcow2"), TagPrefix+"old")
	old := Meta{Name: "old", Project: filepath.Clean(fixtureRoot), Machine: m1, Tag: TagPrefix + "old", Created: t0.Add(-time.Hour), QEMU: "9.2.0", Mtime: 42}
	b, err := json.MarshalIndent(old, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeDurable(filepath.Join(dir1, "old.json"), filepath.Join(dir1, ".old.json.tmp"), b); err != nil {
		t.Fatal(err)
	}

	// "c": a first save killed after its image was created and while its
	// record was being written.
	idC := id("c1")
	if _, err := writeIntent(dir1, Intent{Name: "c", Part: Part{ID: idC, Image: imageName("c", idC), Tag: tagFor("c", idC)}, Owner: fixtureDead}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir1, imageName("c", idC)), "partial")
	writeFile(t, filepath.Join(dir1, recordTempName("c", idC)), "{")

	// A damaged record.
	writeFile(t, filepath.Join(dir1, "bad.json"), "{")

	if err := os.WriteFile("testdata/store.golden", fixtureView(t, st), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixtureImage makes a small qcow2 (512-byte clusters) that holds a
// machine state tagged tag, as far as its snapshot table says: qemu-img
// makes a disk-only snapshot, and its entry's vm_state_size is set.
func fixtureImage(t *testing.T, path, tag string) {
	t.Helper()
	for _, args := range [][]string{
		{"create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, "1M"},
		{"snapshot", "-c", tag, path},
	} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", args, err, out)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h [72]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	for _, c := range h[64:72] {
		off = off<<8 | int64(c)
	}
	if _, err := f.WriteAt([]byte{0, 0, 0x10, 0}, off+32); err != nil {
		t.Fatal(err)
	}
}
