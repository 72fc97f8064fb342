package arch

import (
	"cmp"
	"context"
	"debug/elf"
	"fmt"
	"strconv"
)

// Debugger is what the kernel debugger knows of an architecture: its
// registers as the gdbstub names them, its privilege levels, its traps and
// their verdicts, its page tables, its instructions and the frames its
// Linux entry code leaves. Arch.Debugger returns it, nil for an
// architecture the debugger does not support yet.
type Debugger interface {
	// Registers are the registers the debugger reads and shows.
	Registers() Registers
	// Symbols say what a kernel's symbols for the architecture are.
	Symbols() Symbols
	Traps
	Paging
	Instructions
	Unwinder
}

// CodeModes is implemented by an architecture whose vCPUs can run code
// in modes its disassembler and unwinder do not read (x86's real and
// legacy protected modes, which firmware and boot code run in).
type CodeModes interface {
	// Foreign names the mode a vCPU with these registers (get) runs in
	// and why it is not read, or "" for the mode that is.
	Foreign(get func(name string) (uint64, bool)) string
}

// UnsupportedError is the debugger asked of a guest whose architecture it
// does not support yet.
type UnsupportedError struct {
	Arch string
	// What is not supported; empty means the debugger.
	What string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s does not support %s guests yet", cmp.Or(e.What, "the debugger"), e.Arch)
}

// Symbols say what a kernel's symbols (its vmlinux) for an architecture
// are, and where a Linux build tree keeps its kernel image.
type Symbols struct {
	// Machine is the ELF machine; Family names the architecture in
	// messages ("RISC-V").
	Machine elf.Machine
	Family  string
	// BootDir is the build tree's directory of the kernel image,
	// relative to its top, slash-separated ("arch/riscv/boot").
	BootDir string
}

// Registers name a vCPU's registers as the gdbstub's target description
// does.
type Registers struct {
	// GDB is what a gdb client needs of the architecture's stub.
	GDB GDB
	// General are the general registers a register read shows, in order.
	General []string
	// Other maps a general register's name to the name the stub may give
	// it instead.
	Other map[string]string
	// PC, SP, FP and RA are the program counter, stack pointer, frame
	// pointer and return address, by names General (or the stub) uses.
	PC, SP, FP, RA string
	// Trap are the system registers worth showing when asking why a vCPU
	// trapped: the kernel's level first, then the firmware's.
	Trap []string
	// Priv is QEMU's virtual register holding the privilege level.
	Priv string
	// Wait is the instruction a vCPU waits in for an interrupt.
	Wait string
	// CSRNames says register results name the last traps into the
	// kernel's and the firmware's levels "scause" and "mcause", the
	// system registers "csrs" and the translation "satp": riscv64's own
	// names, which its users rely on. Otherwise they are "exception",
	// "firmware_exception", "system" and "translation".
	CSRNames bool
	// CPUMap is Linux's table of CPU numbers to vCPU IDs (a 64-bit ID per
	// CPU number), "" if there is none.
	CPUMap string
}

// GDB is what a gdb client needs of the architecture's gdbstub.
type GDB struct {
	// Arch is the architecture a target description names.
	Arch string
	// FeaturePrefix starts the names of the description's features for
	// this architecture ("org.gnu.gdb.riscv.").
	FeaturePrefix string
	// Fallback are the registers of a 'g' packet, in order, when the stub
	// sends no target description, each 64 bits wide, in feature
	// FallbackFeature; the last is the pc.
	Fallback        []string
	FallbackFeature string
	// Aliases are other names of the description's registers (alias ->
	// name), for lookups by either.
	Aliases [][2]string
}

// Privilege is the level a vCPU runs at.
type Privilege struct {
	// Name is the level as shown ("user", "supervisor", "machine").
	Name string
	// User says user programs run there; Firmware says firmware does (a
	// kernel may too, booted without firmware).
	User, Firmware bool
}

