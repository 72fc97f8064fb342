package debuginfo

import (
	"debug/elf"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

const tinyELF = "../testdata/images/tiny.elf"

func openTiny(t *testing.T) *File {
	t.Helper()
	return openELF(t, tinyELF)
}

// openELF opens path for the test, and closes it when the test ends.
func openELF(t testing.TB, path string) *File {
	t.Helper()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// lookup is f's symbol name, which the test needs to go on.
func lookup(t testing.TB, f *File, name string) Symbol {
	t.Helper()
	s, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// elfSym is the reference: what debug/elf itself says.
func elfSym(t *testing.T, path, name string) elf.Symbol {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("%s: debug/elf has no symbol %q", path, name)
	return elf.Symbol{}
}

func TestTinyMachine(t *testing.T) {
	if m := openTiny(t).Machine(); m != elf.EM_RISCV {
		t.Fatalf("Machine = %v, want EM_RISCV", m)
	}
}

func TestTinyLookup(t *testing.T) {
	f := openTiny(t)
	want := elfSym(t, tinyELF, "cmd_echo")
	s := lookup(t, f, "cmd_echo")
	if s.Addr != want.Value || !s.Func {
		t.Fatalf("Lookup(cmd_echo) = %+v, want Addr %#x Func", s, want.Value)
	}
	// A label without st_size runs to the next label, cmd_input.
	next := elfSym(t, tinyELF, "cmd_input")
	if s.Size != next.Value-want.Value {
		t.Errorf("cmd_echo size %d, want %d (up to cmd_input)", s.Size, next.Value-want.Value)
	}
	// A sized C function keeps st_size.
	p := lookup(t, f, "tk_probe")
	if ref := elfSym(t, tinyELF, "tk_probe"); p.Addr != ref.Value || p.Size != ref.Size || !p.Func {
		t.Errorf("Lookup(tk_probe) = %+v, want %#x size %d", p, ref.Value, ref.Size)
	}
	// Data is not code.
	if d, err := f.Lookup("str_banner1"); err != nil || d.Func {
		t.Errorf("Lookup(str_banner1) = %+v, %v; want a non-code symbol", d, err)
	}
}

func TestTinyLookupMissing(t *testing.T) {
	f := openTiny(t)
	_, err := f.Lookup("cmd_ech")
	if err == nil || !strings.Contains(err.Error(), "cmd_echo") || !strings.Contains(err.Error(), "tiny.elf") {
		t.Fatalf("Lookup(cmd_ech) error = %v; want a suggestion of cmd_echo naming tiny.elf", err)
	}
	if _, err := f.Lookup("zzzzzzzzzzzzzzzzzzzzz"); err == nil {
		t.Fatal("Lookup of nonsense succeeded")
	}
	for _, bad := range []string{".L0 ", "$xrv64i2p1_m2p0_a2p1_c2p0_zmmul1p0", "kernel.o", ".text"} {
		if _, err := f.Lookup(bad); err == nil {
			t.Errorf("Lookup(%q) succeeded; local labels, mapping, file and section symbols are not indexed", bad)
		}
	}
}

func TestTinySymbolizeAsm(t *testing.T) {
	f := openTiny(t)
	s := lookup(t, f, "cmd_echo")
	loc, ok := f.Symbolize(s.Addr + 4)
	if !ok {
		t.Fatal("Symbolize(cmd_echo+4) found nothing")
	}
	if loc.Function != "cmd_echo" || loc.Offset != 4 || !strings.HasSuffix(loc.File, "kernel.S") || loc.Line <= 0 {
		t.Fatalf("Symbolize(cmd_echo+4) = %+v, want cmd_echo+4 in kernel.S", loc)
	}
	label := testguest.SourceLine(t, "../testdata/images/tiny/kernel.S", "cmd_echo:")
	loc0, _ := f.Symbolize(s.Addr)
	if loc0.Line != label+1 {
		t.Errorf("Symbolize(cmd_echo) line %d, want %d (the line after the label)", loc0.Line, label+1)
	}
	if loc.Line <= loc0.Line {
		t.Errorf("cmd_echo+4 at line %d, not after cmd_echo's %d", loc.Line, loc0.Line)
	}
}

func TestTinyLineAddrsAsm(t *testing.T) {
	f := openTiny(t)
	s, _ := f.Lookup("cmd_echo")
	label := testguest.SourceLine(t, "../testdata/images/tiny/kernel.S", "cmd_echo:")
	m, err := f.LineAddrs("kernel.S", label+1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Line != label+1 || len(m.Addrs) != 1 || m.Addrs[0] != s.Addr {
		t.Fatalf("LineAddrs(kernel.S:%d) = %+v, want [%#x]", label+1, m, s.Addr)
	}
	// The label line itself has no code: like gdb, move to the next line.
	m2, err := f.LineAddrs("kernel.S", label)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Line != label+1 || !slices.Equal(m2.Addrs, m.Addrs) {
		t.Fatalf("LineAddrs(kernel.S:%d) = %+v, want it moved to line %d", label, m2, label+1)
	}
	// Every address it gives must map back to that line.
	for _, a := range m.Addrs {
		if loc, _ := f.Symbolize(a); loc.Line != m.Line || loc.Function != "cmd_echo" {
			t.Errorf("Symbolize(%#x) = %+v, want cmd_echo at line %d", a, loc, m.Line)
		}
	}
	if m3, err := f.LineAddrs("testdata/images/tiny/kernel.S", label+1); err != nil || !slices.Equal(m3.Addrs, m.Addrs) {
		t.Errorf("LineAddrs with the longer path = %+v, %v", m3, err)
	}
}

func TestTinyC(t *testing.T) {
	f := openTiny(t)
	s := lookup(t, f, "tk_probe")
	loc, ok := f.Symbolize(s.Addr + 8)
	if !ok || loc.Function != "tk_probe" || loc.Offset != 8 || !strings.HasSuffix(loc.File, "virtio.c") || loc.Line <= 0 {
		t.Fatalf("Symbolize(tk_probe+8) = %+v, %v; want tk_probe+8 in virtio.c", loc, ok)
	}
	// Symbolize and LineAddrs agree on the function's first line.
	first, _ := f.Symbolize(s.Addr)
	m, err := f.LineAddrs("virtio.c", first.Line)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Addrs, s.Addr) {
		t.Errorf("LineAddrs(virtio.c:%d) = %+v, want %#x (tk_probe) among them", first.Line, m, s.Addr)
	}
	// A static function the compiler renamed keeps its table name.
	q := lookup(t, f, "vio_queue.constprop.0")
	if loc, _ := f.Symbolize(q.Addr + 2); loc.Function != "vio_queue.constprop.0" || !strings.HasSuffix(loc.File, "virtio.c") {
		t.Errorf("Symbolize(vio_queue+2) = %+v", loc)
	}
}

func TestTinySymbolizeOutside(t *testing.T) {
	f := openTiny(t)
	for _, a := range []uint64{0, 0x1000, 0x80100000, 0xffffffff80000000} {
		if loc, ok := f.Symbolize(a); ok {
			t.Errorf("Symbolize(%#x) = %+v, want nothing", a, loc)
		}
	}
	// Data in .bss names its object.
	fb, _ := f.Lookup("fb")
	if loc, ok := f.Symbolize(fb.Addr + 100); !ok || loc.Function != "fb" || loc.Offset != 100 || loc.File != "" {
		t.Errorf("Symbolize(fb+100) = %+v, %v", loc, ok)
	}
}

func TestTinyLineErrors(t *testing.T) {
	f := openTiny(t)
	for _, c := range []struct {
		file string
		line int
		want string
	}{
		{"nosuch.c", 1, "no source file"},
		{"kernel.S", 0, "lines start at 1"},
		{"kernel.S", 100000, "last line with code"},
		{"tiny/virtio.c", 999999, "no code at or after"},
	} {
		_, err := f.LineAddrs(c.file, c.line)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LineAddrs(%s:%d) error = %v, want %q", c.file, c.line, err, c.want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open("../testdata/images/tiny.bin"); err == nil || !strings.Contains(err.Error(), "not a readable ELF") {
		t.Errorf("Open(tiny.bin) error = %v", err)
	}
	if _, err := Open("../testdata/images/nonexistent.elf"); err == nil {
		t.Error("Open of a missing file succeeded")
	}
	osf, err := os.Open(tinyELF)
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(osf)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := osf.Stat(); err == nil {
		t.Error("Close left the descriptor open")
	}
	if _, err := f.Lookup("cmd_echo"); err == nil {
		t.Error("Lookup after Close succeeded")
	}
	if _, ok := f.Symbolize(0x80200000); ok {
		t.Error("Symbolize after Close succeeded")
	}
	if _, err := f.LineAddrs("kernel.S", 60); err == nil {
		t.Error("LineAddrs after Close succeeded")
	}
}

func TestNoDWARF(t *testing.T) {
	dir := t.TempDir()
	stripped := dir + "/tiny-nodebug.elf"
	objcopy(t, "--strip-debug", tinyELF, stripped)
	f := openELF(t, stripped)
	s := lookup(t, f, "cmd_echo")
	if loc, ok := f.Symbolize(s.Addr + 4); !ok || loc.Function != "cmd_echo" || loc.File != "" {
		t.Errorf("Symbolize without DWARF = %+v, %v; want the symbol and no line", loc, ok)
	}
	if _, err := f.LineAddrs("kernel.S", 60); err == nil || !strings.Contains(err.Error(), "CONFIG_DEBUG_INFO") {
		t.Errorf("LineAddrs without DWARF error = %v", err)
	}
}

// TestTinyConcurrent runs first queries of every kind at once on a fresh
// File, so the lazy indexes are built under contention (run with -race).
func TestTinyConcurrent(t *testing.T) {
	f := openTiny(t)
	label := testguest.SourceLine(t, "../testdata/images/tiny/kernel.S", "cmd_echo:")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; i < 20; i++ {
				s, err := f.Lookup("cmd_echo")
				if err != nil {
					t.Error(err)
					return
				}
				if loc, ok := f.Symbolize(s.Addr + 4); !ok || loc.Function != "cmd_echo" || loc.Line == 0 {
					t.Errorf("Symbolize = %+v", loc)
				}
				if m, err := f.LineAddrs("kernel.S", label+1); err != nil || len(m.Addrs) != 1 {
					t.Errorf("LineAddrs = %+v, %v", m, err)
				}
				if _, ok := f.Symbolize(0x802005ba + uint64(i)); !ok {
					t.Error("Symbolize in virtio.c failed")
				}
				_ = f.Stats()
			}
		})
	}
	wg.Wait()
}

