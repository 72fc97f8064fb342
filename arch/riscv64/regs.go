package riscv64

import (
	"debug/elf"
	"fmt"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// The debugger's riscv64: QEMU's gdbstub describes x0..x31 by ABI name
// (x8 as "fp") and pc, the CSRs, and a virtual "priv" register; a hart's
// ID (mhartid) is its vCPU index on the virt board.

func (riscv64) Debugger() arch.Debugger { return debugger{} }

type debugger struct{}

// abiNames are x0..x31 as QEMU's target description names them (s0 is
// "fp"), for lookups by "x5" where the description says "t0".
var abiNames = [32]string{
	"zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2",
	"fp", "s1", "a0", "a1", "a2", "a3", "a4", "a5",
	"a6", "a7", "s2", "s3", "s4", "s5", "s6", "s7",
	"s8", "s9", "s10", "s11", "t3", "t4", "t5", "t6",
}

// general are x1..x31 by ABI name, as a register read shows them.
var general = []string{
	"ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1",
	"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7",
	"s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
	"t3", "t4", "t5", "t6",
}

// trapCSRs are the CSRs worth showing when asking "why did it trap":
// supervisor first (where a kernel runs), then machine (firmware).
var trapCSRs = []string{
	"sstatus", "sepc", "scause", "stval", "satp", "stvec", "sie", "sip", "sscratch",
	"mstatus", "mepc", "mcause", "mtval", "mtvec", "medeleg", "mideleg", "mie", "mip",
}

func (debugger) Registers() arch.Registers {
	g := arch.GDB{
		Arch:            "riscv:rv64",
		FeaturePrefix:   "org.gnu.gdb.riscv.",
		Fallback:        append(abiNames[:], "pc"),
		FallbackFeature: "org.gnu.gdb.riscv.cpu",
	}
	for i, n := range abiNames {
		g.Aliases = append(g.Aliases, [2]string{"x" + strconv.Itoa(i), n})
	}
	g.Aliases = append(g.Aliases, [2]string{"s0", "fp"})
	return arch.Registers{
		GDB:     g,
		General: general,
		Other:   map[string]string{"s0": "fp"},
		PC:      "pc", SP: "sp", FP: "s0", RA: "ra",
		Trap:     trapCSRs,
		Priv:     "priv",
		Wait:     "wfi",
		CPUMap:   "__cpuid_to_hartid_map",
		CSRNames: true,
	}
}

// Symbols are a RISC-V ELF's, and Linux builds arch/riscv/boot/Image.
func (debugger) Symbols() arch.Symbols {
	return arch.Symbols{Machine: elf.EM_RISCV, Family: "RISC-V", BootDir: "arch/riscv/boot"}
}

// Privilege decodes QEMU's priv: 0 user, 1 supervisor, 3 machine.
func (debugger) Privilege(p uint64) arch.Privilege {
	switch p {
	case 0:
		return arch.Privilege{Name: "user", User: true}
	case 1:
		return arch.Privilege{Name: "supervisor"}
	case 3:
		return arch.Privilege{Name: "machine", Firmware: true}
	}
	return arch.Privilege{Name: fmt.Sprintf("unknown (%d)", p)}
}

// View decodes scause/sepc/stval and mcause/mepc/mtval, the status and
// satp, and the trap being taken at stvec (or the kernel's vector) or, in
// M-mode, at mtvec.
func (d debugger) View(get func(string) (uint64, bool), pc uint64, fn string) arch.TrapView {
	var v arch.TrapView
	trap := func(cause, epc, tval string) *arch.Trap {
		cv, ok := get(cause)
		if !ok {
			return nil
		}
		t := DecodeCause(cv)
		t.PC, t.HasPC = get(epc)
		t.Addr, t.HasAddr = get(tval)
		return &t
	}
	v.Kernel = trap("scause", "sepc", "stval")
	v.Firmware = trap("mcause", "mepc", "mtval")
	if s, ok := get("mstatus"); ok {
		v.Status = decodeStatus(s, true)
	} else if s, ok := get("sstatus"); ok {
		v.Status = decodeStatus(s, false)
	}
	if s, ok := get("satp"); ok {
		v.Translation = decodeSatp(s)
	}
	priv, hasPriv := get("priv")
	stvec, _ := get("stvec")
	mtvec, hasMtvec := get("mtvec")
	switch {
	case v.Kernel != nil && (d.IsVector(fn) || pc == stvec&^3):
		t := *v.Kernel
		t.PC, _ = get("sepc")
		t.Addr, _ = get("stval")
		t.Status, _ = get("sstatus")
		v.Taking = &t
	case v.Firmware != nil && hasPriv && priv == 3 && hasMtvec && pc == mtvec&^3:
		// At the M-mode trap vector's first instruction: a kernel that
		// runs in M-mode taking a trap (firmware's traps included).
		t := *v.Firmware
		t.PC, _ = get("mepc")
		t.Addr, _ = get("mtval")
		t.Status, _ = get("mstatus")
		t.Firmware = true
		v.Taking = &t
	}
	return v
}

// decodeStatus names the mstatus/sstatus fields a kernel developer checks:
// the previous privilege (where a trap came from), interrupt enables, and
// SUM/MXR (may supervisor touch user pages).
func decodeStatus(v uint64, machine bool) string {
	bit := func(n uint) uint64 { return v >> n & 1 }
	var f []string
	spp := "U"
	if bit(8) == 1 {
		spp = "S"
	}
	f = append(f, "SPP="+spp, fmt.Sprintf("SIE=%d", bit(1)), fmt.Sprintf("SPIE=%d", bit(5)),
		fmt.Sprintf("SUM=%d", bit(18)), fmt.Sprintf("MXR=%d", bit(19)))
	if machine {
		mpp := map[uint64]string{0: "U", 1: "S", 3: "M"}[v>>11&3]
		f = append(f, "MPP="+mpp, fmt.Sprintf("MIE=%d", bit(3)), fmt.Sprintf("MPRV=%d", bit(17)))
	}
	if fs := v >> 13 & 3; fs != 0 {
		f = append(f, "FS="+[]string{"off", "initial", "clean", "dirty"}[fs])
	}
	return strings.Join(f, " ")
}

// decodeSatp says the translation mode, ASID and root page table.
func decodeSatp(v uint64) string {
	mode := map[uint64]string{0: "Bare", 8: "Sv39", 9: "Sv48", 10: "Sv57"}[v>>60]
	if mode == "" {
		mode = fmt.Sprintf("mode %d", v>>60)
	}
	if v>>60 == 0 {
		return "Bare (no translation)"
	}
	return fmt.Sprintf("%s asid=%d root=%s", mode, v>>44&0xffff, hex((v&(1<<44-1))<<12))
}

func hex(a uint64) string { return "0x" + strconv.FormatUint(a, 16) }