// Trap is an exception or interrupt a vCPU took, as its registers or a
// trap frame record it.
type Trap struct {
	Cause     string
	Interrupt bool
	Code      uint64
	// PC is where the trap was taken, Addr the trap's value (the faulting
	// address, an instruction's bits), each if known.
	PC, Addr       uint64
	HasPC, HasAddr bool
	// Status is the status register the trap was taken with.
	Status uint64
	// Firmware says the trap was taken into the firmware's level.
	Firmware bool
}

// Reader reads a stopped vCPU's registers and memory (through its MMU).
type Reader interface {
	ReadRegister(ctx context.Context, name string) (uint64, error)
	ReadMemory(ctx context.Context, addr uint64, n int) ([]byte, error)
}

// ReadRegisters reads the registers named, in order; an error names the
// register that would not read and where the vCPU is (where: "in the trap
// vector").
func ReadRegisters(ctx context.Context, r Reader, where string, names ...string) ([]uint64, error) {
	vals := make([]uint64, len(names))
	for i, name := range names {
		v, err := r.ReadRegister(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("read %s %s: %w", name, where, err)
		}
		vals[i] = v
	}
	return vals, nil
}

// Machine is a stopped vCPU whose faults a verdict explains: it reads,
// and walks a virtual address through the current page table.
type Machine interface {
	Reader
	Translate(ctx context.Context, va uint64) (Walk, error)
}

// TrapView is what a vCPU's trap registers say.
type TrapView struct {
	// Kernel and Firmware are the last traps into the kernel's and the
	// firmware's level (nil if their cause does not read).
	Kernel, Firmware *Trap
	// Status decodes the status register; Translation the translation
	// register.
	Status, Translation string
	// Taking is the trap the vCPU is taking now, at its trap vector.
	Taking *Trap
}

// TrapSources say where a triage found its trap when no trap frame has
// one.
type TrapSources struct {
	// Kernel: the last trap into the kernel's level; Firmware: the last
	// into the firmware's, of a vCPU running there; NoKernel: the last
	// into the firmware's, of a vCPU that never trapped into the kernel's.
	Kernel, Firmware, NoKernel string
}

// Traps decodes a vCPU's traps and says why they happened.
type Traps interface {
	// Privilege decodes the value of Registers().Priv.
	Privilege(v uint64) Privilege
	// View decodes the trap registers read (get; the privilege level
	// included, by Registers().Priv) of a vCPU at pc, in function fn.
	View(get func(name string) (uint64, bool), pc uint64, fn string) TrapView
	// LastTrap reads the last trap taken into the kernel's level, or
	// with firmware into the firmware's; false if none reads or none was
	// taken.
	LastTrap(ctx context.Context, r Reader, firmware bool) (Trap, bool)
	// Handling is the fault a vCPU at level p is still handling, read
	// from its last trap: one taken from its own level or above.
	Handling(ctx context.Context, r Reader, p Privilege) (Trap, bool)
	// IsFault says whether t is an exception that can crash a kernel: no
	// interrupt, no system call.
	IsFault(t Trap) bool
	// Verdict says in one sentence why t happened, and the walk of its
	// address for a page or access fault.
	Verdict(ctx context.Context, m Machine, t Trap) (string, *Walk)
	// Sources say where a triage's trap came from.
	Sources() TrapSources
}

// Walk is a page-table walk of one virtual address, as the MMU does it.
type Walk struct {
	VA string `json:"va"`
	// Satp is riscv64's root; TTBR and TCR are aarch64's (the table
	// base register the address selects, and the control register).
	Satp string `json:"satp,omitempty"`
	TTBR string `json:"ttbr,omitempty"`
	TCR  string `json:"tcr,omitempty"`
	// CR3 is x86-64's root (the walk also reads CR0, CR4 and EFER).
	CR3 string `json:"cr3,omitempty"`
	// Mode is the translation mode ("Bare" for none).
	Mode   string  `json:"mode"`
	Levels []Level `json:"levels,omitempty"`
	// PA is the physical address when the walk ends at a valid leaf.
	PA string `json:"pa,omitempty"`
	// PageSize is the leaf's page (4K, 2M, ...).
	PageSize string `json:"page_size,omitempty"`
	// Flags are the leaf's flags.
	Flags string `json:"flags,omitempty"`
	// Fault says why the walk stops short of a page (the MMU would
	// raise a page fault for any access).
	Fault string `json:"fault,omitempty"`

	// Phys is PA as a number; Leaf is the leaf entry, when there is one;
	// Faulty says the walk stopped short (Fault says why).
	Phys, Leaf uint64 `json:"-"`
	Faulty     bool   `json:"-"`
}

