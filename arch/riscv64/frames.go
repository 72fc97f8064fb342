package riscv64

import (
	"context"
	"encoding/binary"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// ptRegs is Linux's struct pt_regs on RISC-V: epc, x1..x31, then status,
// badaddr, cause (arch/riscv/include/asm/ptrace.h).
const (
	ptEPC     = 0
	ptStatus  = 32 * 8
	ptBadaddr = 33 * 8
	ptCause   = 34 * 8
	ptSize    = 36 * 8
)

// IsVector reports whether fn is Linux's trap vector (its labels
// included), where the registers of the trapped context are being saved.
func (debugger) IsVector(fn string) bool {
	return strings.HasPrefix(fn, "handle_exception") || fn == "_save_context" || fn == "_restore_kernel_tpsp"
}

// IsEntry reports whether fn is trap entry code that leaves a pt_regs at
// the stack pointer of the handler it calls.
func (debugger) IsEntry(fn string) bool {
	return strings.HasPrefix(fn, "ret_from_") || strings.HasPrefix(fn, "handle_exception") ||
		strings.HasPrefix(fn, "handle_syscall")
}

// IsFirst is a secondary hart's first frame: head.S tail-calls smp_callin
// with no caller to return to.
func (debugger) IsFirst(fn string) bool { return fn == "smp_callin" }

func (debugger) TrapFrameSize() int { return ptSize }

// TrapFrameAt is calleeCFA: the entry code calls its handler with the
// stack pointer at the pt_regs it saved.
func (debugger) TrapFrameAt(_ arch.Frame, calleeCFA uint64) uint64 { return calleeCFA }

// TrapFrame decodes a pt_regs: the trap (scause, stval, sstatus as the
// entry code saved them) and the trapped context; sstatus.SPP says it
// came from user mode.
func (debugger) TrapFrame(_ context.Context, _ arch.Reader, _ string, b []byte) (arch.Trap, arch.Frame, bool) {
	word := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	t := DecodeCause(word(ptCause))
	t.PC, t.Addr, t.HasAddr, t.Status = word(ptEPC), word(ptBadaddr), true, word(ptStatus)
	f := arch.Frame{PC: word(ptEPC), RA: word(1 * 8), SP: word(2 * 8), FP: word(8 * 8)}
	return t, f, word(ptStatus)>>8&1 == 0
}

// InVector recovers the context a trap interrupted while the hart is in
// the trap vector: pc from sepc, the cause from scause, the mode from
// sstatus.SPP; ra, sp and s0 live until the vector has saved them in
// pt_regs (at ra 8, sp 16, s0 64), and from there after.
func (debugger) InVector(ctx context.Context, r arch.Reader, f arch.Frame, pro arch.Prologue) (arch.Frame, arch.Trap, bool, error) {
	csrs, err := arch.ReadRegisters(ctx, r, "in the trap vector", "sepc", "scause", "sstatus")
	if err != nil {
		return f, arch.Trap{}, false, err
	}
	epc, cause, status := csrs[0], csrs[1], csrs[2]
	t := DecodeCause(cause)
	if v, err := r.ReadRegister(ctx, "stval"); err == nil {
		t.Addr, t.HasAddr = v, true
	}
	t.PC, t.Status = epc, status
	next := arch.Frame{PC: epc, RA: f.RA, SP: f.SP, FP: f.FP}
	if pro.SPAdjusted {
		b, err := r.ReadMemory(ctx, f.SP, ptSize)
		if err == nil && len(b) == ptSize {
			next.SP = binary.LittleEndian.Uint64(b[2*8:])
			if pro.RASaved { // the vector sets ra to ret_from_exception later
				next.RA = binary.LittleEndian.Uint64(b[1*8:])
			}
			if pro.FPStored {
				next.FP = binary.LittleEndian.Uint64(b[8*8:])
			}
		}
	}
	return next, t, status>>8&1 == 0, nil
}

// standardPrologue is what GCC and Clang emit with frame pointers:
// ra at fp-8, the caller's fp at fp-16, fp at the CFA.
var standardPrologue = arch.Prologue{FPSet: true, RASaved: true, RAOff: -8, FPOff: -16}

func (debugger) Standard() arch.Prologue { return standardPrologue }

// PrologueScan is 512: a frame is set up in the first few instructions,
// and Linux's trap vector stores the registers into pt_regs within its
// first 400 bytes.
func (debugger) PrologueScan() int { return 512 }

// ScanPrologue recognises the instructions that build a frame: sp -= N;
// sd ra,X(sp); sd s0,Y(sp); addi s0,sp,M (each possibly compressed, other
// instructions between).
func (debugger) ScanPrologue(code []byte) arch.Prologue {
	var ps prologueScanner
	for off := 0; off+2 <= len(code); {
		lo := uint32(binary.LittleEndian.Uint16(code[off:]))
		if lo&3 != 3 { // compressed
			off += 2
			ps.compressed(lo)
			continue
		}
		if off+4 > len(code) {
			break
		}
		ps.full(binary.LittleEndian.Uint32(code[off:]))
		off += 4
	}
	return ps.result()
}

// prologueScanner is ScanPrologue's state: the prologue so far, and where
// ra and s0 were stored relative to the CFA.
type prologueScanner struct {
	p            arch.Prologue
	raPos, s0Pos int64
	s0Saved      bool
}

// compressed takes in a 16-bit instruction.
func (ps *prologueScanner) compressed(lo uint32) {
	p := &ps.p
	op, f3 := lo&3, lo>>13
	rd := lo >> 7 & 0x1f
	switch {
	case op == 1 && f3 == 3 && rd == 2: // c.addi16sp
		imm := int64(lo>>12&1)<<9 | int64(lo>>3&3)<<7 | int64(lo>>5&1)<<6 | int64(lo>>2&1)<<5 | int64(lo>>6&1)<<4
		p.SPOff += signExtend(imm, 10)
		p.SPAdjusted = true
	case op == 1 && f3 == 0 && rd == 2: // c.addi sp,imm
		imm := int64(lo>>12&1)<<5 | int64(lo>>2&0x1f)
		p.SPOff += signExtend(imm, 6)
		p.SPAdjusted = true
	case op == 2 && f3 == 7: // c.sdsp rs2, uimm(sp)
		uimm := int64(lo>>10&7)<<3 | int64(lo>>7&7)<<6
		ps.stored(lo>>2&0x1f, uimm)
	case op == 0 && f3 == 0 && lo>>2&7 == 0: // c.addi4spn s0,sp,nzuimm
		nz := int64(lo>>11&3)<<4 | int64(lo>>7&0xf)<<6 | int64(lo>>6&1)<<2 | int64(lo>>5&1)<<3
		if nz != 0 {
			p.FPSet, p.FPPos = true, p.SPOff+nz
		}
	}
}

// full takes in a 32-bit instruction.
func (ps *prologueScanner) full(x uint32) {
	p := &ps.p
	rd, rs1, rs2 := x>>7&0x1f, x>>15&0x1f, x>>20&0x1f
	f3 := x >> 12 & 7
	switch x & 0x7f {
	case 0x13: // addi
		if f3 != 0 || rs1 != 2 {
			return
		}
		imm := signExtend(int64(x>>20), 12)
		if rd == 2 {
			p.SPOff += imm
			p.SPAdjusted = true
		} else if rd == 8 {
			p.FPSet, p.FPPos = true, p.SPOff+imm
		}
	case 0x23: // store
		if f3 != 3 || rs1 != 2 {
			return
		}
		ps.stored(rs2, signExtend(int64(x>>25)<<5|int64(x>>7&0x1f), 12))
	}
}

// stored takes in "sd reg, off(sp)".
func (ps *prologueScanner) stored(reg uint32, off int64) {
	if reg == 1 {
		ps.p.RASaved, ps.raPos = true, ps.p.SPOff+off
	} else if reg == 8 {
		ps.s0Saved, ps.s0Pos = true, ps.p.SPOff+off
	}
}

// result is the prologue scanned. A leaf may keep ra in its register, its
// frame holding s0 alone.
func (ps *prologueScanner) result() arch.Prologue {
	return ps.p.Framed(ps.s0Pos, ps.s0Saved, ps.raPos, standardPrologue)
}

func signExtend(v int64, bits uint) int64 {
	shift := 64 - bits
	return v << shift >> shift
}
