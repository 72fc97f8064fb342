package tools_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/qcow2test"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testfs"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

type snapInfo struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Machine string `json:"machine"`
	Matches *bool  `json:"matches"`
}

type loadOut struct {
	PID    int   `json:"pid"`
	Cursor int64 `json:"cursor"`
}

// The built-in kernel keeps a half-typed line in its RAM: saved with
// "echo on" typed, each restore finishes it as "one", whatever was typed
// after the save; a new server boots straight into it.
func TestSnapshotTinyKernel(t *testing.T) {
	snaps := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.Snapshots = snaps }, nil)
	s.bootTiny()
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo on", "newline": "none", "match_echo": true, "wait_for": "echo on"}, &w)
	var si snapInfo
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "base"}, &si)
	if si.Name != "base" || si.Size == 0 {
		t.Fatalf("save: %+v", si)
	}
	s.mustCall("serial_send", map[string]any{"data": "x", "wait_for": "onx\r\ntiny> $"}, &w)
	if !w.Matched {
		t.Fatalf("after the save: %+v", w)
	}
	var st0 struct {
		PID int `json:"pid"`
	}
	s.mustCall("qemu_status", nil, &st0)
	lastPID := st0.PID
	for k := range 3 {
		// In place (QEMU 11) the QEMU stays; elsewhere a new one runs.
		var lo loadFull
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "base"}, &lo)
		if lo.PID == 0 || (lo.PID == lastPID) != lo.InPlace {
			t.Errorf("restore %d: %+v, the QEMU before pid %d", k, lo, lastPID)
		}
		lastPID = lo.PID
		// Reads go on from the marker: nothing of the old guest's.
		var r waitOut
		s.mustCall("serial_read", nil, &r)
		if r.OutputStart != lo.Cursor || strings.Contains(r.Output, "onx") {
			t.Errorf("restore %d: read after it starts at %d (%q), want the cursor %d", k, r.OutputStart, r.Output, lo.Cursor)
		}
		s.mustCall("serial_send", map[string]any{"data": "e", "wait_for": `\r\n(on\w+)\r\ntiny> $`}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") {
			t.Fatalf("restore %d: %+v", k, w)
		}
	}
	// The transcript keeps all of it, with a marker at each restore.
	var st struct {
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_status", nil, &st)
	// The transcript is current within moments of the guest going quiet.
	var tr []byte
	var err error
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if tr, err = os.ReadFile(st.Transcript); err == nil && strings.HasSuffix(string(tr), "one\r\ntiny> ") {
			break
		}
	}
	if err != nil || strings.Count(string(tr), "[qemu-mcp: restored snapshot \"base\"") != 3 || !strings.Contains(string(tr), "onx") {
		t.Errorf("transcript %s (%v):\n%s", st.Transcript, err, tr)
	}
	var list struct {
		Snapshots []snapInfo `json:"snapshots"`
		Total     int64      `json:"total"`
	}
	s.mustCall("qemu_snapshot_list", nil, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Matches == nil || !*list.Snapshots[0].Matches || list.Total < list.Snapshots[0].Size {
		t.Errorf("list: %+v", list)
	}

	// A long list comes as the newest 50, the rest counted.
	for k := range 50 {
		s.mustCall("qemu_snapshot_save", map[string]any{"name": fmt.Sprintf("more-%02d", k)}, nil)
	}
	var long struct {
		Snapshots []snapInfo `json:"snapshots"`
		More      int        `json:"more"`
	}
	s.mustCall("qemu_snapshot_list", nil, &long)
	if len(long.Snapshots) != 50 || long.More != 1 || long.Snapshots[0].Name != "more-49" {
		t.Errorf("long list: %d listed, more %d, first %+v", len(long.Snapshots), long.More, long.Snapshots[0])
	}

	// A new server boots straight into it.
	s2 := newSessionWith(t, func(c *testConfig) { c.Snapshots = snaps }, nil)
	var b bootOut
	s2.mustCall("qemu_boot", map[string]any{"snapshot": "base"}, &b)
	s2.mustCall("serial_send", map[string]any{"data": "e", "wait_for": `\r\n(on\w+)\r\ntiny> $`}, &w)
	if !w.Matched || !strings.Contains(w.Output, "\none\n") {
		t.Fatalf("boot from the snapshot: %+v", w)
	}
	// Another machine is refused with the difference.
	s2.wantError("qemu_boot", map[string]any{"instance": "other", "snapshot": "base", "memory": "256M"}, "memory: saved 128M, now 256M")
	s.mustCall("qemu_shutdown", nil, nil)
	s2.mustCall("qemu_shutdown", nil, nil)
	assertEmptyRuntimeDir(t, s.dir)
	assertEmptyRuntimeDir(t, s2.dir)

	var del struct {
		Deleted []snapInfo `json:"deleted"`
	}
	s.mustCall("qemu_snapshot_delete", map[string]any{"name": "base"}, &del)
	if len(del.Deleted) != 1 {
		t.Errorf("delete: %+v", del)
	}
	left, _ := filepath.Glob(filepath.Join(snaps, "*", "*", "base.*"))
	tmp, _ := filepath.Glob(filepath.Join(snaps, "*", "*", ".*"))
	left = append(left, tmp...)
	if len(left) != 0 {
		t.Errorf("left after delete: %v", left)
	}
}

