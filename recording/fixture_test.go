package recording

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// testdata/store is a recording store as the code of the format's
// definition wrote it (fixture_gen_test.go at the commit that added it),
// and testdata/store.golden what that code read from it: stores outlive
// the code that wrote them, so this code must read them the same.

const fixtureRoot = "/src/os"

var (
	// fixtureDead is the recording server: no process has its PID.
	fixtureDead = names.Owner{PID: names.MaxPID, StartTime: 1}
	fixtureTime = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

func fixtureMachine() snapshot.Machine {
	return snapshot.Machine{Machine: "virt", BIOS: snapshot.File{Path: "default"}, Memory: "128M", SMP: 1,
		Kernel: &snapshot.File{Path: "/src/os/build/Image", SHA256: "ef"}}
}

// fixtureRecording is what the store says of one recording, its fields not
// stored included, with the store's directory as $STORE.
type fixtureRecording struct {
	Meta        Meta         `json:"meta"`
	Dir         string       `json:"dir"`
	Status      string       `json:"status"`
	Unreadable  string       `json:"unreadable,omitempty"`
	Sized       [2]bool      `json:"sized"`
	Checkpoints []Checkpoint `json:"checkpoints"`
	CkPaths     []string     `json:"checkpoint_paths"`
	OfQEMU      int          `json:"of_qemu_10_1_0"`
	Verify      string       `json:"verify,omitempty"`
	Header      uint32       `json:"header"`
}

// fixtureView is everything the store reads from the fixture.
func fixtureView(t *testing.T, s Store) []byte {
	t.Helper()
	list, err := s.List(fixtureRoot)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		List      []fixtureRecording `json:"list"`
		Get       []fixtureRecording `json:"get"`
		Total     [2]bool            `json:"total"`
		Leftovers ReapReport         `json:"leftovers"`
	}
	view := func(m Meta) fixtureRecording {
		fr := fixtureRecording{Meta: m, Dir: m.Dir, Status: m.Status(), Unreadable: m.Unreadable(),
			Checkpoints: m.Checkpoints(""), OfQEMU: len(m.Checkpoints("10.1.0"))}
		total, cks := m.Size()
		fr.Sized = [2]bool{total > 0, cks > 0}
		for _, ck := range fr.Checkpoints {
			fr.CkPaths = append(fr.CkPaths, ck.Path)
		}
		if m.Unreadable() != "" {
			return fr
		}
		if err := VerifyImage(m.Image()); err != nil {
			fr.Verify = err.Error()
		}
		fr.Header, _ = ReadHeader(m.Log())
		return fr
	}
	for _, m := range list {
		v.List = append(v.List, view(m))
		if m.Unreadable() != "" {
			continue
		}
		got, err := s.Get(fixtureRoot, m.Name)
		if err != nil {
			t.Fatal(err)
		}
		v.Get = append(v.Get, view(got))
	}
	total, cks := s.Total()
	v.Total = [2]bool{total > 0, cks > 0}
	if v.Leftovers, err = s.Leftovers(); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(bytes.ReplaceAll(b, []byte(s.Dir), []byte("$STORE")), '\n')
}

// The ids the fixture's recordings and checkpoints got, and when.
const (
	fixtureRun    = "4194304-1-dn6n5e05mtun"
	fixtureCut    = "4194304-1-dn6n5ec1vys6"
	fixtureGone   = "4194304-1-dn6n5efk3kbw"
	fixtureCk1000 = "4194304-1-dn6n5e79k228"
	fixtureCk500  = "4194304-1-dn6n5e98wby3"
	fixtureCk2000 = "4194304-1-dn6n5ec1mehj"
)

