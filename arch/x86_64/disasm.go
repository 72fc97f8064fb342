package x86_64

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The disassembler turns x86-64 machine code into assembly text for a
// debugger an agent reads, in AT&T syntax as `objdump -d` (binutils 2.40)
// writes it: golang.org/x/arch's x86asm decodes and formats (its
// GNUSyntax follows an older libopcodes), and this file rewrites what
// binutils now writes otherwise: no q suffix on call, ret, push and pop,
// direct branch targets as absolute addresses, RIP-relative operands
// followed by the address they name.

// Disassemble decodes up to count instructions of code, which is the
// memory at addr. It stops early at the end of code, never in the middle
// of an instruction. An instruction's Encoding is its bytes in hex,
// space-separated as objdump shows them ("48 89 e5"); its Text has one
// space after the mnemonic where objdump pads with several. Bytes no
// instruction starts with are one ".byte 0x.." each.
func (debugger) Disassemble(code []byte, addr uint64, count int, sym arch.Symbolizer) []arch.Instruction {
	var out []arch.Instruction
	for off := 0; off < len(code) && len(out) < count; {
		pc := addr + uint64(off)
		if n, text, ok := decodeExtra(code[off:]); ok {
			out = append(out, arch.Instruction{Addr: pc, Encoding: hexBytes(code[off : off+n]), Text: text, Known: true})
			off += n
			continue
		}
		inst, err := x86asm.Decode(code[off:], 64)
		// A prefix that starts no instruction x86asm knows decodes as
		// an instruction of its own (Op 0): it is as unknown.
		if err != nil || inst.Len == 0 || inst.Op == 0 {
			if pastEnd(code[off:]) {
				break // the instruction goes on past the code given
			}
			out = append(out, arch.Instruction{Addr: pc, Encoding: hexBytes(code[off : off+1]), Text: fmt.Sprintf(".byte %#x", code[off])})
			off++
			continue
		}
		text, target, hasTarget := gnuText(inst, code[off:off+inst.Len], pc)
		in := arch.Instruction{Addr: pc, Encoding: hexBytes(code[off : off+inst.Len]), Text: text, Known: true}
		if hasTarget {
			in.Target = sym.Target(target)
		}
		out = append(out, in)
		off += inst.Len
	}
	return out
}

// pastEnd says whether code, which starts no whole instruction, starts
// one that goes on past its end: whether some bytes after it would make
// it one.
func pastEnd(code []byte) bool {
	if len(code) >= maxInstruction {
		return false
	}
	padded := append(append([]byte(nil), code...), make([]byte, maxInstruction)...)
	if n, _, ok := decodeExtra(padded); ok {
		return n > len(code)
	}
	inst, err := x86asm.Decode(padded, 64)
	return err == nil && inst.Op != 0 && inst.Len > len(code)
}

const maxInstruction = 15

// MaxInstruction is 15, the longest an x86 instruction may be.
func (debugger) MaxInstruction() int { return maxInstruction }

// MinInstruction is 1: x86 instructions are any length, at any byte.
func (debugger) MinInstruction() int { return 1 }

// hexBytes writes b as objdump does: two hex digits a byte, spaced.
func hexBytes(b []byte) string {
	var s strings.Builder
	for i, c := range b {
		if i > 0 {
			s.WriteByte(' ')
		}
		fmt.Fprintf(&s, "%02x", c)
	}
	return s.String()
}

