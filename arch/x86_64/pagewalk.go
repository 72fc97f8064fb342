package x86_64

import (
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The control bits the walk depends on (the Intel SDM, volume 3, "Paging").
const (
	cr0PG   = 1 << 31 // paging on
	cr0WP   = 1 << 16 // supervisor writes honour R/W
	cr4PAE  = 1 << 5
	cr4LA57 = 1 << 12 // 5-level paging, in long mode
	cr4PKE  = 1 << 22 // protection keys for user pages
	cr4PKS  = 1 << 24 // protection keys for supervisor pages
	eferLMA = 1 << 10 // long mode active
	eferNXE = 1 << 11 // the XD bit is honoured (else reserved)
)

// Paging-structure entry bits.
const (
	pteP   = 1 << 0
	pteRW  = 1 << 1
	pteUS  = 1 << 2
	ptePWT = 1 << 3
	ptePCD = 1 << 4
	pteA   = 1 << 5
	pteD   = 1 << 6
	ptePS  = 1 << 7 // a page, in a PDPTE or PDE; PAT in a PTE
	pteG   = 1 << 8
	pteXD  = 1 << 63
)

// addrMask is an entry's (and CR3's) physical address, bits 51:12: the
// architectural maximum. A CPU with a narrower MAXPHYADDR (QEMU's default
// CPUs have 40 bits; KVM's follow the host) treats the bits above its own
// width as reserved, which this walker cannot know without CPUID, so it
// does not report them: it uses them as address bits.
const addrMask = uint64(1)<<52 - 1<<12

// entryNames name the entry at each level (index 1..5).
var entryNames = [6]string{"", "PTE", "PDE", "PDPTE", "PML4E", "PML5E"}

// pageSizes are the pages a leaf maps at each level (index 1..3).
var pageSizes = [4]string{"", "4K", "2M", "1G"}

// Root is "": the walk reads CR0, CR3, CR4 and EFER.
func (debugger) Root() string { return "" }

// Walk walks va as the MMU does: with CR0.PG clear there is no
// translation; in long mode (EFER.LMA) through 4-level tables, or 5-level
// ones with CR4.LA57, from CR3. Entries' addresses are bits 51:12 (see
// addrMask). Paging on outside long mode (legacy protected mode's 32-bit
// and PAE paging, which 32-bit kernels use and 64-bit Linux never does)
// is not walked: Mode names the paging and Fault says the walker does not
// support it.
//
// The leaf's Flags are the access the whole walk allows: writable only if
// every level's R/W is set, user only if every level's U/S is, and no
// execute if any level's XD is (with EFER.NXE). What CR4.SMEP and SMAP
// forbid the kernel on user pages is left to the reader of "user".
func (debugger) Walk(va uint64, reg func(string) (uint64, error), read func(pa uint64) (uint64, error)) (arch.Walk, error) {
	w := arch.Walk{VA: hex(va)}
	cr0, err := reg("cr0")
	if err != nil {
		return w, err
	}
	if cr0&cr0PG == 0 {
		return w.Untranslated("paging off", va), nil
	}
	cr3, err := reg("cr3")
	if err != nil {
		return w, err
	}
	w.CR3 = hex(cr3)
	cr4, err := reg("cr4")
	if err != nil {
		return w, err
	}
	efer, err := reg("efer")
	if err != nil {
		return w, err
	}
	fault := func(why string) (arch.Walk, error) { return w.Stopped(why), nil }
	if efer&eferLMA == 0 {
		w.Mode = "32-bit paging"
		if cr4&cr4PAE != 0 {
			w.Mode = "PAE paging"
		}
		return fault(w.Mode + " (protected mode, not long mode) is not supported: this walker knows long mode's 4- and 5-level tables only")
	}
	levels, vaBits := 4, uint(48)
	if cr4&cr4LA57 != 0 {
		levels, vaBits = 5, 57
	}
	w.Mode = fmt.Sprintf("%d-level paging", levels)
	if top := int64(va) >> (vaBits - 1); top != 0 && top != -1 {
		return fault(fmt.Sprintf("%s is not canonical for %s: bits 63..%d must all equal bit %d (a general-protection fault, not a page fault)", hex(va), w.Mode, vaBits, vaBits-1))
	}
	nxe, pk := efer&eferNXE != 0, cr4&(cr4PKE|cr4PKS) != 0
	writable, user, noExec := true, true, false
	a := cr3 & addrMask
	for lvl := levels; lvl >= 1; lvl-- {
		shift := uint(12 + 9*(lvl-1))
		pa := a + (va>>shift&0x1ff)*8
		e, err := read(pa)
		if err != nil {
			return w, fmt.Errorf("read the level-%d %s at physical %s: %w", lvl, entryNames[lvl], hex(pa), err)
		}
		page := lvl == 1 || lvl <= 3 && e&ptePS != 0
		l := arch.Level{Level: lvl, PTEAddr: hex(pa), PTE: hex(e), Flags: entryFlags(e, lvl, page, pk)}
		w.Levels = append(w.Levels, l)
		at := fmt.Sprintf("level %d (%s at %s)", lvl, entryNames[lvl], hex(pa))
		if e&pteP == 0 {
			return fault("not present at " + at + ": nothing is mapped there")
		}
		if why := reserved(e, lvl, nxe); why != "" {
			return fault("reserved bits set at " + at + ": " + why)
		}
		writable = writable && e&pteRW != 0
		user = user && e&pteUS != 0
		noExec = noExec || nxe && e&pteXD != 0
		if !page {
			a = e & addrMask
			continue
		}
		mask := uint64(1)<<shift - 1
		flags := access(e, writable, user, noExec, cr0&cr0WP != 0, pk)
		return w.Mapped(e&addrMask&^mask|va&mask, pageSizes[lvl], flags, e), nil
	}
	return w, nil // not reached: level 1 is always a page or a fault
}

// reserved says which reserved bits a present entry at level lvl has set,
// "" if none (bits above MAXPHYADDR aside: see addrMask).
func reserved(e uint64, lvl int, nxe bool) string {
	switch {
	case e&pteXD != 0 && !nxe:
		return "bit 63 (XD) while EFER.NXE is clear"
	case lvl >= 4 && e&ptePS != 0:
		return fmt.Sprintf("bit 7 (PS), which a %s must have clear", entryNames[lvl])
	case lvl == 3 && e&ptePS != 0 && e&(1<<30-1<<13) != 0:
		return "bits 29:13 of a 1G page's address (it must be 1G-aligned)"
	case lvl == 2 && e&ptePS != 0 && e&(1<<21-1<<13) != 0:
		return "bits 20:13 of a 2M page's address (it must be 2M-aligned)"
	}
	return ""
}

// bitName names an entry's bit.
type bitName struct {
	mask uint64
	name string
}

// entryFlags says what an entry at level lvl is ("PML4E", "PDE 2M page")
// and names its bits that are set; the protection key too, with pk, for a
// page.
func entryFlags(e uint64, lvl int, page, pk bool) string {
	f := []string{entryNames[lvl]}
	if page {
		f[0] += " " + pageSizes[lvl] + " page"
	}
	if e&pteP == 0 {
		return f[0] + " not present"
	}
	bits := []bitName{{pteP, "P"}, {pteRW, "RW"}, {pteUS, "US"}, {ptePWT, "PWT"}, {ptePCD, "PCD"}, {pteA, "A"}}
	if page {
		// D, G and PAT mean something in a page's entry only; a PTE's
		// bit 7 is PAT, a large page's PAT is bit 12.
		ps, pat := uint64(ptePS), uint64(1<<12)
		if lvl == 1 {
			ps, pat = 0, ptePS
		}
		bits = append(bits, bitName{pteD, "D"}, bitName{ps, "PS"}, bitName{pteG, "G"}, bitName{pat, "PAT"})
	}
	bits = append(bits, bitName{pteXD, "NX"})
	for _, b := range bits {
		if b.mask != 0 && e&b.mask != 0 {
			f = append(f, b.name)
		}
	}
	if page && pk {
		f = append(f, fmt.Sprintf("PK=%d", e>>59&0xf))
	}
	return strings.Join(f, " ")
}

// access states the access a walk ending at the page e allows, its
// permissions combined over the levels: "present, writable, kernel-only,
// no-execute, global, dirty".
func access(e uint64, writable, user, noExec, wp, pk bool) string {
	f := []string{"present", "read-only", "kernel-only", "executable"}
	if writable {
		f[1] = "writable"
	} else if !wp {
		f[1] = "read-only (the kernel may write: CR0.WP is clear)"
	}
	if user {
		f[2] = "user"
	}
	if noExec {
		f[3] = "no-execute"
	}
	for _, b := range []bitName{{pteG, "global"}, {pteA, "accessed"}, {pteD, "dirty"}} {
		if e&b.mask != 0 {
			f = append(f, b.name)
		}
	}
	if pk {
		f = append(f, fmt.Sprintf("protection key %d", e>>59&0xf))
	}
	return strings.Join(f, ", ")
}
