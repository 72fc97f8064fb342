package debugger

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Frame is one frame of a backtrace.
type Frame struct {
	Where
	// Trap is set on a frame the hart trapped out of (an exception or an
	// interrupt): the frame's pc is the trap's epc, read from the pt_regs
	// the kernel's entry code saved.
	Trap *Trap `json:"trap,omitempty"`
	// User marks a trap taken from user mode: the frame is the user
	// program's pc, and unwinding ends there.
	User bool `json:"user,omitempty"`
}

// Backtrace is the unwound stack and why unwinding ended.
type Backtrace struct {
	Frames []Frame `json:"frames"`
	// End says why the walk stopped, when not at the stack's bottom.
	End string `json:"end,omitempty"`
}

// Backtrace unwinds the stack of hart (LastHart: the hart of the last
// stop) by frame pointers, at most max frames; on is the hart.
func (s *Session) Backtrace(ctx context.Context, hart, max int) (bt Backtrace, on int, err error) {
	if max <= 0 || max > 256 {
		return Backtrace{}, 0, fmt.Errorf("a backtrace of %d frames: want 1 to 256", max)
	}
	on, err = s.onHart(ctx, hart, func(th *gdb.Thread) error {
		regs, err := th.ReadRegisters(ctx)
		if err != nil {
			return err
		}
		bt = s.unwind(ctx, th, regs, max)
		return nil
	})
	return bt, on, err
}

// unwindState is what is known of a frame: the pc and frame pointer, and,
// for the innermost frame and frames resumed from a trap, the registers.
type unwindState struct {
	pc, fp uint64
	ra, sp uint64
	exact  bool // ra and sp are the frame's live registers
	// calleeCFA is the canonical frame address (sp at entry) of the
	// frame this one called; entry code keeps pt_regs there.
	calleeCFA uint64
}

// ptRegs is Linux's struct pt_regs on RISC-V: epc, x1..x31, then status,
// badaddr, cause (arch/riscv/include/asm/ptrace.h).
const (
	ptEPC     = 0
	ptStatus  = 32 * 8
	ptBadaddr = 33 * 8
	ptCause   = 34 * 8
	ptSize    = 36 * 8
)

// isVector reports whether fn is Linux's trap vector (its labels
// included), where the registers of the trapped context are being saved.
func isVector(fn string) bool {
	return strings.HasPrefix(fn, "handle_exception") || fn == "_save_context" || fn == "_restore_kernel_tpsp"
}

// isEntry reports whether fn is trap entry code that leaves a pt_regs at
// the stack pointer of the handler it calls.
func isEntry(fn string) bool {
	return strings.HasPrefix(fn, "ret_from_") || strings.HasPrefix(fn, "handle_exception") ||
		strings.HasPrefix(fn, "handle_syscall")
}

func (s *Session) unwind(ctx context.Context, th *gdb.Thread, regs map[string]uint64, max int) Backtrace {
	fp, _ := gpr(regs, "s0")
	st := unwindState{pc: regs["pc"], fp: fp, ra: regs["ra"], sp: regs["sp"], exact: true}
	var bt Backtrace
	for len(bt.Frames) < max {
		f := Frame{Where: s.Where(st.pc)}
		if !st.exact {
			f.Where = s.callerWhere(ctx, th, st.pc)
		}
		var done bool
		if !st.exact && len(bt.Frames) > 0 && (isEntry(f.Function) || isEntry(s.Where(st.pc).Function)) {
			if st, f, done = s.trapFrame(ctx, th, st, f, &bt, max); done {
				return bt
			}
		}
		if st.exact && isVector(f.Function) {
			if st, f, done = s.vectorFrame(ctx, th, st, f, &bt, max); done {
				return bt
			}
		}
		bt.Frames = append(bt.Frames, f)
		if s.cfg.Symbols != nil && f.Function == "" {
			if len(bt.Frames) > 1 {
				bt.End = fmt.Sprintf("%s is not in the kernel's symbols", hex(st.pc))
			}
			return bt
		}
		if f.Function == "smp_callin" {
			// A secondary hart's first frame: head.S tail-calls it with
			// no caller to return to.
			return bt
		}
		next, end := s.caller(ctx, th, st)
		if end != "" {
			bt.End = end
			return bt
		}
		if next.pc == 0 {
			return bt // the bottom of a kernel thread's stack
		}
		st = next
	}
	bt.End = frameLimit(max)
	return bt
}

