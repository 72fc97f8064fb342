package x86_64_test

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// The walk of the x86_64 Linux guest's own page tables, stopped at its
// shell, agrees with QEMU's (HMP gva2gpa) for kernel addresses of every
// kind the guest maps (its image's text and data, its direct map) and
// for the ones it does not (address 0, a non-canonical one), and for the
// user pages of the shell it stops in.
func TestWalkLinux(t *testing.T) {
	lin := testguest.ArchLinux(t, x86_64.Arch)
	bin := testguest.ArchQEMU(t, x86_64.Arch)
	syms := symbols(t, lin.Vmlinux, "linux_banner", "_text", "_etext", "__start_rodata", "_sdata", "__bss_start", "init_top_pgt")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := testguest.SocketDir(t, "x86walk")
	cfg := qemu.NewConfig(qemu.WithArch(x86_64.Arch), qemu.WithBinary(bin), qemu.WithKernel(lin.Kernel),
		qemu.WithInitrd(lin.Initrd), qemu.WithAppend(lin.Append), qemu.WithMemory("256M"))
	m, err := qemu.Start(ctx, qemu.Runtime{
		SerialBase: filepath.Join(dir, "serial"),
		QMPSocket:  filepath.Join(dir, "qmp.sock"),
		GDBSocket:  filepath.Join(dir, "gdb.sock"),
		Logger:     slog.New(slog.DiscardHandler),
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if r, err := m.Console().Buffer().Wait(ctx, 0, regexp.MustCompile(testguest.LinuxPrompt), 2*time.Minute); err != nil || !r.Matched {
		t.Fatalf("waiting for the shell's prompt: %v; console:\n%s", err, r.Output)
	}

	// The shell spinning in a loop: the guest is stopped in it, in user
	// mode, with its page table, whose user pages the walk then finds.
	if _, err := m.Console().Write(ctx, []byte("while :; do :; done\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	c, err := gdb.Dial(ctx, "unix", m.Paths().GDBSocket, gdb.WithArch(x86_64.Arch)) // stops the guest
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := func(name string) (uint64, error) { return c.ReadRegister(ctx, name) }
	for try := 0; ; try++ {
		cs, err := reg("cs")
		if err != nil {
			t.Fatal(err)
		}
		if cs&3 == 3 {
			break
		}
		// In the kernel (a timer's interrupt): run it on a little.
		if try == 20 {
			t.Fatalf("the vCPU is not in user mode after %d stops (cs %#x)", try+1, cs)
		}
		if err := c.Continue(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := c.Interrupt(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rip, err := reg("rip")
	if err != nil {
		t.Fatal(err)
	}
	rsp, err := reg("rsp")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetPhysicalMemory(ctx, true); err != nil {
		t.Fatal(err)
	}
	read := func(pa uint64) (uint64, error) {
		b, err := c.ReadMemory(ctx, pa, 8)
		if err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint64(b), nil
	}
	// gva2gpa translates on the monitor's CPU, the first: the only one.
	gva2gpa := func(va uint64) string {
		raw, err := m.Monitor().Execute(ctx, "human-monitor-command", map[string]any{"command-line": "gva2gpa " + hex(va)})
		if err != nil {
			t.Fatalf("gva2gpa %s: %v", hex(va), err)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(s)
	}
	sizes := map[string]bool{}
	// walk walks va, and checks QEMU agrees.
	walk := func(what string, va uint64) arch.Walk {
		t.Helper()
		w, err := x86_64.Paging.Walk(va, reg, read)
		if err != nil {
			t.Fatalf("walk %s %s: %v", what, hex(va), err)
		}
		q := gva2gpa(va)
		t.Logf("%s %s: gva2gpa %q; walk: %s %s, cr3 %s, pa %q %s [%s] %s", what, hex(va), q, w.Mode, levels(w), w.CR3, w.PA, w.PageSize, w.Flags, w.Fault)
		if w.Mode != "4-level paging" || w.CR3 == "" {
			t.Errorf("%s: mode %q, cr3 %q; want 4-level paging (the kernel has no 5-level support)", what, w.Mode, w.CR3)
		}
		switch {
		case w.Faulty:
			if q != "Unmapped" {
				t.Errorf("%s %s: the walk faults (%s), QEMU says %q", what, hex(va), w.Fault, q)
			}
		case q != "gpa: "+w.PA:
			t.Errorf("%s %s: the walk gives %s, QEMU says %q", what, hex(va), w.PA, q)
		default:
			sizes[w.PageSize] = true
		}
		return w
	}

	for _, name := range []string{"__start_rodata", "_sdata", "__bss_start", "init_top_pgt"} {
		walk(name, syms[name])
	}
	walk("_etext-1", syms["_etext"]-1)
	walk("the direct map", 0xffff888000000000+0x1234567) // no KASLR: the config has no RANDOMIZE_BASE
	w := walk("linux_banner", syms["linux_banner"])
	if w.Faulty || !strings.HasPrefix(w.Flags, "present, read-only, kernel-only, no-execute") {
		t.Errorf("linux_banner (rodata) is %q", w.Flags)
	}
	if b, err := c.ReadMemory(ctx, w.Phys, 14); err != nil || string(b) != "Linux version " {
		t.Errorf("linux_banner at physical %s: %q, %v", w.PA, b, err)
	}
	if w := walk("_text", syms["_text"]); w.Faulty || !strings.HasPrefix(w.Flags, "present, read-only, kernel-only, executable") {
		t.Errorf("_text: %+v", w)
	}
	if w := walk("the shell's pc", rip); w.Faulty || !strings.HasPrefix(w.Flags, "present, read-only, user, executable") {
		t.Errorf("the shell's code: %+v", w)
	}
	if w := walk("the shell's sp", rsp); w.Faulty || !strings.HasPrefix(w.Flags, "present, writable, user, no-execute") {
		t.Errorf("the shell's stack: %+v", w)
	}
	if w := walk("NULL", 0); !strings.HasPrefix(w.Fault, "not present at level") {
		t.Errorf("address 0: %+v", w)
	}
	if w := walk("non-canonical", 0x0000800000000000); !strings.Contains(w.Fault, "not canonical") {
		t.Errorf("a non-canonical address: %+v", w)
	}
	t.Logf("page sizes walked: %v", sizes)
}

// symbols are the addresses of the named symbols of the vmlinux at path.
func symbols(t *testing.T, path string, names ...string) map[string]uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, s := range all {
		got[s.Name] = s.Value
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			t.Fatalf("no %s in %s", n, path)
		}
	}
	return got
}

func hex(v uint64) string { return fmt.Sprintf("%#x", v) }

// levels shows a walk's levels' flags.
func levels(w arch.Walk) string {
	var f []string
	for _, l := range w.Levels {
		f = append(f, fmt.Sprintf("%d:%s=%s", l.Level, l.PTE, l.Flags))
	}
	return "[" + strings.Join(f, "; ") + "]"
}
