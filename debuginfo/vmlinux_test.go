package debuginfo

import (
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/linuxdir"
)

const objcopyTool = "riscv64-linux-gnu-objcopy"

func objcopy(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath(objcopyTool); err != nil {
		t.Skipf("%s not installed (apt-get install binutils-riscv64-linux-gnu)", objcopyTool)
	}
	if out, err := exec.Command(objcopyTool, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", objcopyTool, args, err, out)
	}
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// checkVmlinux runs the debugger's first queries on a kernel and logs what
// they cost.
func checkVmlinux(t *testing.T, path string) {
	heap0 := heapInuse()
	start := time.Now()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	openTime := time.Since(start)
	if f.Machine() != elf.EM_RISCV {
		t.Fatalf("Machine = %v", f.Machine())
	}

	t0 := time.Now()
	sym := lookup(t, f, "sys_newuname")
	lookupTime := time.Since(t0)
	t0 = time.Now()
	loc, ok := f.Symbolize(sym.Addr + 8)
	symbolizeTime := time.Since(t0)
	firstTotal := time.Since(start)
	if !ok || loc.Function != "sys_newuname" || loc.Offset != 8 || loc.File != "kernel/sys.c" || loc.Line < 1000 {
		t.Fatalf("Symbolize(sys_newuname+8) = %+v, %v; want sys_newuname+8 in kernel/sys.c", loc, ok)
	}
	limit := 2 * time.Second
	if raceEnabled {
		// The race detector slows zlib tenfold; this run checks correctness,
		// the plain run checks speed.
		limit = 30 * time.Second
	}
	if firstTotal > limit {
		t.Errorf("Open + Lookup + first Symbolize took %v, want under %v", firstTotal, limit)
	}
	heapSym := heapInuse()

	// The alias and the static helper SYSCALL_DEFINE1 generates.
	for _, name := range []string{"__se_sys_newuname", "__do_sys_newuname"} {
		s := lookup(t, f, name)
		if l, ok := f.Symbolize(s.Addr); !ok || !strings.HasSuffix(l.Function, "sys_newuname") || !strings.HasSuffix(l.File, "kernel/sys.c") {
			t.Errorf("Symbolize(%s) = %+v", name, l)
		}
	}
	banner := lookup(t, f, "linux_banner")
	if banner.Func || banner.Size == 0 {
		t.Errorf("linux_banner = %+v, want a sized object", banner)
	}
	if l, ok := f.Symbolize(banner.Addr + 3); !ok || l.Function != "linux_banner" || l.Offset != 3 {
		t.Errorf("Symbolize(linux_banner+3) = %+v, %v", l, ok)
	}

	t0 = time.Now()
	m, err := f.LineAddrs("kernel/sys.c", loc.Line)
	lineTime := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Line != loc.Line || !slices.ContainsFunc(m.Addrs, func(a uint64) bool { return a >= sym.Addr && a < sym.Addr+sym.Size }) {
		t.Fatalf("LineAddrs(kernel/sys.c:%d) = %+v; want an address in sys_newuname [%#x,+%d)", loc.Line, m, sym.Addr, sym.Size)
	}
	for _, a := range m.Addrs {
		if l, _ := f.Symbolize(a); l.Line != m.Line || !strings.HasSuffix(l.File, "kernel/sys.c") {
			t.Errorf("LineAddrs gave %#x, which Symbolize calls %+v", a, l)
		}
	}
	t0 = time.Now()
	if m2, err := f.LineAddrs("sys.c", loc.Line+1); err != nil || len(m2.Addrs) == 0 {
		t.Errorf("LineAddrs(sys.c:%d) = %+v, %v", loc.Line+1, m2, err)
	}
	secondLineTime := time.Since(t0)
	if _, err := f.LineAddrs("core.c", 10); err == nil || !strings.Contains(err.Error(), "give more of the path") {
		t.Errorf("LineAddrs(core.c) error = %v, want an ambiguity listing", err)
	}
	if _, err := f.Lookup("sys_newunam"); err == nil || !strings.Contains(err.Error(), "sys_newuname") {
		t.Errorf("Lookup(sys_newunam) error = %v, want a suggestion", err)
	}
	// A header file is listed by hundreds of units; check it still answers.
	t0 = time.Now()
	hm, herr := f.LineAddrs("include/linux/list.h", 1)
	headerTime := time.Since(t0)
	if herr != nil || len(hm.Addrs) == 0 {
		t.Errorf("LineAddrs(include/linux/list.h:1) = %+v, %v", hm, herr)
	}
	heapAll := heapInuse()

	st := f.Stats()
	t.Logf("%s: open %v; Lookup (symbol index %v, %d symbols) %v; first Symbolize %v (DWARF setup %v, %d units); open→first Symbolize %v",
		filepath.Base(path), openTime, st.SymbolIndex, st.Symbols, lookupTime, symbolizeTime, st.UnitIndex, st.Units, firstTotal)
	t.Logf("sys_newuname=%#x size %d → %s:%d; LineAddrs(kernel/sys.c:%d) %v (file index %v, %d files) → %#x; second LineAddrs %v; list.h:1 %v → line %d, %d addrs",
		sym.Addr, sym.Size, loc.File, loc.Line, loc.Line, lineTime, st.FileIndex, st.Files, m.Addrs, secondLineTime, headerTime, hm.Line, len(hm.Addrs))
	t.Logf("heap in use: %.1f MB before open, %.1f MB after symbols+first Symbolize, %.1f MB after LineAddrs; Stats.BytesHeld %.1f MB, %d line tables cached",
		mb(heap0), mb(heapSym), mb(heapAll), float64(st.BytesHeld)/1e6, st.LineTables)
	runtime.KeepAlive(f)
}

func mb(b uint64) float64 { return float64(b) / 1e6 }

func TestVmlinux(t *testing.T) {
	checkVmlinux(t, linuxdir.Vmlinux(t, ""))
}

func TestVmlinuxCompressed(t *testing.T) {
	src := linuxdir.Vmlinux(t, "")
	dst := filepath.Join(t.TempDir(), "vmlinux")
	objcopy(t, "--compress-debug-sections=zlib", src, dst)
	ef, err := elf.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	compressed := 0
	for _, s := range ef.Sections {
		if s.Flags&elf.SHF_COMPRESSED != 0 {
			compressed++
		}
	}
	info := ef.Section(".debug_info")
	ef.Close()
	if compressed == 0 || info.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatalf("objcopy left .debug_info uncompressed (%d compressed sections)", compressed)
	}
	t.Logf("%d SHF_COMPRESSED sections; .debug_info %d bytes in the file, %d uncompressed", compressed, info.FileSize, info.Size)
	checkVmlinux(t, dst)
}