// gnuText is inst's text at pc, and a direct branch's destination.
//
// x86asm's GNUSyntax chooses the mnemonic, its suffix and the prefixes
// shown; its operands are rewritten where objdump now writes them
// otherwise: immediates unsigned at the operand's size, displacements
// signed, an index's scale always, no %riz for a SIB byte without an
// index, cs, ds, es and ss overrides (no-ops in 64-bit mode) as prefixes.
func gnuText(inst x86asm.Inst, code []byte, pc uint64) (text string, target uint64, hasTarget bool) {
	end := pc + uint64(inst.Len)
	if r, ok := inst.Args[1].(x86asm.Reg); ok && (inst.Op == x86asm.LSL || inst.Op == x86asm.LAR) &&
		inst.DataSize == 64 && r >= x86asm.EAX && r <= x86asm.R15L {
		inst.Args[1] = r - x86asm.EAX + x86asm.RAX // objdump names the source at the operand's size
	}
	g := x86asm.GNUSyntax(inst, pc, nil)
	head, args := splitHead(g)
	words := strings.Fields(head)
	if len(words) == 0 {
		return g, 0, false
	}
	op := words[len(words)-1]
	prefixes := words[:len(words)-1]
	if inst.Opcode>>24 == 0x90 && inst.Op == x86asm.NOP && inst.DataSize == 16 {
		return "xchg %ax,%ax", 0, false // 66 90, which objdump does not call a nop
	}
	if alt, ok := gnuMnemonics[op]; ok {
		op = alt
	}
	switch inst.Op {
	case x86asm.ANDN, x86asm.BEXTR, x86asm.BLSI, x86asm.BLSMSK, x86asm.BLSR, x86asm.BZHI, x86asm.MULX,
		x86asm.PDEP, x86asm.PEXT, x86asm.RORX, x86asm.SARX, x86asm.SHLX, x86asm.SHRX:
		op = strings.ToLower(inst.Op.String()) // the registers say the size
	case x86asm.SYSRET:
		op = "sysretl"
		if inst.DataSize == 64 {
			op = "sysretq"
		}
	}
	if inst.Op == x86asm.MOV && inst.Opcode>>24&0xf8 == 0xb8 && inst.DataSize == 64 ||
		inst.Op == x86asm.MOV && inst.Opcode>>24&0xfc == 0xa0 {
		op = "movabs" // a 64-bit immediate, or a 64-bit absolute address
	}
	var pre []string
	for _, p := range prefixes {
		switch {
		case p == "data32":
			p = "data16" // in 64-bit mode, a repeated 0x66 is data16
		case p == "rex.W" && (op == "lretq" || op == "sysretq"):
			continue // the REX.W prefix makes it the 64-bit return
		}
		pre = append(pre, p)
	}

	var ripTarget uint64
	hasRIP := false
	if args != "" && !isString[inst.Op] {
		star := strings.HasPrefix(args, "*")
		toks := splitArgs(strings.TrimPrefix(args, "*"))
		vis := visibleArgs(inst)
		if len(toks) == len(vis) {
			for i, a := range vis {
				switch a := a.(type) {
				case x86asm.Mem:
					s, seg := memText(inst, a, dispEncoded(code))
					toks[i] = s
					if seg != "" {
						pre = append(pre, seg)
					}
					if a.Base == x86asm.RIP {
						ripTarget, hasRIP = end+uint64(int64(int32(a.Disp))), true
					}
				case x86asm.Imm:
					toks[i] = immText(inst, a)
				case x86asm.Rel:
					target, hasTarget = end+uint64(int64(a)), true
					toks[i] = strconv.FormatUint(target, 16)
				}
			}
			args = strings.Join(toks, ",")
			if star {
				args = "*" + args
			}
		}
	}
	text = strings.Join(append(pre, op), " ")
	if args != "" {
		text += " " + args
	}
	if hasRIP {
		text += " # " + strconv.FormatUint(ripTarget, 16)
	}
	return text, target, hasTarget
}

// gnuMnemonics are the mnemonics binutils 2.40 writes otherwise than the
// older libopcodes GNUSyntax follows.
var gnuMnemonics = map[string]string{
	"callq": "call", "retq": "ret", "jmpq": "jmp", "pushq": "push", "popq": "pop",
	"pushfq": "pushf", "popfq": "popf", "leaveq": "leave",
	"movsxd": "movslq", "cdqe": "cltq", "cdq": "cltd", "cqo": "cqto", "cwde": "cwtl",
	"cbw": "cbtw", "cwd": "cwtd",
	"ljmpq": "ljmp", "lcallq": "lcall",
	"lgdtl": "lgdt", "lidtl": "lidt", "sgdtl": "sgdt", "sidtl": "sidt",
}

// isString are the string instructions, whose implicit operands GNUSyntax
// writes as objdump does.
var isString = map[x86asm.Op]bool{
	x86asm.MOVSB: true, x86asm.MOVSW: true, x86asm.MOVSD: true, x86asm.MOVSQ: true,
	x86asm.STOSB: true, x86asm.STOSW: true, x86asm.STOSD: true, x86asm.STOSQ: true,
	x86asm.LODSB: true, x86asm.LODSW: true, x86asm.LODSD: true, x86asm.LODSQ: true,
	x86asm.SCASB: true, x86asm.SCASW: true, x86asm.SCASD: true, x86asm.SCASQ: true,
	x86asm.CMPSB: true, x86asm.CMPSW: true, x86asm.CMPSD: true, x86asm.CMPSQ: true,
	x86asm.INSB: true, x86asm.INSW: true, x86asm.INSD: true,
	x86asm.OUTSB: true, x86asm.OUTSW: true, x86asm.OUTSD: true,
}

