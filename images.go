// Package qemumcp carries the guest images built into the qemu-mcp binary,
// so that --selftest and a qemu_boot without a kernel work from any directory.
package qemumcp

import _ "embed"

// TinyKernel is the project's own bare-metal riscv64 test kernel
// (testdata/images/tiny/, rebuilt by scripts/build-tiny-kernel): a banner,
// the prompt "tiny> " and a small line shell on the virt board's UART.
//
//go:embed testdata/images/tiny.bin
var TinyKernel []byte

// TinyKernelELF is the same kernel as ELF with symbols and DWARF lines:
// the debugger's symbols for it.
//
//go:embed testdata/images/tiny.elf
var TinyKernelELF []byte

// TinyKernelAarch64 and TinyKernelAarch64ELF are the tiny kernel for
// aarch64 (testdata/images/tiny-aarch64/): the same shell on the virt
// board's PL011, loaded by QEMU at EL1 (no firmware).
//
//go:embed testdata/images/tiny-aarch64.bin
var TinyKernelAarch64 []byte

//go:embed testdata/images/tiny-aarch64.elf
var TinyKernelAarch64ELF []byte

// TinyKernelX86_64 is the tiny kernel for x86_64
// (testdata/images/tiny-x86_64/): the same shell on the first 16550, an
// ELF64 that SeaBIOS enters through its PVH note; the ELF is both what
// QEMU boots and the symbols.
//
//go:embed testdata/images/tiny-x86_64.elf
var TinyKernelX86_64 []byte

// Image is a built-in kernel: what QEMU boots, and its ELF with symbols.
type Image struct{ Kernel, ELF []byte }

// Tiny is the tiny kernel of the architecture named arch; none (nil
// slices) where the project has none.
func Tiny(arch string) Image { return tiny[arch] }

var tiny = map[string]Image{
	"riscv64": {TinyKernel, TinyKernelELF},
	"aarch64": {TinyKernelAarch64, TinyKernelAarch64ELF},
	"x86_64":  {TinyKernelX86_64, TinyKernelX86_64},
}
