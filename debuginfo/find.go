package debuginfo

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// OpenKernel reads f (named path) as the symbols of a riscv64 kernel; f is
// the File's from then on, closed with it, or at once on error.
func OpenKernel(f *os.File, path string) (*File, error) {
	df, err := OpenFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("symbols %s: %w", path, err)
	}
	if df.Machine() != elf.EM_RISCV {
		df.Close()
		return nil, fmt.Errorf("symbols %s are for %s, not RISC-V: give the riscv64 kernel's vmlinux", path, df.Machine())
	}
	return df, nil
}

// FindKernelSymbols finds the symbols of the kernel image at kernel: the
// kernel itself when it is an ELF, else a vmlinux beside it, else the
// vmlinux at the top of the Linux build tree it came from
// (arch/riscv/boot/Image). open opens a candidate (under the caller's
// access policy) and names it by its real path; a candidate it cannot
// open, or that is no ELF, is skipped. No candidate is nil, "", nil: the
// debugger then shows addresses only.
func FindKernelSymbols(kernel string, open func(path string) (*os.File, string, error)) (*File, string, error) {
	dir := filepath.Dir(kernel)
	cands := []string{kernel, filepath.Join(dir, "vmlinux")}
	if strings.HasSuffix(dir, filepath.Join("arch", "riscv", "boot")) {
		cands = append(cands, filepath.Join(dir, "..", "..", "..", "vmlinux"))
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
		df, err := OpenKernel(f, path)
		return df, path, err
	}
	return nil, "", nil
}

func isELF(f *os.File) bool {
	var magic [4]byte
	_, err := f.ReadAt(magic[:], 0)
	return err == nil && string(magic[:]) == elf.ELFMAG
}
