package arm64

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/arch/arm64/arm64asm"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The disassembler turns AArch64 machine code into assembly text for a
// debugger an agent reads, as `aarch64-linux-gnu-objdump -d` writes it:
// golang.org/x/arch's arm64asm decodes, and this file rewrites what it
// prints differently (system registers by name, memory operands spaced,
// branch targets absolute) and decodes what a kernel is made of that it
// does not: hvc and smc, the hint-space PAC and BTI instructions, the
// pointer-authenticating branches, LSE atomics and cache maintenance.

// Disassemble decodes up to count instructions of code, which is the
// memory at addr. It stops early at the end of code, never in the middle
// of an instruction.
func (debugger) Disassemble(code []byte, addr uint64, count int, sym arch.Symbolizer) []arch.Instruction {
	var out []arch.Instruction
	for off := 0; off+4 <= len(code) && len(out) < count; off += 4 {
		x := binary.LittleEndian.Uint32(code[off:])
		pc := addr + uint64(off)
		text, t, hasTarget, known := decodeInsn(x, pc)
		in := arch.Instruction{Addr: pc, Encoding: fmt.Sprintf("%08x", x), Text: text, Known: known}
		if hasTarget {
			in.Target = sym.Target(t)
		}
		out = append(out, in)
	}
	return out
}

// MaxInstruction is 4: every A64 instruction is one 32-bit word.
func (debugger) MaxInstruction() int { return 4 }

// MinInstruction is 4 too.
func (debugger) MinInstruction() int { return 4 }

// decodeInsn decodes the instruction word x at pc: its text, a direct
// branch's destination, and whether it is an instruction at all.
func decodeInsn(x uint32, pc uint64) (text string, target uint64, hasTarget, known bool) {
	if s, ok := decodeExtra(x); ok {
		return s, 0, false, true
	}
	in, err := arm64asm.Decode(binary.LittleEndian.AppendUint32(nil, x))
	if err != nil {
		return fmt.Sprintf(".word %#08x", x), 0, false, false
	}
	if in.Op == arm64asm.HINT { // what decodeExtra does not name
		return fmt.Sprintf("hint #%#x", x>>5&0x7f), 0, false, true
	}
	var args []string
	for _, a := range in.Args {
		if a == nil {
			break
		}
		switch a := a.(type) {
		case arm64asm.PCRel:
			t := pc + uint64(a)
			if in.Op == arm64asm.ADRP {
				t = pc&^0xfff + uint64(a)
			}
			switch in.Op {
			case arm64asm.B, arm64asm.BL, arm64asm.CBZ, arm64asm.CBNZ, arm64asm.TBZ, arm64asm.TBNZ:
				target, hasTarget = t, true
			}
			args = append(args, fmt.Sprintf("%#x", t))
		case arm64asm.Systemreg:
			args = append(args, sysRegName(x))
		case arm64asm.MemImmediate, arm64asm.MemExtend:
			args = append(args, spaced(strings.ToLower(a.String())))
		default:
			args = append(args, strings.ToLower(a.String()))
		}
	}
	op := strings.ToLower(in.Op.String())
	switch in.Op {
	case arm64asm.RET:
		if len(args) == 1 && args[0] == "x30" {
			args = nil
		}
	case arm64asm.B:
		if c, ok := in.Args[0].(arm64asm.Cond); ok {
			op, args = "b."+strings.ToLower(c.String()), args[1:]
		}
	case arm64asm.ISB:
		if len(args) == 1 && args[0] == "sy" {
			args = nil
		}
	}
	if len(args) == 0 {
		return op, target, hasTarget, true
	}
	return op + " " + strings.Join(args, ", "), target, hasTarget, true
}

// spaced writes a memory operand with a space after each comma, as GNU
// does ("[sp, #-16]!", "[x0], #8"), where arm64asm writes none.
func spaced(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, ", ", ","), ",", ", ")
}

