package debugger

import (
	"bufio"
	"context"
	"encoding/binary"
	enchex "encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// A fake QEMU for the debugger's choices: a gdbstub serving a stopped
// RISC-V guest of several harts, each with its registers, CSRs and
// privilege mode, over one memory, and a kernel ELF with nothing but
// symbols. Tests build the harts' stacks from function names (see
// fakeHart.stack), as frame-pointer frames of standard prologues.

// fakeCSRs are the CSRs the fake describes, by number (QEMU numbers a CSR
// 65 + its number in the description).
var fakeCSRs = map[string]int{
	"sstatus": 0x100, "sie": 0x104, "stvec": 0x105, "sscratch": 0x140, "sepc": 0x141, "scause": 0x142, "stval": 0x143, "sip": 0x144, "satp": 0x180,
	"mstatus": 0x300, "medeleg": 0x302, "mideleg": 0x303, "mie": 0x304, "mtvec": 0x305, "mepc": 0x341, "mcause": 0x342, "mtval": 0x343, "mip": 0x344,
}

// fakeRegNames are x0..x31 and pc as QEMU names them (x8 is fp).
var fakeRegNames = []string{"zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "fp", "s1",
	"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
	"t3", "t4", "t5", "t6", "pc"}

const fakePrivRegnum = 65 + 0x1000

// fakeHart is one hart: registers by name (x0..x31 by ABI name, fp for
// s0, pc, CSRs, priv) and whether it waits in wfi.
type fakeHart struct {
	regs   map[string]uint64
	halted bool
}

// fakeGuest is the stub's state.
type fakeGuest struct {
	t     *testing.T
	harts []*fakeHart
	// stopped is the hart the stub reports stopped ('?'): the hart of
	// the last stop.
	stopped int
	syms    map[string]uint64 // the kernel's functions, by name
	// running is what QMP would say: the guest runs (the session
	// resumes it when it connects); resumed, if set, is called each
	// time the guest is resumed, with the count so far.
	running bool
	resumed func(n int)
	resumes int
	mu      sync.Mutex
	mem     map[uint64]byte
}

// Function addresses: each fakeFuncSize bytes of code, from fakeText.
const (
	fakeText     = 0x80000000
	fakeFuncSize = 0x100
	fakeRAMEnd   = 0x88000000
)

// newFakeGuest makes a guest of n harts whose kernel has the functions
// funcs (in order from fakeText), every one a standard prologue and
// nops; the harts start in S-mode at the first function.
func newFakeGuest(t *testing.T, n int, funcs ...string) *fakeGuest {
	g := &fakeGuest{t: t, syms: map[string]uint64{}, mem: map[uint64]byte{}}
	for i, f := range funcs {
		a := uint64(fakeText + i*fakeFuncSize)
		g.syms[f] = a
		// addi sp,sp,-16; sd ra,8(sp); sd s0,0(sp); addi s0,sp,16
		code := []byte{0x41, 0x11, 0x06, 0xe4, 0x22, 0xe0, 0x00, 0x08}
		for len(code) < fakeFuncSize {
			code = append(code, 0x01, 0x00) // c.nop
		}
		g.write(a, code)
	}
	for range n {
		g.harts = append(g.harts, &fakeHart{regs: map[string]uint64{"priv": 1, "pc": fakeText}})
	}
	return g
}

func (g *fakeGuest) write(a uint64, b []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, c := range b {
		g.mem[a+uint64(i)] = c
	}
}

func (g *fakeGuest) word(a, v uint64) { g.write(a, binary.LittleEndian.AppendUint64(nil, v)) }

// at is an address inside function fn, past its prologue.
func (g *fakeGuest) at(fn string) uint64 {
	a, ok := g.syms[fn]
	if !ok {
		g.t.Fatalf("fake kernel: no function %s", fn)
	}
	return a + 0x20
}

// stack sets hart h's pc in frames[0] and builds the frame-pointer chain
// through the rest (innermost first), each call from 0x20 into the
// caller; a frame "" is an address outside the kernel (firmware).
func (g *fakeGuest) stack(h int, frames ...string) {
	pcOf := func(fn string) uint64 {
		if fn == "" {
			return 0x80000000 - 0x1000 // below the kernel: no symbol
		}
		return g.at(fn)
	}
	base := uint64(0x80100000 + h*0x10000)
	fp := func(i int) uint64 { return base + uint64(i+1)*0x100 }
	for i := range frames {
		var ra, next uint64
		if i+1 < len(frames) {
			ra, next = pcOf(frames[i+1]), fp(i+1)
		}
		g.word(fp(i)-8, ra)
		g.word(fp(i)-16, next)
	}
	r := g.harts[h].regs
	r["pc"], r["fp"], r["sp"] = pcOf(frames[0]), fp(0), fp(0)-16
	if len(frames) > 1 {
		r["ra"] = pcOf(frames[1])
	}
}

func (g *fakeGuest) read(a uint64, n int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []byte
	for i := range uint64(n) {
		b, ok := g.mem[a+i]
		if !ok && (a+i < fakeText || a+i >= fakeRAMEnd) {
			break // nothing there
		}
		out = append(out, b)
	}
	return out
}

// targetXML describes x0..x31, pc, the CSRs and priv as QEMU does.
func targetXML() string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0"?><target><architecture>riscv:rv64</architecture><feature name="org.gnu.gdb.riscv.cpu">`)
	for i, n := range fakeRegNames {
		typ := "int"
		if n == "pc" {
			typ = "code_ptr"
		}
		fmt.Fprintf(&b, `<reg name="%s" bitsize="64" type="%s" regnum="%d"/>`, n, typ, i)
	}
	b.WriteString(`</feature><feature name="org.gnu.gdb.riscv.csr">`)
	names := make([]string, 0, len(fakeCSRs))
	for n := range fakeCSRs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return fakeCSRs[names[i]] < fakeCSRs[names[j]] })
	for _, n := range names {
		fmt.Fprintf(&b, `<reg name="%s" bitsize="64" regnum="%d" group="csr"/>`, n, 65+fakeCSRs[n])
	}
	fmt.Fprintf(&b, `</feature><feature name="org.gnu.gdb.riscv.virtual"><reg name="priv" bitsize="64" regnum="%d"/></feature></target>`, fakePrivRegnum)
	return b.String()
}

