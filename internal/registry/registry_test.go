package registry_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/registrytest"
	"golang.org/x/sys/unix"
)

func TestSelf(t *testing.T) {
	rec, err := registry.Self("http", "127.0.0.1:7777", "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	me, err := proc.Self()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := proc.Exe(os.Getpid())
	cwd, _ := os.Getwd()
	if rec.PID != os.Getpid() || rec.StartTime != me.StartTime || rec.Executable != exe || rec.Cwd != cwd ||
		rec.PPID != os.Getppid() || rec.Transport != "http" || rec.Address != "127.0.0.1:7777" || rec.Version != "1.2.3" {
		t.Fatalf("Self = %+v", rec)
	}
	pinfo, err := proc.Stat(os.Getppid())
	if err != nil || rec.ParentStartTime != pinfo.StartTime {
		t.Errorf("parent start time %d, want %d (%v)", rec.ParentStartTime, pinfo.StartTime, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(exe, &st); err != nil {
		t.Fatal(err)
	}
	if rec.ExeIdentity == nil || rec.ExeIdentity.Inode != st.Ino || rec.ExeIdentity.Dev != st.Dev || rec.ExeIdentity.Size != st.Size {
		t.Errorf("exe identity %+v, stat %+v", rec.ExeIdentity, st)
	}
	if d := time.Since(rec.Started); d < 0 || d > time.Hour {
		t.Errorf("started %v", rec.Started)
	}
	h := registry.Assess(rec)
	if !h.Alive || h.ExeMatch != registry.Yes || h.ImageMatch != registry.Yes || h.ParentNow != os.Getppid() || h.Orphaned {
		t.Errorf("Assess(self) = %+v", h)
	}
}

func TestWriteReadUpdateRemove(t *testing.T) {
	dir := t.TempDir()
	rec, err := registry.Self("stdio", "", "v1")
	if err != nil {
		t.Fatal(err)
	}
	rec.Started = rec.Started.Truncate(time.Second)
	if err := registry.Write(dir, rec); err != nil {
		t.Fatal(err)
	}
	p := registry.Path(dir, rec.Owner())
	if p != filepath.Join(dir, "server-"+strconv.Itoa(rec.PID)+"-"+strconv.FormatUint(rec.StartTime, 10)+".json") {
		t.Fatalf("Path = %s", p)
	}
	fi, err := os.Lstat(p)
	if err != nil || fi.Mode() != 0o600 {
		t.Fatalf("record mode %v, %v", fi.Mode(), err)
	}
	got, err := registry.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Started.Equal(rec.Started) {
		t.Errorf("started %v, want %v", got.Started, rec.Started)
	}
	got.Started = rec.Started
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("read %+v\nwant %+v", got, rec)
	}
	raw, _ := os.ReadFile(p)
	for _, key := range []string{`"pid"`, `"start_time"`, `"executable"`, `"exe_identity"`, `"cwd"`, `"ppid"`,
		`"parent_start_time"`, `"transport": "stdio"`, `"version"`, `"started"`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("record lacks %s:\n%s", key, raw)
		}
	}

	// Update: write again with two instances, a QEMU child and a TAP.
	rec.Instances = []registry.Instance{
		{Name: "default", QEMU: &registry.Child{PID: 4242, StartTime: 99, Executable: "/usr/bin/qemu-system-riscv64"},
			TAP: "qm0123456789abc", Lock: "/repo/.git/qemu-mcp.lock"},
		{Name: "b", Lock: "/repo/.git/qemu-mcp.lock"},
	}
	if err := registry.Write(dir, rec); err != nil {
		t.Fatal(err)
	}
	got, err = registry.Read(p)
	if err != nil || !reflect.DeepEqual(got.Instances, rec.Instances) || len(got.Children()) != 1 {
		t.Fatalf("updated record %+v, %v", got, err)
	}
	des, _ := os.ReadDir(dir)
	if len(des) != 1 {
		t.Errorf("dir holds %d entries, want only the record (no temp files)", len(des))
	}

	if err := registry.Remove(dir, rec.Owner()); err != nil {
		t.Fatal(err)
	}
	if registrytest.Exists(p) {
		t.Fatal("record still there")
	}
	if err := registry.Remove(dir, rec.Owner()); err != nil {
		t.Fatalf("removing a missing record: %v", err)
	}
}

func TestWriteRefusesBadRecord(t *testing.T) {
	dir := t.TempDir()
	for _, rec := range []registry.Record{{}, {PID: -1}, {PID: registry.MaxPID + 1}, {PID: 5, QEMU: &registry.Child{}}, {PID: 5, Instances: []registry.Instance{{Name: "a", QEMU: &registry.Child{PID: -2}}}}} {
		if err := registry.Write(dir, rec); err == nil {
			t.Errorf("Write(%+v) succeeded", rec)
		}
	}
	if des, _ := os.ReadDir(dir); len(des) != 0 {
		t.Errorf("left %d entries", len(des))
	}
}

// Write replaces a symlink planted at the record path; it never writes
// through it.
func TestWriteDoesNotFollowSymlink(t *testing.T) {
	dir := t.TempDir()
	target := plantSymlink(t, registry.Path(dir, names.Owner{PID: 77}))
	if err := registry.Write(dir, registry.Record{PID: 77, Transport: "stdio"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "precious" {
		t.Fatalf("target now %q", b)
	}
	if fi, err := os.Lstat(registry.Path(dir, names.Owner{PID: 77})); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("record %v %v", fi, err)
	}
}

func TestRemoveOnlyRegularFiles(t *testing.T) {
	dir := t.TempDir()
	target := plantSymlink(t, registry.Path(dir, names.Owner{PID: 10}))
	registrytest.Mkfifo(t, registry.Path(dir, names.Owner{PID: 11}))
	for _, pid := range []int{10, 11} {
		if err := registry.Remove(dir, names.Owner{PID: pid}); err == nil {
			t.Errorf("Remove(%d) succeeded", pid)
		}
		if !registrytest.Exists(registry.Path(dir, names.Owner{PID: pid})) {
			t.Errorf("entry of %d removed", pid)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "precious" {
		t.Fatalf("target %q %v", b, err)
	}
}

func TestReadRefusesNonRecords(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "r.json")
	registrytest.Mkfile(t, target, `{"pid": 12}`)
	link := filepath.Join(dir, "link.json")
	os.Symlink(target, link)
	fifo := filepath.Join(dir, "fifo.json")
	registrytest.Mkfifo(t, fifo)
	big := filepath.Join(dir, "big.json")
	registrytest.Mkfile(t, big, `{"pid": 12, "cwd": "`+strings.Repeat("x", registry.MaxRecordSize)+`"}`)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []string{link, fifo, big, filepath.Join(dir, "missing.json"), dir} {
			if _, err := registry.Read(p); err == nil {
				t.Errorf("Read(%s) succeeded", p)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Read blocked (on the FIFO?)")
	}
}

func TestParse(t *testing.T) {
	good := `{"pid": 12, "start_time": 5, "transport": "stdio", "future_field": [1,2]}`
	if rec, err := registry.Parse([]byte(good)); err != nil || rec.PID != 12 || rec.StartTime != 5 {
		t.Errorf("Parse(good) = %+v, %v", rec, err)
	}
	for _, bad := range []string{"", "null", "{}", "[]", `{"pid": 0}`, `{"pid": -3}`, `{"pid": "12"}`,
		`{"pid": 12} {"pid": 13}`, `{"pid": 12, "qemu": {"pid": 0}}`, `{"pid": 12, "started": "yesterday"}`,
		`{"pid": 99999999}`, `{"pid": 12, "start_time": -1}`, "\x00\xff"} {
		if rec, err := registry.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", bad, rec)
		}
	}
}

func TestParseFileName(t *testing.T) {
	for name, want := range map[string]names.Owner{
		"server-1.json": {PID: 1}, "server-4194304.json": {PID: 4194304}, "server-7-123.json": {PID: 7, StartTime: 123},
		"server-0.json": {}, "server-01.json": {}, "server-4194305.json": {}, "server-+1.json": {}, "server-7-0123.json": {},
		"server-1.json.tmp": {}, "server-.json": {}, "xserver-1.json": {}, "server-1a.json": {}, "server-7-.json": {},
	} {
		got, ok := registry.ParseFileName(name)
		if ok != (want.PID != 0) || got != want {
			t.Errorf("ParseFileName(%q) = %v, %v", name, got, ok)
		}
	}
}

func TestList(t *testing.T) {
	dir := t.TempDir()
	for _, pid := range []int{300, 20, 1000} {
		if err := registry.Write(dir, registry.Record{PID: pid, Transport: "stdio"}); err != nil {
			t.Fatal(err)
		}
	}
	registrytest.Mkfile(t, registry.Path(dir, names.Owner{PID: 50}), "garbage{")
	registrytest.Mkfile(t, registry.Path(dir, names.Owner{PID: 60}), `{"pid": 61}`)
	registrytest.Mkfifo(t, registry.Path(dir, names.Owner{PID: 70}))
	registrytest.Mkfile(t, filepath.Join(dir, "server-80-5.json"), `{"pid": 80, "start_time": 6}`)
	registrytest.Mkfile(t, filepath.Join(dir, "server-90-5.json"), `{"pid": 90, "start_time": 5}`)
	registrytest.Mkfile(t, filepath.Join(dir, "server-x.json"), `{"pid": 1}`)
	registrytest.Mkfile(t, filepath.Join(dir, "notes.json"), `{"pid": 1}`)
	entries, err := registry.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		s := strconv.Itoa(e.PID)
		if e.Err != nil {
			s += "!"
		} else if e.Record.PID != e.PID {
			t.Errorf("entry %s has record pid %d", e.Name, e.Record.PID)
		}
		got = append(got, s)
	}
	if want := []string{"20", "50!", "60!", "70!", "80!", "90", "300", "1000"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("List = %v, want %v", got, want)
	}
	if entries, err := registry.List(filepath.Join(dir, "missing")); err != nil || len(entries) != 0 {
		t.Fatalf("List(missing) = %v, %v", entries, err)
	}
}

func TestAssessLiveDeadOrphan(t *testing.T) {
	sl := registrytest.StartSleep(t, 30)
	rec := registrytest.RecordOf(t, sl, "stdio")
	h := registry.Assess(rec)
	if !h.Alive || h.State != "alive" || h.ExeMatch != registry.Yes || h.ImageMatch != registry.Yes ||
		h.ParentNow != os.Getpid() || h.ParentAlive != registry.Yes || h.Orphaned || !h.Verified() {
		t.Fatalf("live: %+v", h)
	}

	dead := registrytest.DeadProcess(t)
	orphan := rec
	orphan.PPID, orphan.ParentStartTime = dead.PID, dead.StartTime
	h = registry.Assess(orphan)
	if !h.Alive || !h.Orphaned || h.ParentAlive != registry.No {
		t.Fatalf("orphan: %+v", h)
	}
	// An http server is never an orphan: it does not belong to a client.
	orphan.Transport = "http"
	if h := registry.Assess(orphan); h.Orphaned {
		t.Fatalf("http orphan: %+v", h)
	}

	// Reparented: the recorded parent lives but is not the parent now.
	other := registrytest.StartSleep(t, 30)
	re := rec
	re.PPID, re.ParentStartTime = other.ID.PID, other.ID.StartTime
	if h := registry.Assess(re); !h.Orphaned || h.ParentAlive != registry.Yes {
		t.Fatalf("reparented: %+v", h)
	}

	gone := registrytest.DeadRecord(dead, "stdio")
	if h := registry.Assess(gone); h.Alive || h.State != "gone" || h.Orphaned || h.Verified() {
		t.Fatalf("dead: %+v", h)
	}
	reused := rec
	reused.StartTime++
	if h := registry.Assess(reused); h.Alive || h.State != "reused" || h.Verified() {
		t.Fatalf("reused: %+v", h)
	}
	// A record whose exe identity is some other file: alive, but not verified.
	wrong := rec
	wrong.ExeIdentity = &registry.ExeIdentity{Dev: 1, Inode: 2}
	if h := registry.Assess(wrong); !h.Alive || h.ImageMatch != registry.No || h.ExeMatch != registry.No || h.Verified() {
		t.Fatalf("wrong image: %+v", h)
	}
}

func TestAssessQEMU(t *testing.T) {
	q := registrytest.StartSleep(t, 30)
	child, err := registry.NewChild(q.ID.PID)
	if err != nil {
		t.Fatal(err)
	}
	if child.StartTime != q.ID.StartTime || child.Executable != q.Exe {
		t.Fatalf("NewChild = %+v", child)
	}
	rec := registrytest.DeadRecord(registrytest.DeadProcess(t), "stdio")
	rec.QEMU = &child
	h := registry.Assess(rec)
	if len(h.QEMU) != 1 || !h.QEMU[0].Alive || h.QEMU[0].ExeMatch != registry.Yes {
		t.Fatalf("qemu: %+v", h.QEMU)
	}
	c := child
	c.StartTime++
	if ch := registry.AssessChild(c); ch.Alive || ch.State != "reused" {
		t.Fatalf("reused qemu: %+v", ch)
	}
	c = child
	c.Executable = "/usr/bin/qemu-system-riscv64"
	if ch := registry.AssessChild(c); !ch.Alive || ch.ExeMatch != registry.No {
		t.Fatalf("other exe: %+v", ch)
	}
}

// A server whose binary was replaced on disk (an upgrade) still runs the
// recorded image (verified) but serves stale code (exe_match no).
func TestAssessReplacedBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "server")
	src, err := os.ReadFile("/usr/bin/sleep")
	if err != nil {
		t.Skip(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot run a binary from %s: %v", dir, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	info, err := proc.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(bin, &st); err != nil {
		t.Fatal(err)
	}
	rec := registry.Record{
		PID: info.PID, StartTime: info.StartTime, Executable: bin, Transport: "stdio",
		ExeIdentity: &registry.ExeIdentity{Dev: st.Dev, Inode: st.Ino, Size: st.Size, MtimeNS: st.Mtim.Nano()},
		PPID:        info.PPID,
	}
	if h := registry.Assess(rec); h.ExeMatch != registry.Yes || h.ImageMatch != registry.Yes {
		t.Fatalf("before upgrade: %+v", h)
	}
	// Upgrade: a new file renamed over the old path.
	if err := os.WriteFile(bin+".new", append(src, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	h := registry.Assess(rec)
	if h.ExeMatch != registry.No || h.ImageMatch != registry.Yes || !h.Verified() {
		t.Fatalf("after upgrade: %+v", h)
	}
	if !strings.Contains(h.ExeDetail, "deleted") && !strings.Contains(h.ExeDetail, "replaced") {
		t.Errorf("detail %q", h.ExeDetail)
	}
}

func TestNewChildGone(t *testing.T) {
	dead := registrytest.DeadProcess(t)
	if _, err := registry.NewChild(dead.PID); !errors.Is(err, proc.ErrNotFound) {
		t.Fatalf("NewChild(dead) err = %v", err)
	}
}

// plantSymlink makes link a symlink to a file holding "precious" in a
// directory of its own, and returns the file's path.
func plantSymlink(t *testing.T, link string) string {
	t.Helper()
	target := filepath.Join(t.TempDir(), "victim")
	registrytest.Mkfile(t, target, "precious")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return target
}