func fixtureCreated(t *testing.T, s string) time.Time {
	t.Helper()
	c, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The fixture store reads as it was written: every field of every record
// and checkpoint, each recording's state now, what killed servers left,
// and the reap of it.
func TestFixtureStore(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/store")); err != nil {
		t.Fatal(err)
	}
	s := Store{Dir: dir}
	pdir := s.projectDir(fixtureRoot)
	dead := fixtureDead
	run := Meta{Name: "run", Project: fixtureRoot, ID: fixtureRun, Machine: fixtureMachine(), QEMU: "10.1.0", Binary: "/usr/bin/qemu-system-riscv64",
		LogVersion: 0xe0200e, Created: fixtureCreated(t, "2026-11-28T06:47:41.644077235Z"), State: Complete, Instance: "default",
		Instructions: 123456, Seen: 120000, Ended: EndedStopped, ConsoleBytes: 6, Seconds: 1.5,
		Drives: []Drive{{Path: "/srv/disks/ro.img", Size: 1 << 20, ModTime: fixtureTime}}, Dir: filepath.Join(pdir, "run."+fixtureRun)}
	cut := Meta{Name: "cut", Project: fixtureRoot, ID: fixtureCut, Machine: fixtureMachine(), QEMU: "10.1.0", Binary: "/usr/bin/qemu-system-riscv64",
		Created: fixtureCreated(t, "2026-11-28T06:47:42.363342058Z"), State: Recording, Owner: &dead, Instance: "second", Seen: 777,
		Dir: filepath.Join(pdir, "cut."+fixtureCut)}

	list, err := s.List(fixtureRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("listed %d recordings, want 3: %+v", len(list), list)
	}
	for k, w := range []Meta{cut, run} {
		got := list[k]
		if !got.Created.Equal(w.Created) {
			t.Errorf("%s: created %v, want %v", got.Name, got.Created, w.Created)
		}
		got.Created = w.Created
		for i, d := range got.Drives {
			if !d.ModTime.Equal(fixtureTime) {
				t.Errorf("%s: drive %s changed at %v, want %v", got.Name, d.Path, d.ModTime, fixtureTime)
			}
			got.Drives[i].ModTime = fixtureTime
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("recording %d:\n got %+v\nwant %+v", k, got, w)
		}
		if err := VerifyImage(got.Image()); err != nil {
			t.Errorf("%s: %v", got.Name, err)
		}
	}
	if list[0].Status() != Cut || list[1].Status() != Complete {
		t.Errorf("states now: %s %s", list[0].Status(), list[1].Status())
	}
	if bad := list[2]; bad.Name != "bad" || !strings.Contains(bad.Unreadable(), "unexpected end of JSON input") {
		t.Errorf("the damaged record: %+v", bad)
	}
	if v, err := ReadHeader(list[1].Log()); err != nil || v != 0xe0200e {
		t.Errorf("the log's header: %#x %v", v, err)
	}

	cks := list[1].Checkpoints("")
	wantCks := []Checkpoint{
		{ICount: 500, Console: 1, QEMU: "9.2.0", ID: fixtureCk500, Created: fixtureCreated(t, "2026-11-28T06:47:42.361033752Z"),
			Path: filepath.Join(run.Dir, "checkpoints", "ck-500."+fixtureCk500+".qcow2")},
		{ICount: 1000, Console: 3, QEMU: "10.1.0", Cost: 0.25, ID: fixtureCk1000, Created: fixtureCreated(t, "2026-11-28T06:47:42.191404997Z"),
			Path: filepath.Join(run.Dir, "checkpoints", "ck-1000."+fixtureCk1000+".qcow2")},
	}
	if len(cks) != len(wantCks) {
		t.Fatalf("checkpoints: %+v", cks)
	}
	for k, w := range wantCks {
		if !cks[k].Created.Equal(w.Created) {
			t.Errorf("checkpoint %d: created %v", k, cks[k].Created)
		}
		cks[k].Created = w.Created
		if !reflect.DeepEqual(cks[k], w) {
			t.Errorf("checkpoint %d:\n got %+v\nwant %+v", k, cks[k], w)
		}
	}
	if of := list[1].Checkpoints("10.1.0"); len(of) != 1 || of[0].ICount != 1000 {
		t.Errorf("QEMU 10.1.0's checkpoints: %+v", of)
	}

	rep, err := s.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, l := range rep.Removed {
		found = append(found, l.What+" "+strings.TrimPrefix(l.Path, pdir+"/"))
		if l.Owner == nil || *l.Owner != dead {
			t.Errorf("%s: owner %v", l, l.Owner)
		}
	}
	wantFound := []string{
		"intent .gone." + fixtureGone + ".intent",
		"partial checkpoint run." + fixtureRun + "/checkpoints/ck-2000." + fixtureCk2000 + ".qcow2",
		"partial recording gone." + fixtureGone,
		"record being written .run." + fixtureRun + ".json.tmp",
	}
	slices.Sort(found)
	if !slices.Equal(found, wantFound) || len(rep.Cut)+len(rep.Errors) > 0 {
		t.Errorf("leftovers:\n got %q\nwant %q\n%+v", found, wantFound, rep)
	}

	if golden, err := os.ReadFile("testdata/store.golden"); err != nil {
		t.Fatal(err)
	} else if got := fixtureView(t, s); !bytes.Equal(got, golden) {
		t.Errorf("the store reads otherwise than when it was written:\n%s\nwant (testdata/store.golden):\n%s", got, golden)
	}

	rep, err = s.Reap()
	if err != nil || !slices.Equal(rep.Cut, []string{"cut"}) || len(rep.Removed) != len(wantFound) {
		t.Fatalf("reap: %+v %v", rep, err)
	}
	got, err := s.Get(fixtureRoot, "cut")
	if err != nil || got.State != Cut || got.Owner != nil || !strings.Contains(got.Ended, "killed while it recorded") {
		t.Errorf("cut after the reap: %+v %v", got, err)
	}
	var left []string
	filepath.WalkDir(pdir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, strings.TrimPrefix(p, pdir+"/"))
		}
		return nil
	})
	wantLeft := []string{"bad.json", "cut." + fixtureCut + "/init.qcow2", "cut.json", "run." + fixtureRun + "/checkpoints/ck-1000." + fixtureCk1000 + ".json",
		"run." + fixtureRun + "/checkpoints/ck-1000." + fixtureCk1000 + ".qcow2", "run." + fixtureRun + "/checkpoints/ck-500." + fixtureCk500 + ".json",
		"run." + fixtureRun + "/checkpoints/ck-500." + fixtureCk500 + ".qcow2", "run." + fixtureRun + "/console.log", "run." + fixtureRun + "/init.qcow2",
		"run." + fixtureRun + "/log.bin", "run.json"}
	if !slices.Equal(left, wantLeft) {
		t.Errorf("after the reap:\n got %q\nwant %q", left, wantLeft)
	}
}