func frameLimit(max int) string {
	return fmt.Sprintf("stopped after %d frames, the most asked for", max)
}

// trapFrame adds f, a frame of trap entry code that called the frame
// before it: the trapped context is in the pt_regs at the callee's CFA,
// and the frame returned is the trapped one. done says the backtrace
// ends (bt.End says why, unless at the user program).
func (s *Session) trapFrame(ctx context.Context, th *gdb.Thread, st unwindState, f Frame, bt *Backtrace, max int) (unwindState, Frame, bool) {
	bt.Frames = append(bt.Frames, f)
	b, err := th.ReadMemory(ctx, st.calleeCFA, ptSize)
	if err != nil || len(b) < ptSize {
		bt.End = fmt.Sprintf("could not read the trap frame at %s", hex(st.calleeCFA))
		return st, f, true
	}
	word := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	t := DecodeCause(word(ptCause))
	t.TVal = hex(word(ptBadaddr))
	t.epc, t.tval, t.status = word(ptEPC), word(ptBadaddr), word(ptStatus)
	st = unwindState{pc: word(ptEPC), ra: word(1 * 8), sp: word(2 * 8), fp: word(8 * 8), exact: true}
	f = Frame{Where: s.Where(st.pc), Trap: &t}
	if len(bt.Frames) >= max {
		bt.End = frameLimit(max)
		return st, f, true
	}
	if word(ptStatus)>>8&1 == 0 { // SPP: the trap came from user mode
		f.User = true
		bt.Frames = append(bt.Frames, f)
		return st, f, true
	}
	return st, f, false
}

// vectorFrame adds f, a frame stopped in the trap vector, before the
// handler: the trapped context is sepc and what the vector has not yet
// moved into pt_regs, and the frame returned is the trapped one. done
// says the backtrace ends.
func (s *Session) vectorFrame(ctx context.Context, th *gdb.Thread, st unwindState, f Frame, bt *Backtrace, max int) (unwindState, Frame, bool) {
	bt.Frames = append(bt.Frames, f)
	next, t, user, err := s.inVector(ctx, th, st)
	if err != nil {
		bt.End = err.Error()
		return st, f, true
	}
	if len(bt.Frames) >= max {
		bt.End = frameLimit(max)
		return st, f, true
	}
	f = Frame{Where: s.Where(next.pc), Trap: &t, User: user}
	if user {
		bt.Frames = append(bt.Frames, f)
		return next, f, true
	}
	return next, f, false
}

// caller is the frame that called st's, by its prologue and frame
// pointer; end says why there is none to find.
func (s *Session) caller(ctx context.Context, th *gdb.Thread, st unwindState) (next unwindState, end string) {
	pro := s.prologue(ctx, th, st.pc)
	if !st.exact && !pro.fpSet {
		pro = standardPrologue // a caller's frame is built; assume it is standard
	}
	switch {
	case st.exact && !pro.fpSet:
		// Stopped before the prologue set the frame pointer (a
		// breakpoint on a function): the caller's pc is ra, and fp is
		// still the caller's.
		return unwindState{pc: st.ra, fp: st.fp, calleeCFA: st.sp - uint64(pro.spOff)}, ""
	case st.fp == 0 || st.fp%8 != 0:
		return st, fmt.Sprintf("frame pointer %s is not a stack address (code built without frame pointers?)", hex(st.fp))
	}
	next = unwindState{calleeCFA: st.fp - uint64(pro.fpPos)}
	var ok bool
	if pro.raSaved {
		next.pc, ok = readWord(ctx, th, st.fp+uint64(pro.raOff))
	} else if st.exact {
		next.pc, ok = st.ra, true // a leaf keeps its return address in ra
	}
	if !ok {
		return st, fmt.Sprintf("could not read the return address near frame pointer %s", hex(st.fp))
	}
	if next.fp, ok = readWord(ctx, th, st.fp+uint64(pro.s0Off)); !ok {
		return st, fmt.Sprintf("could not read the saved frame pointer near %s", hex(st.fp))
	}
	if next.fp != 0 && next.fp <= st.fp && !isEntry(s.callerWhere(ctx, th, next.pc).Function) {
		return st, fmt.Sprintf("saved frame pointer %s is below %s: the stack is corrupt or the code lacks frame pointers", hex(next.fp), hex(st.fp))
	}
	return next, ""
}