// Untranslated is w ending with no translation (mode "Bare", "MMU off"):
// the physical address is va itself.
func (w Walk) Untranslated(mode string, va uint64) Walk {
	w.Mode, w.Phys, w.PA = mode, va, hex(va)
	return w
}

// Stopped is w ending short of a page, why saying why.
func (w Walk) Stopped(why string) Walk {
	w.Fault, w.Faulty = why, true
	return w
}

// Mapped is w ending at the leaf entry leaf, which maps the page of size
// (4K, 2M, ...) holding the physical address pa, with flags.
func (w Walk) Mapped(pa uint64, size, flags string, leaf uint64) Walk {
	w.Phys, w.PA, w.PageSize, w.Flags, w.Leaf = pa, hex(pa), size, flags, leaf
	return w
}

// hex formats v as walks show addresses and entries: 0x and lower-case
// digits.
func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }

// Level is one step of a walk.
type Level struct {
	Level   int    `json:"level"`
	PTEAddr string `json:"pte_addr"`
	PTE     string `json:"pte"`
	Flags   string `json:"flags"`
}

// Paging walks page tables.
type Paging interface {
	// Root is the register naming the current page table, whose value a
	// caller may give instead of the vCPU's; "" when the tables have no
	// single root (the walk reads several registers).
	Root() string
	// Walk walks va as the MMU does: reg reads the vCPU's registers the
	// walk needs (Root's value, or the one given instead), read the
	// 64-bit entry at a physical address. Only an error of reg or read
	// is an error; a walk that finds no page says why in Fault.
	Walk(va uint64, reg func(name string) (uint64, error), read func(pa uint64) (uint64, error)) (Walk, error)
}

// Instruction is one decoded instruction.
type Instruction struct {
	Addr uint64 `json:"addr"`
	// Encoding is the instruction in hex, as objdump shows it.
	Encoding string `json:"encoding"`
	Text     string `json:"text"` // GNU syntax, e.g. "addi sp,sp,-16"
	// Target is the symbolized destination of a direct branch or jump.
	Target string `json:"target,omitempty"`
	// Known is false for bytes no decoder knows (shown as .word/.half).
	Known bool `json:"known"`
}

// Symbolizer names an address: a symbol and the offset into it; ok false
// when no symbol covers it.
type Symbolizer func(addr uint64) (name string, off uint64, ok bool)

// Target names addr as a disassembly names a branch's destination: the
// symbol, and the offset into it unless 0 ("memcpy", "memcpy+0x1c"); ""
// when s is nil or no symbol covers addr.
func (s Symbolizer) Target(addr uint64) string {
	if s == nil {
		return ""
	}
	name, off, ok := s(addr)
	switch {
	case !ok:
		return ""
	case off != 0:
		return fmt.Sprintf("%s+%#x", name, off)
	}
	return name
}

// MemAccess is a load, store or atomic: its length, base register (a name
// of Registers().General), offset and access size.
type MemAccess struct {
	Len, Size int
	Base      string
	Offset    int64
	Store     bool
}

