// Package archtest is what the tests of the architecture packages
// (arch/arm64, arch/riscv64, arch/x86_64) share: the vmlinux of a cached
// Linux guest, machine code spelled in hex, registers and physical memory
// for page walks, and a check of a disassembly. It imports package arch
// and linuxdir alone, so that those packages' own tests may import it: testguest, which
// finds guests for the server's tests, imports the architectures.
package archtest

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/linuxdir"
)

// Vmlinux opens the vmlinux of the Linux guest scripts/build-linux builds
// for the architecture name ("aarch64", "x86_64"), found by
// linuxdir.Vmlinux. Without one the test is skipped.
func Vmlinux(t testing.TB, name string) (*elf.File, string) {
	t.Helper()
	path := linuxdir.Vmlinux(t, name)
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

// Code is the bytes s spells in hex, spaces aside ("48 89 e5").
func Code(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Memory is physical memory holding page tables: 64-bit entries by
// address. Unset memory reads as 0, an entry that maps nothing.
type Memory map[uint64]uint64

// Read reads the entry at pa, as a walk's read does; a misaligned read is
// an error (no walker makes one).
func (m Memory) Read(pa uint64) (uint64, error) {
	if pa%8 != 0 {
		return 0, fmt.Errorf("misaligned entry read at %#x", pa)
	}
	return m[pa], nil
}

// Regs are a vCPU's registers by name.
type Regs map[string]uint64

// Get reads a register, as a walk's reg does; one not set is an error.
func (r Regs) Get(name string) (uint64, error) {
	v, ok := r[name]
	if !ok {
		return 0, errors.New("no register " + name)
	}
	return v, nil
}

// Instructions checks a disassembly against the instructions wanted, one
// by one.
func Instructions(t testing.TB, got, want []arch.Instruction) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d instructions, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("instruction %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Agreement tallies how many of a decoder's instruction texts read as
// objdump's, logging the first few that differ for each mnemonic.
type Agreement struct {
	n, same int
	diffs   map[string]int // texts that differ, by objdump's mnemonic
}

// Compare takes in the instruction at addr, encoded enc: have is the
// decoder's text, want objdump's, each reduced to what both show.
func (a *Agreement) Compare(t testing.TB, addr uint64, enc, have, want string) {
	t.Helper()
	a.n++
	if have == want {
		a.same++
		return
	}
	if a.diffs == nil {
		a.diffs = map[string]int{}
	}
	op := strings.Fields(want)[0]
	if a.diffs[op] < 3 {
		t.Logf("%#x %s: %q, objdump %q", addr, enc, have, want)
	}
	a.diffs[op]++
}

// Check logs the agreement, and fails the test unless thousands of
// instructions were compared and at least the share least of them read as
// objdump reads them.
func (a *Agreement) Check(t testing.TB, least float64) {
	t.Helper()
	if a.n < 4000 {
		t.Fatalf("compared %d instructions, want thousands", a.n)
	}
	ratio := float64(a.same) / float64(a.n)
	t.Logf("%d of %d instructions (%.3f%%) read as objdump reads them; differing, by mnemonic: %v", a.same, a.n, 100*ratio, a.diffs)
	if ratio < least {
		t.Errorf("agreement with objdump %.4f, want at least %g", ratio, least)
	}
}
