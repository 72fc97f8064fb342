package riscv64

import (
	"fmt"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// pointer and leaf build PTEs: a pointer to the table at pa, a leaf
// mapping the page at pa with the given flags.
func pointer(pa uint64) uint64            { return pa>>12<<10 | pteV }
func leaf(pa uint64, flags uint64) uint64 { return pa>>12<<10 | pteV | flags }

// tables builds, under root, the path of tables that leads va to a leaf
// at level leafLevel; the tables sit at root + 0x1000*k.
func tables(m archtest.Memory, root uint64, levels int, va uint64, leafLevel int, pte uint64) {
	a := root
	for i := levels - 1; i > leafLevel; i-- {
		next := root + uint64(levels-i)*0x1000
		m[a+(va>>(12+9*uint(i))&0x1ff)*8] = pointer(next)
		a = next
	}
	m[a+(va>>(12+9*uint(leafLevel))&0x1ff)*8] = pte
}

func satpOf(mode, root uint64) uint64 { return mode<<60 | 5<<44 | root>>12 }

func TestWalk(t *testing.T) {
	const root = 0x80400000
	for _, tc := range []struct {
		name   string
		mode   uint64
		levels int
		va     uint64
		level  int    // the leaf's level
		pte    uint64 // the leaf
		pa     string
		size   string
		fault  string
	}{
		{"Sv39 4K page", 8, 3, 0xffffffff80842900, 0, leaf(0x80a43000, pteR|pteA|pteG), "0x80a43900", "4K", ""},
		{"Sv39 2M superpage", 8, 3, 0xffffffff80842900, 1, leaf(0x80200000, pteR|pteX|pteA), "0x80242900", "2M", ""},
		{"Sv39 1G gigapage", 8, 3, 0xffffffc000123456, 2, leaf(0x80000000, pteR|pteW|pteA|pteD), "0x80123456", "1G", ""},
		{"Sv48 4K page", 9, 4, 0x00007fff12345678, 0, leaf(0x9000_0000, pteR|pteW|pteU|pteA|pteD), "0x90000678", "4K", ""},
		{"Sv48 512G page", 9, 4, 0xffff800000000010, 3, leaf(0, pteR|pteA), "0x10", "512G", ""},
		{"Sv57 4K page", 10, 5, 0xff60000001153c40, 0, leaf(0x81153000, pteR|pteW|pteA|pteD), "0x81153c40", "4K", ""},
		{"Sv57 2M page", 10, 5, 0x0000000000201000, 1, leaf(0x80200000, pteR|pteX|pteU|pteA), "0x80201000", "2M", ""},
		{"Sv39 misaligned superpage", 8, 3, 0xffffffff80842900, 1, leaf(0x80201000, pteR|pteA), "", "", "level 1 PTE at 0x80401020: misaligned superpage"},
		{"Sv39 W without R", 8, 3, 0xffffffff80842900, 0, leaf(0x80a43000, pteW|pteA), "", "", "reserved combination W=1 R=0"},
		{"Sv48 invalid leaf", 9, 4, 0x1000, 0, 0, "", "", "level 0 PTE at 0x80403008: not valid (V=0)"},
		{"Sv57 reserved bits", 10, 5, 0x1000, 0, leaf(0x80000000, pteR|pteA) | 1<<55, "", "", "reserved bits 54..60"},
		{"Sv39 pointer at level 0", 8, 3, 0x1000, 0, pointer(0x80000000), "", "", "a pointer to a next level below level 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := archtest.Memory{}
			tables(m, root, tc.levels, tc.va, tc.level, tc.pte)
			w, err := debugger{}.Walk(tc.va, satpReg(satpOf(tc.mode, root)), m.Read)
			if err != nil {
				t.Fatal(err)
			}
			if w.PA != tc.pa || w.PageSize != tc.size || (tc.fault == "") != (w.Fault == "") || !strings.Contains(w.Fault, tc.fault) {
				t.Errorf("walk: %+v\nwant pa %q size %q fault %q", w, tc.pa, tc.size, tc.fault)
			}
			if want := tc.levels - tc.level; len(w.Levels) != want {
				t.Errorf("%d levels walked, want %d: %+v", len(w.Levels), want, w.Levels)
			}
		})
	}

	// Nothing mapped at the top level: the walk stops there.
	w, _ := debugger{}.Walk(0, satpReg(satpOf(10, root)), archtest.Memory{}.Read)
	if len(w.Levels) != 1 || !strings.Contains(w.Fault, "level 4 PTE at 0x80400000: not valid") {
		t.Errorf("empty Sv57 table: %+v", w)
	}
	// A non-canonical address faults before any read.
	w, _ = debugger{}.Walk(0x0000800000000000, satpReg(satpOf(8, root)), archtest.Memory{}.Read)
	if len(w.Levels) != 0 || !strings.Contains(w.Fault, "not a valid Sv39 address") {
		t.Errorf("non-canonical Sv39 address: %+v", w)
	}
	// Bare: no translation.
	if w, _ := (debugger{}).Walk(0x80200000, satpReg(0), nil); w.PA != "0x80200000" || w.Mode != "Bare" {
		t.Errorf("Bare: %+v", w)
	}
	if got := pteFlags(leaf(0, pteR|pteW|pteA|pteD|pteG)); got != "VRW--GAD" {
		t.Errorf("flags %q", got)
	}
}

// satpReg reads satp as v, and nothing else.
func satpReg(v uint64) func(string) (uint64, error) {
	return func(name string) (uint64, error) {
		if name != "satp" {
			return 0, fmt.Errorf("the walk read %s", name)
		}
		return v, nil
	}
}
