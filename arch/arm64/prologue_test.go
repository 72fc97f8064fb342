package arm64

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

func code(words ...uint32) []byte {
	var b []byte
	for _, x := range words {
		b = append(b, insnBytes(x)...)
	}
	return b
}

// TestScanPrologue decodes prologues GCC 12 emitted for Linux 6.1
// (arch/arm64), cut at each pc a debugger may stop at.
func TestScanPrologue(t *testing.T) {
	// el1h_64_sync_handler: the frame record alone.
	small := code(0xa9bf7bfd, 0x910003fd, 0xd5385201) // stp x29, x30, [sp, #-16]!; mov x29, sp; mrs x1, esr_el1
	// panic: a 208-byte frame, the record at its bottom.
	panicking := code(0xa9b37bfd, 0x910003fd, 0xa9025bf5) // stp x29, x30, [sp, #-208]!; mov x29, sp; stp x21, x22, [sp, #32]
	// r_show: sp lowered first, the record above the outgoing area.
	large := code(0xd10103ff, 0xa9017bfd, 0x910043fd, 0xa90253f3) // sub sp, sp, #0x40; stp x29, x30, [sp, #16]; add x29, sp, #0x10
	// __fpr_set.constprop.0: a 592-byte frame, the record at sp.
	huge := code(0xd10943ff, 0xa9007bfd, 0x910003fd) // sub sp, sp, #0x250; stp x29, x30, [sp]; mov x29, sp
	// do_proc_dointvec_conv: a leaf with no frame.
	leaf := code(0x34000203, 0x39400000, 0xf9400021, 0xb9000041, 0xd65f03c0)
	// paciasp and bti c before the record, and one with sp lowered by
	// 4 KiB pages.
	pac := code(0xd503233f, 0xd503245f, 0xa9bd7bfd, 0x910003fd)
	pages := code(0xa9bf7bfd, 0x910003fd, 0xd14007ff) // ...; sub sp, sp, #0x1, lsl #12
	// el1h_64_sync: entry code storing x29 (and x30) into pt_regs at sp.
	entry := code(0xa90007e0, 0xa90e77fc, 0x910543f5, 0xa90f57fe)

	for _, c := range []struct {
		name string
		code []byte
		want arch.Prologue
	}{
		{"before the record", small[:0], arch.Prologue{}},
		{"record stored", small[:4], arch.Prologue{SPAdjusted: true, SPOff: -16, RASaved: true, FPStored: true, FPSlot: 0}},
		{"small frame", small, arch.Prologue{SPAdjusted: true, SPOff: -16, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		{"panic", panicking, arch.Prologue{SPAdjusted: true, SPOff: -208, FPSet: true, FPPos: -208, RASaved: true, RAOff: 8}},
		{"sp lowered, record not yet", large[:4], arch.Prologue{SPAdjusted: true, SPOff: -64}},
		{"record above sp", large, arch.Prologue{SPAdjusted: true, SPOff: -64, FPSet: true, FPPos: -48, RASaved: true, RAOff: 8}},
		{"huge frame", huge, arch.Prologue{SPAdjusted: true, SPOff: -592, FPSet: true, FPPos: -592, RASaved: true, RAOff: 8}},
		{"leaf", leaf, arch.Prologue{}},
		{"paciasp, bti c", pac, arch.Prologue{SPAdjusted: true, SPOff: -48, FPSet: true, FPPos: -48, RASaved: true, RAOff: 8}},
		{"sp lowered after", pages, arch.Prologue{SPAdjusted: true, SPOff: -16 - 4096, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		{"str x30 pre-indexed", code(0xf81f0ffe), arch.Prologue{SPAdjusted: true, SPOff: -16, RASaved: true}},
		{"entry code", entry, arch.Prologue{RASaved: true, FPStored: true, FPSlot: 232}},
		{"an early return's epilogue", code(0xa9bf7bfd, 0x910003fd, 0xa8c17bfd, 0xd65f03c0, 0xf9400021),
			arch.Prologue{SPAdjusted: true, SPOff: -16, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
	} {
		if got := (debugger{}).ScanPrologue(c.code); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestScanPrologueVmlinux scans the prologues of real functions: the
// frame record found is where the function stores x29 and x30, fp+0 and
// fp+8, and fp is where the function's frame begins.
func TestScanPrologueVmlinux(t *testing.T) {
	f, _ := testVmlinux(t)
	for _, c := range []struct {
		fn     string
		n      int // instructions of the prologue
		fpPos  int64
		spOff  int64
		hasRec bool
	}{
		{"el1h_64_sync_handler", 2, -16, -16, true},
		{"panic", 2, -208, -208, true},
		{"r_show", 3, -48, -64, true},
		{"__fpr_set.constprop.0", 3, -592, -592, true},
		{"do_proc_dointvec_conv", 16, 0, 0, false},
	} {
		_, b := symbolCode(t, f, c.fn)
		p := debugger{}.ScanPrologue(b[:4*c.n])
		if !c.hasRec {
			if p.FPSet || p.RASaved || p.SPAdjusted {
				t.Errorf("%s: %+v, want no frame", c.fn, p)
			}
			continue
		}
		want := arch.Prologue{SPAdjusted: true, SPOff: c.spOff, FPSet: true, FPPos: c.fpPos, RASaved: true, RAOff: 8}
		if p != want {
			t.Errorf("%s: %+v, want %+v", c.fn, p, want)
		}
	}
}

func TestStandard(t *testing.T) {
	d := debugger{}
	p := d.Standard()
	if !p.FPSet || !p.RASaved || p.RAOff != 8 || p.FPOff != 0 || p.FPPos > -16 {
		t.Errorf("Standard() = %+v: want the record at fp (ra at fp+8), fp at least 16 below the CFA", p)
	}
	if d.PrologueScan() < 256 || d.PrologueScan()%4 != 0 {
		t.Errorf("PrologueScan() = %d", d.PrologueScan())
	}
	if d.MaxInstruction() != 4 {
		t.Errorf("MaxInstruction() = %d", d.MaxInstruction())
	}
}
