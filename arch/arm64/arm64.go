// Package arm64 is the AArch64 guest architecture: QEMU's virt board with
// a GICv3, virtio-mmio devices and a PL011 UART. QEMU loads the kernel
// itself (no firmware), as Linux's arm64 boot protocol asks.
package arm64

import (
	"bytes"
	"debug/elf"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// Arch is aarch64.
var Arch arch.Arch = arm64{}

type arm64 struct{}

func (arm64) Name() string      { return "aarch64" }
func (arm64) Aliases() []string { return []string{"arm64"} }

func (arm64) QEMU() arch.QEMU {
	return arch.QEMU{
		Binary:  "qemu-system-aarch64",
		Package: "qemu-system-arm",
		// gic-version=3: Linux's GICv3 driver, and every vCPU count up
		// to the board's 512 (a GICv2 takes 8).
		Machine:  "virt,gic-version=3",
		Machines: []string{"virt", "sbsa-ref", "raspi3b", "raspi4b", "xlnx-zcu102", "none"},
		MachineProps: []string{"gic-version", "highmem", "its", "iommu", "ras", "mte",
			"virtualization", "secure", "acpi", "compact-highmem", "highmem-redists", "highmem-ecam",
			"highmem-mmio", "default-bus-bypass-iommu", "dtb-randomness"},
		// max: every feature TCG emulates (LSE atomics, PAuth, BTI,
		// 48-bit VA and PA) on any kernel's CPU feature checks.
		CPU:          "max",
		FirmwareHelp: "none (QEMU loads the kernel) or a path (such as UEFI)",
		FirmwareDirs: []string{"/usr/share/qemu-efi-aarch64", "/usr/share/AAVMF", "/usr/lib/u-boot"},
		Virtio:       "device",
		DriveBus:     "virtio-mmio-bus.0",
		Console:      "ttyAMA0",
		Earlycon:     "earlycon",
		Commands:     []string{"query-gic-capabilities"},
		Probe:        probe,
		TimeTravel:   true,
	}
}

// probe is the generic timer's virtual timer (the one Linux uses): the
// virtual count CNTVCT_EL0 at CNTFRQ_EL0, and the timer's ISTATUS (in
// CNTV_CTL_EL0) once the count reaches CNTV_CVAL_EL0. QEMU's gdbstub
// shows no count (7.2 and 11.1) and does not write system registers, so
// the probe steps the instructions the kernel would run; the tiny kernel
// runs at EL1 with the MMU off, and the probe's guest has 64 MiB of RAM
// from 0x40000000, the kernel in its first 4 MiB.
var probe = &arch.TimerProbe{
	Counter: "CNTVCT_EL0",
	FreqReg: "CNTFRQ_EL0",
	Count:   arch.Access{Reg: "x0", Insn: 0xd53be040}, // mrs x0, cntvct_el0
	Alarms: []arch.Alarm{{
		Name:    "virtual",
		Compare: arch.Access{Reg: "x0", Insn: 0xd51be340}, // msr cntv_cval_el0, x0
		// ENABLE; interrupts stay masked in PSTATE.
		Control: arch.Access{Reg: "x0", Insn: 0xd51be320}, ControlValue: 1, // msr cntv_ctl_el0, x0
		Pending: arch.Access{Reg: "x0", Insn: 0xd53be320}, PendingBit: 1 << 2, // mrs x0, cntv_ctl_el0: ISTATUS
	}},
	Scratch: 0x43fff000,
}

// Kernel knows an AArch64 ELF and a Linux arm64 Image, whose header has
// "ARM\x64" at 56.
func (arm64) Kernel(head []byte) bool {
	if m, ok := arch.ELFMachine(head); ok {
		return m == elf.EM_AARCH64
	}
	return len(head) >= 60 && bytes.Equal(head[56:60], []byte("ARM\x64"))
}

func (arm64) Debugger() arch.Debugger { return debugger{} }

// debugger is what the kernel debugger knows of AArch64.
type debugger struct{}
