package tools_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
	if err := os.WriteFile(filepath.Join(root, "tiny.bin"), testImage(t, "tiny.bin"), 0o644); err != nil {
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
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = root }, nil)
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
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = root }, nil)
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
	// A drive's device with a property the server does not take, and a
	// host file: both named.
	res = s.call("qemu_boot", map[string]any{"restart": true,
		"command_line": "-kernel tiny.bin -bios none -drive file=/etc/shadow,if=none,id=x -device virtio-blk-device,drive=x,serial=abc"}, nil)
	if msg := text(res); !res.IsError || !strings.Contains(msg, "serial") || !strings.Contains(msg, "/etc/shadow") {
		t.Errorf("a drive's device with serial= and /etc/shadow: %s", msg)
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

// Each drive of a Linux guest is at the transport address the docs give
// (docs/running.md, "Drives where a kernel looks"), read from sysfs:
// without bus, the first drive at the highest address and each next one
// below it; with bus, where it says.
func TestDriveSlotsLinux(t *testing.T) {
	s, lin, root := linuxSession(t)
	for i, name := range []string{"a.img", "b.img"} {
		img := make([]byte, 1<<20)
		copy(img, "qemu-mcp-drive-"+string(rune('A'+i)))
		if err := os.WriteFile(filepath.Join(root, name), img, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Which transport each disk is on, by its first bytes.
	const probe = `for d in /sys/block/vd*; do n=${d##*/}; echo "$(readlink $d | grep -o '1000[0-9a-f]000.virtio_mmio') $(head -c 16 /dev/$n)"; done`
	for _, tc := range []struct {
		name   string
		drives []map[string]any
		want   map[string]string // marker -> address
	}{
		{"without bus", []map[string]any{{"path": "a.img", "format": "raw"}, {"path": "b.img", "format": "raw"}},
			map[string]string{"qemu-mcp-drive-A": "10008000", "qemu-mcp-drive-B": "10007000"}},
		{"with bus", []map[string]any{{"path": "a.img", "format": "raw", "bus": "virtio-mmio-bus.0"}, {"path": "b.img", "format": "raw", "bus": "virtio-mmio-bus.3"}},
			map[string]string{"qemu-mcp-drive-A": "10001000", "qemu-mcp-drive-B": "10004000"}},
	} {
		var b bootOut
		res := s.call("qemu_boot", linuxBoot(lin, map[string]any{"drives": tc.drives, "restart": true}), &b)
		if res.IsError || !b.Matched {
			t.Fatalf("%s: boot: %s", tc.name, text(res))
		}
		o := s.exec(probe, 20)
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(o.Output), "\n") {
			addr, marker, _ := strings.Cut(strings.TrimSpace(l), ".virtio_mmio ")
			got[marker] = addr
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: disks at %v, want %v (guest said %q)", tc.name, got, tc.want, o.Output)
		}
	}
}

// A recording of a command_line boot wires its drive for block replay on
// the line's transport, and its replay boots the same machine.
func TestCommandLineRecording(t *testing.T) {
	root := tinyProject(t)
	state := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir = root
		c.Captures = filepath.Join(state, "captures")
		os.MkdirAll(c.Captures, 0o700)
	}, nil)
	line := "-machine virt -bios none -kernel tiny.bin -nographic -global virtio-mmio.force-legacy=false " +
		"-drive file=disk.img,if=none,format=raw,id=x0,readonly=on -device virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0"
	var b lineBootOut
	res := s.call("qemu_boot", map[string]any{"command_line": line, "record": "line", "wait_for": prompt}, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("recorded boot: %s", text(res))
	}
	argv := strings.Join(b.Argv, " ")
	for _, want := range []string{"driver=blkreplay,if=none,image=drive0-img,id=drive0", "virtio-blk-device,drive=drive0,bus=virtio-mmio-bus.0", "-global virtio-mmio.force-legacy=false"} {
		if !strings.Contains(argv, want) {
			t.Errorf("recording's argv %q lacks %q", argv, want)
		}
	}
	s.mustCall("qemu_shutdown", nil, nil)
	res = s.call("qemu_boot", map[string]any{"replay": "line"}, &b)
	if res.IsError {
		t.Fatalf("replay: %s", text(res))
	}
	if got := strings.Join(b.Argv, " "); !strings.Contains(got, "bus=virtio-mmio-bus.0") || !strings.Contains(got, "virtio-mmio.force-legacy=false") {
		t.Errorf("replay's argv %q lacks the recorded machine's bus or modern transports", got)
	}
}
