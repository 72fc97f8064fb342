package tools_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The teaching kernel of testdata/kernels/tutor (M-mode start on three
// harts, the disk on the first virtio-mmio transport only, modern virtio
// only, a shell that is not POSIX) boots from the very line its
// `make -n qemu` prints, and reads its disk; so it does with drives on
// that transport and modern virtio asked for by a field, and with a
// profile's drives and -global; guest_exec says there is no shell it can
// drive, and the console goes on working after it.
func TestTutorKernel(t *testing.T) {
	dir := testguest.Tutor(t, nil)
	line := testguest.TutorQEMULine(t, dir)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = dir }, nil)

	var b lineBootOut
	res := s.call("qemu_boot", map[string]any{"command_line": line, "wait_for": tutorPrompt}, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("boot from %q: %s", line, text(res))
	}
	if b.CommandLine == nil || len(b.CommandLine.Refused) != 0 || !strings.Contains(strings.Join(optionsOf(b.CommandLine.Replaced), " "), "-nographic") {
		t.Errorf("command_line report: %+v", b.CommandLine)
	}
	ls := func(how string) {
		t.Helper()
		var w waitOut
		res := s.call("serial_send", map[string]any{"data": "ls", "wait_for": tutorPrompt}, &w)
		if res.IsError || !w.Matched || !strings.Contains(w.Output, "hello.txt") || !strings.Contains(w.Output, "poem.txt") {
			t.Errorf("%s: ls: %s %q", how, text(res), w.Output)
		}
	}
	ls("command_line")

	// guest_exec: the shell is not one it can drive; it says so within
	// its timeout, and the console is the user's again.
	start := time.Now()
	var o execOut
	res = s.call("guest_exec", map[string]any{"command": "echo hi", "timeout": 5}, &o)
	if res.IsError || !o.NoShell {
		t.Errorf("guest_exec on a shell that is not POSIX: %s %+v", text(res), o)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Errorf("guest_exec took %v past its 5 s timeout", el)
	}
	var w waitOut
	res = s.call("serial_send", map[string]any{"data": "echo after-exec", "wait_for": `after-exec\r?\n`}, &w)
	if res.IsError || !w.Matched {
		t.Errorf("serial_send after guest_exec: %s", text(res))
	}
	s.call("serial_read", map[string]any{"wait_for": tutorPrompt, "timeout": 5}, nil)

	// drives on the first transport and modern virtio, no -global.
	res = s.call("qemu_boot", map[string]any{"restart": true, "kernel": "kernel/kernel", "bios": "none", "smp": 3, "memory": "128M",
		"drives": []map[string]any{{"path": "fs.img", "format": "raw", "bus": "virtio-mmio-bus.0"}}, "virtio_modern": true, "wait_for": tutorPrompt}, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("boot with drives[].bus and virtio_modern: %s", text(res))
	}
	ls("drives[].bus and virtio_modern")

	// A profile with drives (bus set) and the -global in extra_args.
	prof := `{"profiles": {"tutor": {"kernel": "kernel/kernel", "bios": "none", "smp": 3, "memory": "128M", "prompt": "\\$ $",
		"drives": [{"path": "fs.img", "format": "raw", "bus": "virtio-mmio-bus.0"}],
		"extra_args": ["-global", "virtio-mmio.force-legacy=false"]}}}`
	if err := os.WriteFile(filepath.Join(dir, ".qemu-mcp.json"), []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
	res = s.call("qemu_boot", map[string]any{"restart": true, "profile": "tutor"}, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("boot of a profile with drives[].bus and -global: %s", text(res))
	}
	ls("profile with -global")
}
