package debuginfo

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
)

// OpenKernel reads f (named path) as the symbols of a kernel of
// architecture a (nil: archs.Default()); f is the File's from then on,
// closed with it, or at once on error. An architecture the debugger does
// not support has no symbols to read (arch.UnsupportedError).
func OpenKernel(f *os.File, path string, a arch.Arch) (*File, error) {
	if a == nil {
		a = archs.Default()
	}
	want, err := symbolsOf(a)
	if err != nil {
		f.Close()
		return nil, err
	}
	df, err := OpenFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("symbols %s: %w", path, err)
	}
	if df.Machine() != want.Machine {
		df.Close()
		return nil, fmt.Errorf("symbols %s are for %s, not %s: give the %s kernel's vmlinux", path, df.Machine(), want.Family, a.Name())
	}
	return df, nil
}

// symbolsOf is what a's kernel symbols are.
func symbolsOf(a arch.Arch) (arch.Symbols, error) {
	d := a.Debugger()
	if d == nil {
		return arch.Symbols{}, &arch.UnsupportedError{Arch: a.Name()}
	}
	return d.Symbols(), nil
}

// FindKernelSymbols finds the symbols of the kernel image at kernel, of
// architecture a (nil: archs.Default()): the kernel itself when it is an
// ELF, else a vmlinux beside it, else the vmlinux at the top of the Linux
// build tree it came from (its boot directory, arch/riscv/boot/Image on
// riscv64). open opens a candidate (under the caller's
// access policy) and names it by its real path; a candidate it cannot
// open, or that is no ELF, is skipped. No candidate is nil, "", nil: the
// debugger then shows addresses only.
func FindKernelSymbols(kernel string, a arch.Arch, open func(path string) (*os.File, string, error)) (*File, string, error) {
	if a == nil {
		a = archs.Default()
	}
	want, err := symbolsOf(a)
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Dir(kernel)
	cands := []string{kernel, filepath.Join(dir, "vmlinux")}
	if boot := filepath.FromSlash(want.BootDir); boot != "" && strings.HasSuffix(dir, boot) {
		up := strings.Repeat(".."+string(filepath.Separator), strings.Count(want.BootDir, "/")+1)
		cands = append(cands, filepath.Join(dir, up, "vmlinux"))
	}
	for _, cand := range cands {
		f, path, err := open(cand)
		if err != nil {
			continue
		}
		if !isELF(f) {
			f.Close()
			continue
		}
		df, err := OpenKernel(f, path, a)
		return df, path, err
	}
	return nil, "", nil
}

func isELF(f *os.File) bool {
	var magic [4]byte
	_, err := f.ReadAt(magic[:], 0)
	return err == nil && string(magic[:]) == elf.ELFMAG
}
