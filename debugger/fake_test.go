package debugger

import (
	"bufio"
	"context"
	"debug/elf"
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

	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
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
	// hitFirst, if set, is the stop the next interrupt reports instead
	// of a pause: the guest stopped on its own just before (a breakpoint
	// hit racing the interrupt).
	hitFirst string
	mu       sync.Mutex
	mem      map[uint64]byte
	// data are the kernel's variables, by name (see variable).
	data map[string]fakeDatum
	// bps are the breakpoints and watchpoints the stub holds, conns its
	// connections.
	bps   map[fakeBP]bool
	conns map[net.Conn]bool
	// rep is the recording the guest replays, if it does (see replay).
	rep *fakeReplay
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
	g := &fakeGuest{t: t, syms: map[string]uint64{}, mem: map[uint64]byte{}, data: map[string]fakeDatum{},
		bps: map[fakeBP]bool{}, conns: map[net.Conn]bool{}}
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

// fakeConn is one debugger's connection to the stub.
type fakeConn struct {
	g    *fakeGuest
	conn net.Conn
	// wmu orders what is sent: replies, and stop replies from a replay
	// that runs meanwhile.
	wmu sync.Mutex
	ack bool
	sel int // the hart register commands act on
}

// fakeBP is a breakpoint or watchpoint the stub holds: Z's type, address
// and length.
type fakeBP struct {
	kind       int
	addr, size uint64
}

// serve answers one debugger on conn until it leaves, when the stub
// forgets its breakpoints, as QEMU's does.
func (g *fakeGuest) serve(conn net.Conn) {
	fc := &fakeConn{g: g, conn: conn, ack: true}
	g.mu.Lock()
	g.conns[conn] = true
	g.mu.Unlock()
	defer func() {
		conn.Close()
		g.mu.Lock()
		delete(g.conns, conn)
		clear(g.bps)
		g.mu.Unlock()
	}()
	r := bufio.NewReader(conn)
	for {
		cmd, intr, err := fc.next(r)
		if err != nil {
			return
		}
		if intr {
			fc.interrupt()
			continue
		}
		if !fc.query(cmd) && !fc.registers(cmd) && !fc.control(cmd) {
			fc.send("")
		}
	}
}

// next reads the next packet (acking it) or interrupt, skipping acks.
func (fc *fakeConn) next(r *bufio.Reader) (cmd string, interrupt bool, err error) {
	for {
		c, err := r.ReadByte()
		if err != nil {
			return "", false, err
		}
		switch c {
		case '$':
		case 0x03:
			return "", true, nil
		default:
			continue // acks
		}
		raw, err := r.ReadString('#')
		if err != nil {
			return "", false, err
		}
		if _, err := io.ReadFull(r, make([]byte, 2)); err != nil {
			return "", false, err
		}
		if fc.ack {
			fc.wmu.Lock()
			fc.conn.Write([]byte("+"))
			fc.wmu.Unlock()
		}
		return raw[:len(raw)-1], false, nil
	}
}

func (fc *fakeConn) send(p string) {
	var sum byte
	for i := range len(p) {
		sum += p[i]
	}
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fmt.Fprintf(fc.conn, "$%s#%02x", p, sum)
}

func thread(h int) string { return fmt.Sprintf("%02x", h+1) }

func (fc *fakeConn) hartOf(s string) (int, bool) {
	n, err := strconv.ParseInt(s, 16, 32)
	if err != nil || n < 1 || int(n) > len(fc.g.harts) {
		return 0, false
	}
	return int(n) - 1, true
}

// interrupt stops a replay that runs; a guest that is not replaying, or
// that is stopped, reports a pause at once.
func (fc *fakeConn) interrupt() {
	if r := fc.g.rep; r != nil {
		r.interrupt()
		return
	}
	fc.g.mu.Lock()
	hit := fc.g.hitFirst
	fc.g.hitFirst = ""
	fc.g.mu.Unlock()
	if hit != "" {
		fc.send(hit)
		return
	}
	fc.send("T02thread:" + thread(fc.g.stoppedHart()) + ";")
}

// query answers the handshake's and the threads' packets.
func (fc *fakeConn) query(cmd string) bool {
	g := fc.g
	switch {
	case strings.HasPrefix(cmd, "qSupported"):
		fc.send("PacketSize=4000;qXfer:features:read+;QStartNoAckMode+;vContSupported+")
	case cmd == "QStartNoAckMode":
		fc.send("OK")
		fc.ack = false
	case strings.HasPrefix(cmd, "qXfer:features:read:target.xml:"):
		span := strings.TrimPrefix(cmd, "qXfer:features:read:target.xml:")
		o, l, _ := strings.Cut(span, ",")
		off, _ := strconv.ParseUint(o, 16, 64)
		n, _ := strconv.ParseUint(l, 16, 64)
		doc := targetXML()
		if off+n >= uint64(len(doc)) {
			fc.send("l" + doc[min(off, uint64(len(doc))):])
		} else {
			fc.send("m" + doc[off:off+n])
		}
	case cmd == "vCont?":
		fc.send("vCont;c;C;s;S")
	case cmd == "qC":
		fc.send("QC" + thread(g.stoppedHart()))
	case cmd == "?":
		fc.sel = g.stoppedHart()
		fc.send("T05thread:" + thread(fc.sel) + ";")
	case cmd == "qfThreadInfo":
		var ts []string
		for i := range g.harts {
			ts = append(ts, thread(i))
		}
		fc.send("m" + strings.Join(ts, ","))
	case cmd == "qsThreadInfo":
		fc.send("l")
	case strings.HasPrefix(cmd, "qThreadExtraInfo,"):
		n, ok := fc.hartOf(strings.TrimPrefix(cmd, "qThreadExtraInfo,"))
		if !ok {
			fc.send("E22")
			break
		}
		state := "[running]"
		if g.harts[n].halted {
			state = "[halted ]"
		}
		fc.send(enchex.EncodeToString([]byte(fmt.Sprintf("CPU#%d %s", n, state))))
	case strings.HasPrefix(cmd, "Hg"), strings.HasPrefix(cmd, "Hc"):
		n, ok := fc.hartOf(cmd[2:])
		if !ok {
			fc.send("E22")
			break
		}
		if cmd[1] == 'g' {
			fc.sel = n
		}
		fc.send("OK")
	default:
		return false
	}
	return true
}

// registers answers register and memory reads.
func (fc *fakeConn) registers(cmd string) bool {
	g := fc.g
	switch {
	case cmd == "g":
		var b strings.Builder
		for _, n := range fakeRegNames {
			b.WriteString(le64(g.reg(fc.sel, n)))
		}
		fc.send(b.String())
	case strings.HasPrefix(cmd, "p"):
		n, _ := strconv.ParseUint(cmd[1:], 16, 32)
		if name, ok := regName(int(n)); ok {
			fc.send(le64(g.reg(fc.sel, name)))
		} else {
			fc.send("E14")
		}
	case strings.HasPrefix(cmd, "m"):
		a, l, _ := strings.Cut(cmd[1:], ",")
		addr, _ := strconv.ParseUint(a, 16, 64)
		n, _ := strconv.ParseUint(l, 16, 64)
		if b := g.read(addr, int(n)); len(b) > 0 {
			fc.send(enchex.EncodeToString(b))
		} else {
			fc.send("E14")
		}
	default:
		return false
	}
	return true
}

// control answers what runs the guest and what stops it.
func (fc *fakeConn) control(cmd string) bool {
	g := fc.g
	switch {
	case cmd == "c" || strings.HasPrefix(cmd, "vCont;c"):
		if g.rep != nil {
			g.rep.resume(fc)
			break
		}
		g.mu.Lock()
		g.resumes++
		n := g.resumes
		g.mu.Unlock()
		if g.resumed != nil {
			g.resumed(n)
		}
		// Running: no reply until the interrupt (0x03).
	case cmd == "s" || strings.HasPrefix(cmd, "vCont;s"):
		if g.rep == nil {
			fc.send("E01")
			break
		}
		fc.send(g.rep.step(cmd))
	case strings.HasPrefix(cmd, "Z"), strings.HasPrefix(cmd, "z"):
		var bp fakeBP
		if _, err := fmt.Sscanf(cmd[1:], "%d,%x,%x", &bp.kind, &bp.addr, &bp.size); err != nil {
			fc.send("E22")
			break
		}
		g.mu.Lock()
		if cmd[0] == 'Z' {
			g.bps[bp] = true
		} else {
			delete(g.bps, bp)
		}
		g.mu.Unlock()
		fc.send("OK")
	case strings.HasPrefix(cmd, "Qqemu.PhyMemMode:"), cmd == "D":
		fc.send("OK") // memory is the same either way here
	default:
		return false
	}
	return true
}

// reg is register name of hart h.
func (g *fakeGuest) reg(h int, name string) uint64 {
	if g.rep == nil {
		return g.harts[h].regs[name] // tests set them between calls
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.harts[h].regs[name]
}

func (g *fakeGuest) stoppedHart() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopped
}

// session serves the guest and returns a debugger session on it, with
// the kernel's symbols.
func (g *fakeGuest) session() *Session { return g.sessionOn(nil) }

// sessionOn is session, of a guest that replays tl when tl is not nil.
func (g *fakeGuest) sessionOn(tl Timeline) *Session {
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
	if err := os.WriteFile(elfPath, symbolELF(g.syms, g.data), 0o600); err != nil {
		t.Fatal(err)
	}
	syms, err := debuginfo.Open(elfPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Arch:    riscv64.Arch,
		Dial:    func(ctx context.Context) (*gdb.Client, error) { return gdb.Dial(ctx, "unix", sock) },
		Running: func(context.Context) (bool, error) { return g.running, nil },
		Symbols: syms,
		Logger:  slog.New(slog.DiscardHandler),
	}
	if tl != nil {
		cfg.Timeline = tl
	}
	s := New(cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

// fakeDatum is a variable of the fake kernel, in its .data.
type fakeDatum struct{ addr, size uint64 }

// The fake kernel's .data: where its variables are (see
// fakeGuest.variable), past the harts' stacks.
const (
	fakeData     = 0x80800000
	fakeDataSize = 0x1000
)

// elfSym is a symbol of symbolELF's: its section index and ELF type.
type elfSym struct {
	name       string
	addr, size uint64
	sect       uint16
	typ        byte
}

// symbolELF is a RISC-V ELF whose .text holds the functions of funcs,
// each fakeFuncSize bytes, and .data the variables of data, and nothing
// else of use: no code, no DWARF.
func symbolELF(funcs map[string]uint64, data map[string]fakeDatum) []byte {
	var syms []elfSym
	var textSize uint64
	for n, a := range funcs {
		syms = append(syms, elfSym{n, a, fakeFuncSize, 1, byte(elf.STT_FUNC)})
		textSize = max(textSize, a+fakeFuncSize-fakeText)
	}
	for n, d := range data {
		syms = append(syms, elfSym{n, d.addr, d.size, 2, byte(elf.STT_OBJECT)})
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	symtab, strtab := elfSymbols(syms)
	shstrtab := []byte("\x00.text\x00.data\x00.symtab\x00.strtab\x00.shstrtab\x00")
	const ehSize, phSize, shSize, nProg, nSect = 64, 56, 64, 2, 6
	textOff := uint64(ehSize + nProg*phSize)
	dataOff := textOff + textSize
	symOff := dataOff + fakeDataSize
	strOff := symOff + uint64(len(symtab))
	shstrOff := strOff + uint64(len(strtab))
	shOff := (shstrOff + uint64(len(shstrtab)) + 7) &^ 7
	out := make([]byte, shOff+nSect*shSize)
	elfHeader(out, shOff, nProg, nSect)
	elfProg(out[ehSize:], 5, textOff, fakeText, textSize)            // R X
	elfProg(out[ehSize+phSize:], 6, dataOff, fakeData, fakeDataSize) // R W
	copy(out[symOff:], symtab)
	copy(out[strOff:], strtab)
	copy(out[shstrOff:], shstrtab)
	sh := func(i int, s elfSection) { s.put(out[shOff+uint64(i)*shSize:]) }
	sh(1, elfSection{name: 1, typ: 1, flags: 2 | 4, addr: fakeText, off: textOff, size: textSize, align: 4})     // .text: PROGBITS, ALLOC|EXECINSTR
	sh(2, elfSection{name: 7, typ: 1, flags: 2 | 1, addr: fakeData, off: dataOff, size: fakeDataSize, align: 8}) // .data: ALLOC|WRITE
	sh(3, elfSection{name: 13, typ: 2, off: symOff, size: uint64(len(symtab)), link: 4, info: 1, align: 8, entsize: 24})
	sh(4, elfSection{name: 21, typ: 3, off: strOff, size: uint64(len(strtab)), align: 1})
	sh(5, elfSection{name: 29, typ: 3, off: shstrOff, size: uint64(len(shstrtab)), align: 1})
	return out
}

// elfSymbols are the symbol table of syms (all global) and its strings.
func elfSymbols(syms []elfSym) (symtab, strtab []byte) {
	le := binary.LittleEndian
	strtab = []byte{0}
	symtab = make([]byte, 24) // the null symbol
	for _, s := range syms {
		b := make([]byte, 24)
		le.PutUint32(b[0:], uint32(len(strtab)))
		b[4] = byte(elf.STB_GLOBAL)<<4 | s.typ
		le.PutUint16(b[6:], s.sect)
		le.PutUint64(b[8:], s.addr)
		le.PutUint64(b[16:], s.size)
		symtab = append(symtab, b...)
		strtab = append(append(strtab, s.name...), 0)
	}
	return symtab, strtab
}

// elfHeader writes a 64-bit little-endian RISC-V executable's header.
func elfHeader(out []byte, shOff uint64, nProg, nSect uint16) {
	le := binary.LittleEndian
	copy(out, "\x7fELF")
	out[4], out[5], out[6] = 2, 1, 1 // 64-bit, little-endian, version 1
	le.PutUint16(out[16:], 2)        // ET_EXEC
	le.PutUint16(out[18:], 243)      // EM_RISCV
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[24:], fakeText)
	le.PutUint64(out[32:], 64) // the program headers, right after
	le.PutUint64(out[40:], shOff)
	le.PutUint16(out[52:], 64)
	le.PutUint16(out[54:], 56)
	le.PutUint16(out[56:], nProg)
	le.PutUint16(out[58:], 64)
	le.PutUint16(out[60:], nSect)
	le.PutUint16(out[62:], nSect-1) // .shstrtab, last
}

// elfProg writes a PT_LOAD program header.
func elfProg(b []byte, flags uint32, off, addr, size uint64) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], 1) // PT_LOAD
	le.PutUint32(b[4:], flags)
	le.PutUint64(b[8:], off)
	le.PutUint64(b[16:], addr)
	le.PutUint64(b[24:], addr)
	le.PutUint64(b[32:], size)
	le.PutUint64(b[40:], size)
	le.PutUint64(b[48:], 0x1000)
}

// elfSection is a section header.
type elfSection struct {
	name, typ              uint32
	flags, addr, off, size uint64
	link, info             uint32
	align, entsize         uint64
}

func (s elfSection) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], s.name)
	le.PutUint32(b[4:], s.typ)
	le.PutUint64(b[8:], s.flags)
	le.PutUint64(b[16:], s.addr)
	le.PutUint64(b[24:], s.off)
	le.PutUint64(b[32:], s.size)
	le.PutUint32(b[40:], s.link)
	le.PutUint32(b[44:], s.info)
	le.PutUint64(b[48:], s.align)
	le.PutUint64(b[56:], s.entsize)
}
