package arm64

import (
	"encoding/binary"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// AArch64 Linux is built with frame pointers: each function stores a
// frame record, its caller's x29 and its return address x30, and points
// x29 at it. GCC puts the record at the bottom of the frame,
//
//	stp x29, x30, [sp, #-N]!   // or: sub sp, sp, #N; stp x29, x30, [sp, #M]
//	mov x29, sp                //     add x29, sp, #M
//
// so the caller's x29 is at fp+0 and the return address at fp+8, and the
// CFA (sp at the function's entry, as Prologue counts) is above fp by the
// frame's size.

// standardPrologue is the frame record at fp. FPPos, where fp is below
// the CFA, depends on the frame's size, which the record does not say:
// -16 is the smallest frame, the record alone, and the commonest; for a
// larger frame the CFA is higher still.
var standardPrologue = arch.Prologue{FPSet: true, FPPos: -16, RASaved: true, RAOff: 8, FPOff: 0}

func (debugger) Standard() arch.Prologue { return standardPrologue }

// PrologueScan is 512: GCC sets the frame pointer within the first 256
// bytes of all but a handful of functions (shrink-wrapped ones, their
// frame after an early exit), and within 512 of all but one in a 6.1
// kernel.
func (debugger) PrologueScan() int { return 512 }

// ScanPrologue recognises the instructions that build a frame: sp
// lowered (sub sp, sp, #N or a pre-indexed store to sp), x29 and x30
// stored relative to sp (str, stp), and x29 pointed at sp plus an offset
// (mov x29, sp; add x29, sp, #M); pointer authentication and BTI landing
// pads (paciasp, bti c) and other instructions between them pass. Only
// the first store of x29 and of x30 and the first setting of x29 count,
// and sp raised counts for nothing: an early return's epilogue, before
// the pc, leaves the frame the code after it still runs in.
func (debugger) ScanPrologue(code []byte) arch.Prologue {
	var ps prologueScanner
	for off := 0; off+4 <= len(code); off += 4 {
		ps.take(binary.LittleEndian.Uint32(code[off:]))
	}
	return ps.result()
}

// prologueScanner is ScanPrologue's state: the prologue so far, and where
// x30 (once p.RASaved) and x29 were stored relative to the CFA.
type prologueScanner struct {
	p            arch.Prologue
	raPos, fpPos int64
	fpSaved      bool
}

const spReg = 31

// take takes in one instruction.
func (ps *prologueScanner) take(x uint32) {
	p := &ps.p
	rd, rn := x&0x1f, x>>5&0x1f
	switch {
	case x&0xff800000 == 0xd1000000 && rd == spReg && rn == spReg: // sub sp, sp, #imm{, lsl #12}
		p.SPOff -= int64(x>>10&0xfff) << (12 * (x >> 22 & 1))
		p.SPAdjusted = true
	case x&0xff800000 == 0x91000000 && rd == 29 && rn == spReg: // add x29, sp, #imm (mov x29, sp)
		if !p.FPSet {
			p.FPSet, p.FPPos = true, p.SPOff+int64(x>>10&0xfff)<<(12*(x>>22&1))
		}
	case x&0xffc00000 == 0xa9800000 && rn == spReg: // stp xt1, xt2, [sp, #imm]!
		at := ps.lower(sextImm(int64(x>>15&0x7f), 7) * 8)
		ps.stored(rd, at)
		ps.stored(x>>10&0x1f, at+8)
	case x&0xffc00000 == 0xa9000000 && rn == spReg: // stp xt1, xt2, [sp, #imm]
		off := sextImm(int64(x>>15&0x7f), 7) * 8
		ps.stored(rd, off)
		ps.stored(x>>10&0x1f, off+8)
	case x&0xffe00c00 == 0xf8000c00 && rn == spReg: // str xt, [sp, #imm]!
		ps.stored(rd, ps.lower(sextImm(int64(x>>12&0x1ff), 9)))
	case x&0xffc00000 == 0xf9000000 && rn == spReg: // str xt, [sp, #imm]
		ps.stored(rd, int64(x>>10&0xfff)*8)
	case x&0xffe00c00 == 0xf8000000 && rn == spReg: // stur xt, [sp, #imm]
		ps.stored(rd, sextImm(int64(x>>12&0x1ff), 9))
	}
}

// lower takes in sp moved by off before a pre-indexed store, when it is
// lowered; at is where the store goes relative to sp after.
func (ps *prologueScanner) lower(off int64) (at int64) {
	if off >= 0 {
		return off
	}
	ps.p.SPOff += off
	ps.p.SPAdjusted = true
	return 0
}

// stored takes in "str wxReg, [sp, #off]".
func (ps *prologueScanner) stored(wxReg uint32, off int64) {
	switch {
	case wxReg == 30 && !ps.p.RASaved:
		ps.p.RASaved, ps.raPos = true, ps.p.SPOff+off
	case wxReg == 29 && !ps.fpSaved:
		ps.fpSaved, ps.fpPos = true, ps.p.SPOff+off
	}
}

// result is the prologue scanned.
func (ps *prologueScanner) result() arch.Prologue {
	if ps.p.FPSet && !ps.p.RASaved {
		// x29 set without a whole record (x30 too) stored is no
		// frame-pointer frame; the standard layout is the best guess.
		return standardPrologue
	}
	return ps.p.Framed(ps.fpPos, ps.fpSaved, ps.raPos, standardPrologue)
}

func sextImm(v int64, bits uint) int64 {
	shift := 64 - bits
	return v << shift >> shift
}
