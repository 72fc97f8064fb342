package tools_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

type execOut struct {
	ExitStatus     *int    `json:"exit_status"`
	Output         string  `json:"output"`
	OutputStart    int64   `json:"output_start"`
	OutputEnd      int64   `json:"output_end"`
	Cursor         int64   `json:"cursor"`
	DurationMS     float64 `json:"duration_ms"`
	TimedOut       bool    `json:"timed_out"`
	Interrupted    bool    `json:"interrupted"`
	StillRunning   bool    `json:"still_running"`
	ShellExited    bool    `json:"shell_exited"`
	NoShell        bool    `json:"no_shell"`
	Hint           string  `json:"hint"`
	Truncated      bool    `json:"truncated"`
	Elided         *struct{ Start, End int64 }
	KernelMessages []struct {
		Cursor int64  `json:"cursor"`
		Text   string `json:"text"`
	} `json:"kernel_messages"`
	Tests *struct {
		Passed, Failed, Skipped, Missing int
		Failures                         []struct {
			Name        string   `json:"name"`
			Diagnostics []string `json:"diagnostics"`
		} `json:"failures"`
	} `json:"tests"`
	GuestEvent *guestEvent `json:"guest_event"`
}

type guestEvent struct {
	Event  string         `json:"event"`
	Time   time.Time      `json:"time"`
	Data   map[string]any `json:"data"`
	Cursor int64          `json:"cursor"`
}

func (s *session) exec(cmd string, timeout float64) execOut {
	s.t.Helper()
	var o execOut
	args := map[string]any{"command": cmd}
	if timeout > 0 {
		args["timeout"] = timeout
	}
	res := s.call("guest_exec", args, &o)
	if res.IsError {
		s.t.Fatalf("guest_exec %q: %s", cmd, text(res))
	}
	return o
}

func status(o execOut) int {
	if o.ExitStatus == nil {
		return -1
	}
	return *o.ExitStatus
}

// linuxProject is a project directory with the Linux guest allowed to be
// read from its build directory.
func linuxSession(t *testing.T) (*session, testguest.Linux, string) {
	lin := testguest.LinuxGuest(t)
	root := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir, c.Snapshots, c.AllowPaths = root, t.TempDir(), []string{lin.Dir}
	}, nil)
	return s, lin, root
}

func linuxBoot(lin testguest.Linux, extra map[string]any) map[string]any {
	args := map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend,
		"memory": "256M", "wait_for": testguest.LinuxPrompt, "timeout": 60}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// guest_exec on the Linux guest: exit statuses, a long output read whole