// Instructions decodes machine code.
type Instructions interface {
	// Disassemble decodes up to count instructions of code, the memory
	// at addr, naming branch targets with sym (nil: none). It stops
	// early at the end of code, never in an instruction's middle.
	Disassemble(code []byte, addr uint64, count int, sym Symbolizer) []Instruction
	// MaxInstruction is the longest instruction's length, and
	// MinInstruction the shortest's, which every instruction's address
	// and length are a multiple of.
	MaxInstruction() int
	MinInstruction() int
	// Call says whether code starts with a call that links the return
	// address; n is its length.
	Call(code []byte) (n int, call bool)
	// CallBefore says whether the instructions just before a return
	// address (before, the MaxInstruction bytes that precede it) end in
	// a call: whether the return address is one.
	CallBefore(before []byte) bool
	// Access decodes the memory access code starts with, if it is one.
	Access(code []byte) (MemAccess, bool)
}

// Frame is the registers an unwinder follows.
type Frame struct{ PC, SP, FP, RA uint64 }

// Prologue is what a function's prologue does, as far as the pc reached:
// where it saves the return address and the caller's frame pointer,
// relative to the new frame pointer.
type Prologue struct {
	SPAdjusted bool
	SPOff      int64 // sp relative to the CFA after the adjustment
	FPSet      bool  // the frame pointer was set before the pc
	FPPos      int64 // the frame pointer relative to the CFA
	RASaved    bool
	RAOff      int64 // the return address's slot relative to the frame pointer
	FPOff      int64 // the caller's frame pointer's slot relative to the frame pointer
	// FPStored says the frame pointer was stored at FPSlot, relative to
	// the current sp (trap entry code saving registers).
	FPStored bool
	FPSlot   int64
}

// Framed finishes a scan of a prologue, p so far: the scan found the
// caller's frame pointer stored at fpPos relative to the CFA (if fpSaved)
// and the return address at raPos (if p.RASaved). Until the frame pointer
// is set, a stored one is FPStored, at FPSlot relative to sp; once it is
// set, both slots are given relative to it (RAOff, FPOff). A frame pointer
// set with the caller's not stored is no frame-pointer frame: standard,
// the layout compilers emit, is the best guess.
func (p Prologue) Framed(fpPos int64, fpSaved bool, raPos int64, standard Prologue) Prologue {
	if !p.FPSet {
		if fpSaved {
			p.FPStored, p.FPSlot = true, fpPos-p.SPOff
		}
		return p
	}
	if !fpSaved {
		return standard
	}
	p.RAOff, p.FPOff = raPos-p.FPPos, fpPos-p.FPPos
	return p
}

// Unwinder knows the frames of a Linux kernel on the architecture.
type Unwinder interface {
	// Standard is the prologue compilers emit with frame pointers.
	Standard() Prologue
	// PrologueScan bounds the code read to find a prologue.
	PrologueScan() int
	// ScanPrologue decodes the prologue that code (a function's start,
	// up to the pc) holds.
	ScanPrologue(code []byte) Prologue
	// IsVector says whether fn is the kernel's trap vector, where the
	// trapped context's registers are being saved.
	IsVector(fn string) bool
	// IsEntry says whether fn is trap entry code that leaves a trap
	// frame at the stack pointer of the handler it calls.
	IsEntry(fn string) bool
	// IsFirst says whether fn is a vCPU's first frame, with no caller.
	IsFirst(fn string) bool
	// TrapFrameSize is the size of the kernel's trap frame (pt_regs).
	TrapFrameSize() int
	// TrapFrameAt is where the trap frame of entry code is, the entry's
	// frame being f and the handler it called having its CFA (the stack
	// pointer at the call) at calleeCFA.
	TrapFrameAt(f Frame, calleeCFA uint64) uint64
	// TrapFrame decodes a trap frame, b, that entry code (function
	// entry) left: the trap, the trapped context, and whether it came
	// from user mode. r reads what the frame does not keep (a syndrome
	// register of the vCPU, on an architecture whose frames lack it).
	TrapFrame(ctx context.Context, r Reader, entry string, b []byte) (t Trap, f Frame, user bool)
	// InVector recovers the context a trap interrupted while the vCPU is
	// in the trap vector at f (live registers), whose prologue so far is
	// pro: the trapped context, its trap, and whether it came from user
	// mode.
	InVector(ctx context.Context, r Reader, f Frame, pro Prologue) (Frame, Trap, bool, error)
}
