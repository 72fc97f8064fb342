package tools_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/tools"
)

type lineEntry struct {
	Option string `json:"option"`
	As     string `json:"as"`
	Reason string `json:"reason"`
}

type lineReport struct {
	Kept     []lineEntry `json:"kept"`
	Replaced []lineEntry `json:"replaced"`
	Refused  []lineEntry `json:"refused"`
}

type lineBootOut struct {
	bootOut
	CommandLine *lineReport `json:"command_line"`
}

func optionsOf(es []lineEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Option)
	}
	return out
}

// tinyProject is a project directory holding the tiny kernel as tiny.bin
// and a small disk image.
func tinyProject(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	b, err := os.ReadFile("../testdata/images/tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "tiny.bin"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "disk.img"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// A project's own QEMU line boots as it is: what the server owns is
// replaced, the rest kept, and the QEMU it runs has the line's machine.
func TestCommandLineBoot(t *testing.T) {
	root := tinyProject(t)
	s := newSessionWith(t, func(c *tools.Config) { c.WorkDir = root }, nil)
	line := `qemu-system-riscv64 -machine virt -bios none -kernel tiny.bin -m 64M -smp 2 -nographic \
	  -global virtio-mmio.force-legacy=false \
	  -drive file=disk.img,if=none,format=raw,id=x0 -device virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0`
	var b lineBootOut
	res := s.call("qemu_boot", map[string]any{"command_line": line, "wait_for": prompt}, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("boot: %s", text(res))
	}
	if b.CommandLine == nil || len(b.CommandLine.Refused) != 0 {
		t.Fatalf("command_line report %+v", b.CommandLine)
	}
	if got := optionsOf(b.CommandLine.Replaced); !reflect.DeepEqual(got, []string{"qemu-system-riscv64", "-nographic"}) {
		t.Errorf("replaced %q, want the binary and -nographic", got)
	}
	argv := strings.Join(b.Argv, " ")
	for _, want := range []string{"-bios none", "-m 64M", "-smp 2", "-global virtio-mmio.force-legacy=false", "virtio-blk-device,drive=drive0,bus=virtio-mmio-bus.0"} {
		if !strings.Contains(argv, want) {
			t.Errorf("argv %q lacks %q", argv, want)
		}
	}
	if !strings.Contains(text(res), "replaced by the server's own: qemu-system-riscv64, -nographic") {
		t.Errorf("text: %s", text(res))
	}
	// Explicit fields override the line's.
	res = s.call("qemu_boot", map[string]any{"command_line": line, "memory": "96M", "restart": true, "wait_for": prompt}, &b)
	if res.IsError || !strings.Contains(strings.Join(b.Argv, " "), "-m 96M") {
		t.Errorf("memory given beside the line: %s %q", text(res), b.Argv)
	}
}

// A line with a monitor on a host socket and a host file is refused whole,
// naming both, and the guest already running as that instance goes on.
func TestCommandLineRefused(t *testing.T) {
	root := tinyProject(t)
	s := newSessionWith(t, func(c *tools.Config) { c.WorkDir = root }, nil)
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt}, nil)
	res := s.call("qemu_boot", map[string]any{"restart": true,
		"command_line": "-kernel tiny.bin -bios none -serial stdio -monitor telnet::4444,server,nowait -drive file=/etc/shadow,format=raw"}, nil)
	msg := text(res)
	if !res.IsError {
		t.Fatalf("refused line booted: %s", msg)
	}
	for _, want := range []string{"-monitor telnet::4444,server,nowait", "/etc/shadow", "nothing was started"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo still-here", "wait_for": "still-here\r\n"}, &w)
	// As argv, with a shell syntax error named.
	res = s.call("qemu_boot", map[string]any{"restart": true, "command_line": "-kernel tiny.bin | tee log"}, nil)
	if !res.IsError || !strings.Contains(text(res), "shell syntax") {
		t.Errorf("a pipe in the line: %s", text(res))
	}
	s.mustCall("serial_send", map[string]any{"data": "echo still-here-2", "wait_for": "still-here-2\r\n"}, &w)
}
