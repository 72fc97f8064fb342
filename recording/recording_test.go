package recording

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

// deadOwner is a server that is not running: a PID no process has.
func deadOwner(t *testing.T) names.Owner {
	t.Helper()
	for pid := names.MaxPID - 1; pid > 1000; pid-- {
		if _, err := os.Stat("/proc/" + itoa(pid)); os.IsNotExist(err) {
			return names.Owner{PID: pid, StartTime: 12345}
		}
	}
	t.Fatal("no free pid")
	return names.Owner{}
}

func itoa(n int) string { return strconv.Itoa(n) }

// addInit makes the image hold a machine state tagged init, as QEMU's
// rrsnapshot would (through qemu-img: a snapshot without machine state
// fails the check, so the test edits the table's state size).
func addState(t *testing.T, image, tag string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "snapshot", "-c", tag, image).CombinedOutput(); err != nil {
		t.Skipf("qemu-img: %v %s (scripts/deps installs qemu-utils)", err, out)
	}
	// The table entry's vm_state_size (offset 32 of the entry) is 0 for
	// a disk-only snapshot; QEMU's has the state's size.
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h [72]byte
	f.ReadAt(h[:], 0)
	off := int64(h[64])<<56 | int64(h[65])<<48 | int64(h[66])<<40 | int64(h[67])<<32 | int64(h[68])<<24 | int64(h[69])<<16 | int64(h[70])<<8 | int64(h[71])
	f.WriteAt([]byte{0, 0, 0x10, 0}, off+32)
}