// TestNoAranges covers toolchains that emit no .debug_aranges (clang by
// default): the unit ranges then come from the unit DIEs.
func TestNoAranges(t *testing.T) {
	dst := t.TempDir() + "/tiny-noaranges.elf"
	objcopy(t, "--remove-section=.debug_aranges", tinyELF, dst)
	f := openELF(t, dst)
	for _, name := range []string{"cmd_echo", "tk_probe"} {
		s := lookup(t, f, name)
		if loc, ok := f.Symbolize(s.Addr + 4); !ok || loc.Function != name || loc.Line == 0 {
			t.Errorf("Symbolize(%s+4) without .debug_aranges = %+v, %v", name, loc, ok)
		}
	}
	if f.Stats().RangeIndex == 0 {
		t.Error("the DIE range index was not used")
	}
}

// The tiny kernel's one loadable segment, .bss included, is loaded; what
// lies outside it or runs past its end is not.
func TestTinyLoaded(t *testing.T) {
	f := openTiny(t)
	qmem := elfSym(t, tinyELF, "qmem")
	for _, c := range []struct {
		addr uint64
		n    int
		want bool
	}{
		{0x80200000, 4, true},
		{qmem.Value, int(qmem.Size), true},
		{0x80200000 + 0x143000 - 4, 4, true},
		{0x80200000 + 0x143000 - 4, 5, false},
		{0x80200000 + 0x143000, 1, false},
		{0x801fffff, 1, false},
		{0, 8, false},
		{^uint64(0), 8, false},
	} {
		if got := f.Loaded(c.addr, c.n); got != c.want {
			t.Errorf("Loaded(%#x, %d) = %v, want %v", c.addr, c.n, got, c.want)
		}
	}
}