// through the cursors, a timeout that Ctrl-C ends, output like the
// framing, two calls at once, kernel messages told apart, and test
// results of KUnit (boot log and debugfs) and of kselftest-style TAP.
func TestGuestExecLinux(t *testing.T) {
	s, lin, _ := linuxSession(t)
	var b struct {
		bootOut
		Tests *struct{ Passed, Failed, Skipped int } `json:"tests"`
	}
	// printk.time: kernel messages carry a timestamp, which tells them
	// apart; kunit.enable: KUnit's example suite runs at boot.
	s.mustCall("qemu_boot", linuxBoot(lin, map[string]any{"append": testguest.LinuxAppend + " printk.time=1 kunit.enable=1", "max_bytes": 32768}), &b)
	if !b.Matched {
		t.Fatalf("boot: %+v", b)
	}
	if b.Tests == nil || b.Tests.Passed != 2 || b.Tests.Skipped != 2 || b.Tests.Failed != 0 {
		t.Errorf("KUnit in the boot log: %+v", b.Tests)
	}
	for _, c := range []struct {
		cmd  string
		want int
	}{{"true", 0}, {"false", 1}, {"sh -c 'exit 7'", 7}} {
		if o := s.exec(c.cmd, 0); status(o) != c.want || o.Output != "" {
			t.Errorf("%s: %+v", c.cmd, o)
		}
	}

	// seq 1 100000: the head and the tail in the result, the middle
	// paged with serial_read, every byte once.
	o := s.exec("seq 1 100000", 120)
	if status(o) != 0 || !o.Truncated || o.Elided == nil {
		t.Fatalf("seq: %+v", o.Hint)
	}
	if !strings.HasPrefix(o.Output, "1\n2\n3\n") || !strings.HasSuffix(o.Output, "\n99999\n100000\n") {
		t.Errorf("seq: head and tail %q ... %q", o.Output[:20], o.Output[len(o.Output)-20:])
	}
	// Every byte of it, page by page, from output_start to output_end.
	var all strings.Builder
	for since := o.OutputStart; since < o.OutputEnd; {
		var r struct {
			Output string `json:"output"`
			Cursor int64  `json:"cursor"`
		}
		s.mustCall("serial_read", map[string]any{"since": since, "max_bytes": min(32768, int(o.OutputEnd-since)), "raw": true}, &r)
		if r.Cursor <= since {
			t.Fatalf("no progress at %d", since)
		}
		all.WriteString(r.Output)
		since = r.Cursor
	}
	// Kernel messages that landed in the middle (random: crng init
	// done) stay in the console.
	got := regexp.MustCompile(`\[\s*\d+\.\d{6}\] [^\n]*\n`).ReplaceAllString(strings.ReplaceAll(all.String(), "\r\n", "\n"), "")
	var want strings.Builder
	for i := 1; i <= 100000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if got != want.String() {
		t.Errorf("seq read through the cursors: %d bytes, want %d", len(got), want.Len())
	}

	// Output that looks like the framing is the command's.
	if o := s.exec(`echo "qm0123456789ab:E0"; printf 'qm%s:S\n' x; echo 'trap - 0'`, 0); o.Output != "qm0123456789ab:E0\nqmx:S\ntrap - 0\n" {
		t.Errorf("framing-like output: %q", o.Output)
	}

	// sleep 60 with a timeout of 2 s: timed out in about 2 s, and the
	// next call answers.
	t0 := time.Now()
	o = s.exec("echo started; sleep 60", 2)
	if el := time.Since(t0); !o.TimedOut || !o.Interrupted || o.Output != "started\n" || el > 5*time.Second {
		t.Errorf("sleep 60: %+v after %v", o, el)
	}
	if o := s.exec("echo next", 0); o.Output != "next\n" || status(o) != 0 {
		t.Errorf("after the timeout: %+v", o)
	}

	// Two calls at once: one after the other, each with its own output.
	var wg sync.WaitGroup
	outs := make([]execOut, 2)
	for k, cmd := range []string{"echo one; sleep 0.3; echo one again", "echo two"} {
		wg.Go(func() { outs[k] = s.exec(cmd, 0) })
	}
	wg.Wait()
	if outs[0].Output != "one\none again\n" || outs[1].Output != "two\n" {
		t.Errorf("two calls at once: %q %q", outs[0].Output, outs[1].Output)
	}

	// A kernel message in the middle stays in the console and is told
	// apart from the output.
	o = s.exec("echo before; echo qemu-mcp-kmsg-test > /dev/kmsg; sleep 0.2; echo after", 0)
	if o.Output != "before\nafter\n" || len(o.KernelMessages) != 1 || !strings.Contains(o.KernelMessages[0].Text, "qemu-mcp-kmsg-test") {
		t.Errorf("kernel message: %q %+v", o.Output, o.KernelMessages)
	}
	// dmesg's old lines are the command's output.
	if o := s.exec("dmesg | grep 'Linux version'", 0); !strings.Contains(o.Output, "] Linux version 6.1") || len(o.KernelMessages) != 0 {
		t.Errorf("dmesg: %q %+v", o.Output, o.KernelMessages)
	}

	// KUnit's results from debugfs.
	o = s.exec("mount -t debugfs none /sys/kernel/debug && cat /sys/kernel/debug/kunit/example/results", 0)
	if o.Tests == nil || o.Tests.Passed != 2 || o.Tests.Skipped != 2 || o.Tests.Failed != 0 {
		t.Errorf("KUnit from debugfs: %+v %q", o.Tests, o.Output)
	}
	// kselftest-style TAP with a failure and nested subtests.
	script := `cat <<'EOF'
TAP version 13
1..2
# selftests: demo: nested
# TAP version 13
# 1..2
# ok 1 first
# # want 4, got 5
# not ok 2 second
not ok 1 selftests: demo: nested # exit=1
ok 2 selftests: demo: plain
EOF`
	o = s.exec(script, 0)
	if o.Tests == nil || o.Tests.Passed != 2 || o.Tests.Failed != 1 || len(o.Tests.Failures) != 1 ||
		o.Tests.Failures[0].Name != "selftests: demo: nested.second" || fmt.Sprint(o.Tests.Failures[0].Diagnostics) != "[# want 4, got 5]" {
		t.Errorf("TAP: %+v", o.Tests)
	}

	// exit ends the shell; the guest's init starts another.
	if o := s.exec("exit 5", 0); !o.ShellExited || status(o) != 5 {
		t.Errorf("exit 5: %+v", o)
	}
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, &w)
	if o := s.exec("echo again", 0); o.Output != "again\n" {
		t.Errorf("after exit: %+v", o)
	}
}

