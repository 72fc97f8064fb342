package arm64

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// The tests in this file check the decoder against a real arm64 Linux
// kernel, the one scripts/build-linux leaves in the cache, and GNU
// objdump's reading of it.

// testVmlinux opens the cached arm64 vmlinux, skipping the test without it.
func testVmlinux(t *testing.T) (*elf.File, string) { return archtest.Vmlinux(t, "aarch64") }

// symbolCode is the code of the function named, from the vmlinux.
func symbolCode(t *testing.T, f *elf.File, name string) (uint64, []byte) {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name != name || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		sec := f.Sections[s.Section]
		b, err := sec.Data()
		if err != nil {
			t.Fatal(err)
		}
		off := s.Value - sec.Addr
		return s.Value, b[off : off+s.Size]
	}
	t.Fatalf("no function %s in the vmlinux", name)
	return 0, nil
}

var (
	objdumpLine = regexp.MustCompile(`^\s*([0-9a-f]+):\s+([0-9a-f]{8})\s+(.*)$`)
	symRef      = regexp.MustCompile(` <[^>]*>`)
	longHex     = regexp.MustCompile(`\b(?:0x)?([0-9a-f]{9,})\b`)
	spaces      = regexp.MustCompile(`\s+`)
	dataDump    = regexp.MustCompile(`^[0-9a-f]{8} `)
)

// objdumpNormal reduces an instruction's text to what both sides show: no
// comment, no symbol, addresses without 0x, single spaces.
func objdumpNormal(s string) string {
	if i := strings.Index(s, "//"); i >= 0 {
		s = s[:i]
	}
	s = symRef.ReplaceAllString(s, "")
	s = longHex.ReplaceAllString(s, "$1")
	return strings.TrimSpace(spaces.ReplaceAllString(s, " "))
}

// TestDisassembleMatchesObjdump compares the text of thousands of the
// kernel's instructions with GNU objdump's: windows spread over .text,
// the trap vector and entry code among them.
func TestDisassembleMatchesObjdump(t *testing.T) {
	f, path := testVmlinux(t)
	objdump, err := exec.LookPath("aarch64-linux-gnu-objdump")
	if err != nil {
		t.Skip("no aarch64-linux-gnu-objdump to compare with")
	}
	text := f.Section(".text")
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	// 128 windows of 64 instructions, and the trap vector at the start.
	const windows, window = 128, 256
	in := func(a uint64) bool {
		off := a - text.Addr
		return off < 2048 || off%(text.Size/windows) < window
	}
	out, err := exec.Command(objdump, "-d", "-j", ".text", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var d debugger
	var agree archtest.Agreement
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// The address first: most lines are outside the windows.
		line := sc.Text()
		if i := strings.IndexByte(line, ':'); i < 0 {
			continue
		} else if a, err := strconv.ParseUint(strings.TrimSpace(line[:i]), 16, 64); err != nil || !in(a) {
			continue
		}
		m := objdumpLine.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(m[3], ".word") || dataDump.MatchString(m[3]) {
			continue // data in the text (a literal pool), which objdump knows by its mapping symbols
		}
		addr, _ := strconv.ParseUint(m[1], 16, 64)
		if !in(addr) {
			continue
		}
		off := addr - text.Addr
		got := d.Disassemble(code[off:off+4], addr, 1, nil)
		if len(got) != 1 {
			t.Fatalf("%#x: %d instructions decoded from 4 bytes", addr, len(got))
		}
		if got[0].Encoding != m[2] {
			t.Errorf("%#x: encoding %s, objdump %s", addr, got[0].Encoding, m[2])
		}
		agree.Compare(t, addr, m[2], objdumpNormal(got[0].Text), objdumpNormal(m[3]))
	}
	agree.Check(t, 0.999)
}
