package x86_64

import (
	"context"
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// An x86 exception leaves no syndrome register: the vector is told by the
// entry code it went through (asm_exc_page_fault: 14), and Linux's entry
// code hands the error code to the handler and overwrites it in pt_regs
// (orig_ax = -1), so a verdict rebuilds what the error code said from
// what is left: CR2 (the faulting address), the faulting instruction
// (read or write) and the page table (present or not). An arch.Trap's
// Code is the vector, or one of the codes below; its Status is the
// trapped context's CS, whose low two bits are its privilege level.

// Codes of traps that are no exception vector.
const (
	codeInterrupt = 0x100 // an external or APIC interrupt (vector 32 and up)
	codeSyscall   = 0x101 // a system call (SYSCALL)
	codeUnknown   = 0x102 // entry code this package does not know
)

// Vectors the verdicts tell apart.
const (
	vecDE  = 0
	vecNMI = 2
	vecBP  = 3
	vecUD  = 6
	vecDF  = 8
	vecGP  = 13
	vecPF  = 14
	vecMC  = 18
)

// vectors are the exceptions by the name of Linux's entry code
// (asm_exc_NAME), with their vector and mnemonic.
var vectors = map[string]struct {
	vec  uint64
	name string
}{
	"divide_error": {0, "divide error (#DE)"}, "debug": {1, "debug exception (#DB)"},
	"nmi": {2, "non-maskable interrupt (NMI)"}, "int3": {3, "breakpoint (#BP)"},
	"overflow": {4, "overflow (#OF)"}, "bounds": {5, "bound range exceeded (#BR)"},
	"invalid_op": {6, "invalid opcode (#UD)"}, "device_not_available": {7, "device not available (#NM)"},
	"double_fault": {8, "double fault (#DF)"}, "coproc_segment_overrun": {9, "coprocessor segment overrun"},
	"invalid_tss": {10, "invalid TSS (#TS)"}, "segment_not_present": {11, "segment not present (#NP)"},
	"stack_segment": {12, "stack-segment fault (#SS)"}, "general_protection": {13, "general protection fault (#GP)"},
	"page_fault": {14, "page fault (#PF)"}, "spurious_interrupt_bug": {15, "spurious interrupt (vector 15)"},
	"coprocessor_error": {16, "x87 floating-point error (#MF)"}, "alignment_check": {17, "alignment check (#AC)"},
	"machine_check": {18, "machine check (#MC)"}, "simd_coprocessor_error": {19, "SIMD floating-point error (#XM)"},
	"virtualization_exception": {20, "virtualization exception (#VE)"}, "control_protection": {21, "control protection (#CP)"},
}

// LastTrap is never known: x86 keeps no record of the last exception
// but CR2, which page faults alone write.
func (debugger) LastTrap(context.Context, arch.Reader, bool) (arch.Trap, bool) {
	return arch.Trap{}, false
}

// Handling is never known from the registers, for the same reason: the
// fault a vCPU handles is found in the trap frame its backtrace crosses.
func (debugger) Handling(context.Context, arch.Reader, arch.Privilege) (arch.Trap, bool) {
	return arch.Trap{}, false
}

// IsFault reports whether t is an exception that can crash a kernel: not
// an interrupt (NMIs included), breakpoint or system call.
func (debugger) IsFault(t arch.Trap) bool {
	return !t.Interrupt && t.Code < 32 && t.Code != vecBP && t.Code != 1
}

// Sources: x86 has no trap register a triage could fall back on.
func (debugger) Sources() arch.TrapSources {
	const none = "none: x86 keeps no record of the last exception (only CR2, the last page fault's address)"
	return arch.TrapSources{Kernel: none, Firmware: none, NoKernel: none}
}

// View decodes RFLAGS and CS, and the paging registers. There is no last
// trap to show, and no vector table a pc could be at the entry of: the
// entry code's names say what a vCPU takes (see TrapFrame).
func (debugger) View(get func(string) (uint64, bool), _ uint64, _ string) arch.TrapView {
	var v arch.TrapView
	if f, ok := get("eflags"); ok {
		v.Status = "RFLAGS " + decodeFlags(f)
	}
	if cs, ok := get("cs"); ok {
		if v.Status != "" {
			v.Status += "; "
		}
		v.Status += fmt.Sprintf("CS %#x (CPL %d)", cs, cs&3)
	}
	v.Translation = decodePaging(get)
	return v
}

// canonical says whether va is canonical for 48-bit (or, with la57,
// 57-bit) virtual addresses: its top bits copy the highest one.
func canonical(va uint64, la57 bool) bool {
	bits := uint(48)
	if la57 {
		bits = 57
	}
	top := int64(va) >> (bits - 1)
	return top == 0 || top == -1
}

// mode says where a trap came from, by its CS.
func mode(cs uint64) string {
	if cs&3 == 3 {
		return "user mode"
	}
	return "kernel mode"
}

// Verdict says in one sentence why t happened; for a page fault, with
// the walk of its address.
func (d debugger) Verdict(ctx context.Context, m arch.Machine, t arch.Trap) (string, *arch.Walk) {
	if t.Interrupt || t.Code >= 32 {
		return "", nil
	}
	at := ""
	if t.HasPC {
		at = " at " + hex(t.PC)
	}
	switch t.Code {
	case vecPF:
		return d.pageFault(ctx, m, t)
	case vecGP:
		if t.HasAddr && !canonical(t.Addr, false) {
			return fmt.Sprintf("general protection fault%s in %s: the access to %s, a non-canonical address (its bits 63:47 differ): a corrupted or poisoned pointer", at, mode(t.Status), hex(t.Addr)), nil
		}
		return fmt.Sprintf("general protection fault%s in %s: a privileged instruction, a bad segment or an access the CPU refuses (Linux does not keep the error code)", at, mode(t.Status)), nil
	case vecUD:
		if t.HasPC {
			if b, err := m.ReadMemory(ctx, t.PC, 2); err == nil && len(b) == 2 && b[0] == 0x0f && b[1] == 0x0b {
				return fmt.Sprintf("invalid opcode (#UD)%s in %s: ud2, which BUG() and BUG_ON() execute: the kernel stopped itself on a failed assertion", at, mode(t.Status)), nil
			}
		}
		return fmt.Sprintf("invalid opcode (#UD)%s in %s: an instruction this CPU does not have, or corrupt code", at, mode(t.Status)), nil
	case vecDF:
		return fmt.Sprintf("double fault (#DF)%s: an exception while the CPU delivered another, most often a kernel stack overflow (the page fault on the guard page could not be delivered on the same stack)", at), nil
	case vecDE:
		return fmt.Sprintf("divide error (#DE)%s in %s: a division by zero, or a quotient too large for its register", at, mode(t.Status)), nil
	case vecMC:
		return fmt.Sprintf("machine check (#MC)%s: the machine reported a hardware error", at), nil
	}
	return "", nil
}

// pageFault rebuilds the page fault's error code: an instruction fetch
// when the address is the pc, else a write or a read by the instruction
// at the pc; present or not by the walk of the address now.
func (d debugger) pageFault(ctx context.Context, m arch.Machine, t arch.Trap) (string, *arch.Walk) {
	if !t.HasAddr {
		return fmt.Sprintf("page fault in %s (CR2, its address, was overwritten by a later page fault)", mode(t.Status)), nil
	}
	addr := hex(t.Addr)
	access := "an access"
	switch {
	case t.HasPC && t.Addr == t.PC:
		access = "an instruction fetch"
	case t.HasPC:
		if code, err := m.ReadMemory(ctx, t.PC, d.MaxInstruction()); err == nil {
			if store, ok := memWrite(code); ok {
				access = "a read"
				if store {
					access = "a write"
				}
			}
		}
	}
	by := fmt.Sprintf("%s in %s", access, mode(t.Status))
	if t.HasPC {
		by += " at " + hex(t.PC)
	}
	w, err := m.Translate(ctx, t.Addr)
	if err != nil {
		return fmt.Sprintf("page fault: %s, address %s (the page table did not read: %v)", by, addr, err), nil
	}
	if w.Faulty {
		s := fmt.Sprintf("page fault: not present, address %s (%s): %s", addr, by, w.Fault)
		if t.Addr < 0x1000 {
			s += "; a NULL pointer dereference"
		} else if t.Addr < 0x10000 {
			s += "; a NULL pointer dereference at an offset (a field of a NULL struct pointer)"
		}
		return s, &w
	}
	writable, userOK, nx := w.Leaf>>1&1 == 1, w.Leaf>>2&1 == 1, w.Leaf>>63&1 == 1
	leaf := fmt.Sprintf("the walk's leaf is a %s page (%s)", w.PageSize, w.Flags)
	switch {
	case access == "a write" && !writable:
		return fmt.Sprintf("page fault: write to a present read-only page in %s, address %s (%s): %s", mode(t.Status), addr, by, leaf), &w
	case access == "an instruction fetch" && nx:
		return fmt.Sprintf("page fault: instruction fetch from a present no-execute page in %s, address %s: %s", mode(t.Status), addr, leaf), &w
	case t.Status&3 == 3 && !userOK:
		return fmt.Sprintf("page fault: user-mode access to a present kernel-only page, address %s (%s): %s", addr, by, leaf), &w
	case t.Status&3 != 3 && userOK:
		return fmt.Sprintf("page fault: kernel access to a present user page, address %s (%s), which SMAP or SMEP forbid: %s", addr, by, leaf), &w
	}
	return fmt.Sprintf("page fault at %s (%s): the page is present and allows it now, so the mapping changed after the fault: %s", addr, by, leaf), &w
}
