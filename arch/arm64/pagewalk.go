package arm64

import (
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The translation regime of EL1&0 (the Arm ARM, "The AArch64 Virtual
// Memory System Architecture"): an address whose bit 55 is 0 walks the
// table of TTBR0_EL1, one whose bit 55 is 1 that of TTBR1_EL1, each with
// its own size (TCR_EL1.T0SZ, T1SZ) and granule (TG0, TG1).

// baddrMask is a TTBR's table address (BADDR, 48-bit output addresses);
// outMask a descriptor's output address.
const (
	baddrMask = uint64(1)<<48 - 2
	outMask   = uint64(1)<<48 - 1<<12
)

var (
	granule0 = [4]string{"4K", "64K", "16K", "reserved"}
	granule1 = [4]string{"reserved", "16K", "4K", "64K"}
)

// Descriptor bits of the stage 1 tables, 4K granule.
const (
	descValid = 1 << 0
	descTable = 1 << 1 // at levels 0..2: a table, else a block; at 3: a page
	descAF    = 1 << 10
	descPXN   = 1 << 53
	descUXN   = 1 << 54
)

// apRO and apEL0 are the access permission bits AP[2] (read-only) and
// AP[1] (EL0 may access).
const (
	apRO  = 1 << 7
	apEL0 = 1 << 6
)

var pageSizes = [4]string{"512G", "1G", "2M", "4K"}

// Root is "": the table depends on the address (TTBR0_EL1 or TTBR1_EL1).
func (debugger) Root() string { return "" }

// Walk walks va as the MMU does at EL1: through TTBR0_EL1 or TTBR1_EL1
// by bit 55, with the VA size and granule TCR_EL1 gives, 4K granules only.
func (debugger) Walk(va uint64, reg func(string) (uint64, error), read func(pa uint64) (uint64, error)) (arch.Walk, error) {
	w := arch.Walk{VA: hex(va)}
	sctlr, err := reg("SCTLR_EL1")
	if err != nil {
		return w, err
	}
	if sctlr&1 == 0 {
		return w.Untranslated("MMU off", va), nil
	}
	tcr, err := reg("TCR_EL1")
	if err != nil {
		return w, err
	}
	w.TCR = hex(tcr)
	upper := va>>55&1 == 1
	half, size, tg, epd, tbi := 0, tcr&0x3f, granule0[tcr>>14&3], tcr>>7&1, tcr>>37&1
	if upper {
		half, size, tg, epd, tbi = 1, tcr>>16&0x3f, granule1[tcr>>30&3], tcr>>23&1, tcr>>38&1
	}
	ttbrName := fmt.Sprintf("TTBR%d_EL1", half)
	ttbr, err := reg(ttbrName)
	if err != nil {
		return w, err
	}
	w.TTBR = hex(ttbr)
	vaBits := uint(64 - size)
	w.Mode = fmt.Sprintf("%s %d-bit %s", ttbrName, vaBits, tg)
	fault := func(why string) (arch.Walk, error) { return w.Stopped(why), nil }
	switch {
	case tg != "4K":
		return w, fmt.Errorf("%s uses %s pages: this walker knows 4K granules only", ttbrName, tg)
	case vaBits < 25 || vaBits > 48:
		return w, fmt.Errorf("TCR_EL1 gives a %d-bit VA for %s: this walker knows 25 to 48 bits", vaBits, ttbrName)
	case epd == 1:
		return fault(fmt.Sprintf("walks through %s are disabled (TCR_EL1.EPD%d=1): a translation fault at level 0", ttbrName, half))
	}
	top := uint(64)
	if tbi == 1 {
		top = 56 // the top byte is a tag the MMU ignores
	}
	want := uint64(0)
	if upper {
		want = 1<<(top-vaBits) - 1
	}
	if va<<(64-top)>>(64-top)>>vaBits != want {
		return fault(fmt.Sprintf("%s is outside %s's %d-bit range: bits %d..%d must all be %d", hex(va), ttbrName, vaBits, top-1, vaBits, want&1))
	}
	levels := (vaBits - 12 + 8) / 9
	a := ttbr & baddrMask
	for lvl := 4 - levels; lvl <= 3; lvl++ {
		shift := 12 + 9*(3-lvl)
		idx := va >> shift & 0x1ff
		if lvl == 4-levels {
			idx = va >> shift & (1<<(vaBits-shift) - 1)
		}
		pa := a + idx*8
		d, err := read(pa)
		if err != nil {
			return w, fmt.Errorf("read the level-%d descriptor at physical %s: %w", lvl, hex(pa), err)
		}
		l := arch.Level{Level: int(lvl), PTEAddr: hex(pa), PTE: hex(d)}
		switch {
		case d&descValid == 0:
			l.Flags = "invalid"
		case d&descTable != 0 && lvl < 3:
			l.Flags = tableFlags(d)
		default:
			l.Flags = leafFlags(d, lvl)
		}
		w.Levels = append(w.Levels, l)
		at := fmt.Sprintf("level %d descriptor at %s: ", lvl, hex(pa))
		switch {
		case d&descValid == 0:
			return fault(at + "not valid (bit 0 clear): nothing is mapped there")
		case d&descTable == 0 && lvl == 3:
			return fault(at + "reserved (a level-3 descriptor with bit 1 clear)")
		case d&descTable == 0 && lvl == 0:
			return fault(at + "a block at level 0, which 4K granules do not have")
		case d&descTable != 0 && lvl < 3:
			a = d & outMask
			continue
		}
		mask := uint64(1)<<shift - 1
		return w.Mapped(d&outMask&^mask|va&mask, pageSizes[lvl], l.Flags, d), nil
	}
	return w, nil // not reached: level 3 is always a page or a fault
}

// tableFlags names a table descriptor's hierarchical permission limits.
func tableFlags(d uint64) string {
	f := []string{"table"}
	if d>>59&1 == 1 {
		f = append(f, "PXNTable")
	}
	if d>>60&1 == 1 {
		f = append(f, "UXNTable")
	}
	if ap := d >> 61 & 3; ap != 0 {
		f = append(f, fmt.Sprintf("APTable=%d%d", ap>>1, ap&1))
	}
	return strings.Join(f, " ")
}

// leafFlags names a block's or page's attributes: the level and kind,
// then access permissions, the access flag, execute-never bits,
// shareability, memory attribute index, non-global.
func leafFlags(d uint64, lvl uint) string {
	kind := "block"
	if lvl == 3 {
		kind = "page"
	}
	f := []string{fmt.Sprintf("level-%d %s", lvl, kind), apNames[d>>6&3]}
	if d&descAF != 0 {
		f = append(f, "AF")
	} else {
		f = append(f, "AF=0")
	}
	if d&descPXN != 0 {
		f = append(f, "PXN")
	}
	if d&descUXN != 0 {
		f = append(f, "UXN")
	}
	if d>>51&1 == 1 {
		f = append(f, "DBM")
	}
	f = append(f, []string{"SH=non", "SH=reserved", "SH=outer", "SH=inner"}[d>>8&3], fmt.Sprintf("AttrIndx=%d", d>>2&7))
	if d>>11&1 == 1 {
		f = append(f, "nG")
	}
	return strings.Join(f, " ")
}

// apNames are AP[2:1]'s permissions.
var apNames = [4]string{"AP=00 (EL1 read-write, EL0 none)", "AP=01 (read-write)", "AP=10 (EL1 read-only, EL0 none)", "AP=11 (read-only)"}
