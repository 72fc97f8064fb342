package arm64

import (
	"context"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// A synchronous exception's syndrome (ESR_ELx): the exception class EC
// in bits 31:26, the instruction length IL in 25 and the class's ISS
// below. An arch.Trap's Code is the whole syndrome; interrupts (IRQ, FIQ,
// SError) leave none, and are told by the vector they enter.

// Exception classes the verdicts tell apart.
const (
	ecUnknown     = 0x00
	ecSVC         = 0x15
	ecHVC         = 0x16
	ecSMC         = 0x17
	ecSVC32       = 0x11
	ecIAbortLower = 0x20
	ecIAbort      = 0x21
	ecPCAlign     = 0x22
	ecDAbortLower = 0x24
	ecDAbort      = 0x25
	ecSPAlign     = 0x26
	ecSError      = 0x2f
	ecBRK         = 0x3c
)

var classNames = map[uint64]string{
	0x00: "undefined instruction (unknown reason)", 0x01: "trapped WFI or WFE",
	0x03: "trapped AArch32 coprocessor access", 0x07: "trapped SVE, SIMD or floating-point access",
	0x0d: "branch target exception (BTI)", 0x0e: "illegal execution state",
	0x11: "system call (AArch32 SVC)", 0x15: "system call (SVC)", 0x16: "hypervisor call (HVC)",
	0x17: "secure monitor call (SMC)", 0x18: "trapped MSR, MRS or system instruction",
	0x19: "trapped SVE access", 0x1c: "pointer authentication failure",
	0x20: "instruction abort from a lower level", 0x21: "instruction abort",
	0x22: "PC alignment fault", 0x24: "data abort from a lower level", 0x25: "data abort",
	0x26: "SP alignment fault", 0x28: "AArch32 floating-point exception", 0x2c: "floating-point exception",
	0x2f: "SError interrupt", 0x30: "hardware breakpoint from a lower level", 0x31: "hardware breakpoint",
	0x32: "software step from a lower level", 0x33: "software step", 0x34: "watchpoint from a lower level",
	0x35: "watchpoint", 0x38: "AArch32 BKPT", 0x3c: "BRK instruction",
}

// unknownSyndrome is a trap frame's exception whose syndrome a later
// exception has overwritten.
const unknownSyndrome = ^uint64(0)

// decodeESR decodes a syndrome.
func decodeESR(esr uint64) arch.Trap {
	ec := esr >> 26 & 0x3f
	name := classNames[ec]
	if name == "" {
		name = fmt.Sprintf("exception class %#x", ec)
	}
	return arch.Trap{Cause: fmt.Sprintf("%s (ESR %#x)", name, esr), Code: esr}
}

// interrupt is an exception without a syndrome, by its vector's kind.
func interrupt(kind string) arch.Trap {
	return arch.Trap{Cause: kind, Interrupt: true}
}

// abort says whether ec is an instruction or data abort, and whether
// from a lower level.
func abort(ec uint64) (isAbort, lower bool) {
	switch ec {
	case ecIAbortLower, ecDAbortLower:
		return true, true
	case ecIAbort, ecDAbort:
		return true, false
	}
	return false, false
}

// farValid says whether FAR holds the faulting address of syndrome esr:
// aborts, alignment faults and watchpoints set it unless FnV says not.
func farValid(esr uint64) bool {
	switch esr >> 26 & 0x3f {
	case ecIAbortLower, ecIAbort, ecDAbortLower, ecDAbort:
		return esr>>10&1 == 0
	case ecPCAlign, 0x34, 0x35:
		return true
	}
	return false
}

// lastTrap reads the last synchronous exception taken into EL el: its
// syndrome, return address, fault address and saved PSTATE.
func lastTrap(ctx context.Context, r arch.Reader, el string) (arch.Trap, bool) {
	esr, err := r.ReadRegister(ctx, "ESR_"+el)
	if err != nil || esr == 0 {
		return arch.Trap{}, false
	}
	t := decodeESR(esr)
	if v, err := r.ReadRegister(ctx, "ELR_"+el); err == nil {
		t.PC, t.HasPC = v, true
	}
	if farValid(esr) {
		if v, err := r.ReadRegister(ctx, "FAR_"+el); err == nil {
			t.Addr, t.HasAddr = v, true
		}
	}
	if v, err := r.ReadRegister(ctx, "SPSR_"+el); err == nil {
		t.Status = v
	}
	t.Firmware = el != "EL1"
	return t, true
}

// LastTrap reads the last synchronous exception into EL1 (ESR_EL1,
// ELR_EL1, FAR_EL1, SPSR_EL1), or with firmware into EL2. ok is false
// when the syndrome does not read or is 0: no exception taken.
func (debugger) LastTrap(ctx context.Context, r arch.Reader, firmware bool) (arch.Trap, bool) {
	if firmware {
		return lastTrap(ctx, r, "EL2")
	}
	return lastTrap(ctx, r, "EL1")
}

// Handling is the fault a vCPU at EL1 (or EL2) is in, if any: its last
// exception into that level taken from that level (SPSR's M[3:2]), a
// fault. An exception from EL0 went back to user mode or killed a task.
func (d debugger) Handling(ctx context.Context, r arch.Reader, p arch.Privilege) (arch.Trap, bool) {
	if p.Name != "EL1" && p.Name != "EL2" {
		return arch.Trap{}, false
	}
	t, ok := lastTrap(ctx, r, p.Name)
	if !ok || !d.IsFault(t) || level(t.Status) != p.Name {
		return arch.Trap{}, false
	}
	return t, true
}

// IsFault reports whether t is an exception that can crash a kernel: not
// an interrupt, not a call (SVC, HVC, SMC: how a crash reached through a
// system call entered the kernel, which the backtrace shows), and with a
// syndrome.
func (debugger) IsFault(t arch.Trap) bool {
	if t.Interrupt || t.Code == unknownSyndrome {
		return false
	}
	switch t.Code >> 26 & 0x3f {
	case ecSVC, ecSVC32, ecHVC, ecSMC:
		return false
	}
	return true
}

func (debugger) Sources() arch.TrapSources {
	return arch.TrapSources{
		Kernel:   "ESR_EL1: the last synchronous exception into EL1, which may predate the crash",
		Firmware: "ESR_EL2: the last synchronous exception into EL2 (the vCPU is at EL2 or above), which may predate the crash",
		NoKernel: "ESR_EL2: the last synchronous exception into EL2 (ESR_EL1 is 0: this vCPU never took one into EL1), which may predate the crash",
	}
}

// View decodes the syndromes of the last exceptions into EL1 and EL2,
// PSTATE, the translation registers, and the exception being taken when
// the vCPU is at an entry of the vector table VBAR_EL1 holds (or in the
// kernel's entry code before its handler).
func (d debugger) View(get func(string) (uint64, bool), pc uint64, fn string) arch.TrapView {
	var v arch.TrapView
	trap := func(el string) *arch.Trap {
		esr, ok := get("ESR_" + el)
		if !ok || esr == 0 {
			return nil
		}
		// No pc: ELR_EL1 is the last exception's, IRQs included, while
		// ESR_EL1 is the last synchronous exception's.
		t := decodeESR(esr)
		if farValid(esr) {
			t.Addr, t.HasAddr = get("FAR_" + el)
		}
		t.Status, _ = get("SPSR_" + el)
		return &t
	}
	v.Kernel, v.Firmware = trap("EL1"), trap("EL2")
	if p, ok := get("cpsr"); ok {
		v.Status = "PSTATE " + decodePSTATE(p)
		if s, ok := get("SPSR_EL1"); ok {
			v.Status += "; SPSR_EL1 " + decodePSTATE(s)
		}
	}
	v.Translation = decodeTranslation(get)
	vbar, hasVBAR := get("VBAR_EL1")
	switch {
	case hasVBAR && pc >= vbar && pc < vbar+0x800:
		// Entries of 0x80 bytes: from EL1 with SP_EL0, EL1 with SP_EL1,
		// EL0 in AArch64, EL0 in AArch32; each sync, IRQ, FIQ, SError.
		if kind := (pc - vbar) >> 7 & 3; kind != 0 {
			t := interrupt(vectorKinds[kind])
			v.Taking = &t
		} else if v.Kernel != nil {
			t := *v.Kernel
			v.Taking = &t
		}
	case d.IsVector(fn) && v.Kernel != nil && strings.HasSuffix(fn, "_sync"):
		t := *v.Kernel
		v.Taking = &t
	}
	if v.Taking != nil {
		// Taking it now: ELR_EL1 and SPSR_EL1 are this exception's.
		v.Taking.PC, v.Taking.HasPC = get("ELR_EL1")
	}
	return v
}

var vectorKinds = [4]string{"synchronous exception", "IRQ", "FIQ", "SError"}

// fault is what a verdict is drawn from: the trap, and for aborts the
// walk of the faulting address.
type fault struct {
	trap arch.Trap
	walk *arch.Walk
	insn string // for an undefined instruction, its decoding
}

func (f fault) esr() uint64 { return f.trap.Code }
func (f fault) ec() uint64  { return f.esr() >> 26 & 0x3f }

// from is the level the exception came from, by its class or its saved
// PSTATE.
func (f fault) from() string {
	isAbort, lower := abort(f.ec())
	switch {
	case isAbort && lower:
		return "EL0"
	case isAbort && f.trap.Firmware:
		return "EL2"
	case isAbort:
		return "EL1"
	}
	return level(f.trap.Status)
}

// verdict says in one sentence why the exception happened.
func verdict(f fault) string {
	t := f.trap
	if t.Interrupt {
		return fmt.Sprintf("an interrupt (%s), not a fault", t.Cause)
	}
	if t.Code == unknownSyndrome {
		return t.Cause
	}
	pc := hex(t.PC)
	switch ec := f.ec(); ec {
	case ecIAbortLower, ecIAbort, ecDAbortLower, ecDAbort:
		return abortVerdict(f)
	case ecUnknown:
		what := "an instruction"
		if f.insn != "" {
			what = fmt.Sprintf("%q", f.insn)
		}
		return fmt.Sprintf("undefined instruction at %s: %s that this CPU does not implement or %s may not execute (a bad jump into data, corrupt code, or a feature QEMU's -cpu lacks)", pc, what, f.from())
	case ecBRK:
		imm := f.esr() & 0xffff
		switch {
		case imm == 0x800:
			return fmt.Sprintf("a BRK #0x800 at %s: in Linux a BUG() or WARN() (its message precedes the panic)", pc)
		case imm == 0x100:
			return fmt.Sprintf("a BRK #0x100 at %s: Linux's fault-injection break (an unexpected kernel fault)", pc)
		case imm>>8 == 0x55:
			return fmt.Sprintf("a BRK #%#x at %s: an undefined-behaviour sanitizer (UBSAN) trap", imm, pc)
		}
		return fmt.Sprintf("a BRK #%#x at %s: a software breakpoint (a debugger's, or a compiler's trap)", imm, pc)
	case ecPCAlign:
		return fmt.Sprintf("PC alignment fault: a branch to %s, which is not a multiple of 4", hex(t.Addr))
	case ecSPAlign:
		return fmt.Sprintf("SP alignment fault at %s: a load or store through a stack pointer that is not 16-byte aligned", pc)
	case ecSVC, ecSVC32:
		return "a system call (SVC), not a fault"
	case ecHVC, ecSMC:
		return fmt.Sprintf("a call to a higher level (%s), not a fault", t.Cause)
	case ecSError:
		return "an SError: an asynchronous external abort (a device or memory reported an error the CPU cannot tie to one instruction)"
	case 0x18:
		return fmt.Sprintf("a trapped system register access at %s: the register does not exist on this CPU, or %s may not use it", pc, f.from())
	case 0x1c:
		return fmt.Sprintf("pointer authentication failed at %s: a signed return address or pointer was corrupted or forged", pc)
	case 0x0d:
		return fmt.Sprintf("branch target exception at %s: an indirect branch to an instruction that is not a BTI landing pad", pc)
	case 0x0e:
		return fmt.Sprintf("illegal execution state at %s: an exception return to a level or state that is not allowed", pc)
	}
	return t.Cause
}

// faultStatus names a fault status code (DFSC, IFSC) and its level.
func faultStatus(fsc uint64) (kind string, level int, hasLevel bool) {
	lvl := int(fsc & 3)
	switch fsc >> 2 {
	case 0:
		return "address size fault", lvl, true
	case 1:
		return "translation fault", lvl, true
	case 2:
		return "access flag fault", lvl, true
	case 3:
		return "permission fault", lvl, true
	case 5:
		return "synchronous external abort on a table walk", lvl, true
	}
	switch fsc {
	case 0x10:
		return "synchronous external abort", 0, false
	case 0x11:
		return "tag check fault (MTE)", 0, false
	case 0x21:
		return "alignment fault", 0, false
	case 0x30:
		return "TLB conflict abort", 0, false
	case 0x31:
		return "unsupported atomic hardware update", 0, false
	case 0x2b:
		return "translation fault", -1, true
	}
	return fmt.Sprintf("fault status %#x", fsc), 0, false
}

// abortVerdict explains an instruction or data abort: its kind and level
// by the syndrome, and why by the walk of the faulting address.
func abortVerdict(f fault) string {
	esr := f.esr()
	instr := f.ec() == ecIAbort || f.ec() == ecIAbortLower
	head := "data abort: "
	if instr {
		head = "instruction abort: "
	}
	kind, level, hasLevel := faultStatus(esr & 0x3f)
	head += kind
	if hasLevel {
		head += fmt.Sprintf(" at level %d", level)
	}
	access := "an instruction fetch"
	if !instr {
		access = "a read"
		if esr>>6&1 == 1 { // WnR
			access = "a write"
		}
	}
	addr := "an unknown address (FAR not valid)"
	if f.trap.HasAddr {
		addr = "address " + hex(f.trap.Addr)
	}
	by := fmt.Sprintf(" (%s from %s at %s)", access, f.from(), hex(f.trap.PC))
	w := f.walk
	switch kind {
	case "translation fault":
		why := "nothing is mapped there"
		if f.trap.HasAddr && f.trap.Addr < 0x10000 {
			why = "a NULL pointer dereference: nothing is mapped there"
		}
		if w != nil && w.Faulty && len(w.Levels) > 0 {
			l := w.Levels[len(w.Levels)-1]
			why += fmt.Sprintf(" (the level-%d descriptor at %s is %s)", l.Level, l.PTEAddr, l.Flags)
		} else if w != nil && w.Faulty {
			why += " (" + w.Fault + ")"
		} else if w != nil && w.PA != "" {
			why += "; the page table maps it now (" + w.Flags + "): the mapping changed since the fault, or a TLB was stale"
		}
		return head + ", " + addr + by + ": " + why
	case "permission fault":
		return head + ", " + permission(f, instr, access) + " at " + hex(f.trap.Addr) + fmt.Sprintf(" from %s at %s", f.from(), hex(f.trap.PC)) + leafLevel(w, level)
	case "access flag fault":
		return head + ", " + addr + by + ": the entry's access flag is clear (AF=0), and this CPU does not set it in hardware" + leafLevel(w, level)
	case "alignment fault":
		return head + ", " + addr + by + ": an unaligned access to Device memory, an unaligned exclusive or atomic access, or SCTLR_EL1.A is set"
	case "synchronous external abort":
		return head + ", " + addr + by + ": no memory or device answered at" + physical(w)
	case "address size fault":
		return head + ", " + addr + by + ": an output address wider than the CPU's physical address size (a corrupt table entry or TTBR)"
	}
	return head + ", " + addr + by
}

// permission explains a permission fault by the leaf's AP and XN bits.
func permission(f fault, instr bool, access string) string {
	w := f.walk
	if w == nil || w.Faulty || w.PA == "" {
		if access == "a write" {
			return "write to a page the page table does not allow (the walk could not say why)"
		}
		return access + " the page table does not allow (the walk could not say why)"
	}
	d := w.Leaf
	user := f.from() == "EL0"
	pan := f.trap.Status>>22&1 == 1
	switch {
	case instr && user && d&descUXN != 0:
		return "execute of a page EL0 may not execute (UXN)"
	case instr && !user && d&descPXN != 0:
		return "execute of a page EL1 may not execute (PXN)"
	case instr && !user && d&apEL0 != 0:
		return "execute of a user page from EL1 (a user-writable mapping is never executable at EL1)"
	case user && d&apEL0 == 0:
		return "EL0 access to a kernel page (AP[1]=0)"
	case access == "a write" && d&apRO != 0:
		return "write to a read-only page"
	case !user && d&apEL0 != 0 && pan:
		return "EL1 access to a user page with PSTATE.PAN set (use the uaccess helpers, which clear it)"
	}
	return fmt.Sprintf("%s the page table now allows (%s): the mapping changed since the fault, or a TLB was stale", access, w.Flags)
}

// leafLevel names the walk's leaf level, and says so when it is not the
// level the syndrome reports.
func leafLevel(w *arch.Walk, level int) string {
	if w == nil || len(w.Levels) == 0 {
		return ""
	}
	leaf := w.Levels[len(w.Levels)-1]
	if leaf.Level == level {
		return ": the walk's leaf is a " + leaf.Flags
	}
	return fmt.Sprintf(": the walk now ends at level %d (%s), not the syndrome's level %d: the mapping changed since the fault", leaf.Level, leaf.Flags, level)
}

func physical(w *arch.Walk) string {
	if w == nil || w.PA == "" {
		return " its physical address"
	}
	return " physical " + w.PA
}

// Verdict draws the verdict of t, walking its address for aborts and
// decoding the instruction of an undefined-instruction exception. The
// vCPU must be stopped.
func (d debugger) Verdict(ctx context.Context, m arch.Machine, t arch.Trap) (string, *arch.Walk) {
	f := fault{trap: t}
	if t.Interrupt || t.Code == unknownSyndrome {
		return verdict(f), nil
	}
	switch f.ec() {
	case ecIAbortLower, ecIAbort, ecDAbortLower, ecDAbort:
		if t.HasAddr {
			if w, err := m.Translate(ctx, t.Addr); err == nil {
				f.walk = &w
			}
		}
	case ecUnknown:
		if code, err := m.ReadMemory(ctx, t.PC, 4); err == nil && len(code) == 4 {
			if in := d.Disassemble(code, t.PC, 1, nil); len(in) == 1 {
				f.insn = in[0].Text
			}
		}
	}
	return verdict(f), f.walk
}
