package debugger

import (
	"context"

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

// panicking are the functions a kernel crashes through; the frame below
// the outermost of them is the one that crashed.
var panicking = map[string]bool{
	"panic": true, "nmi_panic": true, "die": true, "die_kernel_fault": true,
	"make_task_dead": true, "do_exit": true, "do_group_exit": true, "oops_end": true,
	"__warn": true, "report_bug": true, "do_trap_break": true, "handle_break": true,
}

// culprit finds the crashing frame of bt (see Triage.Culprit).
func culprit(bt Backtrace, trap *Trap) *Where {
	if trap != nil && trap.EPC != nil {
		return trap.EPC
	}
	last := -1
	for i, f := range bt.Frames {
		if panicking[f.Function] {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	for _, f := range bt.Frames[last+1:] {
		if f.Function != "" && !isEntry(f.Function) {
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
// stack holds the crash (panic, die, a kernel fault) rather than only the
// IPI that stopped it; it becomes the hart of the last stop, and every
// other hart gets a line.
func (s *Session) Triage(ctx context.Context) (Triage, error) {
	defer s.begin()()
	var t Triage
	err := s.stopped(ctx, func(c *gdb.Client) error {
		ths, err := s.hartThreads(ctx, c)
		if err != nil {
			return err
		}
		type hartStack struct {
			th    *gdb.Thread
			hart  int
			regs  map[string]uint64
			bt    Backtrace
			score int
		}
		var harts []hartStack
		var readErr error
		reported, _ := c.LastStop()
		best := -1
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
			h.score = crashScore(h.bt)
			if id == reported.Thread {
				h.score++ // a tie goes to the hart QEMU names
			}
			harts = append(harts, h)
			if best < 0 || h.score > harts[best].score {
				best = len(harts) - 1
			}
		}
		if best < 0 {
			return readErr
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
			o := s.summarize(ctx, h.th, HartState{Hart: h.hart}, h.regs, h.bt, otherFrames)
			if p, ok := procs[h.hart]; ok {
				o.Processor = &p
			}
			t.Others = append(t.Others, o)
		}
		s.triage(ctx, b.th, b.regs, b.bt, &t)
		return nil
	})
	return t, err
}

// crashScore ranks a hart's stack for being the one that crashed: the
// crash machinery (panic, die, an oops) and a fault taken in the kernel
// count; only handling an IPI (how a panic stops the other harts) counts
// against.
func crashScore(bt Backtrace) int {
	var crash, fault, ipi bool
	for _, f := range bt.Frames {
		crash = crash || crashing[f.Function]
		fault = fault || f.Trap != nil && isFault(*f.Trap) && !f.User
		ipi = ipi || f.Function == "handle_IPI"
	}
	score := 0
	if crash {
		score += 8
	}
	if fault {
		score += 4
	}
	if ipi {
		score -= 4
	}
	return score
}

// triage fills in t from the crashed hart: where it is, the trap that
// brought it down, its verdict, and the culprit.
func (s *Session) triage(ctx context.Context, th *gdb.Thread, regs map[string]uint64, bt Backtrace, t *Triage) {
	t.PC, t.RA, t.SP = s.Where(regs["pc"]), s.callerWhere(ctx, th, regs["ra"]), hex(regs["sp"])
	if p, err := th.ReadRegister(ctx, "priv"); err == nil {
		t.Priv = privName(p)
	}
	t.Backtrace = bt
	defer func() { t.Culprit = culprit(t.Backtrace, t.Trap) }()
	for _, f := range t.Backtrace.Frames {
		if f.Trap != nil && isFault(*f.Trap) {
			tr := *f.Trap
			tr.EPC = &f.Where
			t.Trap, t.TrapSource = &tr, "trap frame"
			t.Verdict, t.Walk = s.explain(ctx, th, tr.fault())
			return
		}
	}
	// Without a trap frame, scause is the last trap into S-mode: an
	// exception there may be the crash (a kernel that panics in its
	// trap handler without a frame to show); an interrupt is noise.
	if v, err := th.ReadRegister(ctx, "scause"); err == nil && v != 0 && isFault(DecodeCause(v)) {
		tr := DecodeCause(v)
		if e, err := th.ReadRegister(ctx, "sepc"); err == nil {
			w := s.Where(e)
			tr.EPC = &w
			tr.epc = e
		}
		if v, err := th.ReadRegister(ctx, "stval"); err == nil {
			tr.TVal, tr.tval = hex(v), v
		}
		if v, err := th.ReadRegister(ctx, "sstatus"); err == nil {
			tr.status = v
		}
		t.Trap, t.TrapSource = &tr, "scause: the last trap into supervisor mode, which may predate the crash"
		t.Verdict, t.Walk = s.explain(ctx, th, tr.fault())
	}
}

// isFault reports whether t is an exception that can crash a kernel: not
// an interrupt, and not a system call (an ecall is how a crash reached
// through a syscall entered the kernel, which the backtrace shows).
func isFault(t Trap) bool {
	return !t.Interrupt && (t.Code < 8 || t.Code > 11)
}
