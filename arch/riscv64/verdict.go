package riscv64

import (
	"context"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

var exceptionNames = map[uint64]string{
	0: "instruction address misaligned", 1: "instruction access fault",
	2: "illegal instruction", 3: "breakpoint",
	4: "load address misaligned", 5: "load access fault",
	6: "store/AMO address misaligned", 7: "store/AMO access fault",
	8: "environment call from U-mode", 9: "environment call from S-mode",
	10: "environment call from VS-mode", 11: "environment call from M-mode",
	12: "instruction page fault", 13: "load page fault", 15: "store/AMO page fault",
	18: "software check", 19: "hardware error",
	20: "instruction guest-page fault", 21: "load guest-page fault",
	22: "virtual instruction", 23: "store/AMO guest-page fault",
}

var interruptNames = map[uint64]string{
	1: "supervisor software interrupt", 3: "machine software interrupt",
	5: "supervisor timer interrupt", 7: "machine timer interrupt",
	9: "supervisor external interrupt", 11: "machine external interrupt",
	13: "counter overflow interrupt",
}

// DecodeCause decodes an xcause value.
func DecodeCause(v uint64) arch.Trap {
	t := arch.Trap{Interrupt: v>>63 == 1, Code: v &^ (1 << 63)}
	names := exceptionNames
	if t.Interrupt {
		names = interruptNames
	}
	t.Cause = names[t.Code]
	if t.Cause == "" {
		kind := "exception"
		if t.Interrupt {
			kind = "interrupt"
		}
		t.Cause = fmt.Sprintf("reserved %s %d", kind, t.Code)
	}
	return t
}

// LastTrap reads the last trap a hart took into supervisor mode (scause,
// sepc, stval, sstatus), or with firmware into machine mode (mcause,
// mepc, mtval, mstatus). ok is false when the cause does not read or is
// 0, its value at reset: no trap taken (a misaligned fetch, cause 0,
// cannot happen on a hart with compressed instructions).
func (debugger) LastTrap(ctx context.Context, r arch.Reader, firmware bool) (arch.Trap, bool) {
	p := "s"
	if firmware {
		p = "m"
	}
	v, err := r.ReadRegister(ctx, p+"cause")
	if err != nil || v == 0 {
		return arch.Trap{}, false
	}
	tr := DecodeCause(v)
	tr.Firmware = firmware
	if e, err := r.ReadRegister(ctx, p+"epc"); err == nil {
		tr.PC, tr.HasPC = e, true
	}
	if v, err := r.ReadRegister(ctx, p+"tval"); err == nil {
		tr.Addr, tr.HasAddr = v, true
	}
	if v, err := r.ReadRegister(ctx, p+"status"); err == nil {
		tr.Status = v
	}
	return tr, true
}

// Handling is the fault a hart is in, if any: scause taken from S-mode
// (sstatus.SPP, which sret clears to U) on a hart in S-mode, or mcause
// taken from S- or M-mode (mstatus.MPP, which mret clears to U) on a hart
// in M-mode. A kernel that crashes in its trap handler, without a trap
// frame the unwinder knows, shows its fault here; firmware that emulated
// an access and returned does not.
func (d debugger) Handling(ctx context.Context, r arch.Reader, p arch.Privilege) (arch.Trap, bool) {
	switch p.Name {
	case "supervisor":
		if t, ok := d.LastTrap(ctx, r, false); ok && d.IsFault(t) && t.Status>>8&1 == 1 {
			return t, true
		}
	case "machine":
		if t, ok := d.LastTrap(ctx, r, true); ok && d.IsFault(t) && t.Status>>11&3 != 0 {
			return t, true
		}
	}
	return arch.Trap{}, false
}

// IsFault reports whether t is an exception that can crash a kernel: not
// an interrupt, and not a system call (an ecall is how a crash reached
// through a syscall entered the kernel, which the backtrace shows).
func (debugger) IsFault(t arch.Trap) bool {
	return !t.Interrupt && (t.Code < 8 || t.Code > 11)
}

func (debugger) Sources() arch.TrapSources {
	return arch.TrapSources{
		Kernel:   "scause: the last trap into supervisor mode, which may predate the crash",
		Firmware: "mcause: the last trap into machine mode (the hart is in M-mode: a kernel that runs there, or firmware), which may predate the crash",
		NoKernel: "mcause: the last trap into machine mode (scause is 0: this hart never trapped into supervisor mode), which may predate the crash",
	}
}

// fault is what a verdict is drawn from: the trap, the state the hart
// trapped from, and for page faults the walk of the faulting address.
type fault struct {
	trap   arch.Trap
	epc    uint64
	tval   uint64
	status uint64 // sstatus (or pt_regs.status) at the trap: SPP, SUM, MXR, FS
	// machine says the trap was taken into M-mode (mcause, mepc, mtval):
	// status is then mstatus, whose MPP says where it came from.
	machine bool
	walk    *arch.Walk // for page and access faults, the walk of tval
	insn    string     // for an illegal instruction, its decoding
	bits    uint64     // and its bits
}

// mode is the privilege mode the trap came from: sstatus.SPP for a trap
// into S-mode, mstatus.MPP for one into M-mode.
func (f fault) mode() string {
	if f.machine {
		switch f.status >> 11 & 3 {
		case 0:
			return "U-mode"
		case 1:
			return "S-mode"
		}
		return "M-mode"
	}
	if f.status>>8&1 == 0 {
		return "U-mode"
	}
	return "S-mode"
}

// fromUser reports whether the trapped access came from user mode.
func (f fault) fromUser() bool { return f.mode() == "U-mode" }

// physicalAccess reports whether the trapped access used a physical
// address: M-mode does not translate (MPRV aside, which a trap's mstatus
// no longer shows), so tval is where the access went.
func (f fault) physicalAccess() bool { return f.machine && f.mode() == "M-mode" }

// statusCSR names the status register the trap's state is read from.
func (f fault) statusCSR() string {
	if f.machine {
		return "mstatus"
	}
	return "sstatus"
}

// verdict says in one sentence why the trap happened.
func verdict(f fault) string {
	t := f.trap
	if t.Interrupt {
		return fmt.Sprintf("an interrupt (%s), not a fault", t.Cause)
	}
	mode := f.mode()
	at := hex(f.tval)
	switch t.Code {
	case 0:
		return fmt.Sprintf("instruction address misaligned: a jump or branch to %s, which is not a multiple of 2", at)
	case 1:
		if f.physicalAccess() {
			return fmt.Sprintf("instruction access fault at %s from M-mode (a physical address: M-mode does not translate): no memory or device there to execute, or a locked PMP entry forbids it", at)
		}
		return fmt.Sprintf("instruction access fault at %s%s: no memory or device there, or PMP forbids executing it", at, physical(f.walk))
	case 2:
		return illegal(f, mode)
	case 3:
		return fmt.Sprintf("a breakpoint (ebreak) at %s: in Linux a BUG() or WARN() (its message precedes the panic), or a debugger's breakpoint", hex(f.epc))
	case 4, 6:
		kind := map[uint64]string{4: "load", 6: "store"}[t.Code]
		return fmt.Sprintf("misaligned %s at %s: the address is not a multiple of the access size, and this hart traps on that", kind, at)
	case 5, 7:
		kind := map[uint64]string{5: "load", 7: "store"}[t.Code]
		if f.physicalAccess() {
			return fmt.Sprintf("%s access fault at %s from M-mode (a physical address: M-mode does not translate): no memory or device there, or a locked PMP entry forbids the access", kind, at)
		}
		return fmt.Sprintf("%s access fault at %s%s: no memory or device there, or PMP forbids the access", kind, at, physical(f.walk))
	case 8:
		return "a system call (ecall from U-mode), not a fault"
	case 9:
		return "an SBI call (ecall from S-mode), not a fault"
	case 11:
		return "an ecall from M-mode, not a fault"
	case 12, 13, 15:
		return pageFault(f, mode)
	}
	return t.Cause
}

func physical(w *arch.Walk) string {
	if w == nil || w.PA == "" || w.Mode == "Bare" {
		return ""
	}
	return " (physical " + w.PA + ")"
}

func illegal(f fault, mode string) string {
	what := "an instruction"
	if f.insn != "" {
		what = fmt.Sprintf("%q (%#x)", f.insn, f.bits)
	}
	op := strings.Fields(f.insn + " ")[0]
	fp := strings.HasPrefix(op, "f") && op != "fence" && op != "fence.i" || strings.HasPrefix(op, "c.f")
	switch {
	case f.insn == "" || strings.HasPrefix(f.insn, ".word") || strings.HasPrefix(f.insn, ".half"):
		return fmt.Sprintf("illegal instruction at %s: %s that this hart does not implement (a bad jump into data, corrupt code, or an extension QEMU's -cpu lacks)", hex(f.epc), what)
	case fp && f.status>>13&3 == 0:
		return fmt.Sprintf("illegal instruction at %s: %s uses the FPU while %s.FS is off (the kernel must enable FS first)", hex(f.epc), what, f.statusCSR())
	case strings.HasPrefix(op, "csr"):
		return fmt.Sprintf("illegal instruction at %s: %s accesses a CSR that does not exist or that %s may not use", hex(f.epc), what, mode)
	case op == "mret" || op == "sret" || op == "wfi" || op == "sfence.vma" || op == "hfence.vvma" || op == "hfence.gvma":
		return fmt.Sprintf("illegal instruction at %s: %s is privileged beyond %s (or trapped by mstatus.TSR/TW/TVM)", hex(f.epc), what, mode)
	}
	return fmt.Sprintf("illegal instruction at %s: %s is not allowed in %s on this hart", hex(f.epc), what, mode)
}

func pageFault(f fault, mode string) string {
	kind := map[uint64]string{12: "instruction page fault", 13: "load page fault", 15: "store page fault"}[f.trap.Code]
	head := fmt.Sprintf("%s at %s from %s: ", kind, hex(f.tval), mode)
	w := f.walk
	switch {
	case w == nil:
		return head + "the page table could not be walked"
	case w.Faulty && strings.Contains(w.Fault, "V=0"):
		lvl := w.Levels[len(w.Levels)-1]
		return head + fmt.Sprintf("no mapping (the level-%d PTE at %s is not valid)", lvl.Level, lvl.PTEAddr)
	case w.Faulty:
		return head + "the page table is malformed: " + w.Fault
	case w.Mode == "Bare":
		return head + "but translation is off (satp Bare) now: satp changed since the fault"
	}
	pte := w.Leaf
	has := func(bit uint64) bool { return pte&bit != 0 }
	sum, mxr := f.status>>18&1 == 1, f.status>>19&1 == 1
	switch {
	case f.fromUser() && !has(pteU):
		return head + "a user access to a supervisor page (U=0)"
	case !f.fromUser() && has(pteU) && f.trap.Code == 12:
		return head + "S-mode may never execute a user page (U=1)"
	case !f.fromUser() && has(pteU) && !sum:
		return head + "a user page (U=1) touched from S-mode with sstatus.SUM clear (use the uaccess helpers, which set it)"
	case f.trap.Code == 12 && !has(pteX):
		return head + "the page is not executable (X=0)"
	case f.trap.Code == 13 && !has(pteR) && !(mxr && has(pteX)):
		return head + "the page is not readable (R=0)"
	case f.trap.Code == 15 && !has(pteW):
		return head + "the page is not writable (W=0): it is mapped read-only"
	case !has(pteA):
		return head + "the accessed bit is clear (A=0) on a hart that does not set A/D itself"
	case f.trap.Code == 15 && !has(pteD):
		return head + "the dirty bit is clear (D=0) on a hart that does not set A/D itself"
	}
	return head + fmt.Sprintf("the page table now allows it (%s): the mapping changed since the fault, or a TLB was stale (a missing sfence.vma)", w.Flags)
}

// Verdict draws the verdict of t, walking its address for page and access
// faults (not for an access M-mode made, whose address is physical) and
// decoding the instruction of an illegal-instruction trap. The hart must
// be stopped.
func (d debugger) Verdict(ctx context.Context, m arch.Machine, t arch.Trap) (string, *arch.Walk) {
	f := fault{trap: t, epc: t.PC, tval: t.Addr, status: t.Status, machine: t.Firmware}
	switch f.trap.Code {
	case 1, 5, 7, 12, 13, 15:
		if !f.trap.Interrupt && !f.physicalAccess() {
			if w, err := m.Translate(ctx, f.tval); err == nil {
				f.walk = &w
			}
		}
	case 2:
		if !f.trap.Interrupt {
			f.bits = f.tval
			var code []byte
			if f.bits != 0 {
				code = []byte{byte(f.bits), byte(f.bits >> 8), byte(f.bits >> 16), byte(f.bits >> 24)}
			} else {
				code, _ = m.ReadMemory(ctx, f.epc, 4)
			}
			if in := d.Disassemble(code, f.epc, 1, nil); len(in) == 1 {
				f.insn = in[0].Text
				if f.bits == 0 {
					for i := len(in[0].Encoding) / 2; i > 0; i-- {
						f.bits = f.bits<<8 | uint64(code[i-1])
					}
				}
			}
		}
	}
	return verdict(f), f.walk
}
