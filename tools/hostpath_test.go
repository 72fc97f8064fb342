package tools_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// Through MCP, without --allow-host-access, no path a tool takes reaches a
// host file outside the project: each is refused with the path, the rule
// and the flags, the file outside is neither read nor written, and a
// refused restart leaves the running guest alone.
func TestHostPathPolicy(t *testing.T) {
	base := t.TempDir()
	work, outside := filepath.Join(base, "work"), filepath.Join(base, "outside")
	for _, d := range []string{work, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tiny := testImage(t, "tiny.bin")
	secret := filepath.Join(outside, "secret.img")
	if err := os.WriteFile(secret, append([]byte("SECRET"), make([]byte, 1<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "k.bin"), tiny, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(work, "leak.img")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(secret)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = work }, nil)

	// A guest runs from a kernel inside the project.
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"kernel": "k.bin", "network": "user", "wait_for": prompt}, &b)
	if !b.Matched {
		t.Fatalf("boot from the project: %+v", b)
	}

	refusals := []struct {
		args map[string]any
		want []string
	}{
		{map[string]any{"kernel": secret}, []string{"kernel " + secret + " is refused", "outside the project root", "--allow-path", "--allow-host-access"}},
		{map[string]any{"kernel": "k.bin", "initrd": secret}, []string{"initrd", "is refused"}},
		{map[string]any{"kernel": "k.bin", "dtb": "../outside/secret.img"}, []string{"dtb", "resolves to " + secret}},
		{map[string]any{"kernel": "k.bin", "bios": secret}, []string{"bios", "is refused"}},
		{map[string]any{"kernel": "k.bin", "drives": []any{map[string]any{"path": secret}}}, []string{"drives[0]", "is refused"}},
		{map[string]any{"kernel": "k.bin", "drives": []any{map[string]any{"path": "leak.img", "readonly": true}}}, []string{"drives[0] leak.img", "resolves to " + secret}},
		{map[string]any{"project_root": "/"}, []string{"project_root / is refused"}},
		{map[string]any{"project_root": outside, "kernel": "secret.img"}, []string{"project_root " + outside + " is refused", "working directory"}},
	}
	for _, r := range refusals {
		r.args["restart"] = true
		s.wantError("qemu_boot", r.args, r.want...)
	}
	var st struct {
		State string `json:"state"`
		PID   int    `json:"pid"`
	}
	s.mustCall("qemu_status", nil, &st)
	if st.State != "running" || st.PID != b.PID {
		t.Errorf("after refused restarts the guest is %s (pid %d), want running pid %d", st.State, st.PID, b.PID)
	}

	// Capture files: neither created nor read outside.
	s.wantError("qemu_pcap_start", map[string]any{"path": filepath.Join(outside, "x.pcap")}, "is refused")
	s.wantError("qemu_pcap_read", map[string]any{"path": secret}, "is refused")
	s.wantError("qemu_pcap_read", map[string]any{"path": "/etc/shadow"}, "is refused")
	if _, err := os.Stat(filepath.Join(outside, "x.pcap")); err == nil {
		t.Error("a capture file was created outside the project")
	}

	after, _ := os.Stat(secret)
	if !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Errorf("the file outside changed: %v %d -> %v %d", before.ModTime(), before.Size(), after.ModTime(), after.Size())
	}
	if at := atime(after); at.After(atime(before)) {
		t.Errorf("the file outside was read (atime %v -> %v)", atime(before), at)
	}
}

// --allow-host-access lifts the policy; --allow-path adds a read-only root.
func TestHostPathFlags(t *testing.T) {
	outside := t.TempDir()
	tiny := testImage(t, "tiny.bin")
	kernel := filepath.Join(outside, "k.bin")
	if err := os.WriteFile(kernel, tiny, 0o644); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(outside, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSessionWith(t, func(c *testConfig) { c.AllowPaths = []string{outside} }, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"kernel": kernel, "drives": []any{map[string]any{"path": disk, "readonly": true}}, "wait_for": prompt}, &b)
	if !b.Matched {
		t.Errorf("boot from an allowed path: %+v", b)
	}
	s.wantError("qemu_boot", map[string]any{"kernel": kernel, "drives": []any{map[string]any{"path": disk}}, "restart": true},
		"refused for writing", "read-only", "rule allow-path", "readonly: true")

	// (Another image: QEMU itself locks the one the first guest reads.)
	disk2 := filepath.Join(outside, "disk2.img")
	if err := os.WriteFile(disk2, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newSessionWith(t, func(c *testConfig) { c.AllowHostAccess = true }, nil)
	h.mustCall("qemu_boot", map[string]any{"kernel": kernel, "drives": []any{map[string]any{"path": disk2}}, "wait_for": prompt}, &b)
	if !b.Matched {
		t.Errorf("boot with --allow-host-access: %+v", b)
	}
}

func atime(fi os.FileInfo) time.Time {
	st := fi.Sys().(*syscall.Stat_t)
	return time.Unix(st.Atim.Sec, st.Atim.Nsec)
}

// Kept files stay under their cap: a new boot removes the oldest transcript
// of a stopped guest, never the running boot's, nor a file of another live
// server.
func TestKeptCap(t *testing.T) {
	captures := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.Captures = captures; c.KeepCap = 256 << 10 }, nil)
	var b struct {
		bootOut
		Transcript  string   `json:"transcript"`
		KeptRemoved []string `json:"kept_removed"`
	}
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt}, &b)
	first := b.Transcript
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "flood 300000", "wait_for": `flood done 300000\r\n`, "max_bytes": 1}, &w)
	if !w.Matched {
		t.Fatalf("flood: %+v", w)
	}
	// Still running: its transcript is over the cap and stays.
	s.mustCall("qemu_boot", map[string]any{"instance": "other", "wait_for": prompt}, nil)
	if fi, err := os.Stat(first); err != nil || fi.Size() < 300000 {
		t.Fatalf("the running guest's transcript: %v", err)
	}
	s.mustCall("qemu_shutdown", nil, nil)
	s.mustCall("qemu_shutdown", map[string]any{"instance": "other"}, nil)

	// Another live server's transcript, older still: never ours to remove.
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	info, err := proc.Stat(sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(captures, names.Transcript(names.Owner{PID: info.PID, StartTime: info.StartTime}, "default", 1))
	if err := os.WriteFile(theirs, make([]byte, 300000), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(theirs, old, old)

	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt, "restart": true}, &b)
	if _, err := os.Stat(first); err == nil || len(b.KeptRemoved) == 0 || b.KeptRemoved[0] != first {
		t.Errorf("the stopped guest's transcript %s past the cap: removed %v", first, b.KeptRemoved)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("another live server's transcript was removed: %v", err)
	}
	if _, err := os.Stat(b.Transcript); err != nil {
		t.Errorf("the new boot's transcript: %v", err)
	}
}