// Shares: read-only and writable, symlinks that do not reach outside,
// nothing the guest makes becomes a host symlink, a save refused while a
// share is mounted (the guest runs on), and a snapshot taken with shares
// restores with them.
func TestSharesLinux(t *testing.T) {
	s, lin, root := linuxSession(t)
	ro, rw := filepath.Join(root, "ro"), filepath.Join(root, "rw")
	for _, d := range []string{ro, rw} {
		os.Mkdir(d, 0o755)
	}
	os.WriteFile(filepath.Join(ro, "hello.txt"), []byte("hello from the host\n"), 0o644)
	os.WriteFile(filepath.Join(root, "secret.txt"), []byte("host secret\n"), 0o644)
	os.Symlink("../secret.txt", filepath.Join(ro, "up"))
	os.Symlink(filepath.Join(root, "secret.txt"), filepath.Join(ro, "abs"))
	var b struct {
		bootOut
		Shares []struct {
			Path, Tag, Mount string
			Writable         bool
		} `json:"shares"`
	}
	s.mustCall("qemu_boot", linuxBoot(lin, map[string]any{"shares": []map[string]any{{"path": "ro"}, {"path": "rw", "writable": true, "tag": "out"}}}), &b)
	if len(b.Shares) != 2 || b.Shares[0].Tag != "ro" || b.Shares[1].Tag != "out" || !strings.Contains(b.Shares[0].Mount, "mount -t 9p") {
		t.Fatalf("shares: %+v", b.Shares)
	}
	for _, sh := range b.Shares {
		if o := s.exec(sh.Mount, 0); status(o) != 0 {
			t.Fatalf("%s: %+v", sh.Mount, o)
		}
	}
	if o := s.exec("cat /mnt/ro/hello.txt", 0); o.Output != "hello from the host\n" {
		t.Errorf("read: %+v", o)
	}
	if o := s.exec("echo changed > /mnt/ro/hello.txt", 0); status(o) == 0 {
		t.Errorf("write to a read-only share: %+v", o)
	}
	if o := s.exec("cat /mnt/ro/up /mnt/ro/abs", 0); status(o) == 0 || strings.Contains(o.Output, "host secret") {
		t.Errorf("symlinks out of the share: %+v", o)
	}
	if b, _ := os.ReadFile(filepath.Join(ro, "hello.txt")); string(b) != "hello from the host\n" {
		t.Errorf("the host file changed: %q", b)
	}
	if o := s.exec("echo from the guest > /mnt/out/new.txt && ln -s /etc/passwd /mnt/out/link && mkfifo /mnt/out/fifo && ls -l /mnt/out", 0); status(o) != 0 {
		t.Fatalf("write: %+v", o)
	}
	if b, _ := os.ReadFile(filepath.Join(rw, "new.txt")); string(b) != "from the guest\n" {
		t.Errorf("host sees %q", b)
	}
	for _, n := range []string{"link", "fifo"} {
		fi, err := os.Lstat(filepath.Join(rw, n))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s on the host: %v %v, want a plain file", n, fi, err)
		}
	}

	// A save with a mounted share is refused, clearly; the guest runs on.
	res := s.call("qemu_snapshot_save", map[string]any{"name": "shared"}, nil)
	if !res.IsError || !strings.Contains(text(res), "mounted") || !strings.Contains(text(res), "umount") {
		t.Fatalf("save with a mounted share: %s", text(res))
	}
	if o := s.exec("echo alive", 0); o.Output != "alive\n" {
		t.Fatalf("after the refused save: %+v", o)
	}
	if o := s.exec("umount /mnt/ro /mnt/out", 0); status(o) != 0 {
		t.Fatalf("umount: %+v", o)
	}
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "shared"}, nil)
	s.mustCall("qemu_snapshot_load", map[string]any{"name": "shared"}, nil)
	if o := s.exec(b.Shares[0].Mount+" && cat /mnt/ro/hello.txt", 0); o.Output != "hello from the host\n" {
		t.Errorf("after the restore: %+v", o)
	}
}

