package x86_64

import (
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// Call reports whether code starts with a call that pushes a return
// address: a direct call (e8 rel32) or a near indirect one (ff /2: call
// *%rax, call *0x10(%rbx), call *0x0(%rip)), with whatever prefixes it
// carries. n is the instruction's length, 0 when code starts with no
// instruction. A far call (ff /3), which pushes cs too, is none.
func (debugger) Call(code []byte) (n int, call bool) {
	inst, err := x86asm.Decode(code, 64)
	if err != nil || inst.Op == 0 {
		return 0, false
	}
	return inst.Len, isCall(inst)
}

func isCall(inst x86asm.Inst) bool {
	// A 16-bit operand size makes a call push two bytes, which a 64-bit
	// kernel never does.
	return inst.Op == x86asm.CALL && inst.DataSize != 16
}

// CallBefore reports whether the bytes before a return address, before
// (the MaxInstruction bytes that precede it, or fewer at the start of
// memory), end with a call: whether a call decodes from some offset in
// before and ends exactly at its end. Instructions cannot be decoded
// backwards, so every offset is tried: a direct call is five bytes, an
// indirect one two (call *%rax) to eight (41 ff 94 24 disp32) or more
// with prefixes. Bytes that end a longer instruction, an immediate whose
// last bytes happen to read as a call (e8 and four bytes, or ff d0), make
// it say true where no call is: the check rules an address out, it does
// not prove one.
func (debugger) CallBefore(before []byte) bool {
	for i := range before {
		inst, err := x86asm.Decode(before[i:], 64)
		if err == nil && inst.Len == len(before)-i && isCall(inst) {
			return true
		}
	}
	return false
}

// Access decodes the memory access code starts with: an instruction with
// one explicit memory operand addressed by a 64-bit base register plus a
// displacement, disp(%base). It is a store when the instruction writes
// the operand: a mov to memory, a read-modify-write (add %eax,(%rdi),
// incl 8(%rbx)), xchg, xadd and cmpxchg (lock or not) and setcc. An
// operand with an index register, RIP-relative or absolute, through the
// fs or gs segment (per-CPU data, whose base the operand does not show),
// or of 32-bit address size is none; nor are lea, nops and prefetches,
// which do not access memory, the string instructions, and the stack
// accesses of push, pop, call and ret, which have no such operand.
func (debugger) Access(code []byte) (arch.MemAccess, bool) {
	inst, err := x86asm.Decode(code, 64)
	if err != nil || noAccess[inst.Op] || isString[inst.Op] || inst.MemBytes == 0 {
		return arch.MemAccess{}, false
	}
	at := -1
	for i, a := range inst.Args {
		if a == nil {
			break
		}
		if _, ok := a.(x86asm.Mem); ok {
			if at >= 0 {
				return arch.MemAccess{}, false
			}
			at = i
		}
	}
	if at < 0 {
		return arch.MemAccess{}, false
	}
	m := inst.Args[at].(x86asm.Mem)
	if m.Index != 0 || m.Base < x86asm.RAX || m.Base > x86asm.R15 || m.Segment == x86asm.FS || m.Segment == x86asm.GS ||
		segmentPrefix(inst, x86asm.PrefixFS) || segmentPrefix(inst, x86asm.PrefixGS) {
		return arch.MemAccess{}, false
	}
	store := writes(inst, at)
	return arch.MemAccess{
		Len:    inst.Len,
		Size:   inst.MemBytes,
		Base:   strings.ToLower(m.Base.String()),
		Offset: int64(int32(m.Disp)),
		Store:  store,
	}, true
}

// writes says whether inst writes its memory operand, Args[at].
func writes(inst x86asm.Inst, at int) bool { return at == 0 && !readsFirst[inst.Op] || rmw[inst.Op] }

// memWrite says whether the instruction code starts with accesses memory
// through an explicit operand of any form (RIP-relative, indexed, per-CPU
// included), and if so whether it writes it: what a page fault's verdict
// needs of the faulting instruction, whose address CR2 already gives.
func memWrite(code []byte) (store, ok bool) {
	inst, err := x86asm.Decode(code, 64)
	if err != nil || noAccess[inst.Op] || isString[inst.Op] || inst.MemBytes == 0 {
		return false, false
	}
	for i, a := range inst.Args {
		if a == nil {
			break
		}
		if _, isMem := a.(x86asm.Mem); isMem {
			return writes(inst, i), true
		}
	}
	return false, false
}

// segmentPrefix says whether inst has the segment prefix p.
func segmentPrefix(inst x86asm.Inst, p x86asm.Prefix) bool {
	for _, q := range inst.Prefix {
		if q == 0 {
			break
		}
		if q&0xff == p {
			return true
		}
	}
	return false
}

// noAccess are instructions with a memory operand that they do not read
// or write.
var noAccess = map[x86asm.Op]bool{
	x86asm.LEA: true, x86asm.NOP: true, x86asm.PREFETCHNTA: true, x86asm.PREFETCHT0: true,
	x86asm.PREFETCHT1: true, x86asm.PREFETCHT2: true, x86asm.PREFETCHW: true, x86asm.INVLPG: true,
	x86asm.CLFLUSH: true,
}

// readsFirst are instructions whose first (Intel-order) operand, memory,
// they only read.
var readsFirst = map[x86asm.Op]bool{
	x86asm.CMP: true, x86asm.TEST: true, x86asm.BT: true, x86asm.PUSH: true,
	x86asm.CALL: true, x86asm.JMP: true, x86asm.LCALL: true, x86asm.LJMP: true,
	x86asm.LGDT: true, x86asm.LIDT: true, x86asm.LLDT: true, x86asm.LTR: true, x86asm.LMSW: true,
	x86asm.VERR: true, x86asm.VERW: true, x86asm.FLD: true, x86asm.FILD: true, x86asm.FLDCW: true,
	x86asm.FLDENV: true, x86asm.FRSTOR: true, x86asm.FXRSTOR: true, x86asm.FXRSTOR64: true,
	x86asm.XRSTOR: true, x86asm.XRSTOR64: true, x86asm.LDMXCSR: true,
	x86asm.FCOM: true, x86asm.FCOMP: true, x86asm.FICOM: true, x86asm.FICOMP: true,
	x86asm.FADD: true, x86asm.FSUB: true, x86asm.FSUBR: true, x86asm.FMUL: true, x86asm.FDIV: true, x86asm.FDIVR: true,
	x86asm.FIADD: true, x86asm.FISUB: true, x86asm.FISUBR: true, x86asm.FIMUL: true, x86asm.FIDIV: true, x86asm.FIDIVR: true,
	x86asm.MUL: true, x86asm.IMUL: true, x86asm.DIV: true, x86asm.IDIV: true,
	x86asm.UCOMISS: true, x86asm.UCOMISD: true, x86asm.COMISS: true, x86asm.COMISD: true, x86asm.PTEST: true,
}

// rmw are instructions that write their memory operand wherever it is.
var rmw = map[x86asm.Op]bool{
	x86asm.XCHG: true, x86asm.XADD: true, x86asm.CMPXCHG: true, x86asm.CMPXCHG8B: true, x86asm.CMPXCHG16B: true,
}
