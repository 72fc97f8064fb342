package timetravel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
)

// finished is a recording record as a finished recording leaves it, with
// a log of 12 header bytes holding version and a few bytes of events.
func finished(t *testing.T, version uint32) recording.Meta {
	t.Helper()
	dir := t.TempDir()
	m := recording.Meta{Name: "run", ID: "1-2-3", State: recording.Complete, QEMU: "7.2.22", Binary: "/usr/bin/qemu-system-riscv64",
		LogVersion: version, Dir: dir}
	if err := os.WriteFile(m.Log(), make([]byte, recording.HeaderSize+20), 0o600); err != nil {
		t.Fatal(err)
	}
	if version != 0 {
		if err := recording.WriteHeader(m.Log(), version); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func logVersion(t *testing.T) (bin string, v uint32) {
	t.Helper()
	bin = testguest.QEMU(t)
	v, err := qemu.LogVersion(testContext(t), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bin, v
}

// A recording made by this QEMU, its log whole and no drive, replays.
func TestCheckReplayable(t *testing.T) {
	t.Parallel()
	bin, lv := logVersion(t)
	if err := Check(testContext(t), finished(t, lv), bin, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// A record that could not be read says why it cannot be replayed.
func TestCheckUnreadable(t *testing.T) {
	t.Parallel()
	store := recording.Store{Dir: t.TempDir()}
	root := t.TempDir()
	dir := filepath.Join(store.Dir, names.Project(root))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	list, err := store.List(root)
	if err != nil || len(list) != 1 || list[0].Unreadable() == "" {
		t.Fatalf("list: %+v %v", list, err)
	}
	err = Check(testContext(t), list[0], "/nonexistent/qemu", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `recording "broken" cannot be replayed: `+list[0].Unreadable()) {
		t.Fatalf("Check of an unreadable record: %v", err)
	}
}

// A recording that its server records now is refused, naming the guest
// that records it.
func TestCheckStillRecording(t *testing.T) {
	t.Parallel()
	store := recording.Store{Dir: t.TempDir()}
	b, err := store.Begin(t.TempDir(), "live", recording.Meta{Instance: "rec"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	err = Check(testContext(t), b.Meta, "/nonexistent/qemu", t.TempDir())
	if err == nil || err.Error() != `recording "live" is still being recorded (by guest "rec"): stop that guest first` {
		t.Fatalf("Check while it records: %v", err)
	}
}

// A recording whose server died while it recorded is cut, and replays.
func TestCheckCutByItsServersDeath(t *testing.T) {
	t.Parallel()
	bin, lv := logVersion(t)
	m := finished(t, lv)
	m.State, m.Owner = recording.Recording, &names.Owner{PID: 1 << 30, StartTime: 1}
	if m.Status() != recording.Cut {
		t.Fatalf("status %q", m.Status())
	}
	if err := Check(testContext(t), m, bin, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// A log written by a QEMU of another log format is refused, naming the
// QEMU that made it.
func TestCheckLogVersion(t *testing.T) {
	t.Parallel()
	bin, lv := logVersion(t)
	m := finished(t, lv+1)
	m.QEMU, m.Binary = "11.0.0", "/opt/qemu11/bin/qemu-system-riscv64"
	err := Check(testContext(t), m, bin, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `recording "run" was made by QEMU 11.0.0`) ||
		!strings.Contains(err.Error(), "replay it with the QEMU that recorded it (/opt/qemu11/bin/qemu-system-riscv64)") {
		t.Fatalf("Check of another QEMU's log: %v", err)
	}
}

// A QEMU that cannot say its log format cannot replay.
func TestCheckNoQEMU(t *testing.T) {
	t.Parallel()
	err := Check(testContext(t), finished(t, 0x1234), filepath.Join(t.TempDir(), "qemu-system-riscv64"), t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), "replay: ") {
		t.Fatalf("Check with no QEMU: %v", err)
	}
}

// A drive that changed since the recording, or is gone, is refused: its
// replay would read other bytes.
func TestCheckDrives(t *testing.T) {
	t.Parallel()
	bin, lv := logVersion(t)
	disk := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	m := finished(t, lv)
	m.Drives = []recording.Drive{{Path: disk, Size: fi.Size(), ModTime: fi.ModTime().UTC()}}
	if err := Check(testContext(t), m, bin, t.TempDir()); err != nil {
		t.Fatalf("Check with the drive unchanged: %v", err)
	}

	// The same size, touched.
	later := fi.ModTime().Add(time.Minute)
	if err := os.Chtimes(disk, later, later); err != nil {
		t.Fatal(err)
	}
	err = Check(testContext(t), m, bin, t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), "drive "+disk+` changed since recording "run" was made (4096 bytes modified`) {
		t.Fatalf("Check with the drive touched: %v", err)
	}
	// Grown.
	if err := os.WriteFile(disk, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	err = Check(testContext(t), m, bin, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "then 8192 bytes") {
		t.Fatalf("Check with the drive grown: %v", err)
	}
	// Gone.
	os.Remove(disk)
	err = Check(testContext(t), m, bin, t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), `recording "run" read drive `+disk) {
		t.Fatalf("Check with the drive gone: %v", err)
	}
}

// A log cut before QEMU wrote its header gets the header of this QEMU's
// format, and replays; one without a log cannot.
func TestCheckCompletesACutLog(t *testing.T) {
	t.Parallel()
	bin, lv := logVersion(t)
	m := finished(t, 0)
	m.State = recording.Cut
	if h, _ := recording.ReadHeader(m.Log()); h != 0 {
		t.Fatalf("header %#x before", h)
	}
	if err := Check(testContext(t), m, bin, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if h, err := recording.ReadHeader(m.Log()); h != lv || err != nil {
		t.Fatalf("header %#x %v after Check, want %#x", h, err, lv)
	}

	os.Remove(m.Log())
	err := Check(testContext(t), m, bin, t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), `recording "run": its log: `) {
		t.Fatalf("Check without a log: %v", err)
	}
}
