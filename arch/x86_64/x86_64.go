// Package x86_64 is the x86-64 guest architecture: QEMU's q35 board with
// SeaBIOS (which loads a Linux bzImage, a multiboot kernel or a PVH ELF
// given with -kernel), virtio-pci devices on the PCIe root bus and the
// first 16550 UART on the ISA bus.
//
// q35 rather than microvm: it is the board QEMU's own record/replay tests
// use for x86-64, its PCIe bus takes every virtio device a guest wants
// without kernel command-line device lists, and Debian's and upstream's
// x86-64 kernels boot on it unchanged; SeaBIOS costs a few hundred
// milliseconds of a boot under TCG.
package x86_64

import (
	"bytes"
	"debug/elf"
	"encoding/binary"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// Arch is x86_64.
var Arch arch.Arch = x86{}

type x86 struct{}

func (x86) Name() string      { return "x86_64" }
func (x86) Aliases() []string { return []string{"x86-64", "amd64", "x64"} }

func (x86) QEMU() arch.QEMU {
	return arch.QEMU{
		Binary:   "qemu-system-x86_64",
		Package:  "qemu-system-x86",
		Machine:  "q35",
		Machines: []string{"q35", "pc", "microvm", "isapc"},
		MachineProps: []string{"acpi", "hpet", "pit", "pic", "smm", "vmport", "sata", "usb", "i8042", "smbus",
			"default-bus-bypass-iommu", "graphics", "rtc", "isa-serial", "auto-kernel-cmdline", "ioapic2", "pcie",
			"x-option-roms", "kernel-irqchip"},
		// No kvmvapic (the local APIC's TPR patching for old Windows
		// guests, on by default under TCG too): its state's load asks
		// the vCPU thread to run code, which in a replay waits for the
		// replay lock the loading thread holds, so loading a replay's
		// checkpoint hangs QEMU 7.2 and 11.1 for good.
		Args:         []string{"-global", "apic-common.vapic=off"},
		FirmwareHelp: "none given: QEMU's SeaBIOS; or a path (qboot.rom, OVMF)",
		FirmwareDirs: []string{"/usr/share/seabios", "/usr/share/qemu", "/usr/share/ovmf", "/usr/share/OVMF"},
		Virtio:       "pci",
		DriveBus:     "pcie.0",
		Console:      "ttyS0",
		Probe:        probe,
		Earlycon:     "earlycon=uart8250,io,0x3f8",
		TimeTravel:   true,
		// TCG ends a vCPU's run at every PAUSE, and a replay pays a log
		// event for each run (a recording, a microsecond): the boot's
		// checks of the timer IRQ and of the local APIC timer's rate
		// spin on PAUSE for about 90 M instructions, which a replay of
		// QEMU 7.2 takes over two minutes to pass. Skipped, the replay
		// of a whole boot takes seconds.
		ReplayAppend: []string{"no_timer_check", "noapictimer"},
	}
}

// probe is the HPET of q35 (and pc), which the tiny kernel starts: its
// main counter runs at 100 MHz (QEMU's fixed 10 ns period), and timer 0,
// level-triggered, sets its bit in the general interrupt status once the
// counter reaches its comparator. All of it is memory-mapped, so the probe
// reads and arms it without stepping the guest. QEMU keeps every x86 clock
// (HPET, local APIC timer, TSC) on the same virtual clock and saves it the
// same way, so the HPET answers for the timers Linux uses.
var probe = &arch.TimerProbe{
	Counter: "HPET counter",
	Hz:      100_000_000,
	Count:   arch.Access{Addr: 0xfed000f0},
	Alarms: []arch.Alarm{{
		Name:    "HPET's first",
		Compare: arch.Access{Addr: 0xfed00108},
		// Tn_INT_ENB | Tn_INT_TYPE (level) | route to I/O APIC input 2,
		// the one QEMU offers; the I/O APIC keeps it masked.
		Control: arch.Access{Addr: 0xfed00100}, ControlValue: 1<<2 | 1<<1 | 2<<9,
		Pending: arch.Access{Addr: 0xfed00020}, PendingBit: 1,
	}},
}

// Kernel knows an x86 ELF (64- or 32-bit: qemu-system-x86_64 runs both),
// a Linux bzImage (its setup header's "HdrS" at 0x202) and a multiboot
// kernel (the header's magic, 4-byte aligned in the first 8 KiB).
func (x86) Kernel(head []byte) bool {
	if m, ok := arch.ELFMachine(head); ok {
		return m == elf.EM_X86_64 || m == elf.EM_386
	}
	if len(head) >= 0x206 && bytes.Equal(head[0x202:0x206], []byte("HdrS")) {
		return true
	}
	for off := 0; off+12 <= len(head) && off < arch.HeadSize; off += 4 {
		magic, flags, sum := binary.LittleEndian.Uint32(head[off:]), binary.LittleEndian.Uint32(head[off+4:]), binary.LittleEndian.Uint32(head[off+8:])
		if magic == 0x1badb002 && magic+flags+sum == 0 {
			return true
		}
	}
	return false
}

func (x86) Debugger() arch.Debugger { return debugger{} }
