package tools_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Through the real tools: each class of host access is refused with the
// rule that refused it; guest-only commands pass.
func TestBoundary(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	// QMP writes files only into a directory of their own.
	captures := filepath.Join(s.dir, "captures", "qemu")
	for _, tc := range []struct {
		cmd  string
		args map[string]any
		rule string
	}{
		{"migrate", map[string]any{"uri": "exec:touch /tmp/pwned"}, "host-uri"},
		{"human-monitor-command", map[string]any{"command-line": `migrate "exec:touch /tmp/pwned"`}, "host-uri"},
		{"getfd", map[string]any{"fdname": "x"}, "fd-passing"},
		{"add-fd", map[string]any{}, "fd-passing"},
		{"chardev-add", map[string]any{"id": "c", "backend": map[string]any{"type": "file", "data": map[string]any{"out": "/tmp/x"}}}, ""},
		{"netdev_add", map[string]any{"type": "user", "id": "n"}, ""},
		{"blockdev-add", map[string]any{"driver": "file", "node-name": "f", "filename": "/etc/shadow"}, ""},
		{"dump-guest-memory", map[string]any{"paging": false, "protocol": "file:/tmp/mem"}, "captures-only"},
		{"pmemsave", map[string]any{"val": 0, "size": 16, "filename": "/tmp/mem"}, "captures-only"},
		{"object-add", map[string]any{"qom-type": "memory-backend-file", "id": "m", "mem-path": "/tmp", "size": 4096}, ""},
		{"screendump", map[string]any{"filename": captures + "/../../escape.ppm"}, "captures-only"},
	} {
		res := s.call("qmp_command", map[string]any{"command": tc.cmd, "arguments": tc.args}, nil)
		msg := text(res)
		if !res.IsError || !strings.Contains(msg, "refused by rule") || !strings.Contains(msg, tc.rule) || !strings.Contains(msg, "--allow-host-access") {
			t.Errorf("qmp %s: %s", tc.cmd, msg)
		}
	}
	for _, args := range [][]string{
		{"/etc/shadow", "-device", "virtio-blk-device,drive=none0"},
		{"-drive", "file=/etc/shadow,if=none,id=d"},
		{"-netdev", "user,id=n,hostfwd=tcp::2222-:22"},
		{"-object", "memory-backend-file,id=m,mem-path=/tmp,size=4096"},
		{"-gdb", "tcp::1234"},
		{"-device", "loader,file=/etc/shadow,addr=0x80000000"},
		{"-machine", "dumpdtb=/tmp/x.dtb"},
	} {
		res := s.call("qemu_boot", map[string]any{"restart": true, "extra_args": args}, nil)
		if msg := text(res); !res.IsError || !strings.Contains(msg, "refused by rule") {
			t.Errorf("extra_args %q: %s", args, msg)
		}
	}
	// Guest-only commands and arguments pass.
	s.mustCall("qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "info registers"}}, nil)
	var pm struct{}
	s.mustCall("qmp_command", map[string]any{"command": "pmemsave", "arguments": map[string]any{"val": 0x80200000, "size": 64, "filename": filepath.Join(captures, "mem.bin")}}, &pm)
	if fi, err := os.Stat(filepath.Join(captures, "mem.bin")); err != nil || fi.Size() != 64 {
		t.Errorf("pmemsave into captures: %v", err)
	}
	// Never onto a file that exists: not the same one twice, not the
	// server's own transcript, captures or record.
	var st struct {
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_status", nil, &st)
	before, _ := os.Stat(st.Transcript)
	for _, target := range []string{filepath.Join(captures, "mem.bin"), st.Transcript, filepath.Join(s.dir, ownRecord(t))} {
		s.wantError("qmp_command", map[string]any{"command": "pmemsave", "arguments": map[string]any{"val": 0x80200000, "size": 64, "filename": target}}, "refused by rule")
		s.wantError("qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "pmemsave 0x80200000 64 \"" + target + "\""}}, "refused by rule")
	}
	if after, _ := os.Stat(st.Transcript); after.Size() < before.Size() {
		t.Errorf("the transcript shrank from %d to %d bytes", before.Size(), after.Size())
	}
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"restart": true, "extra_args": []string{"-device", "virtio-rng-device", "-smp", "2", "-no-reboot"}, "wait_for": prompt}, &b)
	if !b.Matched {
		t.Errorf("boot with harmless extra args: %+v", b)
	}
}

