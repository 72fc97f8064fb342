package snapshot

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/storetest"
)

func needQEMUImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not found: run scripts/deps (installs qemu-utils)")
	}
}

func qemuImg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v %s", args, err, out)
	}
	return string(out)
}

func tags(t *testing.T, disk string) []string {
	t.Helper()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snaps, err := InternalSnapshots(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range snaps {
		out = append(out, s.Name)
	}
	return out
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// What killed saves leave is judged by the owner its names carry: a dead
// server's partial image, record temporary and intent go, with the tags
// the intent wrote into a drive that no record names (through qemu-img,
// once no QEMU holds the drive); a live server's save in progress and
// every complete snapshot stay.
func TestReapLeftovers(t *testing.T) {
	needQEMUImg(t)
	self, err := proc.Self()
	if err != nil {
		t.Fatal(err)
	}
	me := names.Owner{PID: self.PID, StartTime: self.StartTime}
	root := t.TempDir()
	st := Store{Dir: filepath.Join(root, "store"), Owner: me}
	dir := st.dir("/proj", "m1")
	os.MkdirAll(dir, 0o700)
	disk := filepath.Join(root, "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", disk, "1M")

	idNew, idLive, idB := writeKilledSaves(t, dir, disk, me)

	// A QEMU holds the drive: its tags stay, reported.
	if _, err := exec.LookPath("qemu-system-riscv64"); err == nil {
		checkHeldDrive(t, st, disk, store.IntentName("b", idB))
	}
	// Listing changes nothing.
	list, err := st.Leftovers()
	if err != nil || len(list.Removed) == 0 {
		t.Fatalf("leftovers %+v %v", list, err)
	}
	rep, err := st.Reap()
	if err != nil || len(rep.Errors) > 0 || len(rep.Left) > 0 {
		t.Fatalf("reap: %+v %v", rep, err)
	}
	want := []string{".d." + idLive + ".intent", ".e.qcow2.tmp-young", "c.json", imageName("c", idNew), imageName("d", idLive)}
	slices.Sort(want)
	if got := storetest.Files(t, dir); !slices.Equal(got, want) {
		t.Errorf("after the reap: %v\nwant %v", got, want)
	}
	if got := tags(t, disk); !slices.Equal(got, []string{tagFor("c", idNew)}) {
		t.Errorf("the drive's tags after the reap: %v", got)
	}
	for _, l := range rep.Removed {
		t.Logf("removed %s", l)
	}
	// Nothing more the second time.
	if rep, _ := st.Reap(); len(rep.Removed) > 0 {
		t.Errorf("a second reap removed %+v", rep.Removed)
	}
}

// writeKilledSaves writes into dir, and into the drive disk, what saves
// left: of a dead server, one killed after it replaced "c" and one killed
// half-way through a first save of "b"; of the live server me, a save of
// "d" in progress; and the first version's leftovers, one old and one
// young. It returns the ids of c's new save, d's and b's.
func writeKilledSaves(t *testing.T, dir, disk string, me names.Owner) (idNew, idLive, idB string) {
	t.Helper()
	dead := storetest.Dead
	idOld, idNew, idLive := dead.Tag()+"-1", dead.Tag()+"-2", me.Tag()+"-3"
	// "c": a dead save replaced the old snapshot (committed), then was
	// killed before removing the old image and tag.
	for _, id := range []string{idOld, idNew} {
		qemuImg(t, "create", "-q", "-f", "qcow2", filepath.Join(dir, imageName("c", id)), "1M")
		qemuImg(t, "snapshot", "-c", tagFor("c", id), disk)
	}
	writeJSON(t, filepath.Join(dir, "c.json"), Meta{Name: "c", Tag: tagFor("c", idNew), ID: idNew, Image: imageName("c", idNew), Drives: []string{disk}})
	writeJSON(t, filepath.Join(dir, store.IntentName("c", idNew)), Intent{Name: "c", Part: Part{ID: idNew, Image: imageName("c", idNew), Tag: tagFor("c", idNew)},
		Drives: []string{disk}, Replaces: &Part{ID: idOld, Image: imageName("c", idOld), Tag: tagFor("c", idOld)}, Owner: dead})
	// "b": a dead first save killed half-way: its tag, its image, no record.
	idB = dead.Tag() + "-4"
	qemuImg(t, "snapshot", "-c", tagFor("b", idB), disk)
	os.WriteFile(filepath.Join(dir, imageName("b", idB)), []byte("partial"), 0o600)
	writeJSON(t, filepath.Join(dir, store.IntentName("b", idB)), Intent{Name: "b", Part: Part{ID: idB, Image: imageName("b", idB), Tag: tagFor("b", idB)}, Drives: []string{disk}, Owner: dead})
	os.WriteFile(filepath.Join(dir, store.RecordTemp("b", idB)), []byte("{"), 0o600)
	// "d": this server's save in progress.
	os.WriteFile(filepath.Join(dir, imageName("d", idLive)), []byte("writing"), 0o600)
	writeJSON(t, filepath.Join(dir, store.IntentName("d", idLive)), Intent{Name: "d", Part: Part{ID: idLive, Image: imageName("d", idLive), Tag: tagFor("d", idLive)}, Owner: me})
	// The first version's leftovers: judged by age.
	os.WriteFile(filepath.Join(dir, ".e.qcow2.tmp-old"), nil, 0o600)
	os.Chtimes(filepath.Join(dir, ".e.qcow2.tmp-old"), time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
	os.WriteFile(filepath.Join(dir, ".e.qcow2.tmp-young"), nil, 0o600)
	return idNew, idLive, idB
}

// checkHeldDrive reaps while a QEMU holds the drive disk: the tags in it
// stay, reported, and so does the intent that names them.
func checkHeldDrive(t *testing.T, st Store, disk, intent string) {
	t.Helper()
	q := exec.Command("qemu-system-riscv64", "-S", "-nodefaults", "-display", "none", "-machine", "virt",
		"-drive", "file="+disk+",format=qcow2,if=none,id=d0", "-device", "virtio-blk-device,drive=d0")
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	rep, err := st.Reap()
	q.Process.Kill() // the process this test started, by its handle
	q.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Left) != 2 || !rep.Left[0].Held || !strings.Contains(rep.Left[0].Why, "qemu-img snapshot -d") {
		t.Fatalf("with the drive held: left %+v", rep.Left)
	}
	if !slices.Contains(storetest.Files(t, st.dir("/proj", "m1")), intent) {
		t.Fatal("the intent went while its tag stayed")
	}
}

// Verify names each missing part; the cap counts complete snapshots only.
func TestVerifyAndTotal(t *testing.T) {
	needQEMUImg(t)
	root := t.TempDir()
	st := Store{Dir: filepath.Join(root, "store")}
	dir := st.dir("/proj", "m1")
	os.MkdirAll(dir, 0o700)
	disk := filepath.Join(root, "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", disk, "1M")
	img := filepath.Join(dir, "a.1-2-3.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", img, "1M")
	qemuImg(t, "snapshot", "-c", "qemu-mcp-a.1-2-3", img)
	writeJSON(t, filepath.Join(dir, "a.json"), Meta{Name: "a", Tag: "qemu-mcp-a.1-2-3", ID: "1-2-3", Image: "a.1-2-3.qcow2", Drives: []string{disk}})
	os.WriteFile(filepath.Join(dir, "b.9-9-9.qcow2"), make([]byte, 1<<20), 0o600) // a leftover: no record
	m, err := st.Get("/proj", "m1", "a")
	if err != nil {
		t.Fatal(err)
	}
	err = Verify(m)
	var inc *IncompleteError
	if !errorsAs(err, &inc) || len(inc.Parts) != 2 || !strings.Contains(inc.Parts[0], "holds no machine state") || !strings.Contains(inc.Parts[1], "has no snapshot qemu-mcp-a.1-2-3") {
		t.Fatalf("verify: %v", err)
	}
	qemuImg(t, "snapshot", "-c", "qemu-mcp-a.1-2-3", disk)
	os.Remove(img)
	if err := Verify(m); !errorsAs(err, &inc) || len(inc.Parts) != 1 || !strings.Contains(inc.Parts[0], "is missing") {
		t.Fatalf("verify without the image: %v", err)
	}
	if n := st.Total(); n != 0 {
		t.Errorf("total %d: counts what no record names", n)
	}
}

func errorsAs(err error, target **IncompleteError) bool {
	e, ok := err.(*IncompleteError)
	if ok {
		*target = e
	}
	return ok
}