// sysRegName names the system register of an MRS or MSR, or writes its
// encoding the way GNU does for one it does not name.
func sysRegName(x uint32) string {
	if name, ok := sysRegNames[uint16(x>>5)]; ok {
		return name
	}
	return fmt.Sprintf("s%d_%d_c%d_c%d_%d", 2+x>>19&1, x>>16&7, x>>12&0xf, x>>8&0xf, x>>5&7)
}

// hintNames are the HINT-space instructions GNU names (arm64asm names only
// nop, yield, wfe, wfi, sev and sevl).
var hintNames = map[uint32]string{
	0: "nop", 1: "yield", 2: "wfe", 3: "wfi", 4: "sev", 5: "sevl",
	7: "xpaclri", 8: "pacia1716", 0xa: "pacib1716", 0xc: "autia1716", 0xe: "autib1716",
	0x10: "esb", 0x11: "psb csync", 0x12: "tsb csync", 0x14: "csdb",
	0x18: "paciaz", 0x19: "paciasp", 0x1a: "pacibz", 0x1b: "pacibsp",
	0x1c: "autiaz", 0x1d: "autiasp", 0x1e: "autibz", 0x1f: "autibsp",
	0x20: "bti", 0x22: "bti c", 0x24: "bti j", 0x26: "bti jc",
}

// sysOpNames are the SYS-space cache and address-translation operations
// arm64asm does not name, by op1, CRn, CRm and op2 (bits 18..5); the last
// bit says they take a register.
var sysOpNames = map[uint32]string{
	0x0388: "ic ialluis", 0x03a8: "ic iallu", 0x1ba9: "ic ivau",
	0x03c0: "at s1e1r", 0x03c1: "at s1e1w", 0x03c2: "at s1e0r", 0x03c3: "at s1e0w",
	0x03c8: "at s1e1rp", 0x03c9: "at s1e1wp",
	0x23c0: "at s1e2r", 0x23c1: "at s1e2w", 0x23c4: "at s12e1r", 0x23c5: "at s12e1w",
	0x23c6: "at s12e0r", 0x23c7: "at s12e0w",
}

// pstateNames are the PSTATE fields an MSR (immediate) writes that arm64asm
// does not name, by op1 and op2.
var pstateNames = map[uint32]string{
	0<<3 | 3: "uao", 0<<3 | 4: "pan", 3<<3 | 1: "ssbs", 3<<3 | 2: "dit", 3<<3 | 4: "tco",
}

