package archs

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// A kernel's architecture is read from its headers: the ELF's machine,
// a Linux Image header's magic; a flat binary has none.
func TestRecognize(t *testing.T) {
	elf, err := os.ReadFile("../../testdata/images/tiny.elf")
	if err != nil {
		t.Fatal(err)
	}
	flat, err := os.ReadFile("../../testdata/images/tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	image := func(at int, magic string) []byte {
		b := make([]byte, 64)
		copy(b[at:], magic)
		return b
	}
	arm64ELF := append([]byte(nil), elf[:64]...)
	arm64ELF[18], arm64ELF[19] = 183, 0 // EM_AARCH64
	x86ELF := append([]byte(nil), elf[:64]...)
	x86ELF[18], x86ELF[19] = 62, 0 // EM_X86_64
	bzImage := make([]byte, 0x400)
	copy(bzImage[0x1fe:], "\x55\xaa\xeb\x66HdrS") // boot flag, jump, the setup header's magic
	multiboot := make([]byte, 4096)
	copy(multiboot[1024:], "\x02\xb0\xad\x1b\x03\x00\x00\x00\xfb\x4f\x52\xe4") // magic, flags 3, checksum
	for _, c := range []struct {
		name string
		head []byte
		want string // "" for none
	}{
		{"riscv64 ELF (the tiny kernel's)", elf, "riscv64"},
		{"flat riscv64 binary", flat, ""},
		{"Linux riscv Image", image(56, "RSC\x05"), "riscv64"},
		{"Linux arm64 Image", image(56, "ARM\x64"), "aarch64"},
		{"aarch64 ELF", arm64ELF, "aarch64"},
		{"x86_64 ELF", x86ELF, "x86_64"},
		{"Linux bzImage", bzImage, "x86_64"},
		{"multiboot kernel", multiboot, "x86_64"},
		{"empty file", nil, ""},
	} {
		a, ok, err := Recognize(bytes.NewReader(c.head))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := ""
		if ok {
			got = a.Name()
		}
		if got != c.want {
			t.Errorf("%s: recognised as %q, want %q", c.name, got, c.want)
		}
	}
}

func TestLookup(t *testing.T) {
	for name, want := range map[string]string{"": "riscv64", "riscv64": "riscv64", "RV64": "riscv64",
		"aarch64": "aarch64", "arm64": "aarch64", "x86_64": "x86_64", "amd64": "x86_64"} {
		a, err := Lookup(name)
		if err != nil || a.Name() != want {
			t.Errorf("Lookup(%q) = %v, %v; want %s", name, a, err, want)
		}
	}
	_, err := Lookup("mips")
	var u *UnknownError
	if !errors.As(err, &u) || err.Error() != `architecture "mips": want one of riscv64, aarch64, x86_64` {
		t.Errorf("Lookup(mips) = %v", err)
	}
}
