package x86_64

import (
	"golang.org/x/arch/x86/x86asm"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// x86-64 Linux built with frame pointers starts each function (after an
// endbr64 landing pad and ftrace's five-byte nop, which a live ftrace
// makes a call to __fentry__) with
//
//	push %rbp
//	mov  %rsp,%rbp
//
// so the caller's rbp is at fp+0 and the return address, which the call
// pushed, at fp+8. The CFA, as Prologue counts, is the stack pointer
// before the call: rsp at the function's entry plus 8.
//
// x86 has no link register: the return address is on the stack, at
// CFA-8, from the function's first instruction. Prologue has RASaved
// true and RAOff (relative to fp) only once fp is set; before that an
// unwinder reads the return address at CFA-8, the CFA being sp-SPOff.

// standardPrologue is push %rbp; mov %rsp,%rbp done: fp is 16 below the
// CFA (the return address and the saved rbp), and so is sp until the
// function lowers it further.
var standardPrologue = arch.Prologue{SPAdjusted: true, SPOff: -16, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8, FPOff: 0}

func (debugger) Standard() arch.Prologue { return standardPrologue }

// PrologueScan is 128: GCC sets rbp within the first 128 bytes of all
// but a few in a thousand of the guest kernel's frame-pointer functions
// (99.8%; 99.05% within 64, TestScanPrologueVmlinux says), usually in
// its first 13 (endbr64, the ftrace nop, push, mov); later ones are
// shrink-wrapped, their frame after an early exit.
func (debugger) PrologueScan() int { return 128 }

// ScanPrologue decodes code, a function's start up to the pc, in order
// and stops at its end: sp lowered (push, sub $N,%rsp, add of a negative
// N, lea -N(%rsp),%rsp), rbp pushed and rbp set from rsp (mov
// %rsp,%rbp), sp realigned (and $-N,%rsp; see take); everything else
// passes, calls too (a call returns with sp where it was). Only the first push of rbp and the first setting of rbp
// count, and sp raised (pop, add $N,%rsp, leave) counts for nothing: an
// early return's epilogue, before the pc, leaves the frame the code
// after it still runs in.
func (debugger) ScanPrologue(code []byte) arch.Prologue {
	ps := prologueScanner{p: arch.Prologue{SPOff: -8}}
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil {
			if err == x86asm.ErrTruncated {
				break
			}
			off++
			continue
		}
		ps.take(inst)
		off += inst.Len
	}
	return ps.result()
}

// prologueScanner is ScanPrologue's state: the prologue so far, and where
// rbp was pushed relative to the CFA.
type prologueScanner struct {
	p       arch.Prologue
	fpPos   int64
	fpSaved bool
}

// take takes in one instruction.
func (ps *prologueScanner) take(inst x86asm.Inst) {
	p := &ps.p
	dst, _ := inst.Args[0].(x86asm.Reg)
	switch inst.Op {
	case x86asm.PUSH, x86asm.PUSHF:
		ps.lower(8)
		if inst.Args[0] == x86asm.RBP && !ps.fpSaved {
			ps.fpSaved, ps.fpPos = true, p.SPOff
		}
	case x86asm.MOV:
		if dst == x86asm.RBP && inst.Args[1] == x86asm.RSP && !p.FPSet {
			p.FPSet, p.FPPos = true, p.SPOff
		}
	case x86asm.SUB, x86asm.ADD:
		imm, ok := inst.Args[1].(x86asm.Imm)
		if dst != x86asm.RSP || !ok {
			break
		}
		if inst.Op == x86asm.ADD {
			imm = -imm
		}
		ps.lower(int64(imm))
	case x86asm.AND:
		if dst == x86asm.RSP {
			// The stack realigned (GCC's drap, for a function with
			// over-aligned locals): sp is no longer a known distance
			// from the CFA. GCC then pushes a copy of the return
			// address and builds the standard frame on it, so the
			// scan goes on from sp as if it were the CFA: what is
			// relative to fp holds.
			p.SPOff, p.SPAdjusted = 0, true
		}
	case x86asm.LEA:
		m, ok := inst.Args[1].(x86asm.Mem)
		if dst == x86asm.RSP && ok && m.Base == x86asm.RSP && m.Index == 0 {
			ps.lower(-int64(int32(m.Disp)))
		}
	}
}

// lower takes in sp lowered by n bytes, when n is positive.
func (ps *prologueScanner) lower(n int64) {
	if n > 0 {
		ps.p.SPOff -= n
		ps.p.SPAdjusted = true
	}
}

// result is the prologue scanned: once rbp is set, the return address
// (at CFA-8 from the first instruction) is RASaved relative to it.
func (ps *prologueScanner) result() arch.Prologue {
	p := ps.p
	p.RASaved = p.FPSet
	return p.Framed(ps.fpPos, ps.fpSaved, -8, standardPrologue)
}
