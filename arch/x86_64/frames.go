package x86_64

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// ptRegs is Linux's struct pt_regs on x86-64 (arch/x86/include/asm/
// ptrace.h): r15 .. rdi as the entry code pushes them, orig_ax, then the
// frame the CPU pushed: ip, cs, flags, sp, ss.
const (
	ptRBP    = 4 * 8
	ptOrigAX = 15 * 8
	ptIP     = 16 * 8
	ptCS     = 17 * 8
	ptSP     = 19 * 8
	ptSize   = 21 * 8
)

// ptRegNames are the general registers' offsets in pt_regs.
var ptRegNames = map[string]int{"r15": 0, "r14": 8, "r13": 16, "r12": 24, "rbp": 32, "rbx": 40,
	"r11": 48, "r10": 56, "r9": 64, "r8": 72, "rax": 80, "rcx": 88, "rdx": 96, "rsi": 104, "rdi": 112, "rsp": ptSP}

// entryKind says what entry code fn is: an exception's (asm_exc_NAME),
// an interrupt's (asm_sysvec_*, asm_common_interrupt,
// asm_spurious_interrupt), a system call's (entry_SYSCALL_64 and its
// labels), or none.
func entryKind(fn string) (kind, name string) {
	switch {
	case strings.HasPrefix(fn, "asm_exc_"):
		return "exception", strings.TrimPrefix(fn, "asm_exc_")
	case strings.HasPrefix(fn, "asm_sysvec_"):
		return "interrupt", strings.TrimPrefix(fn, "asm_sysvec_")
	case fn == "asm_common_interrupt" || fn == "asm_spurious_interrupt":
		return "interrupt", strings.TrimPrefix(fn, "asm_")
	case strings.HasPrefix(fn, "entry_SYSCALL_64"):
		return "syscall", ""
	}
	return "", ""
}

// IsVector is false: the entry code's stops before its handler are not
// unwound through (their pt_regs is half built), and there is no vector
// table to be in.
func (debugger) IsVector(string) bool { return false }

// IsEntry reports whether fn is entry code that saves a pt_regs at its
// stack pointer and calls its handler with it.
func (debugger) IsEntry(fn string) bool { k, _ := entryKind(fn); return k != "" }

// IsFirst is a CPU's first frame: the boot CPU's and the others' start
// code, and ret_from_fork, the bottom of every kernel thread.
func (debugger) IsFirst(fn string) bool {
	switch fn {
	case "x86_64_start_kernel", "x86_64_start_reservations", "secondary_startup_64",
		"secondary_startup_64_no_verify", "start_secondary", "ret_from_fork":
		return true
	}
	return false
}

func (debugger) TrapFrameSize() int { return ptSize }

// TrapFrameAt is the handler's CFA: the entry code passes its stack
// pointer, the pt_regs, as the handler's first argument and calls it
// there.
func (debugger) TrapFrameAt(_ arch.Frame, calleeCFA uint64) uint64 { return calleeCFA }

// TrapFrame decodes a pt_regs that entry (asm_exc_page_fault,
// asm_sysvec_apic_timer_interrupt, entry_SYSCALL_64, ...) saved: the
// exception by the entry's name, a page fault's address from CR2, a
// general protection fault's from the faulting instruction and the saved
// registers.
func (d debugger) TrapFrame(ctx context.Context, r arch.Reader, entry string, b []byte) (arch.Trap, arch.Frame, bool) {
	word := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	cs := word(ptCS)
	user := cs&3 == 3
	f := arch.Frame{PC: word(ptIP), SP: word(ptSP), FP: word(ptRBP)}
	var t arch.Trap
	switch kind, name := entryKind(entry); kind {
	case "exception":
		v, ok := vectors[name]
		if !ok {
			t = arch.Trap{Cause: "exception (taken through " + entry + ")", Code: codeUnknown}
			break
		}
		t = arch.Trap{Cause: v.name, Code: v.vec, Interrupt: v.vec == vecNMI}
		switch v.vec {
		case vecPF:
			if cr2, err := r.ReadRegister(ctx, "cr2"); err == nil {
				t.Addr, t.HasAddr = cr2, true
			}
		case vecGP:
			t.Addr, t.HasAddr = d.accessed(ctx, r, f.PC, b)
		}
	case "interrupt":
		t = arch.Trap{Cause: name + " interrupt", Code: codeInterrupt, Interrupt: true}
	case "syscall":
		t = arch.Trap{Cause: fmt.Sprintf("system call %d", int64(word(ptOrigAX))), Code: codeSyscall}
	default:
		t = arch.Trap{Cause: "exception (taken through " + entry + ")", Code: codeUnknown}
	}
	t.PC, t.HasPC, t.Status = f.PC, true, cs
	return t, f, user
}

// accessed is the address the instruction at pc accessed, by its base
// register's value in the pt_regs b and its displacement.
func (d debugger) accessed(ctx context.Context, r arch.Reader, pc uint64, b []byte) (uint64, bool) {
	code, err := r.ReadMemory(ctx, pc, d.MaxInstruction())
	if err != nil {
		return 0, false
	}
	a, ok := d.Access(code)
	if !ok {
		return 0, false
	}
	off, ok := ptRegNames[a.Base]
	if !ok {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[off:]) + uint64(a.Offset), true
}

// InVector is never asked (IsVector is false).
func (debugger) InVector(context.Context, arch.Reader, arch.Frame, arch.Prologue) (arch.Frame, arch.Trap, bool, error) {
	return arch.Frame{}, arch.Trap{}, false, errors.New("x86_64: a stop in entry code before its handler is not unwound")
}