// The Linux guest writes "one" to a file, is saved, writes "two", and
// each of three restores in a row reads "one" and sleeps a second (the
// timer QEMU does not save is re-armed); a new server boots into it.
func TestSnapshotLinux(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	snaps := t.TempDir()
	adjust := func(c *testConfig) { c.WorkDir, c.Snapshots = lin.Dir, snaps }
	s := newSessionWith(t, adjust, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
		"memory": "256M", "wait_for": testguest.LinuxPrompt, "timeout": 60}, &b)
	if !b.Matched {
		t.Fatalf("boot: %+v", b)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo one > /tmp/f", "wait_for": testguest.LinuxPrompt}, &w)
	var si snapInfo
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "prompt"}, &si)
	t.Logf("snapshot: %+v", si)
	s.mustCall("serial_send", map[string]any{"data": "echo two > /tmp/f; cat /tmp/f", "wait_for": `two\r\n` + testguest.LinuxPrompt}, &w)
	if !w.Matched {
		t.Fatalf("after the save: %+v", w)
	}
	check := func(s *session, what string) {
		t.Helper()
		s.mustCall("serial_send", map[string]any{"data": "cat /tmp/f; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 15}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") || strings.Contains(w.Output, "two") {
			t.Fatalf("%s: %+v", what, w)
		}
	}
	for k := range 3 {
		var lo loadOut
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "prompt"}, &lo)
		check(s, fmt.Sprintf("restore %d", k))
	}
	s2 := newSessionWith(t, adjust, nil)
	s2.mustCall("qemu_boot", map[string]any{"snapshot": "prompt"}, &b)
	check(s2, "boot from the snapshot")
}

// A writable qcow2 drive is saved with the machine: the Linux guest's
// disk reads back what it held at the save. A raw writable drive is
// refused by name.
func TestSnapshotDrives(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not found: run scripts/deps (installs qemu-utils)")
	}
	root := t.TempDir()
	for _, c := range [][]string{
		{"create", "-q", "-f", "qcow2", filepath.Join(root, "disk.qcow2"), "1M"},
		{"create", "-q", "-f", "raw", filepath.Join(root, "disk.raw"), "1M"},
	} {
		if out, err := exec.Command("qemu-img", c...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", c, err, out)
		}
	}
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir, c.Snapshots, c.AllowPaths = root, t.TempDir(), []string{lin.Dir}
	}, nil)
	boot := func(drive, format string) {
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend,
			"memory": "256M", "drives": []map[string]any{{"path": drive, "format": format}},
			"wait_for": testguest.LinuxPrompt, "timeout": 60, "restart": true}, &b)
		if !b.Matched {
			t.Fatalf("boot: %+v", b)
		}
	}
	boot("disk.raw", "raw")
	s.wantError("qemu_snapshot_save", map[string]any{"name": "d"}, "drive drive0", "disk.raw", "is writable raw", "qemu-img convert -O qcow2")

	boot("disk.qcow2", "qcow2")
	var w waitOut
	disk := func(data string) {
		s.mustCall("serial_send", map[string]any{"data": "echo " + data + " > /dev/vda; sync", "wait_for": testguest.LinuxPrompt}, &w)
	}
	disk("one")
	var si struct {
		Drives []string `json:"drives"`
	}
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "d"}, &si)
	if len(si.Drives) != 1 || filepath.Base(si.Drives[0]) != "disk.qcow2" {
		t.Errorf("save: %+v", si)
	}
	disk("two")
	// A second save of the name replaces the first, in the drive too.
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "d"}, nil)
	disk("three")
	for range 2 {
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "d"}, nil)
		s.mustCall("serial_send", map[string]any{"data": "head -c 4 /dev/vda", "wait_for": testguest.LinuxPrompt}, &w)
		if !strings.Contains(w.Output, "two") {
			t.Fatalf("disk after the restore: %+v", w)
		}
		disk("four")
	}
	out, err := exec.Command("qemu-img", "snapshot", "-U", "-l", filepath.Join(root, "disk.qcow2")).CombinedOutput()
	if err != nil || strings.Count(string(out), "qemu-mcp-d") != 1 {
		t.Errorf("the drive's snapshots: %v\n%s", err, out)
	}
	var del struct {
		Left []string `json:"left_in_drives"`
	}
	s.mustCall("qemu_snapshot_delete", map[string]any{"name": "d"}, &del)
	if len(del.Left) != 0 {
		t.Errorf("delete left the drive's part: %+v", del)
	}
	out, _ = exec.Command("qemu-img", "snapshot", "-U", "-l", filepath.Join(root, "disk.qcow2")).CombinedOutput()
	if strings.Contains(string(out), "qemu-mcp-d") {
		t.Errorf("the drive still holds the snapshot:\n%s", out)
	}
}

