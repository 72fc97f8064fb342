package x86_64

import (
	"fmt"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// Linux's: paging and write protection on, long mode with NX.
const (
	cr0Linux  = cr0PG | cr0WP | 1
	eferLinux = eferLMA | eferNXE | 1<<8 | 1
	table     = pteP | pteRW | pteUS | pteA // Linux's _KERNPG_TABLE | _PAGE_USER
)

// tables builds, under root, the path of tables that leads va to the
// entry leaf at level leafLevel, each table above it pointing down with
// the flags upper; the tables sit at root + 0x1000*k.
func tables(m archtest.Memory, root uint64, levels int, va uint64, leafLevel int, leaf, upper uint64) {
	a := root
	for lvl := levels; lvl > leafLevel; lvl-- {
		next := root + uint64(levels-lvl+1)*0x1000
		m[a+(va>>(12+9*uint(lvl-1))&0x1ff)*8] = next | upper
		a = next
	}
	m[a+(va>>(12+9*uint(leafLevel-1))&0x1ff)*8] = leaf
}

func TestWalk(t *testing.T) {
	const root = 0x1a09000
	for _, tc := range []struct {
		name   string
		levels int
		va     uint64
		level  int    // the leaf's level
		leaf   uint64 // its entry
		upper  uint64 // the tables' entries' flags; 0 means table
		efer   uint64 // 0 means eferLinux
		pa     string
		size   string
		flags  string // the walk's (or, with a fault, the last level's)
		fault  string
	}{
		{name: "4-level kernel 4K page", levels: 4, va: 0xffffffff8185b7e0, level: 1, leaf: 0x185b000 | pteP | pteA | pteG | pteXD,
			pa: "0x185b7e0", size: "4K", flags: "present, read-only, kernel-only, no-execute, global, accessed"},
		{name: "4-level 2M page", levels: 4, va: 0xffffffff81212345, level: 2, leaf: 0x1200000 | pteP | pteRW | pteA | pteD | ptePS | pteG,
			pa: "0x1212345", size: "2M", flags: "present, writable, kernel-only, executable, global, accessed, dirty"},
		{name: "4-level 1G page", levels: 4, va: 0xffff888012345678, level: 3, leaf: 0x40000000 | pteP | pteRW | pteA | pteD | ptePS | pteXD,
			pa: "0x52345678", size: "1G", flags: "present, writable, kernel-only, no-execute, accessed, dirty"},
		{name: "4-level user page", levels: 4, va: 0x00007ffd12345678, level: 1, leaf: 0x3456000 | pteP | pteRW | pteUS | pteA,
			pa: "0x3456678", size: "4K", flags: "present, writable, user, executable, accessed"},
		{name: "5-level 4K page", levels: 5, va: 0xff11000000001234, level: 1, leaf: 0x7000 | pteP | pteRW | pteA | pteD,
			pa: "0x7234", size: "4K", flags: "present, writable, kernel-only, executable, accessed, dirty"},
		{name: "5-level 2M page above 47 bits", levels: 5, va: 0x0000800000201000, level: 2, leaf: 0x80000000 | pteP | pteUS | ptePS | pteA,
			pa: "0x80001000", size: "2M", flags: "present, read-only, user, executable, accessed"},
		{name: "5-level 1G page", levels: 5, va: 0xffd4000040000010, level: 3, leaf: 0xfc0000000 | pteP | pteRW | ptePS,
			pa: "0xfc0000010", size: "1G", flags: "present, writable, kernel-only, executable"},
		{name: "address bits 51:12", levels: 4, va: 0x1234, level: 1, leaf: 0xf_ffff_ffff_f000 | pteP,
			pa: "0xffffffffff234", size: "4K"},

		// Permissions combine over the levels.
		{name: "read-only table above a writable page", levels: 4, va: 0x401000, level: 1, leaf: 0x5000 | pteP | pteRW | pteUS,
			upper: pteP | pteUS, pa: "0x5000", size: "4K", flags: "present, read-only, user, executable"},
		{name: "kernel-only table above a user page", levels: 4, va: 0x401000, level: 1, leaf: 0x5000 | pteP | pteRW | pteUS,
			upper: pteP | pteRW, pa: "0x5000", size: "4K", flags: "present, writable, kernel-only, executable"},
		{name: "no-execute table above an executable page", levels: 4, va: 0x401000, level: 1, leaf: 0x5000 | pteP | pteRW | pteUS,
			upper: table | pteXD, pa: "0x5000", size: "4K", flags: "present, writable, user, no-execute"},

		// Faults.
		{name: "PML5E not present", levels: 5, va: 0x1000, level: 5, leaf: 0x2000 | pteRW, flags: "PML5E not present",
			fault: "not present at level 5 (PML5E at 0x1a09000)"},
		{name: "PML4E not present", levels: 4, va: 0xffffffff81000000, level: 4, leaf: 0, flags: "PML4E not present",
			fault: "not present at level 4 (PML4E at 0x1a09ff8)"},
		{name: "PDPTE not present", levels: 4, va: 0xffffffff81000000, level: 3, leaf: 0, flags: "PDPTE not present",
			fault: "not present at level 3 (PDPTE at 0x1a0aff0)"},
		{name: "PDE not present", levels: 4, va: 0xffffffff81000000, level: 2, leaf: 0, flags: "PDE not present",
			fault: "not present at level 2 (PDE at 0x1a0b040)"},
		{name: "PTE not present", levels: 4, va: 0xffffffff81003000, level: 1, leaf: 0x3000 | pteRW, flags: "PTE 4K page not present",
			fault: "not present at level 1 (PTE at 0x1a0c018)"},
		{name: "XD without EFER.NXE", levels: 4, va: 0x1000, level: 1, leaf: 0x1000 | pteP | pteXD, efer: eferLMA,
			fault: "reserved bits set at level 1 (PTE at 0x1a0c008): bit 63 (XD) while EFER.NXE is clear"},
		{name: "PS in a PML4E", levels: 4, va: 0x1000, level: 4, leaf: 0x1000 | pteP | ptePS,
			fault: "reserved bits set at level 4 (PML4E at 0x1a09000): bit 7 (PS)"},
		{name: "misaligned 2M page", levels: 4, va: 0x1000, level: 2, leaf: 0x202000 | pteP | ptePS,
			fault: "reserved bits set at level 2 (PDE at 0x1a0b000): bits 20:13"},
		{name: "misaligned 1G page", levels: 5, va: 0x1000, level: 3, leaf: 0x40200000 | pteP | ptePS,
			fault: "reserved bits set at level 3 (PDPTE at 0x1a0b000): bits 29:13"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := archtest.Memory{}
			upper := uint64(table)
			if tc.upper != 0 {
				upper = tc.upper
			}
			tables(m, root, tc.levels, tc.va, tc.level, tc.leaf, upper)
			cr4, efer := uint64(cr4PAE), uint64(eferLinux)
			if tc.levels == 5 {
				cr4 |= cr4LA57
			}
			if tc.efer != 0 {
				efer = tc.efer
			}
			// The low bits of CR3 are a PCID, not the table's address.
			r := archtest.Regs{"cr0": cr0Linux, "cr3": root | 0x5, "cr4": cr4, "efer": efer}
			w, err := debugger{}.Walk(tc.va, r.Get, m.Read)
			if err != nil {
				t.Fatal(err)
			}
			flags := w.Flags
			if tc.fault != "" && len(w.Levels) > 0 {
				flags = w.Levels[len(w.Levels)-1].Flags
			}
			if w.PA != tc.pa || w.PageSize != tc.size || !strings.HasPrefix(flags, tc.flags) ||
				(tc.fault == "") != (w.Fault == "") || w.Faulty != (tc.fault != "") || !strings.Contains(w.Fault, tc.fault) {
				t.Errorf("walk: %+v\nwant pa %q size %q flags %q fault %q", w, tc.pa, tc.size, tc.flags, tc.fault)
			}
			if want := tc.levels - tc.level + 1; len(w.Levels) != want {
				t.Errorf("%d levels walked, want %d: %+v", len(w.Levels), want, w.Levels)
			}
			if w.CR3 != fmt.Sprintf("%#x", root|0x5) || w.Mode != fmt.Sprintf("%d-level paging", tc.levels) {
				t.Errorf("CR3 %q, mode %q", w.CR3, w.Mode)
			}
			if tc.fault == "" && (w.Phys != parseHex(t, tc.pa) || w.Leaf != tc.leaf) {
				t.Errorf("Phys %#x, Leaf %#x; want %s, %#x", w.Phys, w.Leaf, tc.pa, tc.leaf)
			}
		})
	}
}