// started is a recording of name that s began and whose QEMU saved its
// first state, not yet committed.
func started(t *testing.T, s Store, root, name string) *Begun {
	t.Helper()
	b, err := s.Begin(root, name, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.NewImage(); err != nil {
		t.Fatal(err)
	}
	addState(t, b.Meta.Image(), InitTag)
	return b
}

// committed is a recording of name that s began and committed.
func committed(t *testing.T, s Store, root, name string) Meta {
	t.Helper()
	m, err := started(t, s, root, name).Commit(Meta{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCommitReplaceDelete(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	root := "/src/os"
	b, err := s.Begin(root, "run", Meta{Instance: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := s.List(root); len(ms) != 0 {
		t.Fatalf("a recording that did not start is listed: %+v", ms)
	}
	if err := b.NewImage(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Commit(Meta{}); err == nil || !strings.Contains(err.Error(), "no machine state") {
		t.Fatalf("commit of an image without the machine: %v", err)
	}
	addState(t, b.Meta.Image(), InitTag)
	m, err := b.Commit(Meta{Instance: "default", LogVersion: 0xe0200c})
	if err != nil {
		t.Fatal(err)
	}
	if m.Status() != Recording {
		t.Errorf("a recording of this live server is %q", m.Status())
	}
	// A second recording of the name replaces it once committed.
	b2 := started(t, s, root, "run")
	if ms, _ := s.List(root); len(ms) != 1 || ms[0].ID != m.ID {
		t.Fatalf("before the commit the old recording is the name's: %+v", ms)
	}
	m2, err := b2.Commit(Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := s.List(root); len(ms) != 1 || ms[0].ID != m2.ID {
		t.Fatalf("after the commit: %+v", ms)
	}
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Errorf("the replaced recording's files stay: %v", err)
	}
	m2.State, m2.Owner, m2.Instructions = Complete, nil, 12345
	if err := s.Update(m2); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(root, "run")
	if err != nil || got.Status() != Complete || got.Instructions != 12345 {
		t.Fatalf("get: %+v %v", got, err)
	}
	if err := s.Delete(got); err != nil {
		t.Fatal(err)
	}
	if ms, _ := s.List(root); len(ms) != 0 {
		t.Errorf("deleted, still listed: %+v", ms)
	}
	if _, err := os.Stat(got.Dir); !os.IsNotExist(err) {
		t.Errorf("deleted, its files stay: %v", err)
	}
	rep, _ := s.Leftovers()
	if len(rep.Removed) != 0 {
		t.Errorf("leftovers after clean work: %+v", rep)
	}
}

func TestAbortKeepsOld(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	old := committed(t, s, "/p", "run")
	b2, _ := s.Begin("/p", "run", Meta{})
	b2.NewImage()
	b2.Abort()
	if ms, _ := s.List("/p"); len(ms) != 1 || ms[0].ID != old.ID {
		t.Fatalf("after an abort: %+v", ms)
	}
	if _, err := os.Stat(b2.Meta.Dir); !os.IsNotExist(err) {
		t.Errorf("an aborted recording's files stay")
	}
	rep, _ := s.Leftovers()
	if len(rep.Removed) != 0 {
		t.Errorf("leftovers: %+v", rep)
	}
}

// What a server killed at each point of a recording's start left: the
// reaper removes what no record names, keeps what a live server makes,
// and marks a recording whose server died while it recorded as cut.
func TestReap(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	k := killRecordings(t, Store{Dir: s.Dir, Owner: deadOwner(t)})
	live, _ := s.Begin("/p", "c", Meta{}) // this live server's: kept
	rep, err := s.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	var what []string
	for _, l := range rep.Removed {
		what = append(what, l.What+" "+filepath.Base(l.Path))
	}
	slices.Sort(what)
	t.Logf("leftovers: %v", what)
	for _, want := range []string{"intent " + filepath.Base(k.intentA), "partial recording " + filepath.Base(k.dirA), "partial checkpoint " + filepath.Base(k.ck),
		"record being written " + filepath.Base(k.tmp), "intent " + filepath.Base(k.intentB), "partial recording " + filepath.Base(k.replaced)} {
		if !slices.Contains(what, want) {
			t.Errorf("leftovers lack %q", want)
		}
	}
	if slices.ContainsFunc(what, func(w string) bool { return strings.Contains(w, live.Meta.ID) || strings.Contains(w, "b."+k.b.ID+"/") }) {
		t.Errorf("leftovers name a live server's work or a recording: %v", what)
	}
	if ms, _ := s.List("/p"); len(ms) != 1 || ms[0].Status() != Cut {
		t.Fatalf("the recording whose server died: %+v", ms)
	}
	rep, err = s.Reap()
	if err != nil || len(rep.Errors) > 0 {
		t.Fatal(err, rep.Errors)
	}
	if !slices.Contains(rep.Cut, "b") {
		t.Errorf("reap did not mark b cut: %+v", rep)
	}
	got, _ := s.Get("/p", "b")
	if got.State != Cut || !strings.Contains(got.Ended, "killed") {
		t.Errorf("after reap: %+v", got)
	}
	for _, p := range []string{k.dirA, k.ck, k.tmp, k.intentB, k.replaced} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s stays after reap", p)
		}
	}
	if _, err := os.Stat(live.Meta.Dir); err != nil {
		t.Errorf("the live server's recording start was removed: %v", err)
	}
	if rep, _ := s.Leftovers(); len(rep.Removed) != 0 {
		t.Errorf("leftovers after reap: %+v", rep.Removed)
	}
}

// killedStarts is what killRecordings left.
type killedStarts struct {
	// intentA and dirA: the start of "a", killed before its record.
	intentA, dirA string
	// b: the recording "b", whose server was killed while it recorded;
	// replaced the directory of the "b" it replaced, and intentB the
	// intent of that replacement, both left as a kill after the new
	// record leaves them.
	b                 Meta
	replaced, intentB string
	// tmp: b's record being written; ck: a checkpoint of b whose save
	// was killed before its record.
	tmp, ck string
}

// killRecordings has the store of a dead server start recordings and be
// killed at each point of a start.
func killRecordings(t *testing.T, killed Store) killedStarts {
	t.Helper()
	var k killedStarts
	// Killed after the intent and the directory.
	b, _ := killed.Begin("/p", "a", Meta{})
	b.NewImage()
	k.intentA, k.dirA = b.intent, b.Meta.Dir
	// Killed after committing (it recorded, then was cut).
	cm := committed(t, killed, "/p", "b")
	os.WriteFile(cm.Log(), make([]byte, 100), 0o600)
	// A record being written.
	k.tmp = filepath.Join(filepath.Dir(cm.Dir), ".b."+cm.ID+".json.tmp")
	os.WriteFile(k.tmp, []byte("{"), 0o600)
	// Killed while replacing b, after the new record: the old one's
	// directory and the intent stay.
	d := started(t, killed, "/p", "b")
	k.intentB = d.intent
	raw, _ := os.ReadFile(k.intentB)
	var err error
	if k.b, err = d.Commit(Meta{}); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(cm.Dir, 0o700)
	os.WriteFile(cm.Log(), make([]byte, 100), 0o600)
	os.WriteFile(k.intentB, raw, 0o600)
	k.replaced = cm.Dir
	ck, _ := killed.NewCheckpoint(k.b, 1000)
	ck.NewImage()
	k.ck = ck.Path
	return k
}

func TestCheckpointsAndEvict(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	m := committed(t, s, "/p", "a")
	for _, n := range []uint64{300, 100, 200} {
		ck, err := s.NewCheckpoint(m, n)
		if err != nil {
			t.Fatal(err)
		}
		ck.NewImage()
		if err := s.CommitCheckpoint(ck); err == nil {
			t.Fatal("a checkpoint without its state committed")
		}
		addState(t, ck.Path, CheckpointTag)
		ck.QEMU = "11.1.3"
		if err := s.CommitCheckpoint(ck); err != nil {
			t.Fatal(err)
		}
	}
	cks := m.Checkpoints("11.1.3")
	if len(cks) != 3 || cks[0].ICount != 100 || cks[2].ICount != 300 {
		t.Fatalf("checkpoints: %+v", cks)
	}
	if len(m.Checkpoints("7.2.22")) != 0 {
		t.Errorf("another QEMU's checkpoints are offered")
	}
	_, ckBytes := m.Size()
	if ckBytes == 0 {
		t.Fatal("checkpoints take no space")
	}
	freed, n := s.Evict(1)
	if n != 1 || freed == 0 || len(m.Checkpoints("")) != 2 {
		t.Errorf("evict 1 byte: freed %d in %d, left %d", freed, n, len(m.Checkpoints("")))
	}
	s.Evict(1 << 40)
	if len(m.Checkpoints("")) != 0 {
		t.Errorf("evict all: left %+v", m.Checkpoints(""))
	}
	if _, err := s.Get("/p", "a"); err != nil {
		t.Errorf("eviction removed the recording: %v", err)
	}
}

func TestHeader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log.bin")
	os.WriteFile(p, make([]byte, 64), 0o600)
	if v, _ := ReadHeader(p); v != 0 {
		t.Fatalf("header %#x", v)
	}
	if err := WriteHeader(p, 0xe0200e); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if v, _ := ReadHeader(p); v != 0xe0200e || len(b) != 64 || b[0] != 0 || b[1] != 0xe0 || b[2] != 0x20 || b[3] != 0x0e {
		t.Fatalf("header %x", b[:8])
	}
}