// Input around a restore: bytes typed for the old guest just before a load
// never reach the restored guest (the built-in kernel keeps a typed line
// in RAM, so any stray byte would show in it), and a line typed right
// after the load arrives whole.
func TestSnapshotRestoreInput(t *testing.T) {
	s := newSessionWith(t, func(c *testConfig) { c.Snapshots = t.TempDir() }, nil)
	s.bootTiny()
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo on", "newline": "none", "match_echo": true, "wait_for": "echo on"}, &w)
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "line"}, nil)
	dropped := 0
	for k := range 20 {
		// Typed, not waited for: the old guest may or may not read it.
		s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf("zz%d", k), "newline": "none"}, nil)
		var lo struct {
			loadOut
			Discarded int `json:"discarded_input"`
		}
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "line"}, &lo)
		dropped += lo.Discarded
		s.mustCall("serial_send", map[string]any{"data": "e; echo after" + fmt.Sprint(k), "wait_for": `\r\n(on[^\r]*)\r\ntiny> $`}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none; echo after"+fmt.Sprint(k)+"\n") || strings.Contains(w.Output, "zz") {
			t.Fatalf("restore %d: %+v", k, w)
		}
	}
	t.Logf("20 restores: %d bytes typed for the old guest were dropped, none reached the restored one", dropped)
}

// A re-save on a nearly full disk fails, and the snapshot it would have
// replaced stays whole: listed as whole, its tag still in the drive, and
// it loads into a guest that answers (RAM and disk as they were saved).
func TestSnapshotResaveFullDisk(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	testguest.QEMUImg(t)
	root := t.TempDir()
	disk := filepath.Join(root, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	snaps := testfs.Tmpfs(t, 48<<20)
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir, c.Snapshots, c.AllowPaths = root, snaps, []string{lin.Dir}
	}, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend,
		"memory": "256M", "drives": []map[string]any{{"path": "disk.qcow2", "format": "qcow2"}},
		"wait_for": testguest.LinuxPrompt, "timeout": 60}, &b)
	var w waitOut
	set := func(v string) {
		s.mustCall("serial_send", map[string]any{"data": "echo " + v + " > /tmp/state; echo " + v + " > /dev/vda; sync", "wait_for": testguest.LinuxPrompt}, &w)
	}
	set("old")
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "a"}, nil)
	before := testguest.SnapshotTags(t, disk)
	set("new")
	free := testfs.Fill(t, snaps, 4<<20)
	defer free()
	s.wantError("qemu_snapshot_save", map[string]any{"name": "a"}, `save snapshot "a"`, "KiB free", `the snapshot "a" saved before is unchanged`)
	var list struct {
		Snapshots []struct {
			Name       string `json:"name"`
			Matches    *bool  `json:"matches"`
			Incomplete string `json:"incomplete"`
		} `json:"snapshots"`
	}
	s.mustCall("qemu_snapshot_list", nil, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Matches == nil || !*list.Snapshots[0].Matches || list.Snapshots[0].Incomplete != "" {
		t.Fatalf("list after the failed re-save: %+v", list)
	}
	if after := testguest.SnapshotTags(t, disk); !slices.Equal(after, before) || len(after) != 1 {
		t.Fatalf("the drive's snapshots: before %v, after the failed re-save %v", before, after)
	}
	if left, _ := filepath.Glob(filepath.Join(snaps, "*", "*", "*")); len(left) != 2 {
		t.Errorf("the store after the failed re-save: %v (want the record and its image)", left)
	}
	s.mustCall("qemu_snapshot_load", map[string]any{"name": "a"}, nil)
	s.mustCall("serial_send", map[string]any{"data": "cat /tmp/state; head -c 3 /dev/vda; echo; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 20}, &w)
	if !w.Matched || strings.Count(w.Output, "old") != 2 || strings.Contains(w.Output, "new") {
		t.Fatalf("the old snapshot after the failed re-save: %+v", w)
	}
}

// busy loads every core with a process the test starts, and stops it
// (by the handle it started) when the test ends.
func busy(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Process.Kill()
			c.Wait()
		})
	}
}

