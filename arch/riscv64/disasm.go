package riscv64

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/arch/riscv64/riscv64asm"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The disassembler turns RISC-V machine code into assembly text for a
// debugger an agent reads: RV64GC through golang.org/x/arch's riscv64asm,
// plus the privileged instructions it does not decode (mret, sret, wfi,
// sfence.vma and their kin), which a kernel is made of. Branch and jump
// targets are named with a caller's symbolizer.

// Disassemble decodes up to count instructions of code, which is the
// memory at addr. It stops early at the end of code, never in the middle
// of an instruction.
func (debugger) Disassemble(code []byte, addr uint64, count int, sym arch.Symbolizer) []arch.Instruction {
	var out []arch.Instruction
	for off := 0; off < len(code) && len(out) < count; {
		in, n := decodeOne(code[off:], addr+uint64(off))
		if n == 0 {
			break // a 4-byte instruction cut at the end of code
		}
		in.Encoding = encoding(code[off : off+n])
		if t, ok := target(code[off:off+n], in.Addr); ok && in.Known {
			in.Text = absolute(in.Text, t)
			in.Target = sym.Target(t)
		}
		out = append(out, in)
		off += n
	}
	return out
}

func encoding(b []byte) string {
	if len(b) == 4 {
		return fmt.Sprintf("%08x", binary.LittleEndian.Uint32(b))
	}
	return fmt.Sprintf("%04x", binary.LittleEndian.Uint16(b))
}

// absolute replaces a branch's relative offset, the last operand, with
// the address it goes to, as objdump shows it.
func absolute(text string, t uint64) string {
	i := strings.LastIndexAny(text, ", ")
	if i < 0 {
		return text
	}
	return text[:i+1] + fmt.Sprintf("%#x", t)
}

// Compiled on first use, off the server's start-up.
var (
	xreg = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\bx([0-9]|[12][0-9]|3[01])\b`) })
	freg = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\bf([0-9]|[12][0-9]|3[01])\b`) })
)

var fabi = strings.Fields("ft0 ft1 ft2 ft3 ft4 ft5 ft6 ft7 fs0 fs1 fa0 fa1 fa2 fa3 fa4 fa5 fa6 fa7 fs2 fs3 fs4 fs5 fs6 fs7 fs8 fs9 fs10 fs11 ft8 ft9 ft10 ft11")

// withABINames writes registers by their ABI names (sp, a0, ft0), as kernel
// sources and objdump do.
func withABINames(text string) string {
	text = xreg().ReplaceAllStringFunc(text, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return abi[n]
	})
	return freg().ReplaceAllStringFunc(text, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return fabi[n]
	})
}

// decodeOne decodes the instruction at the start of b; n is its length, or
// 0 when b is too short for it.
func decodeOne(b []byte, addr uint64) (arch.Instruction, int) {
	if len(b) < 2 {
		return arch.Instruction{}, 0
	}
	if b[0]&3 == 3 {
		if len(b) < 4 {
			return arch.Instruction{}, 0
		}
		x := binary.LittleEndian.Uint32(b)
		if text, ok := privileged(x); ok {
			return arch.Instruction{Addr: addr, Text: text, Known: true}, 4
		}
	}
	in, err := riscv64asm.Decode(b)
	if err != nil || in.Len == 0 {
		if b[0]&3 == 3 {
			return arch.Instruction{Addr: addr, Text: fmt.Sprintf(".word %#08x", binary.LittleEndian.Uint32(b))}, 4
		}
		return arch.Instruction{Addr: addr, Text: fmt.Sprintf(".half %#04x", binary.LittleEndian.Uint16(b))}, 2
	}
	return arch.Instruction{Addr: addr, Text: withABINames(riscv64asm.GNUSyntax(in)), Known: true}, in.Len
}

