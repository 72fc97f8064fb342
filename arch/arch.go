// Package arch says what differs between the guest architectures the server
// boots: the QEMU that runs them, the board and its devices, and how to tell
// a kernel of theirs. The rest of the server asks a guest's Arch and never
// names an architecture itself; each architecture is a package below this
// one, and package archs lists them.
package arch

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// Arch is one guest architecture.
type Arch interface {
	// Name is the architecture as users name it ("riscv64", "aarch64").
	Name() string
	// Aliases are other names users give it ("arm64").
	Aliases() []string
	// QEMU is what a QEMU command line for its guests needs.
	QEMU() QEMU
	// Kernel reports whether a kernel image starting with head (at least
	// HeadSize bytes, fewer if the file is shorter) is for this
	// architecture, by its own headers only: an ELF's machine, a Linux
	// Image header's magic.
	Kernel(head []byte) bool
	// Debugger is what the kernel debugger knows of the architecture;
	// nil where it does not support it yet.
	Debugger() Debugger
}

// HeadSize is how much of a kernel image Kernel is given: room for the
// headers a loader looks for near the start (a multiboot header is within
// the first 8 KiB).
const HeadSize = 8192

// QEMU is what one architecture's QEMU command lines need.
type QEMU struct {
	// Binary is the system emulator's name, looked up on PATH, and
	// Package the Debian package that installs it.
	Binary, Package string
	// Machine is the -machine value a boot gets unless it names one.
	Machine string
	// Machines are the boards a boot may name with -machine.
	Machines []string
	// MachineProps are the -machine properties a boot may set besides
	// the type: they change the guest's board, not the host.
	MachineProps []string
	// CPU is the -cpu value a boot gets unless it names one; empty leaves
	// QEMU's default.
	CPU string
	// Args are options every boot of this architecture gets, after the
	// board's: settings of its devices that the server relies on.
	Args []string
	// Firmware is the -bios a boot gets unless it names one, and
	// FirmwareHelp what the user may give instead; empty Firmware gives no
	// -bios (the board starts the kernel itself).
	Firmware, FirmwareHelp string
	// FirmwareDirs are where Debian's packages put this architecture's
	// firmware (a boot may read them, besides QEMU's own ROMs).
	FirmwareDirs []string
	// Virtio is the suffix of the board's virtio devices' names: "device"
	// (virtio-mmio: virtio-blk-device) or "pci".
	Virtio string
	// DriveBus is an example of a drive's bus as its transport names it,
	// for the documentation of a drive's bus.
	DriveBus string
	// Console is the Linux console device of the board's first serial
	// port ("ttyS0", "ttyAMA0"), for a kernel command line.
	Console string
	// Earlycon is the kernel command-line option with which Linux prints
	// on that port from its first instructions ("earlycon=sbi"), for the
	// boots that need to see an early crash.
	Earlycon string
	// Timer is what a loaded state needs to find its timer again, where
	// this architecture's QEMU may lose it; nil where it keeps it.
	Timer *Timer
	// Probe is what the capability probe (package qemu/caps) reads and
	// arms of the board's timer, on the architecture's tiny kernel; nil
	// where its QEMU is not probed.
	Probe *TimerProbe
	// TimeTravel says recording and replaying this architecture's guests
	// (the debugger's time travel) is verified and offered.
	TimeTravel bool
	// ReplayAppend are Linux command-line options that keep a replay of
	// this architecture's Linux about as fast as its recording: where
	// the boot spins in a loop that costs a replay far more than it cost
	// the recording, the options that skip the loop.
	ReplayAppend []string
	// Commands are the QMP and HMP commands of this architecture's QEMU
	// that read its board's own devices (the GIC's capabilities, say):
	// commands the server refuses for other architectures' boards, which
	// never have those devices, and allows for this one.
	Commands []string
}

// Timer is a board timer that a QEMU may not restore with a loaded state:
// its count is saved with a snapshot and written back after a load, and
// its interrupt raised through the gdbstub, so that the kernel programs
// its next one.
type Timer struct {
	// Counter is the physical address of the timer's 64-bit count.
	Counter uint64
	// PendingReg is the gdbstub's register whose PendingBit raises the
	// timer's interrupt.
	PendingReg string
	PendingBit uint64
}

// TimerProbe is how the capability probe sees the board timer of a guest
// running the architecture's tiny kernel (which uses no timer and takes no
// interrupt, so a timer the probe arms stays pending once it fired),
// through the gdbstub with the guest stopped.
type TimerProbe struct {
	// Counter names the count in the probe's answers ("mtime").
	Counter string
	// Hz is the count's frequency; 0 means FreqReg's value.
	Hz      uint64
	FreqReg string
	// Count reads the count.
	Count Access
	// Alarms are the timers the probe arms before a save: each fires
	// once the count reaches the deadline written to its Compare.
	Alarms []Alarm
	// Scratch is a guest address, unused by the tiny kernel and mapped
	// as it runs, where the probe steps an Access's instruction.
	Scratch uint64
}

// Access is one 64-bit value of the timer: at the physical address Addr,
// else in the gdbstub's register Reg; with Insn, the value is what the
// instruction Insn (little-endian), stepped at TimerProbe.Scratch, reads
// into Reg or writes from it (a register the gdbstub cannot read or
// write, or whose write through it would not re-arm the timer).
type Access struct {
	Addr uint64
	Reg  string
	Insn uint32
}

// Alarm is one timer the probe arms.
type Alarm struct {
	// Name says which timer ("machine", "virtual").
	Name string
	// Compare is the deadline; Optional alarms are armed only where the
	// gdbstub has Compare.Reg (an extension of the CPU's).
	Compare  Access
	Optional bool
	// Control, if set, is written ControlValue after the deadline: it
	// enables the timer.
	Control      Access
	ControlValue uint64
	// Pending has PendingBit set once the timer fired.
	Pending    Access
	PendingBit uint64
}

// Device is the name of a virtio device of kind ("blk", "net", "9p",
// "gpu", "keyboard", "tablet") on q's board.
func (q QEMU) Device(kind string) string { return "virtio-" + kind + "-" + q.Virtio }

// ELFMachine is the machine an ELF header names; ok is false if head is
// no ELF's start.
func ELFMachine(head []byte) (m elf.Machine, ok bool) {
	if len(head) < 20 || !bytes.HasPrefix(head, []byte(elf.ELFMAG)) {
		return 0, false
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if elf.Data(head[elf.EI_DATA]) == elf.ELFDATA2MSB {
		bo = binary.BigEndian
	}
	return elf.Machine(bo.Uint16(head[18:20])), true
}
