package qemumcp

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The x86_64 tiny kernel (testdata/images/tiny-x86_64/README.md), booted
// by a plain qemu-system-x86_64: these tests check its output contract,
// the riscv64 tiny kernel's, on a PC.

const (
	tinyX86ELF = "testdata/images/tiny-x86_64.elf"
	// qemuX86Env names another qemu-system-x86_64 for these tests.
	qemuX86Env     = testguest.QEMUEnv + "_X86_64"
	isaDebugExit   = "isa-debug-exit,iobase=0xf4,iosize=4"
	tinyNoDebugExt = "exit: no isa-debug-exit (QEMU without -device isa-debug-exit,iobase=0xf4,iosize=4): powering off, QEMU exits 0\r\n"
)

// qemuX86 is $QEMU_MCP_QEMU_X86_64, else qemu-system-x86_64 on PATH; the
// test is QEMU-facing, and skips without one.
func qemuX86(t *testing.T) string {
	t.Helper()
	p := os.Getenv(qemuX86Env)
	if p == "" {
		p, _ = exec.LookPath("qemu-system-x86_64")
	}
	t.Logf("%s %s", testguest.Facing, p)
	if p == "" {
		t.Skip("qemu-system-x86_64 not found: install Debian's qemu-system-x86, or set " + qemuX86Env)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v", qemuX86Env, p, err)
	}
	return p
}

// bootX86 starts qemu-system-x86_64 with the kernel, the serial console on
// its stdin and stdout, and the extra arguments (the machine first). QEMU
// is killed when the test ends.
func bootX86(t *testing.T, extra ...string) *aarch64Guest {
	t.Helper()
	args := append(append([]string{}, extra...), "-m", "128M", "-nodefaults", "-display", "none",
		"-serial", "stdio", "-kernel", tinyX86ELF)
	g := startGuest(t, qemuX86(t), args)
	return g
}

// floodPattern is the first n bytes of the flood pattern (the contract's
// Python, in Go).
func floodPattern(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%08d abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR\n", i)
	}
	return b.String()[:n]
}

