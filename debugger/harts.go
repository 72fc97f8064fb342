package debugger

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// A guest's harts are the stub's threads: QEMU names vCPU n thread n+1,
// and on the virt board a vCPU's index is its hart ID (mhartid). The
// guest stops and runs as a whole; registers, memory through the MMU,
// backtraces and steps are per hart.

// LastHart asks a per-hart operation for the hart of the last stop.
const LastHart = -1

// hartThreads lists the guest's harts and their threads, in hart order.
// A stub that names no threads has one hart, 0. s.mu is held and the
// guest is stopped.
func (s *Session) hartThreads(ctx context.Context, c *gdb.Client) ([]string, error) {
	if s.threadsOf != c {
		ths, err := c.Threads(ctx)
		if err != nil {
			return nil, fmt.Errorf("debugger: list the harts: %w", err)
		}
		s.threads, s.threadsOf = ths, c
	}
	return s.threads, nil
}

// hartOf is the hart ID of a thread, false for a thread the stub does not
// number.
func hartOf(thread string) (int, bool) {
	n, ok := gdb.ThreadNumber(thread)
	return n - 1, ok
}

// on returns the thread of hart (LastHart: the hart of the last stop).
func (s *Session) on(ctx context.Context, c *gdb.Client, hart int) (*gdb.Thread, int, error) {
	if hart == LastHart {
		hart = s.hart
	}
	ths, err := s.hartThreads(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	for _, th := range ths {
		if h, ok := hartOf(th); ok && h == hart {
			return c.Thread(th), hart, nil
		}
	}
	if len(ths) == 1 && ths[0] == "" && hart == 0 {
		return c.Thread(""), 0, nil
	}
	return nil, 0, fmt.Errorf("no hart %d: the guest has %s", hart, hartRange(ths))
}

// onHart runs f, as one operation, on hart (LastHart: the hart of the last
// stop) with the guest stopped, and resumes it afterwards if it was
// running; on is the hart f ran on.
func (s *Session) onHart(ctx context.Context, hart int, f func(th *gdb.Thread) error) (on int, err error) {
	defer s.begin()()
	err = s.stopped(ctx, func(c *gdb.Client) error {
		th, h, err := s.on(ctx, c, hart)
		if err != nil {
			return err
		}
		on = h
		return f(th)
	})
	return on, err
}

func hartRange(ths []string) string {
	if len(ths) == 1 {
		return "one hart, 0"
	}
	first, _ := hartOf(ths[0])
	last, _ := hartOf(ths[len(ths)-1])
	return fmt.Sprintf("harts %d to %d", first, last)
}

// stoppedHart is the thread and hart of a stop, which becomes the hart
// per-hart operations act on by default. A stop that names no thread
// leaves the default as it was.
func (s *Session) stoppedHart(ctx context.Context, c *gdb.Client, st gdb.Stop) (*gdb.Thread, int, error) {
	if h, ok := hartOf(st.Thread); ok {
		s.hart = h
		return c.Thread(st.Thread), h, nil
	}
	return s.on(ctx, c, LastHart)
}

// processors reads Linux's map of CPU numbers to hart IDs
// (__cpuid_to_hartid_map, an SMP kernel's): hart -> processor. It is nil
// on a guest with one hart (where both are 0), without the symbol, or
// when no hart can read it.
func (s *Session) processors(ctx context.Context, c *gdb.Client, first *gdb.Thread) map[int]int {
	ths, err := s.hartThreads(ctx, c)
	if err != nil || len(ths) < 2 || s.cfg.Symbols == nil {
		return nil
	}
	if s.regs.CPUMap == "" {
		return nil
	}
	sym, err := s.cfg.Symbols.Lookup(s.regs.CPUMap)
	if err != nil || sym.Size < 8 || sym.Size > 8*4096 {
		return nil
	}
	// A virtual address: a hart in M-mode (firmware) cannot read it.
	tries := []*gdb.Thread{first}
	for _, th := range ths {
		if th != first.ID() {
			tries = append(tries, c.Thread(th))
		}
	}
	for _, th := range tries {
		b, err := th.ReadMemory(ctx, sym.Addr, int(sym.Size))
		if err != nil {
			continue
		}
		m := map[int]int{}
		for cpu := range len(b) / 8 {
			// INVALID_HARTID (ULONG_MAX) marks CPU numbers not in use.
			if h := binary.LittleEndian.Uint64(b[cpu*8:]); h < 1<<20 {
				m[int(h)] = cpu
			}
		}
		return m
	}
	return nil
}

// processor is the kernel's CPU number of hart, if known.
func (s *Session) processor(ctx context.Context, c *gdb.Client, th *gdb.Thread, hart int) *int {
	if p, ok := s.processors(ctx, c, th)[hart]; ok {
		return &p
	}
	return nil
}

// HartState is one hart at a glance: what it runs and how it got there.
type HartState struct {
	Hart      int  `json:"hart"`
	Processor *int `json:"processor,omitempty"`
	// Current marks the hart per-hart operations act on by default.
	Current bool   `json:"current,omitempty"`
	Priv    string `json:"priv,omitempty"`
	// State is panic, ipi, lock, trap, idle, user, firmware, machine mode
	// or running (stateWords says what each means).
	State string `json:"state"`
	// Halted says the hart waits in wfi for an interrupt.
	Halted bool   `json:"halted,omitempty"`
	PC     string `json:"pc"`
	// Backtrace is the functions from pc outwards; a frame a trap
	// interrupted carries its cause in brackets.
	Backtrace []string `json:"backtrace,omitempty"`

	// wait is the instruction a halted hart waits in.
	wait string
}

// stateWords say what each HartState.State means.
var stateWords = map[string]string{
	"panic":    "in panic (its stack holds panic, die or an oops)",
	"ipi":      "handling an IPI (a panic's stop request parks it here)",
	"lock":     "spinning on a lock (or waiting for another hart to answer)",
	"trap":     "in a trap handler (an interrupt or exception)",
	"idle":     "idle",
	"user":     "in user mode",
	"firmware": "in firmware (code outside the kernel's symbols at the firmware's level, such as OpenSBI), not started or parked",
	// A kernel's own code at the firmware's level: booted without
	// firmware, before it drops to the kernel's level, or a kernel that
	// stays there throughout.
	"machine mode": "running kernel code at the firmware's level (M-mode, EL2 or EL3)",
	"running":      "running kernel code",
}

// crashing are Linux's functions whose frame on a stack means the hart
// crashed (crashes also takes any function named like a panic).
var crashing = map[string]bool{
	"panic": true, "nmi_panic": true, "die": true, "die_kernel_fault": true,
	"make_task_dead": true, "oops_end": true, "do_trap_break": true,
}

// crashes reports whether a frame of fn on a stack means the hart crashed.
func crashes(fn string) bool { return crashing[fn] || panicLike(fn) }

// panicLike reports whether fn is named like a kernel's crash machinery,
// Linux or not: panic anywhere in the name (panic, kpanic, panic_halt),
// a word (between underscores) abort, die, halt, oops or hcf ("halt and
// catch fire"), or a C library's assertion or stack-protector failure.
// Linux's CPU hot-unplug (cpu_die, __cpu_die) and x86's idle halt
// (native_safe_halt, native_halt) are no crash.
func panicLike(fn string) bool {
	l := strings.ToLower(fn)
	switch {
	case l == "":
		return false
	case strings.Contains(l, "panic"):
		return true
	case strings.HasPrefix(l, "__assert_f") || strings.HasPrefix(l, "assert_fail") || strings.HasPrefix(l, "__stack_chk_fail"):
		return true
	case strings.Contains(l, "cpu_die"), strings.HasSuffix(l, "safe_halt"), l == "native_halt":
		// Hot-unplug, and x86's idle halt (native_safe_halt): no crash.
		return false
	}
	for _, w := range strings.FieldsFunc(l, func(r rune) bool { return r == '_' || r == '.' || r == '$' }) {
		switch w {
		case "abort", "die", "halt", "oops", "hcf":
			return true
		}
	}
	return false
}

// hartFacts is what a hart's CSRs and the stub say of it, besides its
// stack.
type hartFacts struct {
	// level is the privilege level; its Name is "" when it does not read.
	level  arch.Privilege
	halted bool // waiting in wfi
	// fault is the last trap the hart took when it is a fault that the
	// hart has not returned from: scause taken from S-mode (sstatus.SPP,
	// which sret clears to U) on a hart in S-mode, or mcause taken from
	// S- or M-mode (mstatus.MPP, which mret clears to U) on a hart in
	// M-mode. A kernel that crashes in its trap handler, without a trap
	// frame the unwinder knows, shows its fault here; firmware that
	// emulated an access and returned does not.
	fault *Trap
}

// facts reads a hart's privilege mode, whether it waits in wfi, and the
// fault it is in, if any. The guest must be stopped.
func (s *Session) facts(ctx context.Context, th *gdb.Thread) hartFacts {
	var f hartFacts
	if p, err := th.ReadRegister(ctx, s.regs.Priv); err == nil {
		f.level = s.d.Privilege(p)
	}
	if info, err := th.Client().ThreadInfo(ctx, th.ID()); err == nil {
		f.halted = gdb.Halted(info)
	}
	if t, ok := s.d.Handling(ctx, th, f.level); ok {
		tr := s.trap(t, true)
		f.fault = &tr
	}
	return f
}

// idling are the idle loop's functions.
var idling = map[string]bool{
	"arch_cpu_idle": true, "default_idle_call": true, "do_idle": true, "cpu_idle_poll": true,
	"cpu_startup_entry": true, "wait_for_interrupt": true,
	// x86: the idle loop halts in these.
	"native_safe_halt": true, "arch_safe_halt": true, "default_idle": true, "amd_e400_idle": true,
}

// spinning reports whether fn busy-waits: for a lock, or for other harts
// to run a function it asked of them.
func spinning(fn string) bool {
	for _, p := range []string{"_raw_spin_lock", "_raw_read_lock", "_raw_write_lock", "queued_spin_lock_slowpath",
		"queued_read_lock_slowpath", "queued_write_lock_slowpath", "do_raw_spin_lock", "__pv_queued_spin_lock",
		"csd_lock_wait", "smp_call_function_many_cond", "osq_lock", "mutex_spin_on_owner", "rwsem_optimistic_spin"} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

// classify says what a hart does from its privilege mode, its stack
// (innermost frame first) and whether its trap CSRs show a fault it is
// handling (fault): M-mode outside the kernel's symbols is firmware; a
// crash anywhere on the stack wins; else what runs above the innermost
// trap frame; else a fault being handled; else the mode.
func classify(d arch.Debugger, priv arch.Privilege, frames []Frame, fault bool) string {
	if priv.Firmware && (len(frames) == 0 || frames[0].Function == "") {
		return "firmware"
	}
	for _, f := range frames {
		if crashes(f.Function) {
			return "panic"
		}
	}
	for _, f := range frames {
		if f.Trap != nil {
			// f is what a trap interrupted; the frames before it are
			// the trap's handler.
			if f.Trap.Interrupt || d.IsFault(f.Trap.raw) {
				return "trap"
			}
			break // a system call: the kernel runs for a task
		}
		switch {
		case f.Function == "handle_IPI":
			return "ipi"
		case spinning(f.Function):
			return "lock"
		case idling[f.Function]:
			return "idle"
		case d.IsVector(f.Function):
			return "trap"
		}
	}
	switch {
	case fault:
		return "trap"
	case priv.User:
		return "user"
	case priv.Firmware:
		return "machine mode"
	}
	return "running"
}

// frameWords is a backtrace as short words: function names, a trap's
// cause in brackets after the frame it interrupted, a user pc as such.
func frameWords(bt Backtrace, max int) []string {
	var out []string
	for _, f := range bt.Frames {
		if len(out) == max {
			out = append(out, "...")
			break
		}
		w := f.Function
		switch {
		case f.User:
			w = "user " + f.Addr
		case w == "":
			w = f.Addr
		}
		if f.Trap != nil {
			w += " [" + f.Trap.Cause + "]"
		}
		out = append(out, w)
	}
	return out
}

// hartState looks at one hart: privilege, pc and a short backtrace.
func (s *Session) hartState(ctx context.Context, th *gdb.Thread, hart, frames int) HartState {
	h := HartState{Hart: hart, Current: hart == s.hart, wait: s.regs.Wait}
	regs, err := th.ReadRegisters(ctx)
	if err != nil {
		h.State, h.PC = "unknown", "registers unreadable: "+err.Error()
		return h
	}
	bt := s.unwind(ctx, th, regs, frames)
	return s.summarize(h, s.facts(ctx, th), regs, bt, frames)
}

// summarize fills h from a hart's facts, registers and backtrace.
func (s *Session) summarize(h HartState, f hartFacts, regs map[string]uint64, bt Backtrace, frames int) HartState {
	h.Priv, h.Halted, h.wait = f.level.Name, f.halted, s.regs.Wait
	w, _ := s.at(regs)
	h.PC = w.String()
	h.State = classify(s.d, f.level, bt.Frames, f.fault != nil)
	if h.Halted && (h.State == "running" || h.State == "machine mode") {
		// Kernel code waiting in wfi, outside an idle loop this
		// package knows by name (a scheduler that waits for work).
		h.State = "idle"
	}
	h.Backtrace = frameWords(bt, frames)
	return h
}

// allHartsFrames bounds each hart's backtrace in AllHarts: enough to see
// through a trap frame into what was interrupted.
const allHartsFrames = 8

// AllHarts looks at every hart: its privilege mode, pc, state and a
// short backtrace. It stops a running guest for the look and resumes it.
func (s *Session) AllHarts(ctx context.Context) ([]HartState, error) {
	defer s.begin()()
	var out []HartState
	err := s.stopped(ctx, func(c *gdb.Client) error {
		ths, err := s.hartThreads(ctx, c)
		if err != nil {
			return err
		}
		cur, _, err := s.on(ctx, c, LastHart)
		if err != nil {
			cur = c.Thread(ths[0])
		}
		procs := s.processors(ctx, c, cur)
		for i, th := range ths {
			hart, ok := hartOf(th)
			if !ok {
				hart = i
			}
			h := s.hartState(ctx, c.Thread(th), hart, allHartsFrames)
			if p, ok := procs[hart]; ok {
				h.Processor = &p
			}
			out = append(out, h)
		}
		return nil
	})
	return out, err
}

// Line is a hart's state as one line of text.
func (h HartState) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "hart %d", h.Hart)
	if h.Processor != nil && *h.Processor != h.Hart {
		fmt.Fprintf(&b, " (cpu %d)", *h.Processor)
	}
	fmt.Fprintf(&b, " %s", h.State)
	if h.Halted {
		b.WriteString(", " + h.wait)
	}
	fmt.Fprintf(&b, ": %s", h.PC)
	if len(h.Backtrace) > 1 {
		fmt.Fprintf(&b, " < %s", strings.Join(h.Backtrace[1:], " < "))
	}
	return b.String()
}
