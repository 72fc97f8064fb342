//go:build fixturegen

package recording

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestWriteFixture writes testdata/store through this code's Store, as
// recording servers that were then killed left it, and
// testdata/store.golden, what this code reads from it. Run it once, where
// the format is defined:
//
//	go test -tags fixturegen -run TestWriteFixture ./recording/
func TestWriteFixture(t *testing.T) {
	if err := os.RemoveAll("testdata/store"); err != nil {
		t.Fatal(err)
	}
	s := Store{Dir: "testdata/store", Owner: fixtureDead}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	begin := func(name string, m Meta) *Begun {
		b, err := s.Begin(fixtureRoot, name, m)
		must(err)
		fixtureImage(t, b.Meta.Image(), InitTag)
		return b
	}
	// "run": recorded to its end, with two checkpoints of two QEMUs.
	b := begin("run", Meta{})
	run, err := b.Commit(Meta{Instance: "default", Machine: fixtureMachine(), QEMU: "10.1.0", Binary: "/usr/bin/qemu-system-riscv64",
		LogVersion: 0xe0200e, Drives: []Drive{{Path: "/srv/disks/ro.img", Size: 1 << 20, ModTime: fixtureTime}}})
	must(err)
	must(os.WriteFile(run.Log(), make([]byte, HeaderSize+20), 0o600))
	must(WriteHeader(run.Log(), run.LogVersion))
	must(os.WriteFile(run.Console(), []byte("hello\n"), 0o600))
	run.State, run.Owner, run.Instructions, run.Seen, run.Ended, run.ConsoleBytes, run.Seconds = Complete, nil, 123456, 120000, EndedStopped, 6, 1.5
	must(s.Update(run))
	for _, c := range []Checkpoint{{ICount: 1000, Console: 3, QEMU: "10.1.0", Cost: 0.25}, {ICount: 500, Console: 1, QEMU: "9.2.0"}} {
		ck, err := s.NewCheckpoint(run, c.ICount)
		must(err)
		fixtureImage(t, ck.Path, CheckpointTag)
		ck.Console, ck.QEMU, ck.Cost = c.Console, c.QEMU, c.Cost
		must(s.CommitCheckpoint(ck))
	}
	// A checkpoint save killed before its record, and an update killed
	// while it wrote the record.
	ck, err := s.NewCheckpoint(run, 2000)
	must(err)
	must(os.WriteFile(ck.Path, []byte("partial"), 0o600))
	must(os.WriteFile(filepath.Join(filepath.Dir(run.Dir), "."+run.Name+"."+run.ID+".json.tmp"), []byte("{"), 0o600))

	// "cut": its server was killed while it recorded.
	c := begin("cut", Meta{})
	_, err = c.Commit(Meta{Instance: "second", Machine: fixtureMachine(), QEMU: "10.1.0", Binary: "/usr/bin/qemu-system-riscv64", Seen: 777})
	must(err)

	// "gone": its server was killed before the recording started.
	begin("gone", Meta{})

	// A damaged record.
	must(os.WriteFile(filepath.Join(s.projectDir(fixtureRoot), "bad.json"), []byte("{"), 0o600))

	must(os.WriteFile("testdata/store.golden", fixtureView(t, Store{Dir: s.Dir}), 0o644))
}

// fixtureImage makes a small qcow2 (512-byte clusters) that holds a
// machine state tagged tag, as far as its snapshot table says.
func fixtureImage(t *testing.T, path, tag string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	addState(t, path, tag)
}