// The shell as the riscv64 contract has it, on q35: commands, line
// editing, the flood and its Ctrl-C, typeahead, and poweroff.
func TestTinyX86_64Shell(t *testing.T) {
	g := bootX86(t, "-M", "q35")
	at := g.waitFor(0, tinyPrompt)
	if got := g.output(); got != tinyBanner+tinyPrompt {
		t.Fatalf("boot output %q, want %q", got, tinyBanner+tinyPrompt)
	}

	out, at := g.run(at, "help")
	if !strings.HasPrefix(out, tinyHelpHeader) || strings.Count(out, "\r\n") != 7 ||
		!strings.Contains(out, "  exit N     make QEMU exit with status N (1..255)\r\n") {
		t.Errorf("help printed %q", out)
	}
	for _, c := range []struct{ line, want string }{
		{"echo  two  spaces", " two  spaces\r\n"},
		{"echo", "\r\n"},
		{"   echo padded", "padded\r\n"},
		{"frobnicate now", "unknown command: frobnicate\r\n"},
		{"ECHO x", "unknown command: ECHO\r\n"},
		{"flood 100", floodPattern(100) + "\r\nflood done 100\r\n"},
		{"flood 0", "\r\nflood done 0\r\n"},
		{"flood", "usage: flood N\r\n"},
		{"flood 12x", "usage: flood N\r\n"},
		{"flood 1234567890123456789", "usage: flood N\r\n"},
		{"input", "input: keyboard=no tablet=no\r\n"},
		{"gfx", "gfx: no virtio-gpu device\r\n"},
	} {
		if out, at = g.run(at, c.line); out != c.want {
			t.Errorf("%q printed %q, want %q", c.line, out, c.want)
		}
	}

	// Line editing: BS and DEL erase, other control chars and bytes >=
	// 0x80 are ignored, CRLF ends one line only, Ctrl-C drops the line.
	for _, c := range []struct{ typed, console string }{
		{"echp\bo h\x7fhi\r", "echp\b \bo h\b \bhi\r\nhi\r\n" + tinyPrompt},
		{"ec\x01h\x80o x\r\n", "echo x\r\nx\r\n" + tinyPrompt},
		{"echo dropped\x03", "echo dropped^C\r\n" + tinyPrompt},
		{"\b\r", "\r\n" + tinyPrompt},
		{"   \r", "   \r\n" + tinyPrompt},
		{"echo " + strings.Repeat("y", 300) + "\r", "echo " + strings.Repeat("y", 250) + "\r\n" + strings.Repeat("y", 250) + "\r\n" + tinyPrompt},
	} {
		io.WriteString(g.in, c.typed)
		next := g.waitFor(at, tinyPrompt)
		if got := g.output()[at:next]; got != c.console {
			t.Errorf("typing %q shows %q, want %q", c.typed, got, c.console)
		}
		at = next
	}

	// What is typed during a flood runs after it.
	io.WriteString(g.in, "flood 20000\recho after\r")
	want := "flood 20000\r\n" + floodPattern(20000) + "\r\nflood done 20000\r\n" + tinyPrompt + "echo after\r\nafter\r\n" + tinyPrompt
	next := g.waitFor(at, "after\r\nafter\r\n"+tinyPrompt)
	if got := g.output()[at:next]; got != want {
		t.Errorf("flood 20000 with typeahead shows %d bytes, want %d:\n%q\nwant\n%q", len(got), len(want), tail(got), tail(want))
	}
	at = next

	// Ctrl-C stops a flood and throws the typeahead away.
	io.WriteString(g.in, "flood 100000000\r")
	g.waitFor(at, "00000100 ")
	io.WriteString(g.in, "echo lost\r\x03")
	next = g.waitFor(at, "\r\n^C\r\n"+tinyPrompt)
	if got := g.output()[at:next]; !strings.HasPrefix(got, "flood 100000000\r\n"+floodPattern(6400)) || strings.Contains(got, "flood done") {
		t.Errorf("Ctrl-C during a flood shows %q", tail(got))
	}
	at = next
	io.WriteString(g.in, "echo next\r")
	next = g.waitFor(at, "next\r\n"+tinyPrompt)
	if got := g.output()[at:next]; got != "echo next\r\nnext\r\n"+tinyPrompt {
		t.Errorf("after the cancelled flood, echo next shows %q (the typeahead is not dropped?)", got)
	}
	at = next

	io.WriteString(g.in, "poweroff\r")
	g.waitFor(at, "poweroff\r\n"+tinyPoweroffMsg)
	if code := g.exit(); code != 0 {
		t.Errorf("QEMU exited %d after poweroff, want 0", code)
	}
	if got := g.output()[at:]; got != "poweroff\r\n"+tinyPoweroffMsg {
		t.Errorf("poweroff shows %q", got)
	}
}

func tail(s string) string {
	if len(s) > 200 {
		return "..." + s[len(s)-200:]
	}
	return s
}

// Every machine boots it to the same prompt with CPU 0 alone, powers off
// through its own ACPI, and exit N ends QEMU through isa-debug-exit.
func TestTinyX86_64Boots(t *testing.T) {
	for _, c := range []struct {
		name    string
		args    []string
		command string
		output  string // after the echoed command
		code    int
	}{
		{"q35 smp 4", []string{"-M", "q35", "-smp", "4"}, "poweroff", tinyPoweroffMsg, 0},
		{"pc", []string{"-M", "pc"}, "poweroff", tinyPoweroffMsg, 0},
		{"microvm smp 2", []string{"-M", "microvm", "-smp", "2"}, "poweroff", tinyPoweroffMsg, 0},
		{"exit odd", []string{"-M", "q35", "-device", isaDebugExit}, "exit 3", "Exiting with status 3\r\n", 3},
		{"exit even", []string{"-M", "q35", "-device", isaDebugExit}, "exit 4",
			"Exiting with status 4\r\nexit: isa-debug-exit makes odd statuses only: QEMU exits 5\r\n", 5},
		{"exit out of range", []string{"-M", "q35", "-device", isaDebugExit}, "exit 256", "Exiting with status 1\r\n", 1},
		{"exit 255 microvm default port", []string{"-M", "microvm", "-device", "isa-debug-exit"}, "exit 255", "Exiting with status 255\r\n", 255},
		{"exit without the device", []string{"-M", "q35"}, "exit 3", "Exiting with status 3\r\n" + tinyNoDebugExt, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := bootX86(t, c.args...)
			g.exits(c.command, c.output, c.code)
		})
	}
}

