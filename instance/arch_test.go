package instance

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// A boot's architecture is the one it names, else its kernel's, else the
// default; its QEMU, board, CPU, firmware and built-in kernel are that
// architecture's; a kernel of another architecture than the one named is
// refused before QEMU starts.
func TestMachineConfigArch(t *testing.T) {
	root := t.TempDir()
	arm64Image := make([]byte, 4096)
	copy(arm64Image[56:], "ARM\x64")
	riscvImage := make([]byte, 4096)
	copy(riscvImage[56:], "RSC\x05")
	for name, b := range map[string][]byte{"Image": arm64Image, "rv-Image": riscvImage, "flat.bin": {0x13, 0, 0, 0}} {
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runtime := t.TempDir()
	policy := hostpath.Policy{WorkDir: root, Images: ImagesDir(runtime)}
	m := &Manager{cfg: Config{RuntimeDir: runtime, HostPolicy: policy, Platforms: map[string]Platform{
		"riscv64": {Kernel: []byte("riscv tiny")},
		"aarch64": {QEMU: "/opt/q/qemu-system-aarch64", Kernel: []byte("arm tiny")},
	}}}
	scope, err := policy.Project(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		mach       profile.Profile
		want       []string // words of the command line, in order
		wantKernel string   // the built-in kernel's content, or a file's name
	}{
		{"nothing given: riscv64's tiny kernel", profile.Profile{},
			[]string{"qemu-system-riscv64", "-machine", "virt", "-bios", "default"}, "riscv tiny"},
		{"arch aarch64, no kernel: aarch64's tiny kernel on its QEMU", profile.Profile{Arch: "arm64"},
			[]string{"/opt/q/qemu-system-aarch64", "-machine", "virt,gic-version=3", "-cpu", "max"}, "arm tiny"},
		{"an arm64 Image: aarch64", profile.Profile{Kernel: "Image"},
			[]string{"/opt/q/qemu-system-aarch64", "-cpu", "max", "-kernel"}, "Image"},
		{"a riscv Image: riscv64", profile.Profile{Kernel: "rv-Image"},
			[]string{"qemu-system-riscv64", "-bios", "default", "-kernel"}, "rv-Image"},
		{"a flat binary: the default", profile.Profile{Kernel: "flat.bin"},
			[]string{"qemu-system-riscv64", "-kernel"}, "flat.bin"},
		{"a flat binary named aarch64", profile.Profile{Kernel: "flat.bin", Arch: "aarch64"},
			[]string{"/opt/q/qemu-system-aarch64", "-kernel"}, "flat.bin"},
		{"bios none on aarch64: no -bios (QEMU would look for a ROM named none)", profile.Profile{Kernel: "Image", BIOS: "none"},
			[]string{"/opt/q/qemu-system-aarch64", "-kernel"}, "Image"},
	} {
		cfg, err := m.machineConfig(Args{Machine: c.mach, scope: scope})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		argv := cfg.Argv("/r/serial", 3)
		qemu.CloseFiles(cfg.Files)
		if !inOrder(argv, c.want) {
			t.Errorf("%s: command line %q lacks %q in that order", c.name, argv, c.want)
		}
		if slices.Contains(argv, "-bios") != (cfg.ArchName() == "riscv64") {
			t.Errorf("%s: %q: -bios only where the board has firmware of its own", c.name, argv)
		}
		if b, _ := os.ReadFile(cfg.Kernel); filepath.Base(cfg.Kernel) != c.wantKernel && string(b) != c.wantKernel {
			t.Errorf("%s: kernel %s (%q), want %s", c.name, cfg.Kernel, b, c.wantKernel)
		}
	}
	_, err = m.machineConfig(Args{Machine: profile.Profile{Kernel: "Image", Arch: "riscv64"}, scope: scope})
	var mis *ArchMismatchError
	if !errors.As(err, &mis) || mis.KernelArch != "aarch64" || mis.Asked != "riscv64" {
		t.Errorf("an arm64 Image booted as riscv64: %v, want an ArchMismatchError", err)
	}
	if _, err := m.machineConfig(Args{Machine: profile.Profile{Arch: "mips"}, scope: scope}); err == nil ||
		err.Error() != `architecture "mips": want one of riscv64, aarch64, x86_64` {
		t.Errorf("arch mips: %v", err)
	}
}

// inOrder says whether want's words appear in argv in that order.
func inOrder(argv, want []string) bool {
	i := 0
	for _, a := range argv {
		if i < len(want) && a == want[i] {
			i++
		}
	}
	return i == len(want)
}
