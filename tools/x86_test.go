package tools_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
)

// qemu_boot {arch: "x86_64"} with no kernel boots the built-in x86_64 tiny
// kernel on q35: the console echoes; a snapshot restored three times
// brings its state back; poweroff ends QEMU with status 0.
func TestX86TinyKernel(t *testing.T) {
	snaps := t.TempDir()
	s, q := archSession(t, x86_64.Arch, func(c *testConfig) { c.Snapshots = snaps })
	var b bootOut
	res := s.call("qemu_boot", map[string]any{"arch": "x86_64", "wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched || !strings.Contains(b.Output, "qemu-mcp tiny kernel") {
		t.Fatalf("boot: %s %+v", text(res), b)
	}
	var st struct {
		Arch string   `json:"arch"`
		Argv []string `json:"argv"`
	}
	s.mustCall("qemu_status", nil, &st)
	if len(st.Argv) == 0 || st.Argv[0] != q || !slices.Contains(st.Argv, "q35") {
		t.Errorf("command line %q: want %s and q35", st.Argv, q)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo one", "wait_for": "one\r\n" + prompt}, &w)
	if !w.Matched {
		t.Fatalf("echo: %+v", w)
	}
	var si snapInfo
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "one"}, &si)
	s.mustCall("serial_send", map[string]any{"data": "echo two", "wait_for": "two\r\n" + prompt}, &w)
	for k := range 3 {
		var lo loadFull
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "one"}, &lo)
		s.mustCall("serial_send", map[string]any{"data": "echo again", "wait_for": "again\r\n" + prompt, "timeout": 10}, &w)
		if !w.Matched {
			t.Fatalf("restore %d: %+v", k+1, w)
		}
	}
	s.poweroffExits()
}

// The x86_64 Linux guest: its shell, guest_exec's statuses, a share, a
// snapshot restored with a live timer three times, a boot from it.
func TestX86Linux(t *testing.T) { archLinux(t, x86_64.Arch) }