// After panic, and after a poweroff nothing answers, the kernel halts:
// QEMU keeps running and input is ignored.
func TestTinyX86_64Halts(t *testing.T) {
	for _, c := range []struct {
		name, machine, command, output string
	}{
		{"panic", "q35", "panic", "Kernel panic - not syncing: requested by user\r\n"},
		{"poweroff without ACPI", "microvm,acpi=off", "poweroff", tinyPoweroffMsg + "poweroff: no ACPI power-off answered: halted\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := bootX86(t, "-M", c.machine)
			at := g.waitFor(0, tinyPrompt)
			io.WriteString(g.in, c.command+"\r")
			at = g.waitFor(at, c.command+"\r\n"+c.output)
			io.WriteString(g.in, "echo still here\r")
			select {
			case <-g.done:
				t.Fatalf("QEMU exited (%v) after %s", g.cmd.ProcessState, c.command)
			case <-time.After(2 * time.Second):
			}
			if got := g.output()[at:]; got != "" {
				t.Errorf("after %s the console went on: %q", c.command, got)
			}
		})
	}
}

// The image is what QEMU's PVH loader and the debugger expect: an ELF64
// for x86_64 whose PT_NOTE holds the PVH entry (the entry point), with the
// shell's symbols and DWARF lines for kernel.S.
func TestTinyX86_64Image(t *testing.T) {
	ef, err := elf.Open(tinyX86ELF)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	if ef.Class != elf.ELFCLASS64 || ef.Machine != elf.EM_X86_64 || ef.Entry != 0x100000 {
		t.Fatalf("%s: %v %v entry %#x, want ELFCLASS64 EM_X86_64 at 0x100000", tinyX86ELF, ef.Class, ef.Machine, ef.Entry)
	}
	var pvh []uint32
	for _, p := range ef.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			t.Fatal(err)
		}
		for len(b) >= 12 {
			namesz, descsz, typ := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
			name := b[12 : 12+(namesz+3)&^3]
			desc := b[12+len(name) : 12+len(name)+int((descsz+3)&^3)]
			if typ == 18 && bytes.Equal(name[:namesz], []byte("Xen\x00")) && descsz == 4 {
				pvh = append(pvh, binary.LittleEndian.Uint32(desc))
			}
			b = b[12+len(name)+len(desc):]
		}
	}
	if len(pvh) != 1 || uint64(pvh[0]) != ef.Entry {
		t.Errorf("PVH entry notes %#x, want one naming the entry point %#x", pvh, ef.Entry)
	}
	addr := symbolsOf(t, tinyX86ELF, ef, "pvh_start", "start64", "cmd_echo", "cmd_flood", "system_off", "__bss_end")
	if addr["pvh_start"] != ef.Entry {
		t.Errorf("pvh_start at %#x, the entry point at %#x", addr["pvh_start"], ef.Entry)
	}
	d, err := ef.DWARF()
	if err != nil {
		t.Fatal(err)
	}
	r := d.Reader()
	found := false
	for e, err := r.Next(); err == nil && e != nil; e, err = r.Next() {
		if lr, err := d.LineReader(e); err == nil && lr != nil {
			for _, f := range lr.Files() {
				found = found || (f != nil && filepath.Base(f.Name) == "kernel.S")
			}
		}
		r.SkipChildren()
	}
	if !found {
		t.Error("the DWARF line tables do not name kernel.S")
	}
}

// symbolsOf reads the symbol table of ef, the ELF file at path, as
// addresses by name, and fails t for each of want it lacks.
func symbolsOf(t *testing.T, path string, ef *elf.File, want ...string) map[string]uint64 {
	t.Helper()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	addr := map[string]uint64{}
	for _, s := range syms {
		addr[s.Name] = s.Value
	}
	for _, name := range want {
		if _, ok := addr[name]; !ok {
			t.Errorf("%s has no symbol %s", path, name)
		}
	}
	return addr
}