// privileged decodes the SYSTEM-opcode instructions of the privileged
// architecture that riscv64asm leaves out.
func privileged(x uint32) (string, bool) {
	switch x {
	case 0x30200073:
		return "mret", true
	case 0x10200073:
		return "sret", true
	case 0x00200073:
		return "uret", true
	case 0x7b200073:
		return "dret", true
	case 0x10500073:
		return "wfi", true
	}
	if x&0x7f != 0x73 || (x>>12)&7 != 0 || (x>>7)&0x1f != 0 {
		return "", false
	}
	rs1, rs2 := (x>>15)&0x1f, (x>>20)&0x1f
	args := func() string {
		switch {
		case rs1 == 0 && rs2 == 0:
			return ""
		case rs2 == 0:
			return " " + reg(rs1)
		default:
			return " " + reg(rs1) + "," + reg(rs2)
		}
	}
	switch x >> 25 {
	case 0x09:
		return "sfence.vma" + args(), true
	case 0x11:
		return "hfence.vvma" + args(), true
	case 0x31:
		return "hfence.gvma" + args(), true
	case 0x0b:
		return "sinval.vma" + args(), true
	}
	return "", false
}

var abi = strings.Fields("zero ra sp gp tp t0 t1 t2 s0 s1 a0 a1 a2 a3 a4 a5 a6 a7 s2 s3 s4 s5 s6 s7 s8 s9 s10 s11 t3 t4 t5 t6")

func reg(n uint32) string { return abi[n] }

// target computes the destination of a direct branch or jump: jal, the
// conditional branches, and their compressed forms.
func target(b []byte, pc uint64) (uint64, bool) {
	if len(b) == 4 {
		x := binary.LittleEndian.Uint32(b)
		switch x & 0x7f {
		case 0x6f: // jal
			imm := signExtend32(((x>>31)&1)<<20|((x>>12)&0xff)<<12|((x>>20)&1)<<11|((x>>21)&0x3ff)<<1, 21)
			return pc + uint64(imm), true
		case 0x63: // branches
			imm := signExtend32(((x>>31)&1)<<12|((x>>7)&1)<<11|((x>>25)&0x3f)<<5|((x>>8)&0xf)<<1, 13)
			return pc + uint64(imm), true
		}
		return 0, false
	}
	x := uint32(binary.LittleEndian.Uint16(b))
	op, f3 := x&3, (x>>13)&7
	if op != 1 {
		return 0, false
	}
	switch f3 {
	case 5: // c.j
		imm := ((x>>12)&1)<<11 | ((x>>11)&1)<<4 | ((x>>9)&3)<<8 | ((x>>8)&1)<<10 |
			((x>>7)&1)<<6 | ((x>>6)&1)<<7 | ((x>>3)&7)<<1 | ((x>>2)&1)<<5
		return pc + uint64(signExtend32(imm, 12)), true
	case 6, 7: // c.beqz, c.bnez
		imm := ((x>>12)&1)<<8 | ((x>>10)&3)<<3 | ((x>>5)&3)<<6 | ((x>>3)&3)<<1 | ((x>>2)&1)<<5
		return pc + uint64(signExtend32(imm, 9)), true
	}
	return 0, false
}

func signExtend32(v uint32, bits uint) int64 {
	shift := 64 - bits
	return int64(uint64(v)<<shift) >> shift
}

// MaxInstruction is 4: RV64GC has 4- and 2-byte instructions.
func (debugger) MaxInstruction() int { return 4 }

// MinInstruction is 2: the compressed instructions.
func (debugger) MinInstruction() int { return 2 }

// Call reports whether code starts with a call: jal/jalr linking ra, or
// c.jalr; n is the instruction's length.
func (debugger) Call(code []byte) (n int, call bool) {
	if code[0]&3 != 3 {
		x := uint16(code[0]) | uint16(code[1])<<8
		// c.jalr rs1: funct4 1001, rs1 != 0, rs2 == 0.
		return 2, x&0xf07f == 0x9002 && (x>>7)&0x1f != 0
	}
	if len(code) < 4 {
		return 4, false
	}
	x := uint32(code[0]) | uint32(code[1])<<8 | uint32(code[2])<<16 | uint32(code[3])<<24
	rd := (x >> 7) & 0x1f
	switch x & 0x7f {
	case 0x6f, 0x67: // jal, jalr
		return 4, rd == 1
	}
	return 4, false
}