// Shares the boundary refuses, before anything starts.
func TestSharesRefused(t *testing.T) {
	root := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = root }, nil)
	os.MkdirAll(filepath.Join(root, "repo", ".git", "hooks"), 0o755)
	os.MkdirAll(filepath.Join(root, "deep", "sub", ".git"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "etc"))
	os.WriteFile(filepath.Join(root, "file"), nil, 0o644)
	for _, c := range []struct {
		share map[string]any
		want  string
	}{
		{map[string]any{"path": "/etc"}, "outside the project"},
		{map[string]any{"path": "etc"}, "resolves to /etc"},
		{map[string]any{"path": "repo", "writable": true}, ".git"},
		{map[string]any{"path": "deep", "writable": true}, ".git"},
		{map[string]any{"path": "repo/.git/hooks", "writable": true}, "git directory"},
		{map[string]any{"path": "file"}, "not a directory"},
		{map[string]any{"path": ".", "tag": "bad tag"}, "tag"},
	} {
		s.wantError("qemu_boot", map[string]any{"shares": []map[string]any{c.share}}, c.want)
	}
	// Read-only, a directory with a .git is fine.
	s.mustCall("qemu_boot", map[string]any{"shares": []map[string]any{{"path": "repo"}}, "wait_for": prompt}, nil)
}

// A console without a shell (the tiny kernel's) says so within the
// timeout; a guest reset interrupts a wait, and qemu_status lists it.
func TestExecWithoutShellAndEvents(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	t0 := time.Now()
	o := s.exec("true", 1)
	if !o.NoShell || o.ExitStatus != nil || !strings.Contains(o.Hint, "no shell answered") || time.Since(t0) > 3*time.Second {
		t.Errorf("no shell: %+v after %v", o, time.Since(t0))
	}
	type waitEv struct {
		waitOut
		GuestEvent *guestEvent `json:"guest_event"`
	}
	done := make(chan waitEv)
	go func() {
		var w waitEv
		s.call("serial_read", map[string]any{"wait_for": "never printed", "timeout": 20}, &w)
		done <- w
	}()
	time.Sleep(300 * time.Millisecond)
	s.mustCall("qmp_command", map[string]any{"command": "system_reset"}, nil)
	select {
	case w := <-done:
		if w.GuestEvent == nil || w.GuestEvent.Event != "RESET" || w.TimedOut || w.Matched {
			t.Errorf("wait across a reset: %+v", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reset did not end the wait")
	}
	var st struct {
		Events []guestEvent `json:"events"`
	}
	s.mustCall("qemu_status", nil, &st)
	found := false
	for _, e := range st.Events {
		found = found || e.Event == "RESET" && e.Data["reason"] == "host-qmp-system-reset"
	}
	if !found {
		t.Errorf("qemu_status events: %+v", st.Events)
	}
}

// reboot and poweroff in the Linux guest are events, and the waits they
// interrupt say so.
func TestRebootPoweroffEvents(t *testing.T) {
	s, lin, _ := linuxSession(t)
	s.mustCall("qemu_boot", linuxBoot(lin, nil), nil)
	o := s.exec("reboot -f", 20)
	if o.GuestEvent == nil || o.GuestEvent.Event != "RESET" || o.GuestEvent.Data["reason"] != "guest-reset" {
		t.Fatalf("reboot: %+v", o)
	}
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 60}, &w)
	if !w.Matched {
		t.Fatalf("no prompt after the reboot: %+v", w)
	}
	var pw struct {
		waitOut
		GuestEvent *guestEvent `json:"guest_event"`
	}
	res := s.call("serial_send", map[string]any{"data": "poweroff -f", "wait_for": "never printed", "timeout": 20}, &pw)
	if pw.GuestEvent == nil || pw.GuestEvent.Event != "SHUTDOWN" || !strings.Contains(text(res), "shut down") {
		var st any
		s.mustCall("qemu_status", nil, &st)
		t.Fatalf("poweroff: %+v %s; status %v", pw, text(res), st)
	}
	var st struct {
		Events []guestEvent `json:"events"`
	}
	s.mustCall("qemu_status", nil, &st)
	var names []string
	for _, e := range st.Events {
		names = append(names, e.Event+":"+fmt.Sprint(e.Data["reason"]))
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "RESET:guest-reset") || !strings.Contains(got, "SHUTDOWN:guest-shutdown") {
		t.Errorf("qemu_status events: %s", got)
	}
}