// decodeExtra decodes the instructions arm64asm does not, or names badly.
func decodeExtra(x uint32) (string, bool) {
	rn, rt := x>>5&0x1f, x&0x1f
	switch {
	case x&0xfffff01f == 0xd503201f: // HINT
		s, ok := hintNames[x>>5&0x7f]
		return s, ok
	case x&0xffe0001f == 0xd4000002:
		return fmt.Sprintf("hvc #%#x", x>>5&0xffff), true
	case x&0xffe0001f == 0xd4000003:
		return fmt.Sprintf("smc #%#x", x>>5&0xffff), true
	case x&0xffff0000 == 0:
		return fmt.Sprintf("udf #%d", x&0xffff), true
	case x == 0xd50330ff:
		return "sb", true
	case x&0xffffffe0 == 0xd5031000:
		return "wfet " + xreg(rt), true
	case x&0xffffffe0 == 0xd5031020:
		return "wfit " + xreg(rt), true
	case x&0xfff8f01f == 0xd500401f && pstateNames[x>>16&7<<3|x>>5&7] != "":
		return fmt.Sprintf("msr %s, #%#x", pstateNames[x>>16&7<<3|x>>5&7], x>>8&0xf), true
	case x&0xfff80000 == 0xd5080000: // SYS
		if s, ok := sysOpNames[x>>5&0x3fff]; ok {
			if s[:2] == "ic" && rt == 31 {
				return s, true
			}
			return s + ", " + xreg(rt), true
		}
		if _, err := arm64asm.Decode(binary.LittleEndian.AppendUint32(nil, x)); err == nil {
			return "", false
		}
		s := fmt.Sprintf("sys #%d, C%d, C%d, #%d", x>>16&7, x>>12&0xf, x>>8&0xf, x>>5&7)
		if rt != 31 {
			s += ", " + xreg(rt)
		}
		return s, true
	case x&0x3ffffc00 == 0x38bfc000:
		w := 4
		if x>>30 == 3 {
			w = 8
		}
		return fmt.Sprintf("ldapr%s %s, [%s]", [4]string{"b", "h", "", ""}[x>>30], wxReg(rt, w), xregSP(rn)), true
	case x&0xff200400 == 0xf8200400: // ldraa, ldrab
		return fmt.Sprintf("ldra%s %s, %s", keyAB(x>>23), xreg(rt), pacMem(x)), true
	case x == 0xd65f0bff:
		return "retaa", true
	case x == 0xd65f0fff:
		return "retab", true
	case x == 0xd69f0bff:
		return "eretaa", true
	case x == 0xd69f0fff:
		return "eretab", true
	case x&0xfffff81f == 0xd61f081f: // braaz, brabz
		return fmt.Sprintf("bra%sz %s", keyAB(x>>10), xreg(rn)), true
	case x&0xfffff81f == 0xd63f081f: // blraaz, blrabz
		return fmt.Sprintf("blra%sz %s", keyAB(x>>10), xreg(rn)), true
	case x&0xfffff800 == 0xd71f0800: // braa, brab
		return fmt.Sprintf("bra%s %s, %s", keyAB(x>>10), xreg(rn), xregSP(rt)), true
	case x&0xfffff800 == 0xd73f0800: // blraa, blrab
		return fmt.Sprintf("blra%s %s, %s", keyAB(x>>10), xreg(rn), xregSP(rt)), true
	}
	if s, ok := atomicText(x); ok {
		return s, true
	}
	return "", false
}

// pacMem writes the memory operand of ldraa and ldrab: a signed 10-bit
// offset in 8-byte units, pre-indexed when W (bit 11) is set.
func pacMem(x uint32) string {
	off := int64(x>>22&1<<9|x>>12&0x1ff) << 54 >> 54 * 8
	s := "[" + xregSP(x>>5&0x1f)
	if off != 0 {
		s += fmt.Sprintf(", #%d", off)
	}
	if x>>11&1 == 1 {
		return s + "]!"
	}
	return s + "]"
}

func keyAB(bit uint32) string {
	if bit&1 == 1 {
		return "b"
	}
	return "a"
}

// xreg names general register n of a 64-bit operand (31: xzr).
func xreg(n uint32) string {
	if n == 31 {
		return "xzr"
	}
	return fmt.Sprintf("x%d", n)
}

// xregSP names general register n where 31 is sp: a base register.
func xregSP(n uint32) string {
	if n == 31 {
		return "sp"
	}
	return fmt.Sprintf("x%d", n)
}

// wxReg names general register n of size bytes (4: w, 8: x; 31: zr).
func wxReg(n uint32, size int) string {
	if size == 8 {
		return xreg(n)
	}
	if n == 31 {
		return "wzr"
	}
	return fmt.Sprintf("w%d", n)
}

// lse is an LSE atomic: a read-modify-write of size bytes at base rn.
type lse struct {
	name       string
	rs, rt, rn uint32
	size       int
	pair       bool // casp: rs and rt are pairs
	store      bool // the st* alias: no register receives the old value
}

