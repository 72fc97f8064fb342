package debugger

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/arch"
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

func (s *Session) unwind(ctx context.Context, th *gdb.Thread, regs map[string]uint64, max int) Backtrace {
	fp, _ := s.gpr(regs, s.regs.FP)
	st := unwindState{pc: regs[s.regs.PC], fp: fp, ra: regs[s.regs.RA], sp: regs[s.regs.SP], exact: true}
	var bt Backtrace
	if w, mode := s.at(regs); mode != "" {
		return Backtrace{Frames: []Frame{{Where: w}}, End: "the hart runs " + mode + ": frames are read in 64-bit code only"}
	}
	for len(bt.Frames) < max {
		f := Frame{Where: s.Where(st.pc)}
		if !st.exact {
			f.Where = s.callerWhere(ctx, th, st.pc)
		}
		var done bool
		if !st.exact && len(bt.Frames) > 0 && (s.d.IsEntry(f.Function) || s.d.IsEntry(s.Where(st.pc).Function)) {
			if st, f, done = s.trapFrame(ctx, th, st, f, &bt, max); done {
				return bt
			}
		}
		if st.exact && s.d.IsVector(f.Function) {
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
		if s.d.IsFirst(f.Function) {
			return bt // a secondary hart's first frame: no caller
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
	size := s.d.TrapFrameSize()
	at := s.d.TrapFrameAt(arch.Frame{PC: st.pc, SP: st.sp, FP: st.fp, RA: st.ra}, st.calleeCFA)
	b, err := th.ReadMemory(ctx, at, size)
	if err != nil || len(b) < size {
		bt.End = fmt.Sprintf("could not read the trap frame at %s", hex(at))
		return st, f, true
	}
	tr, regs, user := s.d.TrapFrame(ctx, th, f.Function, b)
	t := s.trap(tr, false)
	st = unwindState{pc: regs.PC, ra: regs.RA, sp: regs.SP, fp: regs.FP, exact: true}
	f = Frame{Where: s.Where(st.pc), Trap: &t}
	if len(bt.Frames) >= max {
		bt.End = frameLimit(max)
		return st, f, true
	}
	if user {
		f.User = true
		bt.Frames = append(bt.Frames, f)
		return st, f, true
	}
	return st, f, false
}

// vectorFrame adds f, a frame stopped in the trap vector, before the
// handler: the trapped context is what the vector has not yet moved into
// the trap frame, and the frame returned is the trapped one. done
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
	if !st.exact && !pro.FPSet {
		pro = s.d.Standard() // a caller's frame is built; assume it is standard
	}
	switch {
	case st.exact && !pro.FPSet:
		// Stopped before the prologue set the frame pointer (a
		// breakpoint on a function): the caller's pc is ra, and fp is
		// still the caller's.
		cfa := st.sp - uint64(pro.SPOff)
		ra := st.ra
		if s.regs.RA == "" {
			// No link register: the call pushed the return address
			// just below the CFA.
			var ok bool
			if ra, ok = readWord(ctx, th, cfa-8); !ok {
				return st, fmt.Sprintf("could not read the return address at %s", hex(cfa-8))
			}
		}
		return unwindState{pc: ra, fp: st.fp, calleeCFA: cfa}, ""
	case st.fp == 0 || st.fp%8 != 0:
		return st, fmt.Sprintf("frame pointer %s is not a stack address (code built without frame pointers?)", hex(st.fp))
	}
	next = unwindState{calleeCFA: st.fp - uint64(pro.FPPos)}
	var ok bool
	if pro.RASaved {
		next.pc, ok = readWord(ctx, th, st.fp+uint64(pro.RAOff))
	} else if st.exact {
		next.pc, ok = st.ra, true // a leaf keeps its return address in ra
	}
	if !ok {
		return st, fmt.Sprintf("could not read the return address near frame pointer %s", hex(st.fp))
	}
	if next.fp, ok = readWord(ctx, th, st.fp+uint64(pro.FPOff)); !ok {
		return st, fmt.Sprintf("could not read the saved frame pointer near %s", hex(st.fp))
	}
	if next.fp != 0 && next.fp <= st.fp && !s.d.IsEntry(s.callerWhere(ctx, th, next.pc).Function) {
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
// the trap vector, from the trap registers and what the vector has saved
// so far.
func (s *Session) inVector(ctx context.Context, th *gdb.Thread, st unwindState) (unwindState, Trap, bool, error) {
	pro := s.prologue(ctx, th, st.pc)
	next, t, user, err := s.d.InVector(ctx, th, arch.Frame{PC: st.pc, SP: st.sp, FP: st.fp, RA: st.ra}, pro)
	if err != nil {
		return st, Trap{}, false, err
	}
	return unwindState{pc: next.PC, ra: next.RA, sp: next.SP, fp: next.FP, exact: true}, s.trap(t, false), user, nil
}

// callerWhere symbolizes a return address: by the call before it when
// there is one, else (entry code sets ra to a label, such as
// ret_from_syscall, without a call) as it is.
func (s *Session) callerWhere(ctx context.Context, th *gdb.Thread, ra uint64) Where {
	w := s.Where(ra)
	if w.Function == "" && s.Where(ra-1).Function != "" {
		// Right after a function, in no symbol: a call was its last
		// instruction (functions not aligned, as x86 builds for size
		// leave them; the code itself may be freed init text).
		return s.whereReturn(ra)
	}
	m := uint64(s.d.MaxInstruction())
	code, _ := th.ReadMemory(ctx, ra-m, int(m))
	if uint64(len(code)) == m {
		if s.d.CallBefore(code) {
			return s.whereReturn(ra)
		}
		return w
	}
	// The code before ra is gone (init text, which the kernel unmaps
	// after boot): a return address at a function's first instruction
	// follows a call that ended the function before it, unless it is an
	// entry code label.
	if w.Offset == "0x0" && !s.d.IsEntry(w.Function) {
		return s.whereReturn(ra)
	}
	return w
}

// whereReturn symbolizes a return address by the call before it: a call
// to a function that does not return can be a function's last
// instruction, and its return address the next function's first.
func (s *Session) whereReturn(ra uint64) Where { return s.whereBy(ra, ra-1) }

// prologue decodes the start of the function holding pc up to pc (at
// most the architecture's PrologueScan bytes). Without symbols, or when
// the code does not read, it assumes the standard prologue.
func (s *Session) prologue(ctx context.Context, th *gdb.Thread, pc uint64) arch.Prologue {
	if s.cfg.Symbols == nil {
		return s.d.Standard()
	}
	loc, ok := s.cfg.Symbols.Symbolize(pc)
	if !ok {
		return s.d.Standard()
	}
	scan := uint64(s.d.PrologueScan())
	start := pc - loc.Offset
	n := int(min(loc.Offset, scan))
	var code []byte
	if n > 0 {
		code, _ = th.ReadMemory(ctx, start, n)
	}
	p := s.d.ScanPrologue(code)
	if !p.FPSet && loc.Offset > scan {
		return s.d.Standard() // a long function's prologue is long done
	}
	return p
}
