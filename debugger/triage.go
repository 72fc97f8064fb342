package debugger

import (
	"context"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Triage is what an agent needs first about a crashed kernel: where the
// hart is, the trap that brought it down, and how it got there.
type Triage struct {
	PC   Where  `json:"pc"`
	RA   Where  `json:"ra"`
	SP   string `json:"sp"`
	Priv string `json:"priv,omitempty"`
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

// Triage stops the guest (if it runs), reads where it is and unwinds, and
// leaves it in the run state it found.
func (s *Session) Triage(ctx context.Context) (Triage, error) {
	defer s.begin()()
	var t Triage
	err := s.stopped(ctx, func(c *gdb.Client) error {
		regs, err := c.ReadRegisters(ctx)
		if err != nil {
			return err
		}
		t.PC, t.RA, t.SP = s.Where(regs["pc"]), s.callerWhere(ctx, c, regs["ra"]), hex(regs["sp"])
		if p, err := c.ReadRegister(ctx, "priv"); err == nil {
			t.Priv = privName(p)
		}
		t.Backtrace = s.unwind(ctx, c, regs, triageFrames)
		defer func() { t.Culprit = culprit(t.Backtrace, t.Trap) }()
		for _, f := range t.Backtrace.Frames {
			if f.Trap != nil && isFault(*f.Trap) {
				tr := *f.Trap
				tr.EPC = &f.Where
				t.Trap, t.TrapSource = &tr, "trap frame"
				t.Verdict, t.Walk = s.explain(ctx, c, tr.fault())
				return nil
			}
		}
		// Without a trap frame, scause is the last trap into S-mode: an
		// exception there may be the crash (a kernel that panics in its
		// trap handler without a frame to show); an interrupt is noise.
		if v, err := c.ReadRegister(ctx, "scause"); err == nil && v != 0 && isFault(DecodeCause(v)) {
			tr := DecodeCause(v)
			if e, err := c.ReadRegister(ctx, "sepc"); err == nil {
				w := s.Where(e)
				tr.EPC = &w
			}
			if v, err := c.ReadRegister(ctx, "stval"); err == nil {
				tr.TVal, tr.tval = hex(v), v
			}
			if e, err := c.ReadRegister(ctx, "sepc"); err == nil {
				tr.epc = e
			}
			if v, err := c.ReadRegister(ctx, "sstatus"); err == nil {
				tr.status = v
			}
			t.Trap, t.TrapSource = &tr, "scause: the last trap into supervisor mode, which may predate the crash"
			t.Verdict, t.Walk = s.explain(ctx, c, tr.fault())
		}
		return nil
	})
	return t, err
}

// isFault reports whether t is an exception that can crash a kernel: not
// an interrupt, and not a system call (an ecall is how a crash reached
// through a syscall entered the kernel, which the backtrace shows).
func isFault(t Trap) bool {
	return !t.Interrupt && (t.Code < 8 || t.Code > 11)
}