func parseHex(t *testing.T, s string) uint64 {
	t.Helper()
	var v uint64
	if _, err := fmt.Sscanf(s, "0x%x", &v); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

// The levels' flags: what each entry is, then its bits.
func TestWalkLevels(t *testing.T) {
	const root = 0x100000
	m := archtest.Memory{}
	va := uint64(0xffffffff8185b7e0)
	tables(m, root, 4, va, 1, 0x185b000|pteP|ptePWT|pteA|pteD|pteG|ptePS|pteXD|5<<59, table)
	r := archtest.Regs{"cr0": cr0Linux, "cr3": root, "cr4": cr4PAE | cr4PKE, "efer": eferLinux}
	w, err := debugger{}.Walk(va, r.Get, m.Read)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range w.Levels {
		got = append(got, fmt.Sprintf("%d %s %s %s", l.Level, l.PTEAddr, l.PTE, l.Flags))
	}
	want := []string{
		"4 0x100ff8 0x101027 PML4E P RW US A",
		"3 0x101ff0 0x102027 PDPTE P RW US A",
		"2 0x102060 0x103027 PDE P RW US A",
		"1 0x1032d8 0xa80000000185b1e9 PTE 4K page P PWT A D G PAT NX PK=5",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("levels:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if w.Flags != "present, read-only, kernel-only, no-execute, global, accessed, dirty, protection key 5" {
		t.Errorf("flags %q", w.Flags)
	}

	// A 2M page's PS and PAT (bit 12); CR0.WP clear lets the kernel
	// write a read-only page.
	m = archtest.Memory{}
	tables(m, root, 4, va, 2, 0x1800000|pteP|ptePS|1<<12, table)
	r["cr0"], r["cr4"] = cr0PG, cr4PAE
	w, err = debugger{}.Walk(va, r.Get, m.Read)
	if err != nil {
		t.Fatal(err)
	}
	if l := w.Levels[2]; l.Flags != "PDE 2M page P PS PAT" || w.PA != "0x185b7e0" ||
		w.Flags != "present, read-only (the kernel may write: CR0.WP is clear), kernel-only, executable" {
		t.Errorf("2M page: %+v", w)
	}
}

func TestWalkModes(t *testing.T) {
	never := func(pa uint64) (uint64, error) { return 0, fmt.Errorf("read at %#x", pa) }
	// Paging off: no translation, and nothing but CR0 read.
	w, err := debugger{}.Walk(0xfffffff0, archtest.Regs{"cr0": 0x60000010}.Get, never)
	if err != nil || w.Mode != "paging off" || w.PA != "0xfffffff0" || w.Phys != 0xfffffff0 || w.Faulty || w.CR3 != "" {
		t.Errorf("paging off: %+v, %v", w, err)
	}
	// Protected mode's paging is named, not walked.
	for cr4, mode := range map[uint64]string{0: "32-bit paging", cr4PAE: "PAE paging"} {
		r := archtest.Regs{"cr0": cr0Linux, "cr3": 0x1000, "cr4": cr4, "efer": 0}
		w, err := debugger{}.Walk(0xc1000000, r.Get, never)
		if err != nil || w.Mode != mode || !w.Faulty || !strings.Contains(w.Fault, mode+" (protected mode, not long mode) is not supported") || w.PA != "" {
			t.Errorf("%s: %+v, %v", mode, w, err)
		}
	}
	// Non-canonical addresses fault before any read.
	for _, tc := range []struct {
		cr4   uint64
		va    uint64
		fault string
	}{
		{cr4PAE, 0x0000800000000000, "0x800000000000 is not canonical for 4-level paging: bits 63..48 must all equal bit 47"},
		{cr4PAE, 0xfff0000000000000, "is not canonical for 4-level paging"},
		{cr4PAE | cr4LA57, 0x0100000000000000, "0x100000000000000 is not canonical for 5-level paging: bits 63..57 must all equal bit 56"},
		{cr4PAE | cr4LA57, 0x8000000000000000, "is not canonical for 5-level paging"},
	} {
		r := archtest.Regs{"cr0": cr0Linux, "cr3": 0x1000, "cr4": tc.cr4, "efer": eferLinux}
		w, err := debugger{}.Walk(tc.va, r.Get, never)
		if err != nil || !w.Faulty || !strings.Contains(w.Fault, tc.fault) || len(w.Levels) != 0 {
			t.Errorf("%#x: %+v, %v", tc.va, w, err)
		}
	}
	// An error reading a register or an entry is the walk's error.
	if _, err := (debugger{}).Walk(0, archtest.Regs{"cr0": cr0Linux}.Get, never); err == nil || !strings.Contains(err.Error(), "no register cr3") {
		t.Errorf("no cr3: %v", err)
	}
	r := archtest.Regs{"cr0": cr0Linux, "cr3": 0x1000, "cr4": cr4PAE, "efer": eferLinux}
	if _, err := (debugger{}).Walk(0, r.Get, never); err == nil || !strings.Contains(err.Error(), "read the level-4 PML4E at physical 0x1000: read at 0x1000") {
		t.Errorf("entry read fails: %v", err)
	}
	if (debugger{}).Root() != "" {
		t.Error("Root: the walk reads several registers")
	}
}
