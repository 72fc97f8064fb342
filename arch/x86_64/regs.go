package x86_64

import (
	"debug/elf"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The debugger's x86-64: QEMU's gdbstub describes one feature,
// org.gnu.gdb.i386.core, with the general registers, rip, eflags, the
// segment selectors and bases, and the control registers cr0, cr2, cr3,
// cr4, cr8 and efer (QEMU 7.2 and 11.1), always in its 64-bit layout.
// There is no privilege register: the low two bits of CS are the current
// privilege level in protected and long mode. x86 keeps no syndrome of
// the last exception either: only CR2, the last page fault's address.

// general are the general registers as a register read shows them.
var general = []string{"rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
	"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}

// trapRegs are the system registers worth showing when asking why a vCPU
// trapped: the last page fault's address, the paging registers, the
// flags and selectors, and the per-CPU bases the kernel's entry swaps.
var trapRegs = []string{"cr2", "cr0", "cr3", "cr4", "efer", "eflags", "cs", "ss", "fs_base", "gs_base", "k_gs_base"}

func (debugger) Registers() arch.Registers {
	return arch.Registers{
		GDB: arch.GDB{
			Arch:            "i386:x86-64",
			FeaturePrefix:   "org.gnu.gdb.i386.",
			Fallback:        append(append([]string(nil), general...), "rip"),
			FallbackFeature: "org.gnu.gdb.i386.core",
			Aliases:         [][2]string{{"pc", "rip"}, {"sp", "rsp"}, {"fp", "rbp"}},
		},
		General: general,
		// No link register: a call pushes the return address.
		PC: "rip", SP: "rsp", FP: "rbp",
		Trap: trapRegs,
		Priv: "cs",
		Wait: "hlt",
	}
}

// Symbols are an x86-64 ELF's, and Linux builds arch/x86/boot/bzImage.
func (debugger) Symbols() arch.Symbols {
	return arch.Symbols{Machine: elf.EM_X86_64, Family: "x86-64", BootDir: "arch/x86/boot"}
}

// Privilege decodes CS: its selector's low two bits are the CPL. Ring 0
// runs the kernel (and a tiny kernel without firmware), ring 3 user
// programs; rings 1 and 2 are unused by Linux.
func (debugger) Privilege(cs uint64) arch.Privilege {
	switch cpl := cs & 3; cpl {
	case 0:
		return arch.Privilege{Name: "ring 0"}
	case 3:
		return arch.Privilege{Name: "ring 3", User: true}
	default:
		return arch.Privilege{Name: fmt.Sprintf("ring %d", cpl)}
	}
}

// decodeFlags names the RFLAGS bits a kernel developer checks: whether
// interrupts are on, AC (SMAP's override), the trap flag and the
// arithmetic flags.
func decodeFlags(v uint64) string {
	f := []string{"IF=0 (interrupts off)"}
	if v>>9&1 == 1 {
		f[0] = "IF=1"
	}
	for _, b := range []struct {
		bit  uint
		name string
	}{{18, "AC"}, {8, "TF"}, {14, "NT"}, {17, "VM"}} {
		if v>>b.bit&1 == 1 {
			f = append(f, b.name)
		}
	}
	var a strings.Builder
	for _, b := range []struct {
		bit  uint
		name byte
	}{{11, 'O'}, {7, 'S'}, {6, 'Z'}, {0, 'C'}} {
		if v>>b.bit&1 == 1 {
			a.WriteByte(b.name)
		} else {
			a.WriteByte('-')
		}
	}
	return strings.Join(append(f, "OSZC="+a.String()), " ")
}

// Foreign says whether the vCPU runs anything but long mode's code: real
// mode (firmware at reset) and legacy protected mode (32-bit boot code,
// such as a PVH entry) address and encode code otherwise than 64-bit
// code, which is what the disassembler and unwinder read.
func (debugger) Foreign(get func(string) (uint64, bool)) string {
	cr0, ok := get("cr0")
	if !ok {
		return ""
	}
	if cr0&1 == 0 {
		cs, _ := get("cs")
		ip, _ := get("rip")
		return fmt.Sprintf("16-bit real mode (CR0.PE=0: the pc is IP, at CS:IP %04x:%04x)", cs&0xffff, ip&0xffff)
	}
	if efer, _ := get("efer"); efer>>10&1 == 0 {
		return "legacy protected mode (EFER.LMA=0: 32- or 16-bit code)"
	}
	return ""
}

// decodePaging says whether paging is on, its mode, the table and the
// protections CR0, CR4 and EFER switch on.
func decodePaging(get func(string) (uint64, bool)) string {
	cr0, ok := get("cr0")
	if !ok {
		return ""
	}
	if cr0>>31&1 == 0 {
		if cr0&1 == 0 {
			return "paging off, real mode (CR0.PE=0)"
		}
		return "paging off (CR0.PG=0), protected mode"
	}
	cr4, _ := get("cr4")
	efer, _ := get("efer")
	mode := "32-bit paging"
	switch {
	case efer>>10&1 == 1 && cr4>>12&1 == 1:
		mode = "5-level paging (long mode, CR4.LA57)"
	case efer>>10&1 == 1:
		mode = "4-level paging (long mode)"
	case cr4>>5&1 == 1:
		mode = "PAE paging"
	}
	s := mode
	if cr3, ok := get("cr3"); ok {
		s += ", table " + hex(cr3&^0xfff)
		if cr4>>17&1 == 1 {
			s += fmt.Sprintf(" PCID %d", cr3&0xfff)
		}
	}
	var on []string
	for _, b := range []struct {
		v    uint64
		bit  uint
		name string
	}{{cr0, 16, "WP"}, {efer, 11, "NX"}, {cr4, 20, "SMEP"}, {cr4, 21, "SMAP"}, {cr4, 22, "PKE"}} {
		if b.v>>b.bit&1 == 1 {
			on = append(on, b.name)
		}
	}
	if len(on) > 0 {
		s += "; " + strings.Join(on, " ") + " on"
	}
	return s
}