// Restores on a busy machine (every core loaded by another process): a
// command typed right after each load arrives whole, and a line typed just
// before each load neither reaches the restored guest nor arrives twice.
// QEMU_MCP_RESTORES sets how many (default 10).
func TestSnapshotRestoresBusy(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	n := 10
	if v, err := strconv.Atoi(os.Getenv("QEMU_MCP_RESTORES")); err == nil && v > 0 {
		n = v
	}
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir, c.Snapshots = lin.Dir, t.TempDir() }, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
		"memory": "256M", "wait_for": testguest.LinuxPrompt, "timeout": 60}, &b)
	var w waitFull
	s.mustCall("serial_send", map[string]any{"data": "echo saved-state > /tmp/state", "wait_for": testguest.LinuxPrompt}, &w)
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "busy"}, nil)
	busy(t)
	start := time.Now()
	dropped := 0
	for k := range n {
		// For the old guest, not waited for: bef""ore-K prints as
		// before-K, so any copy of it in the output is the line run.
		before := fmt.Sprintf("before-%d", k)
		s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf(`echo bef""ore-%d`, k)}, nil)
		var lo struct {
			loadOut
			Discarded int `json:"discarded_input"`
		}
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "busy"}, &lo)
		dropped += lo.Discarded
		s.mustCall("serial_send", map[string]any{"data": "cat /tmp/state", "wait_for": []string{`saved-state\r\n` + testguest.LinuxPrompt, `not found`}, "timeout": 20}, &w)
		if !w.Matched || *w.MatchIndex != 0 || !strings.Contains(w.Output, "cat /tmp/state\n") {
			t.Fatalf("restore %d: the command typed after the load did not arrive whole: %+v", k, w)
		}
		var all waitFull
		s.mustCall("serial_read", map[string]any{"since": lo.Cursor, "max_bytes": 32768}, &all)
		if strings.Contains(all.Output, before) || strings.Contains(all.Output, `bef""ore`) {
			t.Fatalf("restore %d: input typed for the old guest reached the restored one:\n%s", k, all.Output)
		}
	}
	el := time.Since(start)
	// Nothing arrived twice: each before-K ran at most once, in the old
	// guest.
	var st struct {
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_status", nil, &st)
	tr, err := os.ReadFile(st.Transcript)
	if err != nil {
		t.Fatal(err)
	}
	for k := range n {
		if c := strings.Count(string(tr), fmt.Sprintf("before-%d\r\n", k)); c > 1 {
			t.Errorf("before-%d ran %d times", k, c)
		}
	}
	t.Logf("%d restores on a busy machine in %v (%v each): every command after a load arrived whole; %d bytes typed for old guests were dropped, none reached a restored guest",
		n, el.Round(time.Millisecond), (el / time.Duration(n)).Round(time.Millisecond), dropped)
}

