package arm64

import (
	"debug/elf"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The debugger's aarch64: QEMU's gdbstub describes x0..x30, sp, pc and
// cpsr (PSTATE) in org.gnu.gdb.aarch64.core, and the system registers
// (ESR_EL1, FAR_EL1, TCR_EL1, ...) in org.qemu.gdb.arm.sys.regs; there is
// no virtual privilege register: PSTATE's M field holds the exception
// level. A vCPU's index is its MPIDR affinity on the virt board, up to 16
// vCPUs per cluster.

// general are x0..x30 and sp, as a register read shows them.
var general = func() []string {
	var g []string
	for i := range 31 {
		g = append(g, "x"+strconv.Itoa(i))
	}
	return append(g, "sp")
}()

// trapRegs are the system registers worth showing when asking why a vCPU
// took an exception: the syndrome, fault address, return address and
// saved PSTATE of the last exception into EL1, then what the MMU uses.
var trapRegs = []string{
	"ESR_EL1", "FAR_EL1", "ELR_EL1", "SPSR_EL1", "SP_EL0", "SCTLR_EL1",
	"TCR_EL1", "TTBR0_EL1", "TTBR1_EL1", "MAIR_EL1", "VBAR_EL1", "TPIDR_EL1",
}

func (debugger) Registers() arch.Registers {
	return arch.Registers{
		GDB: arch.GDB{
			Arch:            "aarch64",
			FeaturePrefix:   "org.gnu.gdb.aarch64.",
			Fallback:        append(slices.Clone(general), "pc"),
			FallbackFeature: "org.gnu.gdb.aarch64.core",
			// QEMU 7.2 names SCTLR_EL1 and VBAR_EL1 "SCTLR" and "VBAR";
			// fp and lr are x29 and x30 as the ABI calls them.
			Aliases: [][2]string{{"fp", "x29"}, {"lr", "x30"}, {"SCTLR_EL1", "SCTLR"}, {"VBAR_EL1", "VBAR"}},
		},
		General: general,
		PC:      "pc", SP: "sp", FP: "x29", RA: "x30",
		Trap:   trapRegs,
		Priv:   "cpsr",
		Wait:   "wfi",
		CPUMap: "__cpu_logical_map",
	}
}

// Symbols are an AArch64 ELF's, and Linux builds arch/arm64/boot/Image.
func (debugger) Symbols() arch.Symbols {
	return arch.Symbols{Machine: elf.EM_AARCH64, Family: "AArch64", BootDir: "arch/arm64/boot"}
}

// Privilege decodes PSTATE (cpsr): its M[3:2] are the exception level.
// EL2 runs a hypervisor (or a kernel with VHE), EL3 the secure monitor:
// both are the firmware's levels here.
func (debugger) Privilege(cpsr uint64) arch.Privilege {
	if cpsr>>4&1 == 1 {
		return arch.Privilege{Name: "AArch32 " + aarch32Modes[cpsr&0xf], User: cpsr&0xf == 0}
	}
	switch el := level(cpsr); el {
	case "EL0":
		return arch.Privilege{Name: el, User: true}
	case "EL1":
		return arch.Privilege{Name: el}
	default:
		return arch.Privilege{Name: el, Firmware: true}
	}
}

// level is the exception level a PSTATE (or an SPSR that saved one) is
// at, by its M[3:2]: "EL0" to "EL3".
func level(pstate uint64) string { return "EL" + strconv.Itoa(int(pstate>>2&3)) }

var aarch32Modes = [16]string{0: "user", 1: "FIQ", 2: "IRQ", 3: "supervisor", 6: "monitor", 7: "abort",
	10: "hypervisor", 11: "undefined", 15: "system"}

// decodePSTATE names the fields of a PSTATE (cpsr, or an SPSR that saved
// one) a kernel developer checks: the level and stack, the masked
// exceptions (DAIF), PAN (may EL1 touch user memory) and the flags.
func decodePSTATE(v uint64) string {
	var f []string
	if v>>4&1 == 1 {
		f = append(f, "AArch32 "+aarch32Modes[v&0xf])
	} else {
		sp := "t"
		if v&1 == 1 {
			sp = "h"
		}
		f = append(f, level(v)+sp)
	}
	var masked []string
	for i, n := range []string{"F", "I", "A", "D"} {
		if v>>(6+uint(i))&1 == 1 {
			masked = append([]string{n}, masked...)
		}
	}
	if len(masked) == 0 {
		f = append(f, "DAIF=none masked")
	} else {
		f = append(f, "DAIF="+strings.Join(masked, "")+" masked")
	}
	f = append(f, fmt.Sprintf("PAN=%d", v>>22&1))
	var nzcv strings.Builder
	for i, n := range "NZCV" {
		if v>>(31-uint(i))&1 == 1 {
			nzcv.WriteRune(n)
		} else {
			nzcv.WriteByte('-')
		}
	}
	return strings.Join(append(f, "NZCV="+nzcv.String()), " ")
}

// decodeTranslation says whether the MMU is on, and the VA sizes, granule
// and tables TCR_EL1 and TTBR0/1_EL1 give.
func decodeTranslation(get func(string) (uint64, bool)) string {
	sctlr, ok := get("SCTLR_EL1")
	if ok && sctlr&1 == 0 {
		return "MMU off (SCTLR_EL1.M=0): no translation"
	}
	tcr, ok := get("TCR_EL1")
	if !ok {
		return ""
	}
	s := fmt.Sprintf("TTBR0: %d-bit VA, %s granule", 64-tcr&0x3f, granule0[tcr>>14&3])
	if tcr>>7&1 == 1 {
		s += " (walks disabled, EPD0)"
	}
	if v, ok := get("TTBR0_EL1"); ok {
		s += fmt.Sprintf(", table %s ASID %d", hex(v&baddrMask), v>>48)
	}
	s += fmt.Sprintf("; TTBR1: %d-bit VA, %s granule", 64-tcr>>16&0x3f, granule1[tcr>>30&3])
	if tcr>>23&1 == 1 {
		s += " (walks disabled, EPD1)"
	}
	if v, ok := get("TTBR1_EL1"); ok {
		s += fmt.Sprintf(", table %s", hex(v&baddrMask))
	}
	return s
}

func hex(a uint64) string { return "0x" + strconv.FormatUint(a, 16) }
