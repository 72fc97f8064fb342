// Package riscv64 is the RISC-V 64-bit guest architecture: QEMU's virt
// board with OpenSBI, virtio-mmio devices and an ns16550 UART; and what
// the debugger knows of it: the gdbstub's registers and CSRs, privilege
// modes, trap causes and their verdicts, Sv39/48/57 page walks, RV64GC
// disassembly and Linux's trap frames.
package riscv64

import (
	"bytes"
	"debug/elf"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// Arch is riscv64.
var Arch arch.Arch = riscv64{}

type riscv64 struct{}

func (riscv64) Name() string      { return "riscv64" }
func (riscv64) Aliases() []string { return []string{"riscv", "rv64"} }

func (riscv64) QEMU() arch.QEMU {
	return arch.QEMU{
		Binary:       "qemu-system-riscv64",
		Package:      "qemu-system-misc",
		Machine:      "virt",
		Machines:     []string{"virt", "spike", "sifive_u", "sifive_e", "microchip-icicle-kit", "shakti_c"},
		MachineProps: []string{"aclint", "aia", "aia-guests"},
		Firmware:     "default",
		FirmwareHelp: "'default' (OpenSBI), 'none' or a path",
		FirmwareDirs: []string{"/usr/lib/riscv64-linux-gnu/opensbi", "/usr/share/opensbi", "/usr/lib/u-boot"},
		Virtio:       "device",
		DriveBus:     "virtio-mmio-bus.0",
		Console:      "ttyS0",
		Earlycon:     "earlycon=sbi",
		// QEMU up to 10.1 does not re-arm the supervisor timer of a
		// loaded state: about half of all restores leave a Linux guest
		// whose sleeps never end. The count is the ACLINT's mtime; mip.STIP
		// raised makes the kernel take a timer interrupt.
		Timer:      &arch.Timer{Counter: 0x200bff8, PendingReg: "mip", PendingBit: 1 << 5},
		Probe:      probe,
		TimeTravel: true,
	}
}

// probe is the virt board's ACLINT: mtime counts at 10 MHz, and hart 0's
// machine timer fires (mip.MTIP) once it reaches mtimecmp; with Sstc, the
// supervisor timer (mip.STIP) once it reaches stimecmp.
var probe = &arch.TimerProbe{
	Counter: "mtime",
	Hz:      10_000_000,
	Count:   arch.Access{Addr: 0x200bff8},
	Alarms: []arch.Alarm{
		{Name: "machine", Compare: arch.Access{Addr: 0x2004000}, Pending: arch.Access{Reg: "mip"}, PendingBit: 1 << 7},
		{Name: "supervisor (Sstc)", Compare: arch.Access{Reg: "stimecmp"}, Optional: true, Pending: arch.Access{Reg: "mip"}, PendingBit: 1 << 5},
	},
}

// Kernel knows a RISC-V ELF and a Linux riscv Image, whose header has
// "RISCV\0\0\0" at 48 and "RSC\x05" at 56.
func (riscv64) Kernel(head []byte) bool {
	if m, ok := arch.ELFMachine(head); ok {
		return m == elf.EM_RISCV
	}
	return len(head) >= 60 && bytes.Equal(head[56:60], []byte("RSC\x05"))
}
