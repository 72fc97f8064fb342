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
		Commands:     []string{"query-gic-capabilities"},
	}
}

// Kernel knows an AArch64 ELF and a Linux arm64 Image, whose header has
// "ARM\x64" at 56.
func (arm64) Kernel(head []byte) bool {
	if m, ok := arch.ELFMachine(head); ok {
		return m == elf.EM_AARCH64
	}
	return len(head) >= 60 && bytes.Equal(head[56:60], []byte("ARM\x64"))
}

// Debugger is nil: the debugger does not support aarch64 guests yet.
func (arm64) Debugger() arch.Debugger { return nil }