// BenchmarkSymbolize measures a warm Symbolize over the whole kernel text.
func BenchmarkSymbolize(b *testing.B) {
	f := openELF(b, linuxdir.Vmlinux(b, ""))
	start, _ := f.Lookup("_stext")
	end, _ := f.Lookup("_etext")
	if end.Addr <= start.Addr {
		b.Skip("no _stext/_etext")
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		a := start.Addr + uint64(i*4099)%(end.Addr-start.Addr)
		f.Symbolize(a)
	}
}

// TestVmlinuxAgainstAddr2line compares Symbolize's lines with binutils on
// addresses spread over every function of the kernel.
func TestVmlinuxAgainstAddr2line(t *testing.T) {
	path := linuxdir.Vmlinux(t, "")
	const tool = "riscv64-linux-gnu-addr2line"
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not installed", tool)
	}
	f := openELF(t, path)
	ix, err := f.symbols()
	if err != nil {
		t.Fatal(err)
	}
	var addrs []uint64
	for i, s := range ix.syms {
		if s.typ == elf.STT_FUNC && s.size > 8 && i%7 == 0 {
			addrs = append(addrs, s.addr+(uint64(i)*2)%s.size&^1)
		}
	}
	args := []string{"-e", path}
	for _, a := range addrs {
		args = append(args, fmt.Sprintf("%#x", a))
	}
	out, err := exec.Command(tool, args...).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(addrs) {
		t.Fatalf("%s printed %d lines for %d addresses", tool, len(lines), len(addrs))
	}
	bad := 0
	for i, a := range addrs {
		want, _, _ := strings.Cut(lines[i], " (discriminator")
		loc, ok := f.Symbolize(a)
		got := "??:0"
		if ok && loc.File != "" {
			got = fmt.Sprintf("%s:%d", loc.File, loc.Line)
		}
		if file, line, ok := strings.Cut(want, ":"); ok && file != "??" {
			want = filepath.Clean(file) + ":" + line
		} else {
			want = "??:0"
		}
		// Symbolize names files relative to the build directory, the
		// tools as DWARF has them (absolute for the kernel's build).
		if got != want && !strings.HasSuffix(want, "/"+got) {
			if bad++; bad <= 10 {
				t.Errorf("%#x (%s+%#x): Symbolize says %s, %s says %s", a, loc.Function, loc.Offset, got, tool, want)
			}
		}
	}
	t.Logf("%d addresses compared, %d differ", len(addrs), bad)
}

func TestVmlinuxNoAranges(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "vmlinux")
	objcopy(t, "--remove-section=.debug_aranges", linuxdir.Vmlinux(t, ""), dst)
	checkVmlinux(t, dst)
}
