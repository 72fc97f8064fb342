package debugger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/gdb"
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

// Walk is a page-table walk of one virtual address, as the MMU does it.
type Walk struct {
	VA   string `json:"va"`
	Satp string `json:"satp"`
	// Mode is Bare, Sv39, Sv48 or Sv57.
	Mode   string  `json:"mode"`
	Levels []Level `json:"levels,omitempty"`
	// PA is the physical address when the walk ends at a valid leaf.
	PA string `json:"pa,omitempty"`
	// PageSize is the leaf's page: 4K, 2M, 1G, 512G or 256T.
	PageSize string `json:"page_size,omitempty"`
	// Flags are the leaf's V R W X U G A D.
	Flags string `json:"flags,omitempty"`
	// Fault says why the walk stops short of a page (the MMU would
	// raise a page fault for any access).
	Fault string `json:"fault,omitempty"`

	pa     uint64
	leaf   uint64 // the leaf PTE, when there is one
	faulty bool
}

// Level is one step of a walk.
type Level struct {
	Level   int    `json:"level"`
	PTEAddr string `json:"pte_addr"`
	PTE     string `json:"pte"`
	Flags   string `json:"flags"`
}

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

// walkPT walks va through the page table that satp names, reading PTEs
// with read (physical addresses). Only an error of read is an error; a
// walk that finds no page says why in Fault.
func walkPT(va, satp uint64, read func(pa uint64) (uint64, error)) (Walk, error) {
	w := Walk{VA: hex(va), Satp: hex(satp)}
	var levels int
	switch satp >> 60 {
	case 0:
		w.Mode, w.pa, w.PA = "Bare", va, hex(va)
		return w, nil
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
		w.Fault, w.faulty = fmt.Sprintf("%s is not a valid %s address: bits 63..%d must all equal bit %d", hex(va), w.Mode, vaBits, vaBits-1), true
		return w, nil
	}
	a := (satp & (1<<44 - 1)) << 12
	for i := levels - 1; i >= 0; i-- {
		vpn := va >> (12 + 9*uint(i)) & 0x1ff
		pa := a + vpn*8
		pte, err := read(pa)
		if err != nil {
			return w, fmt.Errorf("read the level-%d PTE at physical %s: %w", i, hex(pa), err)
		}
		w.Levels = append(w.Levels, Level{Level: i, PTEAddr: hex(pa), PTE: hex(pte), Flags: pteFlags(pte)})
		fail := func(why string) (Walk, error) {
			w.Fault, w.faulty = fmt.Sprintf("level %d PTE at %s: %s", i, hex(pa), why), true
			return w, nil
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
		w.pa = ppn<<12&^mask | va&mask
		w.PA, w.PageSize, w.Flags, w.leaf = hex(w.pa), pageSizes[i], pteFlags(pte), pte
		return w, nil
	}
	return w, nil // not reached: level 0 is always a leaf or a fault
}

// Translate walks addr (a location) through the page table of satp, or
// when satp is nil of the current satp of hart (LastHart: the hart of the
// last stop); on is that hart.
func (s *Session) Translate(ctx context.Context, hart int, loc string, satp *uint64) (w Walk, on int, err error) {
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return Walk{}, 0, err
	}
	on, err = s.onHart(ctx, hart, func(th *gdb.Thread) (err error) {
		w, err = s.translate(ctx, th, addrs[0], satp)
		return err
	})
	return w, on, err
}

func (s *Session) translate(ctx context.Context, th *gdb.Thread, va uint64, satp *uint64) (Walk, error) {
	var sv uint64
	if satp != nil {
		sv = *satp
	} else {
		v, err := th.ReadRegister(ctx, "satp")
		if err != nil {
			return Walk{}, fmt.Errorf("read satp: %w", err)
		}
		sv = v
	}
	if sv>>60 == 0 {
		return walkPT(va, sv, nil)
	}
	if err := th.Client().SetPhysicalMemory(ctx, true); err != nil {
		if errors.Is(err, gdb.ErrUnsupported) {
			return Walk{}, errors.New("this QEMU's gdbstub cannot read physical memory (Qqemu.PhyMemMode), which a page walk needs")
		}
		return Walk{}, err
	}
	defer th.Client().SetPhysicalMemory(context.WithoutCancel(ctx), false)
	return walkPT(va, sv, func(pa uint64) (uint64, error) {
		b, err := th.ReadMemory(ctx, pa, 8)
		if err != nil {
			return 0, err
		}
		return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56, nil
	})
}
