// Package disasm turns RISC-V machine code into assembly text for a
// debugger an agent reads: RV64GC through golang.org/x/arch's riscv64asm,
// plus the privileged instructions it does not decode (mret, sret, wfi,
// sfence.vma and their kin), which a kernel is made of. Branch and jump
// targets are named with a caller's symbolizer.
package disasm

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/arch/riscv64/riscv64asm"
)

// Inst is one decoded instruction.
type Inst struct {
	Addr uint64 `json:"addr"`
	// Encoding is the instruction word in hex, as objdump shows it:
	// 8 digits, or 4 for a compressed instruction.
	Encoding string `json:"encoding"`
	Text     string `json:"text"` // GNU syntax, e.g. "addi sp,sp,-16"
	// Target is the symbolized destination of a direct branch or jump.
	Target string `json:"target,omitempty"`
	// Known is false for bytes no decoder knows (shown as .word/.half).
	Known bool `json:"known"`
}

// Symbolizer names an address: a symbol and the offset into it; ok false
// when no symbol covers it.
type Symbolizer func(addr uint64) (name string, off uint64, ok bool)

// Decode decodes up to count instructions of code, which is the memory at
// addr. It stops early at the end of code, never in the middle of an
// instruction.
func Decode(code []byte, addr uint64, count int, sym Symbolizer) []Inst {
	var out []Inst
	for off := 0; off < len(code) && len(out) < count; {
		in, n := decodeOne(code[off:], addr+uint64(off))
		if n == 0 {
			break // a 4-byte instruction cut at the end of code
		}
		in.Encoding = encoding(code[off : off+n])
		if t, ok := target(code[off:off+n], in.Addr); ok && in.Known {
			in.Text = absolute(in.Text, t)
			if sym != nil {
				if name, o, ok := sym(t); ok {
					in.Target = name
					if o != 0 {
						in.Target = fmt.Sprintf("%s+%#x", name, o)
					}
				}
			}
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

// abiNames writes registers by their ABI names (sp, a0, ft0), as kernel
// sources and objdump do.
func abiNames(text string) string {
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
func decodeOne(b []byte, addr uint64) (Inst, int) {
	if len(b) < 2 {
		return Inst{}, 0
	}
	if b[0]&3 == 3 {
		if len(b) < 4 {
			return Inst{}, 0
		}
		x := binary.LittleEndian.Uint32(b)
		if text, ok := privileged(x); ok {
			return Inst{Addr: addr, Text: text, Known: true}, 4
		}
	}
	in, err := riscv64asm.Decode(b)
	if err != nil || in.Len == 0 {
		if b[0]&3 == 3 {
			return Inst{Addr: addr, Text: fmt.Sprintf(".word %#08x", binary.LittleEndian.Uint32(b))}, 4
		}
		return Inst{Addr: addr, Text: fmt.Sprintf(".half %#04x", binary.LittleEndian.Uint16(b))}, 2
	}
	return Inst{Addr: addr, Text: abiNames(riscv64asm.GNUSyntax(in)), Known: true}, in.Len
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
			imm := signExtend(((x>>31)&1)<<20|((x>>12)&0xff)<<12|((x>>20)&1)<<11|((x>>21)&0x3ff)<<1, 21)
			return pc + uint64(imm), true
		case 0x63: // branches
			imm := signExtend(((x>>31)&1)<<12|((x>>7)&1)<<11|((x>>25)&0x3f)<<5|((x>>8)&0xf)<<1, 13)
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
		return pc + uint64(signExtend(imm, 12)), true
	case 6, 7: // c.beqz, c.bnez
		imm := ((x>>12)&1)<<8 | ((x>>10)&3)<<3 | ((x>>5)&3)<<6 | ((x>>3)&3)<<1 | ((x>>2)&1)<<5
		return pc + uint64(signExtend(imm, 9)), true
	}
	return 0, false
}

func signExtend(v uint32, bits uint) int64 {
	shift := 64 - bits
	return int64(uint64(v)<<shift) >> shift
}