// A snapshot with a part gone is listed as incomplete with the part named,
// and a load or a boot of it is refused before the running guest is
// touched.
func TestSnapshotIncomplete(t *testing.T) {
	testguest.QEMUImg(t)
	root, snaps := t.TempDir(), t.TempDir()
	disk := filepath.Join(root, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir, c.Snapshots = root, snaps }, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"drives": []map[string]any{{"path": "disk.qcow2", "format": "qcow2"}}, "wait_for": prompt}, &b)
	var si struct {
		Drives []string `json:"drives"`
	}
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "a"}, &si)
	type listed struct {
		Snapshots []struct {
			Matches    *bool  `json:"matches"`
			Incomplete string `json:"incomplete"`
		} `json:"snapshots"`
	}
	images, _ := filepath.Glob(filepath.Join(snaps, "*", "*", "a.*.qcow2"))
	if len(images) != 1 {
		t.Fatalf("images %v", images)
	}
	os.Rename(images[0], images[0]+".away")
	var l listed
	s.mustCall("qemu_snapshot_list", nil, &l)
	if len(l.Snapshots) != 1 || l.Snapshots[0].Matches == nil || *l.Snapshots[0].Matches || !strings.Contains(l.Snapshots[0].Incomplete, "is missing") {
		t.Fatalf("list without the image: %+v", l)
	}
	s.wantError("qemu_snapshot_load", map[string]any{"name": "a"}, `snapshot "a" is incomplete`, "is missing", "left as it was")
	var st struct {
		PID   int    `json:"pid"`
		State string `json:"state"`
	}
	s.mustCall("qemu_status", nil, &st)
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo still", "wait_for": `still\r\n`}, &w)
	if st.PID != b.PID || st.State != "running" || !w.Matched {
		t.Fatalf("the guest after a refused load: %+v (booted pid %d), echo %v", st, b.PID, w.Matched)
	}
	os.Rename(images[0]+".away", images[0])
	s.mustCall("qemu_shutdown", nil, nil)
	tags := testguest.SnapshotTags(t, disk)
	if out, err := exec.Command("qemu-img", "snapshot", "-d", tags[0], disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	s.mustCall("qemu_snapshot_list", nil, &l)
	if len(l.Snapshots) != 1 || !strings.Contains(l.Snapshots[0].Incomplete, "has no snapshot "+tags[0]) {
		t.Fatalf("list without the drive's part: %+v", l)
	}
	s.wantError("qemu_boot", map[string]any{"snapshot": "a"}, "has no snapshot "+tags[0])
}

// loadsInPlace waits until server_info says what the QEMU under test was
// probed to do (after the session's first boot) and reports whether it
// loads a snapshot in place, with the probe's detail.
func loadsInPlace(t *testing.T, s *session) (bool, string) {
	t.Helper()
	var info capsInfo
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		s.mustCall("server_info", nil, &info)
		if info.QEMUCaps.State == "probed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the QEMU's capabilities were not probed in 2 minutes: %+v", info.QEMUCaps)
		}
	}
	q := info.QEMUCaps
	return q.Timer.Answer == "yes" && q.InPlace.Answer == "yes", q.InPlace.Answer + ", " + q.InPlace.Detail
}

type loadFull struct {
	loadOut
	InPlace   bool   `json:"in_place"`
	Note      string `json:"note"`
	Discarded int    `json:"discarded_input"`
}