// CallBefore reports whether the 4 bytes before a return address end in a
// call: a 4-byte one, or a compressed one in the last 2.
func (d debugger) CallBefore(before []byte) bool {
	if len(before) != 4 {
		return false
	}
	if n, call := d.Call(before); call && n == 4 {
		return true
	}
	n, call := d.Call(before[2:])
	return call && n == 2
}

// Access decodes the load, store or AMO that code starts with, if it is
// one.
func (debugger) Access(code []byte) (arch.MemAccess, bool) {
	m, ok := memAccess(code)
	if !ok || m.base <= 0 || m.base > len(general) {
		// x0 as a base: its value is 0, as a missing register's.
		return arch.MemAccess{Len: m.n, Size: m.size, Offset: m.imm, Store: m.store}, ok
	}
	return arch.MemAccess{Len: m.n, Size: m.size, Base: general[m.base-1], Offset: m.imm, Store: m.store}, ok
}

// mem is a load, store or AMO: its length, base register, offset and
// access size.
type mem struct {
	n, base, size int
	imm           int64
	store         bool
}

// memAccess decodes the memory access that code starts with, if it is one.
func memAccess(code []byte) (mem, bool) {
	if len(code) < 2 {
		return mem{}, false
	}
	x := uint32(binary.LittleEndian.Uint16(code))
	if x&3 != 3 { // compressed
		f3 := x >> 13
		r := func(lo uint) int { return 8 + int(x>>lo&7) }
		switch x & 3 {
		case 0: // c.lw c.ld c.sw c.sd c.fld c.fsd, base rs1'
			w := int64(x>>10&7)<<3 | int64(x>>6&1)<<2 | int64(x>>5&1)<<6 // lw/sw
			d := int64(x>>10&7)<<3 | int64(x>>5&3)<<6                    // ld/sd/fld/fsd
			switch f3 {
			case 2:
				return mem{n: 2, base: r(7), size: 4, imm: w}, true
			case 6:
				return mem{n: 2, base: r(7), size: 4, imm: w, store: true}, true
			case 1, 3:
				return mem{n: 2, base: r(7), size: 8, imm: d}, true
			case 5, 7:
				return mem{n: 2, base: r(7), size: 8, imm: d, store: true}, true
			}
		case 2: // c.lwsp c.ldsp c.fldsp c.swsp c.sdsp c.fsdsp, base sp
			switch f3 {
			case 2:
				return mem{n: 2, base: 2, size: 4, imm: int64(x>>12&1)<<5 | int64(x>>4&7)<<2 | int64(x>>2&3)<<6}, x>>7&0x1f != 0
			case 1, 3:
				return mem{n: 2, base: 2, size: 8, imm: int64(x>>12&1)<<5 | int64(x>>5&3)<<3 | int64(x>>2&7)<<6}, f3 == 1 || x>>7&0x1f != 0
			case 6:
				return mem{n: 2, base: 2, size: 4, imm: int64(x>>9&0xf)<<2 | int64(x>>7&3)<<6, store: true}, true
			case 5, 7:
				return mem{n: 2, base: 2, size: 8, imm: int64(x>>10&7)<<3 | int64(x>>7&7)<<6, store: true}, true
			}
		}
		return mem{}, false
	}
	if len(code) < 4 {
		return mem{}, false
	}
	x = binary.LittleEndian.Uint32(code)
	rs1, f3 := int(x>>15&0x1f), x>>12&7
	switch x & 0x7f {
	case 0x03, 0x07: // loads, FP loads
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), imm: signExtend(int64(x>>20), 12)}, true
	case 0x23, 0x27: // stores, FP stores
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), imm: signExtend(int64(x>>25)<<5|int64(x>>7&0x1f), 12), store: true}, true
	case 0x2f: // AMOs, LR/SC
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), store: x>>27 != 2}, true
	}
	return mem{}, false
}