func regName(n int) (string, bool) {
	if n < len(fakeRegNames) {
		return fakeRegNames[n], true
	}
	if n == fakePrivRegnum {
		return "priv", true
	}
	for name, c := range fakeCSRs {
		if 65+c == n {
			return name, true
		}
	}
	return "", false
}

func le64(v uint64) string { return enchex.EncodeToString(binary.LittleEndian.AppendUint64(nil, v)) }

// serve answers one debugger on conn until it leaves.
func (g *fakeGuest) serve(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	ack := true
	sel := 0
	send := func(p string) {
		var sum byte
		for i := range len(p) {
			sum += p[i]
		}
		fmt.Fprintf(conn, "$%s#%02x", p, sum)
	}
	thread := func(h int) string { return fmt.Sprintf("%02x", h+1) }
	hartOf := func(s string) (int, bool) {
		n, err := strconv.ParseInt(s, 16, 32)
		if err != nil || n < 1 || int(n) > len(g.harts) {
			return 0, false
		}
		return int(n) - 1, true
	}
	for {
		c, err := r.ReadByte()
		if err != nil {
			return
		}
		switch c {
		case '$':
		case 0x03:
			send("T02thread:" + thread(g.stopped) + ";")
			continue
		default:
			continue // acks
		}
		raw, err := r.ReadString('#')
		if err != nil {
			return
		}
		if _, err := io.ReadFull(r, make([]byte, 2)); err != nil {
			return
		}
		if ack {
			conn.Write([]byte("+"))
		}
		cmd := raw[:len(raw)-1]
		h := g.harts[sel]
		switch {
		case strings.HasPrefix(cmd, "qSupported"):
			send("PacketSize=4000;qXfer:features:read+;QStartNoAckMode+;vContSupported+")
		case cmd == "QStartNoAckMode":
			send("OK")
			ack = false
		case strings.HasPrefix(cmd, "qXfer:features:read:target.xml:"):
			span := strings.TrimPrefix(cmd, "qXfer:features:read:target.xml:")
			o, l, _ := strings.Cut(span, ",")
			off, _ := strconv.ParseUint(o, 16, 64)
			n, _ := strconv.ParseUint(l, 16, 64)
			doc := targetXML()
			if off+n >= uint64(len(doc)) {
				send("l" + doc[min(off, uint64(len(doc))):])
			} else {
				send("m" + doc[off:off+n])
			}
		case cmd == "vCont?":
			send("vCont;c;C;s;S")
		case cmd == "qC":
			send("QC" + thread(g.stopped))
		case cmd == "?":
			sel = g.stopped
			send("T05thread:" + thread(g.stopped) + ";")
		case cmd == "qfThreadInfo":
			var ts []string
			for i := range g.harts {
				ts = append(ts, thread(i))
			}
			send("m" + strings.Join(ts, ","))
		case cmd == "qsThreadInfo":
			send("l")
		case strings.HasPrefix(cmd, "qThreadExtraInfo,"):
			n, ok := hartOf(strings.TrimPrefix(cmd, "qThreadExtraInfo,"))
			if !ok {
				send("E22")
				continue
			}
			state := "[running]"
			if g.harts[n].halted {
				state = "[halted ]"
			}
			send(enchex.EncodeToString([]byte(fmt.Sprintf("CPU#%d %s", n, state))))
		case strings.HasPrefix(cmd, "Hg"), strings.HasPrefix(cmd, "Hc"):
			n, ok := hartOf(cmd[2:])
			if !ok {
				send("E22")
				continue
			}
			if cmd[1] == 'g' {
				sel = n
			}
			send("OK")
		case cmd == "g":
			var b strings.Builder
			for _, n := range fakeRegNames {
				b.WriteString(le64(h.regs[n]))
			}
			send(b.String())
		case strings.HasPrefix(cmd, "p"):
			n, _ := strconv.ParseUint(cmd[1:], 16, 32)
			if name, ok := regName(int(n)); ok {
				send(le64(h.regs[name]))
			} else {
				send("E14")
			}
		case strings.HasPrefix(cmd, "m"):
			a, l, _ := strings.Cut(cmd[1:], ",")
			addr, _ := strconv.ParseUint(a, 16, 64)
			n, _ := strconv.ParseUint(l, 16, 64)
			if b := g.read(addr, int(n)); len(b) > 0 {
				send(enchex.EncodeToString(b))
			} else {
				send("E14")
			}
		case cmd == "c" || strings.HasPrefix(cmd, "vCont;c"):
			g.mu.Lock()
			g.resumes++
			n := g.resumes
			g.mu.Unlock()
			if g.resumed != nil {
				g.resumed(n)
			}
			// Running: no reply until the interrupt (0x03).
		case strings.HasPrefix(cmd, "Qqemu.PhyMemMode:"), cmd == "D", strings.HasPrefix(cmd, "Z"), strings.HasPrefix(cmd, "z"):
			send("OK") // memory is the same either way here
		default:
			send("")
		}
	}
}

