package riscv64

import (
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// PTE bits (the RISC-V privileged spec, "Sv39").
const (
	pteV = 1 << iota
	pteR
	pteW
	pteX
	pteU
	pteG
	pteA
	pteD
)

// pteReserved are bits 53..60 of a PTE that a hart without Svpbmt and
// Svnapot must find zero (PBMT 61..62, N 63 are reported, not judged).
const pteReserved = uint64(0x7f) << 54

func pteFlags(pte uint64) string {
	var b strings.Builder
	for i, c := range "VRWXUGAD" {
		if pte>>i&1 == 1 {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	if pte>>63 == 1 {
		b.WriteString(" N")
	}
	if pbmt := pte >> 61 & 3; pbmt != 0 {
		b.WriteString(" PBMT=" + []string{"PMA", "NC", "IO", "reserved"}[pbmt])
	}
	return b.String()
}

var pageSizes = []string{"4K", "2M", "1G", "512G", "256T"}

// Root is satp, whose mode is Bare, Sv39, Sv48 or Sv57.
func (debugger) Root() string { return "satp" }

// Walk walks va through the page table that satp names, as the MMU does.
func (debugger) Walk(va uint64, reg func(string) (uint64, error), read func(pa uint64) (uint64, error)) (arch.Walk, error) {
	satp, err := reg("satp")
	if err != nil {
		return arch.Walk{}, err
	}
	w := arch.Walk{VA: hex(va), Satp: hex(satp)}
	var levels int
	switch satp >> 60 {
	case 0:
		return w.Untranslated("Bare", va), nil
	case 8:
		w.Mode, levels = "Sv39", 3
	case 9:
		w.Mode, levels = "Sv48", 4
	case 10:
		w.Mode, levels = "Sv57", 5
	default:
		return w, fmt.Errorf("satp %s: mode %d is not a translation mode this walker knows (Bare, Sv39, Sv48, Sv57)", hex(satp), satp>>60)
	}
	vaBits := uint(12 + 9*levels)
	if top := int64(va) >> (vaBits - 1); top != 0 && top != -1 {
		return w.Stopped(fmt.Sprintf("%s is not a valid %s address: bits 63..%d must all equal bit %d", hex(va), w.Mode, vaBits, vaBits-1)), nil
	}
	a := (satp & (1<<44 - 1)) << 12
	for i := levels - 1; i >= 0; i-- {
		vpn := va >> (12 + 9*uint(i)) & 0x1ff
		pa := a + vpn*8
		pte, err := read(pa)
		if err != nil {
			return w, fmt.Errorf("read the level-%d PTE at physical %s: %w", i, hex(pa), err)
		}
		w.Levels = append(w.Levels, arch.Level{Level: i, PTEAddr: hex(pa), PTE: hex(pte), Flags: pteFlags(pte)})
		fail := func(why string) (arch.Walk, error) {
			return w.Stopped(fmt.Sprintf("level %d PTE at %s: %s", i, hex(pa), why)), nil
		}
		switch {
		case pte&pteV == 0:
			return fail("not valid (V=0): nothing is mapped there")
		case pte&pteR == 0 && pte&pteW != 0:
			return fail("reserved combination W=1 R=0")
		case pte&pteReserved != 0:
			return fail("reserved bits 54..60 are set")
		}
		ppn := pte >> 10 & (1<<44 - 1)
		if pte&(pteR|pteX) == 0 {
			if i == 0 {
				return fail("a pointer to a next level below level 0")
			}
			if pte&(pteA|pteD|pteU) != 0 {
				return fail("a pointer to the next level with A, D or U set (reserved)")
			}
			a = ppn << 12
			continue
		}
		// A leaf at level i maps a 4K << 9i page; its low PPN fields
		// must be zero.
		if low := ppn & (1<<(9*uint(i)) - 1); low != 0 {
			return fail(fmt.Sprintf("misaligned superpage: a level-%d leaf whose PPN has low bits set", i))
		}
		mask := uint64(1)<<(12+9*uint(i)) - 1
		return w.Mapped(ppn<<12&^mask|va&mask, pageSizes[i], pteFlags(pte), pte), nil
	}
	return w, nil // not reached: level 0 is always a leaf or a fault
}