// Where QEMU loads a snapshot in place (QEMU 11), qemu_snapshot_load puts
// the Linux guest back in the running QEMU, three times in a row: the pid
// stays, the saved state is back, sleep 1 returns, reads go on from the
// marker, input typed for the old guest never reaches the restored one,
// the guest's events show a pause and a resume (no shutdown), and the
// kept snapshot's image is never written.
func TestSnapshotInPlace(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	snaps := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir, c.Snapshots, c.AllowPaths = t.TempDir(), snaps, []string{lin.Dir}
	}, nil)
	var b bootOut
	s.mustCall("qemu_boot", linuxBoot(lin, nil), &b)
	if !b.Matched {
		t.Fatalf("boot: %+v", b)
	}
	if ok, why := loadsInPlace(t, s); !ok {
		t.Skipf("%s does not load a snapshot into the running QEMU (probed: %s): restores start a new QEMU there (TestSnapshotLinux)", qemuVersionOf(t, s), why)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo one > /tmp/f", "wait_for": testguest.LinuxPrompt}, &w)
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "prompt"}, nil)
	images, _ := filepath.Glob(filepath.Join(snaps, "*", "*", "prompt.*.qcow2"))
	if len(images) != 1 {
		t.Fatalf("the snapshot's image: %v", images)
	}
	kept := testguest.FileSum(t, images[0])
	dropped := 0
	for k := range 3 {
		s.mustCall("serial_send", map[string]any{"data": "echo two > /tmp/f; cat /tmp/f", "wait_for": `two\r\n` + testguest.LinuxPrompt}, &w)
		// For the old guest, not waited for.
		s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf(`echo bef""ore-%d`, k)}, nil)
		var lo loadFull
		res := s.call("qemu_snapshot_load", map[string]any{"name": "prompt"}, &lo)
		if res.IsError || !lo.InPlace || lo.PID != b.PID || lo.Note != "" || !strings.Contains(text(res), "in place") {
			t.Fatalf("restore %d: %+v (booted pid %d): %s", k, lo, b.PID, text(res))
		}
		dropped += lo.Discarded
		var r waitOut
		s.mustCall("serial_read", nil, &r)
		if r.OutputStart != lo.Cursor || strings.Contains(r.Output, "two") {
			t.Errorf("restore %d: read after it starts at %d (%q), want the cursor %d", k, r.OutputStart, r.Output, lo.Cursor)
		}
		s.mustCall("serial_send", map[string]any{"data": "cat /tmp/f; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 15}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") || strings.Contains(w.Output, "two") {
			t.Fatalf("restore %d: the saved state, then sleep 1: %+v", k, w)
		}
		var all waitFull
		s.mustCall("serial_read", map[string]any{"since": lo.Cursor, "max_bytes": 32768}, &all)
		if strings.Contains(all.Output, fmt.Sprintf("before-%d", k)) || strings.Contains(all.Output, `bef""ore`) {
			t.Fatalf("restore %d: input typed for the old guest reached the restored one:\n%s", k, all.Output)
		}
	}
	var st struct {
		PID    int `json:"pid"`
		Events []struct {
			Event string `json:"event"`
		} `json:"events"`
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_status", nil, &st)
	var evs []string
	for _, e := range st.Events {
		evs = append(evs, e.Event)
	}
	if st.PID != b.PID || slices.Contains(evs, "SHUTDOWN") || slices.Contains(evs, "RESET") || strings.Count(strings.Join(evs, " "), "STOP RESUME") < 3 {
		t.Errorf("qemu_status after three loads in place: pid %d (booted %d), events %v", st.PID, b.PID, evs)
	}
	if testguest.FileSum(t, images[0]) != kept {
		t.Errorf("the kept image %s changed", images[0])
	}
	if left, _ := filepath.Glob(filepath.Join(s.dir, "snapload-*")); len(left) != 0 {
		// The copy goes right after the answer.
		time.Sleep(time.Second)
		if left, _ = filepath.Glob(filepath.Join(s.dir, "snapload-*")); len(left) != 0 {
			t.Errorf("copies left: %v", left)
		}
	}
	tr, _ := os.ReadFile(st.Transcript)
	if n := strings.Count(string(tr), `[qemu-mcp: restored snapshot "prompt"`); n != 3 {
		t.Errorf("the transcript has %d restore markers, want 3", n)
	}
	t.Logf("3 loads in place into qemu pid %d; %d bytes typed for the old guest were dropped", b.PID, dropped)
}

