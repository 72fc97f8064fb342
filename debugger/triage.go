package debugger

import (
	"context"
	"fmt"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Triage is what an agent needs first about a crashed kernel: which hart
// crashed, where it is, the trap that brought it down, and how it got
// there; and a line for every other hart.
type Triage struct {
	// Hart is the hart that crashed, Processor its kernel CPU number on
	// a guest with several harts.
	Hart      int    `json:"hart"`
	Processor *int   `json:"processor,omitempty"`
	PC        Where  `json:"pc"`
	RA        Where  `json:"ra"`
	SP        string `json:"sp"`
	Priv      string `json:"priv,omitempty"`
	// Trap is the innermost fault in the backtrace (read from the
	// trap frame the kernel saved); without one, the last trap into
	// supervisor mode (scause), which TrapSource then says.
	Trap       *Trap  `json:"trap,omitempty"`
	TrapSource string `json:"trap_source,omitempty"`
	// Culprit is where the crash came from: the faulting pc of Trap, or
	// else the caller of the panic machinery (panic, die, ...), whatever
	// the hart was doing (printing, delaying) when it was stopped.
	Culprit *Where `json:"culprit,omitempty"`
	// Verdict says in one sentence why Trap happened; Walk is the page
	// walk of its address, for page and access faults.
	Verdict   string    `json:"verdict,omitempty"`
	Walk      *Walk     `json:"walk,omitempty"`
	Backtrace Backtrace `json:"backtrace"`
	// Others are the other harts at the time, each at a glance.
	Others []HartState `json:"other_harts,omitempty"`
}

// panicking are the functions a Linux kernel crashes through; the frame
// below the outermost of them (or of any function named like a panic, see
// panicLike) is the one that crashed.
var panicking = map[string]bool{
	"panic": true, "nmi_panic": true, "die": true, "die_kernel_fault": true,
	"make_task_dead": true, "do_exit": true, "do_group_exit": true, "oops_end": true,
	"__warn": true, "report_bug": true, "do_trap_break": true, "handle_break": true,
}

// culprit finds the crashing frame of bt (see Triage.Culprit).
func culprit(d arch.Debugger, bt Backtrace, trap *Trap) *Where {
	if trap != nil && trap.EPC != nil {
		return trap.EPC
	}
	last := -1
	for i, f := range bt.Frames {
		if panicking[f.Function] || panicLike(f.Function) {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	for _, f := range bt.Frames[last+1:] {
		if f.Function != "" && !d.IsEntry(f.Function) {
			w := f.Where
			return &w
		}
	}
	return nil
}

// triageFrames bounds a triage's backtrace: enough to reach the faulting
// function through panic's frames and a trap frame.
const triageFrames = 32

// otherFrames bounds the backtrace of each other hart in a triage.
const otherFrames = 6

// Triage stops the guest (if it runs), finds the hart that crashed, reads
// where it is and unwinds it, and leaves the guest in the run state it
// found. On a guest with several harts the crashed hart is the one whose
// stack holds the crash (panic, die, an oops, or any function named like
// a panic) or a fault (a trap frame, or the last trap CSRs) rather than
// only the IPI that stopped it, or a wait in wfi (see crashRank); it
// becomes the hart of the last stop, and every other hart gets a line.
// A running guest whose crashed hart is caught in firmware, in a call it
// soon returns from (panic's SBI call that stops the other harts), is let
// run briefly and looked at again (see firmwareLooks).
func (s *Session) Triage(ctx context.Context) (Triage, error) {
	defer s.begin()()
	var t Triage
	err := s.stoppedFrom(ctx, func(c *gdb.Client, running bool) error {
		var harts []hartStack
		var best int
		for look := 1; ; look++ {
			var err error
			if harts, best, err = s.rankHarts(ctx, c); err != nil {
				return err
			}
			if look == firmwareLooks || !running || !s.inFirmware(harts[best]) ||
				len(s.breaks) > 0 || len(s.watches) > 0 || s.cfg.Timeline != nil {
				break
			}
			// Nothing set can stop the guest meanwhile, nor is a
			// recording replayed: a short run changes nothing but
			// where the harts are.
			if err := c.Continue(ctx); err != nil {
				return err
			}
			wait := time.NewTimer(firmwareWait)
			select {
			case <-ctx.Done():
			case <-wait.C:
			}
			wait.Stop()
			// Stopped again even so: f runs with the guest stopped.
			if _, err := c.Interrupt(context.WithoutCancel(ctx)); err != nil {
				return fmt.Errorf("debugger: stop the guest: %w", err)
			}
		}
		b := harts[best]
		s.hart = b.hart
		t.Hart = b.hart
		procs := s.processors(ctx, c, b.th)
		if p, ok := procs[b.hart]; ok {
			t.Processor = &p
		}
		for _, h := range harts {
			if h.hart == b.hart {
				continue
			}
			o := s.summarize(HartState{Hart: h.hart}, h.facts, h.regs, h.bt, otherFrames)
			if p, ok := procs[h.hart]; ok {
				o.Processor = &p
			}
			t.Others = append(t.Others, o)
		}
		s.triage(ctx, b.th, b.regs, b.bt, b.facts, &t)
		return nil
	})
	return t, err
}

// firmwareLooks bounds the looks a triage takes at a running guest whose
// crashed hart it finds in firmware, firmwareWait apart.
const (
	firmwareLooks = 5
	firmwareWait  = 20 * time.Millisecond
)

// hartStack is one hart as a triage sees it.
type hartStack struct {
	th    *gdb.Thread
	hart  int
	regs  map[string]uint64
	bt    Backtrace
	facts hartFacts
	rank  int
}

// rankHarts reads and unwinds every hart, and ranks them (crashRank):
// harts[best] is the one that crashed. The guest is stopped.
func (s *Session) rankHarts(ctx context.Context, c *gdb.Client) (harts []hartStack, best int, err error) {
	ths, err := s.hartThreads(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	var readErr error
	reported, _ := c.LastStop()
	best = -1
	for i, id := range ths {
		h := hartStack{th: c.Thread(id), hart: i}
		if n, ok := hartOf(id); ok {
			h.hart = n
		}
		if h.regs, err = h.th.ReadRegisters(ctx); err != nil {
			readErr = err
			continue
		}
		h.bt = s.unwind(ctx, h.th, h.regs, triageFrames)
		h.facts = s.facts(ctx, h.th)
		h.rank = crashRank(s.d, h.bt, h.facts, id == reported.Thread)
		harts = append(harts, h)
		if best < 0 || h.rank > harts[best].rank {
			best = len(harts) - 1
		}
	}
	if best < 0 {
		return nil, 0, readErr
	}
	return harts, best, nil
}

// inFirmware reports whether h runs firmware: M-mode code outside the
// kernel's symbols, not waiting in wfi (a hart parked there, or hung
// after a fatal trap, waits).
func (s *Session) inFirmware(h hartStack) bool {
	return s.cfg.Symbols != nil && h.facts.level.Firmware && !h.facts.halted &&
		(len(h.bt.Frames) == 0 || h.bt.Frames[0].Function == "")
}

// crashScore ranks a hart's stack for being the one that crashed: the
// crash machinery (panic, die, an oops, a function named like a panic)
// and a fault taken in the kernel (a trap frame, or trapFault: the last
// trap CSRs hold a fault the hart is still handling) count; only handling
// an IPI (how a panic stops the other harts) counts against.
func crashScore(d arch.Debugger, bt Backtrace, trapFault bool) int {
	var crash, fault, ipi bool
	for _, f := range bt.Frames {
		crash = crash || crashes(f.Function)
		fault = fault || f.Trap != nil && d.IsFault(f.Trap.raw) && !f.User
		ipi = ipi || f.Function == "handle_IPI"
	}
	score := 0
	if crash {
		score += 8
	}
	if fault || trapFault {
		score += 4
	}
	if ipi {
		score -= 4
	}
	return score
}

// crashRank orders the harts for being the one that crashed: by
// crashScore; at equal scores a hart that runs beats one waiting in wfi
// (an idle hart), and then the hart of the last stop (reported) wins.
func crashRank(d arch.Debugger, bt Backtrace, f hartFacts, reported bool) int {
	rank := 4 * crashScore(d, bt, f.fault != nil)
	if !f.halted {
		rank += 2
	}
	if reported {
		rank++
	}
	return rank
}

// sourceFrame is a triage's trap_source for a trap read from a trap frame.
const sourceFrame = "trap frame"

// triage fills in t from the crashed hart: where it is, the trap that
// brought it down, its verdict, and the culprit.
func (s *Session) triage(ctx context.Context, th *gdb.Thread, regs map[string]uint64, bt Backtrace, facts hartFacts, t *Triage) {
	t.PC, t.SP = s.Where(regs[s.regs.PC]), hex(regs[s.regs.SP])
	if s.regs.RA != "" {
		t.RA = s.callerWhere(ctx, th, regs[s.regs.RA])
	} else if len(bt.Frames) > 1 {
		t.RA = bt.Frames[1].Where // no link register: the caller's frame
	}
	t.Priv = facts.level.Name
	t.Backtrace = bt
	defer func() { t.Culprit = culprit(s.d, t.Backtrace, t.Trap) }()
	for _, f := range t.Backtrace.Frames {
		if f.Trap != nil && s.d.IsFault(f.Trap.raw) {
			tr := *f.Trap
			tr.EPC = &f.Where
			t.Trap, t.TrapSource = &tr, sourceFrame
			t.Verdict, t.Walk = s.explain(ctx, th, tr.raw)
			return
		}
	}
	// Without a trap frame, the last trap registers: an exception there
	// may be the crash (a kernel that panics in its trap handler without
	// a frame to show); an interrupt is noise. A hart at the firmware's
	// level (a kernel that runs there, or firmware) has its last trap
	// there; so has one that never trapped into the kernel's.
	var source string
	var tr Trap
	src := s.d.Sources()
	if facts.level.Firmware {
		if m, ok := s.lastTrap(ctx, th, true); ok && s.d.IsFault(m.raw) {
			tr, source = m, src.Firmware
		}
	}
	if source == "" {
		sv, ok := s.lastTrap(ctx, th, false)
		switch {
		case ok && s.d.IsFault(sv.raw):
			tr, source = sv, src.Kernel
		case !ok && !facts.level.Firmware:
			if m, ok := s.lastTrap(ctx, th, true); ok && s.d.IsFault(m.raw) {
				tr, source = m, src.NoKernel
			}
		}
	}
	if source != "" {
		t.Trap, t.TrapSource = &tr, source
		t.Verdict, t.Walk = s.explain(ctx, th, tr.raw)
	}
}

// lastTrap reads the last trap a hart took into the kernel's level, or
// with firmware into the firmware's; false if none was taken.
func (s *Session) lastTrap(ctx context.Context, th *gdb.Thread, firmware bool) (Trap, bool) {
	t, ok := s.d.LastTrap(ctx, th, firmware)
	if !ok {
		return Trap{}, false
	}
	return s.trap(t, true), true
}
