package arm64

import (
	"context"
	"encoding/binary"
	"fmt"
	"regexp"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// ptRegs is Linux's struct pt_regs on arm64 (arch/arm64/include/asm/
// ptrace.h): x0..x30, sp, pc, pstate, then orig_x0, syscallno, ... and
// stackframe, the frame record the entry code links x29 to: {the
// interrupted x29, its pc} from EL1, zeros from EL0.
const (
	ptSP         = 31 * 8
	ptPC         = 32 * 8
	ptPSTATE     = 33 * 8
	ptSyscallNo  = 35 * 8
	ptStackFrame = 38 * 8
	ptSize       = 42 * 8
)

// entryRe are Linux's exception entry functions (entry.S's
// entry_handler): el1h_64_sync and its kin, each saving a pt_regs at its
// stack pointer and calling its handler with it.
var entryRe = regexp.MustCompile(`^el[01][th]_(64|32)_(sync|irq|fiq|error)$`)

// IsVector reports whether fn is the vector table or entry code before
// its handler: where the interrupted context is being saved.
func (debugger) IsVector(fn string) bool { return fn == "vectors" || entryRe.MatchString(fn) }

// IsEntry reports whether fn is entry code that leaves a pt_regs.
func (debugger) IsEntry(fn string) bool { return entryRe.MatchString(fn) }

// IsFirst is a CPU's first frame: head.S calls start_kernel and
// secondary_start_kernel from these with no frame record to return to.
func (debugger) IsFirst(fn string) bool {
	return fn == "__primary_switched" || fn == "__secondary_switched"
}

func (debugger) TrapFrameSize() int { return ptSize }

// TrapFrameAt is below the entry's frame record: kernel_entry points x29
// at pt_regs.stackframe before it calls the handler.
func (debugger) TrapFrameAt(f arch.Frame, _ uint64) uint64 { return f.FP - ptStackFrame }

// TrapFrame decodes a pt_regs that entry (el1h_64_sync, el0t_64_irq, ...)
// saved. A pt_regs keeps no syndrome: an interrupt is told by the entry's
// name, a system call by its syscallno, and another synchronous exception
// reads ESR_EL1 and FAR_EL1, which hold the last one's; when they cannot
// be this frame's (an abort class from the other level), the trap says
// the syndrome is lost.
func (debugger) TrapFrame(ctx context.Context, r arch.Reader, entry string, b []byte) (arch.Trap, arch.Frame, bool) {
	word := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	pstate := word(ptPSTATE)
	user := pstate>>2&3 == 0 || pstate>>4&1 == 1
	f := arch.Frame{PC: word(ptPC), SP: word(ptSP), FP: word(29 * 8), RA: word(30 * 8)}
	var t arch.Trap
	switch kind := entryRe.FindStringSubmatch(entry); {
	case kind == nil:
		t = arch.Trap{Cause: "exception (taken through " + entry + ")", Code: unknownSyndrome}
	case kind[2] == "irq":
		t = interrupt("IRQ")
	case kind[2] == "fiq":
		t = interrupt("FIQ")
	case kind[2] == "error":
		t = interrupt("SError")
	case user && int32(binary.LittleEndian.Uint32(b[ptSyscallNo:])) >= 0:
		t = decodeESR(ecSVC << 26)
		t.Cause = fmt.Sprintf("system call (SVC) %d", int32(binary.LittleEndian.Uint32(b[ptSyscallNo:])))
	default:
		t = syndromeOf(ctx, r, user)
	}
	t.PC, t.HasPC, t.Status = f.PC, true, pstate
	return t, f, user
}

// syndromeOf is the synchronous exception a pt_regs from EL0 (user) or
// EL1 records, by ESR_EL1 and FAR_EL1.
func syndromeOf(ctx context.Context, r arch.Reader, user bool) arch.Trap {
	lost := arch.Trap{Cause: "synchronous exception (its syndrome, ESR_EL1, now holds a later exception's)", Code: unknownSyndrome}
	esr, err := r.ReadRegister(ctx, "ESR_EL1")
	if err != nil || esr == 0 {
		return lost
	}
	ec := esr >> 26 & 0x3f
	if isAbort, lower := abort(ec); isAbort && lower != user || ec == ecSVC || ec == ecSVC32 {
		return lost
	}
	t := decodeESR(esr)
	if farValid(esr) {
		if v, err := r.ReadRegister(ctx, "FAR_EL1"); err == nil {
			t.Addr, t.HasAddr = v, true
		}
	}
	return t
}

// InVector recovers the context an exception interrupted while the vCPU
// is in the vector table or in entry code before the handler: the pc from
// ELR_EL1, the level from SPSR_EL1, the exception from the vector entry
// (or the syndrome); sp is the live one above the pt_regs the vector
// made room for (but at a vector entry's first instruction), and x29 and
// x30 are live until kernel_entry links x29 into the pt_regs, then saved
// there.
func (d debugger) InVector(ctx context.Context, r arch.Reader, f arch.Frame, _ arch.Prologue) (arch.Frame, arch.Trap, bool, error) {
	v, err := arch.ReadRegisters(ctx, r, "in the exception vector", "ELR_EL1", "SPSR_EL1")
	if err != nil {
		return f, arch.Trap{}, false, err
	}
	elr, spsr := v[0], v[1]
	user := spsr>>2&3 == 0 || spsr>>4&1 == 1
	next := arch.Frame{PC: elr, SP: f.SP, FP: f.FP, RA: f.RA}
	var t arch.Trap
	vbar, verr := r.ReadRegister(ctx, "VBAR_EL1")
	inTable := verr == nil && f.PC >= vbar && f.PC < vbar+0x800
	if kind := (f.PC - vbar) >> 7 & 3; inTable && kind != 0 {
		t = interrupt(vectorKinds[kind])
	} else {
		t = syndromeOf(ctx, r, user)
	}
	t.PC, t.HasPC, t.Status = elr, true, spsr
	if !(inTable && f.PC&0x7f == 0) {
		regs := f.SP
		next.SP = regs + ptSize
		if user {
			next.SP = 0 // SP_EL0: the user's, not on this stack
			if v, err := r.ReadRegister(ctx, "SP_EL0"); err == nil {
				next.SP = v
			}
		}
		if f.FP == regs+ptStackFrame {
			if b, err := r.ReadMemory(ctx, regs, ptSize); err == nil && len(b) == ptSize {
				next.FP = binary.LittleEndian.Uint64(b[29*8:])
				next.RA = binary.LittleEndian.Uint64(b[30*8:])
			}
		}
	}
	return next, t, user, nil
}