// splitHead splits GNUSyntax's text into its prefixes and mnemonic, and
// its operands: the first word that starts as no mnemonic does.
func splitHead(g string) (head, args string) {
	for i := 0; i < len(g); {
		j := strings.IndexByte(g[i:], ' ')
		if c := g[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return strings.TrimSpace(g[:i]), g[i:]
		}
		if j < 0 {
			break
		}
		i += j + 1
	}
	return g, ""
}

// splitArgs splits operands at the commas outside parentheses and braces.
func splitArgs(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(', '{':
			depth++
		case ')', '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// visibleArgs are inst's operands GNUSyntax writes, in its order.
func visibleArgs(inst x86asm.Inst) []x86asm.Arg {
	var out []x86asm.Arg
	for _, a := range inst.Args {
		if a == nil {
			break
		}
		if a == x86asm.Imm(1) && (inst.Opcode>>24)&^1 == 0xd0 {
			continue // a shift by one: the count is the opcode's
		}
		out = append(out, a)
	}
	switch inst.Op {
	case x86asm.BOUND, x86asm.LCALL, x86asm.ENTER, x86asm.LJMP:
	default:
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out
}

// memText writes a memory operand as objdump does, and the segment
// override it writes as a prefix.
func memText(inst x86asm.Inst, m x86asm.Mem, hasDisp bool) (text, prefix string) {
	var s strings.Builder
	seg := m.Segment
	for _, p := range inst.Prefix {
		if p == 0 {
			break
		}
		switch p &^ (x86asm.PrefixImplicit | x86asm.PrefixIgnored) {
		case x86asm.PrefixCS:
			seg = x86asm.CS
		case x86asm.PrefixDS:
			seg = x86asm.DS
		case x86asm.PrefixES:
			seg = x86asm.ES
		case x86asm.PrefixSS:
			seg = x86asm.SS
		case x86asm.PrefixFS:
			seg = x86asm.FS
		case x86asm.PrefixGS:
			seg = x86asm.GS
		}
	}
	switch seg {
	case x86asm.FS:
		s.WriteString("%fs:")
	case x86asm.GS:
		s.WriteString("%gs:")
	case x86asm.CS, x86asm.DS, x86asm.ES, x86asm.SS:
		prefix = strings.ToLower(seg.String())
	}
	disp := int64(int32(m.Disp))
	if m.Base == 0 && m.Index == 0 {
		if inst.Op == x86asm.MOV && inst.Opcode>>24&0xfc == 0xa0 {
			disp = m.Disp // moffs: a 64-bit address
		}
		s.WriteString("0x" + strconv.FormatUint(uint64(disp), 16))
		return s.String(), prefix
	}
	// A zero displacement shows when it is encoded.
	if disp != 0 || hasDisp || m.Base == 0 || m.Base == x86asm.RIP {
		s.WriteString(signedHex(disp))
	}
	s.WriteByte('(')
	if m.Base != 0 {
		s.WriteString(regName(m.Base))
	}
	switch {
	case m.Index != 0:
		s.WriteString("," + regName(m.Index) + "," + strconv.Itoa(int(m.Scale)))
	case m.Scale > 1:
		s.WriteString(",%riz," + strconv.Itoa(int(m.Scale)))
	}
	s.WriteByte(')')
	return s.String(), prefix
}

// dispEncoded says whether the ModRM byte of the instruction code is
// encodes a displacement (mod 01 or 10), which objdump shows even when
// zero; x86asm does not say.
func dispEncoded(code []byte) bool {
	i := 0
	for i < len(code) && isPrefix(code[i]) {
		i++
	}
	if i < len(code) && code[i]&0xf0 == 0x40 { // REX
		i++
	}
	if i >= len(code) {
		return false
	}
	switch code[i] {
	case 0xc5: // two-byte VEX, then the opcode
		i += 3
	case 0xc4: // three-byte VEX
		i += 4
	case 0x62: // EVEX
		i += 5
	case 0x0f:
		if i+1 < len(code) && (code[i+1] == 0x38 || code[i+1] == 0x3a) {
			i += 3
		} else {
			i += 2
		}
	default:
		i++
	}
	if i >= len(code) {
		return false
	}
	mod := code[i] >> 6
	return mod == 1 || mod == 2
}

// isPrefix says whether b is a legacy prefix.
func isPrefix(b byte) bool {
	switch b {
	case 0x66, 0x67, 0xf0, 0xf2, 0xf3, 0x2e, 0x3e, 0x26, 0x36, 0x64, 0x65:
		return true
	}
	return false
}

// regName is a base or index register's name.
func regName(r x86asm.Reg) string {
	if r >= x86asm.R8L && r <= x86asm.R15L {
		return fmt.Sprintf("%%r%dd", r-x86asm.R8L+8)
	}
	return "%" + strings.ToLower(r.String())
}

func signedHex(v int64) string {
	if v < 0 {
		return "-0x" + strconv.FormatUint(uint64(-v), 16)
	}
	return "0x" + strconv.FormatUint(uint64(v), 16)
}

// immText writes an immediate as objdump does: unsigned, at the size of
// the operand it goes into.
func immText(inst x86asm.Inst, imm x86asm.Imm) string {
	v := uint64(imm)
	if imm < 0 {
		bits := inst.DataSize
		if inst.Op == x86asm.PUSH {
			bits = 64 // sign-extended to the stack's width
		}
		for _, a := range inst.Args {
			switch a := a.(type) {
			case x86asm.Reg:
				if a >= x86asm.AL && a <= x86asm.R15B {
					bits = 8
				}
			case x86asm.Mem:
				if inst.MemBytes == 1 {
					bits = 8
				}
			}
		}
		if bits < 64 {
			v &= 1<<bits - 1
		}
	}
	return "$0x" + strconv.FormatUint(v, 16)
}

// fixedExtra are instructions x86asm does not decode, or writes otherwise
// than objdump, whose bytes are fixed: system instructions of a kernel.
var fixedExtra = []struct {
	code string
	text string
}{
	{"\xf3\x0f\x1e\xfa", "endbr64"},
	{"\xf3\x0f\x1e\xfb", "endbr32"},
	{"\x0f\x01\xe8", "serialize"},
	{"\x0f\x01\xd8", "vmrun"},
	{"\x0f\x01\xda", "vmload"},
	{"\x0f\x01\xdb", "vmsave"},
	{"\x0f\x01\xdc", "stgi"},
	{"\x0f\x01\xdd", "clgi"},
	{"\x0f\x01\xdf", "invlpga"},
	{"\x0f\x01\xc8", "monitor %rax,%ecx,%edx"},
	{"\x0f\x01\xc9", "mwait %eax,%ecx"},
	{"\x0f\x01\xfa", "monitorx %rax,%ecx,%edx"},
	{"\x0f\x01\xfb", "mwaitx %eax,%ecx,%ebx"},
	{"\xc4\xe2\x78\x49\xc0", "tilerelease"},
}

// decodeExtra decodes the instructions x86asm does not, or writes
// otherwise than objdump: its length and text.
func decodeExtra(code []byte) (int, string, bool) {
	for _, f := range fixedExtra {
		if strings.HasPrefix(string(code), f.code) {
			return len(f.code), f.text, true
		}
	}
	// rdrand and rdseed (0f c7 /6 and /7 of a register), and tpause,
	// umonitor and umwait (66, f3 and f2 0f ae /6 of a register), with
	// an operand-size or REX prefix.
	i, rex, data16 := 0, byte(0), false
	var rep byte
	for ; i < len(code) && i < 4; i++ {
		switch c := code[i]; {
		case c == 0x66:
			data16 = true
			continue
		case c == 0xf2 || c == 0xf3:
			rep = c
			continue
		case c&0xf0 == 0x40:
			rex = c
			i++
		}
		break
	}
	if i+3 > len(code) || code[i] != 0x0f || code[i+2]>>6 != 3 {
		return 0, "", false
	}
	reg := code[i+2] & 7
	if rex&1 != 0 {
		reg += 8
	}
	n := i + 3
	switch op, ext := code[i+1], code[i+2]>>3&7; {
	case op == 0xc7 && (ext == 6 || ext == 7) && rep == 0:
		name := "rdrand"
		if ext == 7 {
			name = "rdseed"
		}
		size := 32
		switch {
		case rex&8 != 0:
			size = 64
		case data16:
			size = 16
		}
		return n, name + " " + gpr(reg, size), true
	case op == 0xae && ext == 6 && rex&8 == 0:
		switch {
		case data16 && rep == 0:
			return n, "tpause " + gpr(reg, 32), true
		case rep == 0xf3 && !data16:
			return n, "umonitor " + gpr(reg, 64), true
		case rep == 0xf2 && !data16:
			return n, "umwait " + gpr(reg, 32), true
		}
	}
	return 0, "", false
}

// gpr names general register n (0-15) of size bits as AT&T does.
func gpr(n byte, size int) string {
	legacy := [8]string{"ax", "cx", "dx", "bx", "sp", "bp", "si", "di"}
	if n >= 8 {
		return fmt.Sprintf("%%r%d", n) + map[int]string{16: "w", 32: "d", 64: ""}[size]
	}
	switch size {
	case 16:
		return "%" + legacy[n]
	case 32:
		return "%e" + legacy[n]
	}
	return "%r" + legacy[n]
}