// session serves the guest and returns a debugger session on it, with
// the kernel's symbols.
func (g *fakeGuest) session() *Session {
	t := g.t
	dir, err := os.MkdirTemp("", "dbgf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gdb.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go g.serve(conn)
		}
	}()
	elfPath := filepath.Join(dir, "kernel.elf")
	if err := os.WriteFile(elfPath, symbolELF(g.syms), 0o600); err != nil {
		t.Fatal(err)
	}
	syms, err := debuginfo.Open(elfPath)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{
		Dial:    func(ctx context.Context) (*gdb.Client, error) { return gdb.Dial(ctx, "unix", sock) },
		Running: func(context.Context) (bool, error) { return g.running, nil },
		Symbols: syms,
		Logger:  slog.New(slog.DiscardHandler),
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// symbolELF is a RISC-V ELF whose .text holds the functions of syms,
// each fakeFuncSize bytes, and nothing else of use: no code, no DWARF.
func symbolELF(syms map[string]uint64) []byte {
	names := make([]string, 0, len(syms))
	for n := range syms {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return syms[names[i]] < syms[names[j]] })
	var textSize uint64
	for _, a := range syms {
		textSize = max(textSize, a+fakeFuncSize-fakeText)
	}
	le := binary.LittleEndian
	strtab := []byte{0}
	symtab := make([]byte, 24) // the null symbol
	for _, n := range names {
		sym := make([]byte, 24)
		le.PutUint32(sym[0:], uint32(len(strtab)))
		sym[4] = byte(1<<4 | 2)  // STB_GLOBAL, STT_FUNC
		le.PutUint16(sym[6:], 1) // .text
		le.PutUint64(sym[8:], syms[n])
		le.PutUint64(sym[16:], fakeFuncSize)
		symtab = append(symtab, sym...)
		strtab = append(append(strtab, n...), 0)
	}
	shstrtab := []byte("\x00.text\x00.symtab\x00.strtab\x00.shstrtab\x00")
	const ehSize, phSize, shSize = 64, 56, 64
	text := make([]byte, textSize)
	off := uint64(ehSize + phSize)
	textOff := off
	off += textSize
	symOff := off
	off += uint64(len(symtab))
	strOff := off
	off += uint64(len(strtab))
	shstrOff := off
	off += uint64(len(shstrtab))
	shOff := (off + 7) &^ 7

	out := make([]byte, shOff+5*shSize)
	copy(out, "\x7fELF")
	out[4], out[5], out[6] = 2, 1, 1 // 64-bit, little-endian, version 1
	le.PutUint16(out[16:], 2)        // ET_EXEC
	le.PutUint16(out[18:], 243)      // EM_RISCV
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[24:], fakeText)
	le.PutUint64(out[32:], ehSize)
	le.PutUint64(out[40:], shOff)
	le.PutUint16(out[52:], ehSize)
	le.PutUint16(out[54:], phSize)
	le.PutUint16(out[56:], 1)
	le.PutUint16(out[58:], shSize)
	le.PutUint16(out[60:], 5)
	le.PutUint16(out[62:], 4) // .shstrtab
	ph := out[ehSize:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // R X
	le.PutUint64(ph[8:], textOff)
	le.PutUint64(ph[16:], fakeText)
	le.PutUint64(ph[24:], fakeText)
	le.PutUint64(ph[32:], textSize)
	le.PutUint64(ph[40:], textSize)
	le.PutUint64(ph[48:], 0x1000)
	copy(out[textOff:], text)
	copy(out[symOff:], symtab)
	copy(out[strOff:], strtab)
	copy(out[shstrOff:], shstrtab)
	sh := func(i int, name, typ uint32, flags, addr, off, size uint64, link, info uint32, align, entsize uint64) {
		b := out[shOff+uint64(i)*shSize:]
		le.PutUint32(b[0:], name)
		le.PutUint32(b[4:], typ)
		le.PutUint64(b[8:], flags)
		le.PutUint64(b[16:], addr)
		le.PutUint64(b[24:], off)
		le.PutUint64(b[32:], size)
		le.PutUint32(b[40:], link)
		le.PutUint32(b[44:], info)
		le.PutUint64(b[48:], align)
		le.PutUint64(b[56:], entsize)
	}
	sh(1, 1, 1, 2|4, fakeText, textOff, textSize, 0, 0, 4, 0) // .text: PROGBITS, ALLOC|EXECINSTR
	sh(2, 7, 2, 0, 0, symOff, uint64(len(symtab)), 3, 1, 8, 24)
	sh(3, 15, 3, 0, 0, strOff, uint64(len(strtab)), 0, 0, 1, 0)
	sh(4, 23, 3, 0, 0, shstrOff, uint64(len(shstrtab)), 0, 0, 1, 0)
	return out
}