// --allow-host-access lifts the boundary: the same command reaches QEMU,
// which answers for itself.
func TestAllowHostAccess(t *testing.T) {
	s := newSessionWith(t, func(c *testConfig) { c.AllowHostAccess = true }, nil)
	s.bootTiny()
	s.wantError("qmp_command", map[string]any{"command": "no-such-command"}, "CommandNotFound")
	s.wantError("qmp_command", map[string]any{"command": "getfd", "arguments": map[string]any{"fdname": "x"}}, "GenericError")
	img := filepath.Join(t.TempDir(), "d.img")
	os.WriteFile(img, make([]byte, 1<<20), 0o644)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"restart": true, "extra_args": []string{"-drive", "file=" + img + ",format=raw,if=none,id=x", "-device", "virtio-blk-device,drive=x"}, "wait_for": prompt}, &b)
	if !b.Matched {
		t.Errorf("boot with a host drive allowed: %+v", b)
	}
}

// Device properties that name no host resource pass extra_args and
// device_add by the type the server's QEMU gives them (asked of it when a
// check first needs it, then cached); host-facing ones are refused by
// their rule, naming the property.
func TestBoundaryDeviceProperties(t *testing.T) {
	cache := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.CacheDir = cache }, nil)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"extra_args": []string{"-global", "virtio-mmio.force-legacy=false",
		"-global", "virtio-blk-device.queue-size=128", "-device", "virtio-rng-pci,disable-legacy=on"},
		"wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched {
		t.Fatalf("boot with -global and typed -device properties: %+v", b)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "qemu-caps", "*.props.json")); len(m) != 1 {
		t.Errorf("the property types are not cached: %v", m)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-global", "loader.file=/etc/passwd"}, `refused by rule "host-file": property file of loader is a string (str)`},
		{[]string{"-global", "virtio-blk-pci.romfile=x"}, `refused by rule "host-file": property romfile of virtio-blk-pci`},
		{[]string{"-global", "virtio-blk-device.queue-size=abc"}, `refused by rule "guest-device": property queue-size of virtio-blk-device`},
		{[]string{"-device", "virtio-blk-device,drive=x,serial=abc"}, `refused by rule "block-layer": property drive of virtio-blk-device`},
	} {
		s.wantError("qemu_boot", map[string]any{"restart": true, "extra_args": tc.args}, tc.want, "--allow-host-access")
	}
	qmp := func(command string, args map[string]any) string {
		return text(s.call("qmp_command", map[string]any{"command": command, "arguments": args}, nil))
	}
	// Passed by the boundary: QEMU answers for itself (no such bus). The
	// guest is stopped first: QEMU 7.2's device_add, even one that fails,
	// can stall for long while the tiny kernel runs.
	if res := s.call("qmp_command", map[string]any{"command": "stop", "arguments": map[string]any{}}, nil); res.IsError {
		t.Fatalf("stop: %s", text(res))
	}
	if msg := qmp("device_add", map[string]any{"driver": "virtio-rng-pci", "disable-legacy": "on", "bus": "nobus"}); strings.Contains(msg, "refused by rule") || !strings.Contains(msg, "nobus") {
		t.Errorf("device_add with a typed property: %s", msg)
	}
	if msg := qmp("human-monitor-command", map[string]any{"command-line": "device_add virtio-rng-pci,disable-legacy=auto,bus=nobus"}); strings.Contains(msg, "refused by rule") || !strings.Contains(msg, "nobus") {
		t.Errorf("HMP device_add with a typed property: %s", msg)
	}
	if msg := qmp("device_add", map[string]any{"driver": "virtio-rng-pci", "disable-legacy": "/etc/passwd"}); !strings.Contains(msg, `refused by rule "guest-device"`) {
		t.Errorf("device_add with a path for an OnOffAuto: %s", msg)
	}
	if msg := qmp("human-monitor-command", map[string]any{"command-line": "device_add virtio-blk-device,drive=x"}); !strings.Contains(msg, `refused by rule "block-layer": property drive`) {
		t.Errorf("HMP device_add with drive=: %s", msg)
	}
}
