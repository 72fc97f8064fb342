package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
)

// On a PCI board a drive's bus is a PCI bus and, after a colon, an
// optional slot; two drives may share a bus but not a slot. On a
// virtio-mmio board a bus is one transport, holding one drive.
func TestDriveBusPCI(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k, a, b := file("k"), file("a.img"), file("b.img")
	for _, tc := range []struct {
		bus, want, err string
	}{
		{"pcie.0", "virtio-blk-pci,drive=drive0,bus=pcie.0", ""},
		{"pcie.0:5", "virtio-blk-pci,drive=drive0,bus=pcie.0,addr=0x5", ""},
		{"pcie.0:0x1f", "virtio-blk-pci,drive=drive0,bus=pcie.0,addr=0x1f", ""},
		{"pcie.0:0", "", "a PCI slot from 1 to 0x1f"},
		{"pcie.0:20", "", "a PCI slot from 1 to 0x1f"},
		{"pcie 0", "", "want a bus name such as pcie.0"},
	} {
		c := NewConfig(WithArch(x86_64.Arch), WithKernel(k), WithDrive(Drive{Path: a, Bus: tc.bus}))
		err := c.Validate()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("bus %q: %v, want %q", tc.bus, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("bus %q: %v", tc.bus, err)
			continue
		}
		if argv := c.Argv("/s", 3); !slices.Contains(argv, tc.want) {
			t.Errorf("bus %q: argv %q lacks %q", tc.bus, argv, tc.want)
		}
	}
	two := func(bus1, bus2 string) error {
		c := NewConfig(WithArch(x86_64.Arch), WithKernel(k), WithDrive(Drive{Path: a, Bus: bus1}), WithDrive(Drive{Path: b, Bus: bus2}))
		return c.Validate()
	}
	if err := two("pcie.0", "pcie.0"); err != nil {
		t.Errorf("two drives on pcie.0: %v", err)
	}
	if err := two("pcie.0:5", "pcie.0:0x5"); err == nil || !strings.Contains(err.Error(), "holds one device") {
		t.Errorf("two drives in slot 5: %v", err)
	}
	c := NewConfig(WithKernel(k), WithDrive(Drive{Path: a, Bus: "virtio-mmio-bus.0"}), WithDrive(Drive{Path: b, Bus: "virtio-mmio-bus.0"}))
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "holds one device") {
		t.Errorf("two drives on one virtio-mmio transport: %v", err)
	}
}