// decodeAtomic decodes the LSE atomics (ldadd and its kin, swp, cas,
// casp), which arm64asm does not.
func decodeAtomic(x uint32) (lse, bool) {
	rs, rn, rt := x>>16&0x1f, x>>5&0x1f, x&0x1f
	size := 1 << (x >> 30)
	sizeSuffix := [4]string{"b", "h", "", ""}[x>>30]
	ord := func(acq, rel bool) string {
		switch {
		case acq && rel:
			return "al"
		case acq:
			return "a"
		case rel:
			return "l"
		}
		return ""
	}
	switch {
	case x&0x3f200c00 == 0x38200000: // atomic memory operations
		a, r := x>>23&1 == 1, x>>22&1 == 1
		o3, opc := x>>15&1, x>>12&7
		names := [8]string{"add", "clr", "eor", "set", "smax", "smin", "umax", "umin"}
		switch {
		case o3 == 0:
			if rt == 31 && !a { // the st* alias
				return lse{name: "st" + names[opc] + ord(false, r) + sizeSuffix, rs: rs, rn: rn, size: size, store: true}, true
			}
			return lse{name: "ld" + names[opc] + ord(a, r) + sizeSuffix, rs: rs, rt: rt, rn: rn, size: size}, true
		case opc == 0:
			return lse{name: "swp" + ord(a, r) + sizeSuffix, rs: rs, rt: rt, rn: rn, size: size}, true
		}
	case x&0x3fa07c00 == 0x08a07c00: // cas
		return lse{name: "cas" + ord(x>>22&1 == 1, x>>15&1 == 1) + sizeSuffix, rs: rs, rt: rt, rn: rn, size: size}, true
	case x&0xbfa07c00 == 0x08207c00: // casp
		return lse{name: "casp" + ord(x>>22&1 == 1, x>>15&1 == 1), rs: rs, rt: rt, rn: rn, size: 8 << (x >> 30 & 1), pair: true}, true
	}
	return lse{}, false
}

// atomicText writes an LSE atomic as GNU does.
func atomicText(x uint32) (string, bool) {
	l, ok := decodeAtomic(x)
	if !ok {
		return "", false
	}
	w := min(l.size, 8)
	if l.pair {
		w = l.size / 2
		return fmt.Sprintf("%s %s, %s, %s, %s, [%s]", l.name, wxReg(l.rs, w), wxReg(l.rs+1, w), wxReg(l.rt, w), wxReg(l.rt+1, w), xregSP(l.rn)), true
	}
	if w < 4 {
		w = 4
	}
	if l.store {
		return fmt.Sprintf("%s %s, [%s]", l.name, wxReg(l.rs, w), xregSP(l.rn)), true
	}
	return fmt.Sprintf("%s %s, %s, [%s]", l.name, wxReg(l.rs, w), wxReg(l.rt, w), xregSP(l.rn)), true
}

// Call reports whether code starts with a call, an instruction that links
// the return address in x30: bl, blr and the pointer-authenticating
// blraa, blrab, blraaz and blrabz.
func (debugger) Call(code []byte) (n int, call bool) {
	if len(code) < 4 {
		return 4, false
	}
	return 4, isCall(binary.LittleEndian.Uint32(code))
}

func isCall(x uint32) bool {
	return x&0xfc000000 == 0x94000000 || // bl
		x&0xfffffc1f == 0xd63f0000 || // blr
		x&0xfffff800 == 0xd73f0800 || // blraa, blrab
		x&0xfffff81f == 0xd63f081f // blraaz, blrabz
}

// CallBefore reports whether the instruction before a return address is
// a call.
func (d debugger) CallBefore(before []byte) bool {
	if len(before) != 4 {
		return false
	}
	_, call := d.Call(before)
	return call
}