// readWord reads the 64-bit word at a.
func readWord(ctx context.Context, th *gdb.Thread, a uint64) (uint64, bool) {
	b, err := th.ReadMemory(ctx, a, 8)
	if err != nil || len(b) < 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b), true
}

// inVector recovers the context a trap interrupted while the hart is in
// the trap vector: pc from sepc, the cause from scause, the mode from
// sstatus.SPP; ra, sp and s0 live until the vector has saved them in
// pt_regs (at ra 8, sp 16, s0 64), and from there after.
func (s *Session) inVector(ctx context.Context, th *gdb.Thread, st unwindState) (unwindState, Trap, bool, error) {
	csr := func(name string) (uint64, error) {
		v, err := th.ReadRegister(ctx, name)
		if err != nil {
			return 0, fmt.Errorf("read %s in the trap vector: %w", name, err)
		}
		return v, nil
	}
	epc, err := csr("sepc")
	if err != nil {
		return st, Trap{}, false, err
	}
	cause, err := csr("scause")
	if err != nil {
		return st, Trap{}, false, err
	}
	status, err := csr("sstatus")
	if err != nil {
		return st, Trap{}, false, err
	}
	t := DecodeCause(cause)
	if v, err := csr("stval"); err == nil {
		t.TVal, t.tval = hex(v), v
	}
	t.epc, t.status = epc, status
	next := unwindState{pc: epc, ra: st.ra, sp: st.sp, fp: st.fp, exact: true}
	if pro := s.prologue(ctx, th, st.pc); pro.spAdjusted {
		b, err := th.ReadMemory(ctx, st.sp, ptSize)
		if err == nil && len(b) == ptSize {
			next.sp = binary.LittleEndian.Uint64(b[2*8:])
			if pro.raSaved { // the vector sets ra to ret_from_exception later
				next.ra = binary.LittleEndian.Uint64(b[1*8:])
			}
			if pro.s0Stored {
				next.fp = binary.LittleEndian.Uint64(b[8*8:])
			}
		}
	}
	return next, t, status>>8&1 == 0, nil
}

// callerWhere symbolizes a return address: by the call before it when
// there is one, else (entry code sets ra to a label, such as
// ret_from_syscall, without a call) as it is.
func (s *Session) callerWhere(ctx context.Context, th *gdb.Thread, ra uint64) Where {
	if code, _ := th.ReadMemory(ctx, ra-4, 4); len(code) == 4 {
		if n, call := isCall(code); call && n == 4 {
			return s.whereReturn(ra)
		}
		if n, call := isCall(code[2:]); call && n == 2 {
			return s.whereReturn(ra)
		}
	}
	return s.Where(ra)
}

// whereReturn symbolizes a return address by the call before it: a call
// to a function that does not return can be a function's last
// instruction, and its return address the next function's first.
func (s *Session) whereReturn(ra uint64) Where { return s.whereBy(ra, ra-1) }

// prologue is what a function's prologue does, as far as pc reached:
// where it saves ra and the caller's frame pointer, relative to the new
// frame pointer.
type prologue struct {
	spAdjusted bool
	spOff      int64 // sp relative to the CFA after the adjustment
	fpSet      bool  // "addi s0,sp,N" ran before pc
	fpPos      int64 // the frame pointer relative to the CFA
	raSaved    bool
	raOff      int64 // ra's slot relative to the frame pointer
	s0Off      int64 // the caller's fp slot relative to the frame pointer
	// s0Stored says s0 was stored at s0Slot, relative to the current sp
	// (trap entry code saving registers into pt_regs).
	s0Stored bool
	s0Slot   int64
}

