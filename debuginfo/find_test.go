package debuginfo

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
)

// A kernel image in a Linux build tree's boot directory has its symbols
// at the tree's top; symbols of another machine are refused by name.
func TestFindKernelSymbols(t *testing.T) {
	elfData, err := os.ReadFile("../testdata/images/tiny.elf")
	if err != nil {
		t.Fatal(err)
	}
	flat, err := os.ReadFile("../testdata/images/tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	boot := filepath.Join(tree, "arch", "riscv", "boot")
	if err := os.MkdirAll(boot, 0o755); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(boot, "Image")
	for path, data := range map[string][]byte{filepath.Join(tree, "vmlinux"): elfData, image: flat} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(p string) (*os.File, string, error) {
		f, err := os.Open(p)
		return f, filepath.Clean(p), err
	}
	df, path, err := FindKernelSymbols(image, riscv64.Arch, open)
	if err != nil || df == nil || path != filepath.Join(tree, "vmlinux") {
		t.Fatalf("riscv64 build tree: %v, %q, %v", df, path, err)
	}
	df.Close()

	var u *arch.UnsupportedError
	if _, _, err := FindKernelSymbols(image, noDebugger{arm64.Arch}, open); !errors.As(err, &u) {
		t.Errorf("an architecture without the debugger: %v, want the debugger's unsupported architecture", err)
	}

	other := append([]byte(nil), elfData...)
	other[18], other[19] = 183, 0 // EM_AARCH64
	otherPath := filepath.Join(tree, "vmlinux.arm64")
	if err := os.WriteFile(otherPath, other, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(otherPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKernel(f, otherPath, nil); err == nil || !strings.HasSuffix(err.Error(), "are for EM_AARCH64, not RISC-V: give the riscv64 kernel's vmlinux") {
		t.Errorf("aarch64 symbols for a riscv64 kernel: %v", err)
	}
}

// noDebugger is an architecture the debugger does not support.
type noDebugger struct{ arch.Arch }

func (noDebugger) Debugger() arch.Debugger { return nil }