// Access decodes the load, store or atomic that code starts with, if it
// is one whose address is a base register plus an immediate: a
// register-offset or pc-relative access, a prefetch, or a SIMD structure
// load or store is none. Atomics read and write, and count as stores.
func (debugger) Access(code []byte) (arch.MemAccess, bool) {
	if len(code) < 4 {
		return arch.MemAccess{}, false
	}
	x := binary.LittleEndian.Uint32(code)
	if l, ok := decodeAtomic(x); ok {
		return arch.MemAccess{Len: 4, Size: l.size, Base: xregSP(l.rn), Store: true}, true
	}
	switch {
	case x&0x3ffffc00 == 0x38bfc000: // ldapr
		return arch.MemAccess{Len: 4, Size: 1 << (x >> 30), Base: xregSP(x >> 5 & 0x1f)}, true
	case x&0xff200400 == 0xf8200400: // ldraa, ldrab
		m := arch.MemAccess{Len: 4, Size: 8, Base: xregSP(x >> 5 & 0x1f)}
		m.Offset = int64(x>>22&1<<9|x>>12&0x1ff) << 54 >> 54 * 8
		return m, true
	}
	in, err := arm64asm.Decode(code[:4])
	if err != nil || in.Op == arm64asm.PRFM || in.Op == arm64asm.PRFUM {
		return arch.MemAccess{}, false
	}
	var regs []arm64asm.Reg
	for _, a := range in.Args {
		switch a := a.(type) {
		case arm64asm.Reg:
			regs = append(regs, a)
		case arm64asm.MemImmediate:
			return immAccess(in.Op, regs, a)
		case nil:
			return arch.MemAccess{}, false
		default:
			return arch.MemAccess{}, false // a structure's vector list, a MemExtend
		}
	}
	return arch.MemAccess{}, false
}

// immAccess is the access of op, whose data registers are regs (after an
// exclusive store's status register), at the base and immediate of m.
func immAccess(op arm64asm.Op, regs []arm64asm.Reg, m arm64asm.MemImmediate) (arch.MemAccess, bool) {
	name := op.String()
	store := strings.HasPrefix(name, "ST")
	if store && strings.Contains(name, "X") && len(regs) > 1 { // stxr, stlxr, stxp, stlxp
		regs = regs[1:]
	}
	if len(regs) == 0 || m.Mode == arm64asm.AddrPostReg {
		return arch.MemAccess{}, false
	}
	size := dataRegSize(regs[0])
	switch {
	case strings.HasSuffix(name, "SW"):
		size = 4
	case strings.HasSuffix(name, "B"):
		size = 1
	case strings.HasSuffix(name, "H"):
		size = 2
	}
	if size == 0 {
		return arch.MemAccess{}, false
	}
	a := arch.MemAccess{Len: 4, Size: size * len(regs), Store: store}
	switch base := arm64asm.Reg(m.Base); {
	case base == arm64asm.SP:
		a.Base = "sp"
	case base >= arm64asm.X0 && base <= arm64asm.X30:
		a.Base = fmt.Sprintf("x%d", base-arm64asm.X0)
	default:
		return arch.MemAccess{}, false
	}
	if m.Mode != arm64asm.AddrPostIndex {
		// The offset shows only in the operand's text ("[x0,#-16]!").
		s := m.String()
		if i := strings.IndexByte(s, '#'); i >= 0 {
			j := i + 1
			for j < len(s) && (s[j] == '-' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			off, err := strconv.ParseInt(s[i+1:j], 10, 64)
			if err != nil {
				return arch.MemAccess{}, false
			}
			a.Offset = off
		}
	}
	return a, true
}

// dataRegSize is the size in bytes of a data register, 0 for one that is
// none (a vector with an arrangement).
func dataRegSize(r arm64asm.Reg) int {
	switch {
	case r >= arm64asm.W0 && r <= arm64asm.WZR:
		return 4
	case r >= arm64asm.X0 && r <= arm64asm.XZR:
		return 8
	case r >= arm64asm.B0 && r <= arm64asm.B31:
		return 1
	case r >= arm64asm.H0 && r <= arm64asm.H31:
		return 2
	case r >= arm64asm.S0 && r <= arm64asm.S31:
		return 4
	case r >= arm64asm.D0 && r <= arm64asm.D31:
		return 8
	case r >= arm64asm.Q0 && r <= arm64asm.Q31:
		return 16
	}
	return 0
}