// A restore, in place (QEMU 11) or in a new QEMU (7.2), leaves the guest's
// shares and debugger as they were: a share mounted when the load came is
// not mounted in the restored guest (as at the save), mounts again and
// reads; the guest saves again (QEMU's mount blocker is gone); a
// breakpoint set before the restore stops the restored kernel, the
// first command typed after it included.
func TestSnapshotRestoreSharesAndDebugger(t *testing.T) {
	s, lin, root := linuxSession(t)
	os.Mkdir(filepath.Join(root, "ro"), 0o755)
	os.WriteFile(filepath.Join(root, "ro", "hello.txt"), []byte("hello from the host\n"), 0o644)
	var b struct {
		bootOut
		Shares []struct{ Mount string } `json:"shares"`
	}
	s.mustCall("qemu_boot", linuxBoot(lin, map[string]any{"gdb": true, "shares": []map[string]any{{"path": "ro"}}}), &b)
	if !b.Matched || len(b.Shares) != 1 {
		t.Fatalf("boot: %+v", b)
	}
	inPlace, _ := loadsInPlace(t, s)
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "s"}, nil)
	var br breakOut
	s.mustCall("debug_break", map[string]any{"location": "sys_newuname"}, &br)
	for k := range 2 {
		if o := s.exec(b.Shares[0].Mount+" && cat /mnt/ro/hello.txt", 0); o.Output != "hello from the host\n" {
			t.Fatalf("restore %d: mount before: %+v", k, o)
		}
		var lo loadFull
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "s"}, &lo)
		if lo.InPlace != inPlace || (lo.PID == b.PID) != inPlace {
			t.Fatalf("restore %d: %+v, booted pid %d, in place expected: %v", k, lo, b.PID, inPlace)
		}
		if o := s.exec("grep -c ' 9p ' /proc/mounts", 0); o.Output != "0\n" {
			t.Errorf("restore %d: mounted in the restored guest: %+v", k, o)
		}
		if o := s.exec(b.Shares[0].Mount+" && cat /mnt/ro/hello.txt && umount /mnt/ro", 0); status(o) != 0 || o.Output != "hello from the host\n" {
			t.Fatalf("restore %d: the share after the restore: %+v", k, o)
		}
		s.mustCall("qemu_snapshot_save", map[string]any{"name": "again"}, nil)
		// The breakpoint is in place from the restored guest's first
		// instruction: the command typed next stops in it, with no
		// debugger call in between.
		var hit struct {
			waitOut
			DebugStop *stopOut `json:"debug_stop"`
		}
		// The wait ends at the stop, not at its timeout.
		start := time.Now()
		s.mustCall("serial_send", map[string]any{"data": "uname -sr", "wait_for": "Linux 6.1", "timeout": 30}, &hit)
		if hit.Matched || hit.TimedOut || hit.DebugStop == nil || hit.DebugStop.Reason != "breakpoint" || hit.DebugStop.Function != "sys_newuname" {
			t.Fatalf("restore %d: the breakpoint in the restored guest: %+v, debugger %+v", k, hit.waitOut, hit.DebugStop)
		}
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("restore %d: the wait took %v to end at the breakpoint", k, took)
		}
		var st stopOut
		s.mustCall("debug_continue", map[string]any{"timeout": 0.5}, &st)
		if st.Stopped {
			t.Fatalf("restore %d: the continue from the breakpoint stopped again: %+v", k, st)
		}
		var w waitOut
		s.mustCall("serial_read", map[string]any{"wait_for": "Linux 6.1.*\r\n" + testguest.LinuxPrompt, "timeout": 10}, &w)
		if !w.Matched {
			t.Fatalf("restore %d: uname after the breakpoint: %+v", k, w)
		}
	}
}

// A snapshot whose machine state is damaged inside its image (its parts
// all there, so the checks before the load pass) fails the load without
// a hang: in place (QEMU 11) the load gives way to a new QEMU, which fails
// too; the error says the guest is stopped and how to go on, and the
// server boots it again.
func TestSnapshotDamagedState(t *testing.T) {
	snaps := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.Snapshots = snaps }, nil)
	s.bootTiny()
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "bad"}, nil)
	images, _ := filepath.Glob(filepath.Join(snaps, "*", "*", "bad.*.qcow2"))
	if len(images) != 1 {
		t.Fatalf("images %v", images)
	}
	qcow2test.DamageState(t, images[0])
	start := time.Now()
	res := s.call("qemu_snapshot_load", map[string]any{"name": "bad"}, nil)
	msg := text(res)
	if !res.IsError || !strings.Contains(msg, `restore snapshot "bad"`) || !strings.Contains(msg, "the guest is stopped: boot it again with qemu_boot") {
		t.Fatalf("the damaged load: %s", msg)
	}
	t.Logf("the damaged load failed in %v: %s", time.Since(start).Round(time.Millisecond), msg)
	var st struct {
		State string `json:"state"`
	}
	s.mustCall("qemu_status", nil, &st)
	if st.State != "stopped" {
		t.Errorf("after the failed load: %+v", st)
	}
	s.bootTiny()
	s.mustCall("qemu_shutdown", nil, nil)
	assertEmptyRuntimeDir(t, s.dir)
}
