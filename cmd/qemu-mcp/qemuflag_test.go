package main

import "testing"

// -qemu PATH is riscv64's QEMU, as before the server knew other
// architectures; -qemu ARCH=PATH another's.
func TestQEMUFlag(t *testing.T) {
	for _, c := range []struct{ in, arch, path, err string }{
		{"/opt/q/qemu-system-riscv64", "riscv64", "/opt/q/qemu-system-riscv64", ""},
		{"qemu-system-riscv64", "riscv64", "qemu-system-riscv64", ""},
		{"aarch64=/opt/q/qemu-system-aarch64", "aarch64", "/opt/q/qemu-system-aarch64", ""},
		{"arm64=qemu-system-aarch64", "aarch64", "qemu-system-aarch64", ""},
		{"/opt/a=b/qemu", "riscv64", "/opt/a=b/qemu", ""},
		{"mips=/opt/q/qemu-system-mips", "", "", `architecture "mips": want one of riscv64, aarch64, x86_64`},
	} {
		arch, path, err := qemuFlag(c.in)
		if got := errText(err); got != c.err || arch != c.arch || path != c.path {
			t.Errorf("-qemu %s = %q, %q, %q; want %q, %q, %q", c.in, arch, path, got, c.arch, c.path, c.err)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