// standardPrologue is what GCC and Clang emit with frame pointers:
// ra at fp-8, the caller's fp at fp-16, fp at the CFA.
var standardPrologue = prologue{fpSet: true, raSaved: true, raOff: -8, s0Off: -16}

// prologueScan bounds the code read to find a prologue: a frame is set
// up in the first few instructions, and Linux's trap vector stores the
// registers into pt_regs within its first 400 bytes.
const prologueScan = 512

// prologue decodes the start of the function holding pc up to pc (at
// most prologueScan bytes). Without symbols, or when the code does not read,
// it assumes the standard prologue.
func (s *Session) prologue(ctx context.Context, th *gdb.Thread, pc uint64) prologue {
	if s.cfg.Symbols == nil {
		return standardPrologue
	}
	loc, ok := s.cfg.Symbols.Symbolize(pc)
	if !ok {
		return standardPrologue
	}
	start := pc - loc.Offset
	n := int(min(loc.Offset, prologueScan))
	if n == 0 {
		return prologue{}
	}
	code, _ := th.ReadMemory(ctx, start, n)
	p := scanPrologue(code)
	if !p.fpSet && loc.Offset > prologueScan {
		return standardPrologue // a long function's prologue is long done
	}
	return p
}

// scanPrologue recognises the instructions that build a frame: sp -= N;
// sd ra,X(sp); sd s0,Y(sp); addi s0,sp,M (each possibly compressed, other
// instructions between).
func scanPrologue(code []byte) prologue {
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

// prologueScanner is scanPrologue's state: the prologue so far, and where
// ra and s0 were stored relative to the CFA.
type prologueScanner struct {
	p            prologue
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
		p.spOff += signExtend(imm, 10)
		p.spAdjusted = true
	case op == 1 && f3 == 0 && rd == 2: // c.addi sp,imm
		imm := int64(lo>>12&1)<<5 | int64(lo>>2&0x1f)
		p.spOff += signExtend(imm, 6)
		p.spAdjusted = true
	case op == 2 && f3 == 7: // c.sdsp rs2, uimm(sp)
		uimm := int64(lo>>10&7)<<3 | int64(lo>>7&7)<<6
		ps.stored(lo>>2&0x1f, uimm)
	case op == 0 && f3 == 0 && lo>>2&7 == 0: // c.addi4spn s0,sp,nzuimm
		nz := int64(lo>>11&3)<<4 | int64(lo>>7&0xf)<<6 | int64(lo>>6&1)<<2 | int64(lo>>5&1)<<3
		if nz != 0 {
			p.fpSet, p.fpPos = true, p.spOff+nz
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
			p.spOff += imm
			p.spAdjusted = true
		} else if rd == 8 {
			p.fpSet, p.fpPos = true, p.spOff+imm
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
		ps.p.raSaved, ps.raPos = true, ps.p.spOff+off
	} else if reg == 8 {
		ps.s0Saved, ps.s0Pos = true, ps.p.spOff+off
	}
}

// result is the prologue scanned.
func (ps *prologueScanner) result() prologue {
	p := ps.p
	if ps.s0Saved {
		p.s0Stored, p.s0Slot = true, ps.s0Pos-p.spOff
	}
	if !p.fpSet {
		return p
	}
	if !ps.s0Saved {
		// Without a saved fp the frame is not a frame-pointer frame;
		// the standard layout is the best guess.
		return standardPrologue
	}
	p.raOff, p.s0Off = ps.raPos-p.fpPos, ps.s0Pos-p.fpPos
	p.s0Stored, p.s0Slot = false, 0
	return p
}

func signExtend(v int64, bits uint) int64 {
	shift := 64 - bits
	return v << shift >> shift
}
