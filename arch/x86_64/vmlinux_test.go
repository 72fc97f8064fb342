package x86_64

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The tests in this file check the decoder against a real x86-64 Linux
// kernel, the one scripts/build-linux leaves in the cache, and the host's
// GNU objdump's reading of it.

// testVmlinux opens the cached x86-64 vmlinux, skipping the test without it.
func testVmlinux(t *testing.T) (*elf.File, string) {
	t.Helper()
	// The x86_64 Linux guest scripts/test builds (testguest.ArchLinux
	// finds it the same way; this package's tests cannot import it).
	dir := os.Getenv("QEMU_MCP_LINUX_DIR_X86_64")
	if dir == "" {
		out, err := exec.Command("../../scripts/build-linux", "--arch", "x86_64", "--print-dir").Output()
		if err != nil {
			t.Skip("no x86_64 Linux guest to check against: scripts/build-linux --arch x86_64 builds it (scripts/test does)")
		}
		dir = strings.TrimSpace(string(out))
	}
	path := filepath.Join(dir, "vmlinux")
	f, err := elf.Open(path)
	if err != nil {
		t.Skipf("no x86_64 vmlinux to check against (%v): scripts/build-linux --arch x86_64 builds one", err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

// objdumpInsn is one instruction as objdump reads it.
type objdumpInsn struct {
	addr     uint64
	encoding string // bytes, space-separated
	text     string // normalized by objdumpNormal
}

var (
	objdumpOnce sync.Once
	objdumpOut  []byte
	objdumpErr  error
)

// objdumpText runs objdump over the vmlinux's .text once for all tests.
func objdumpText(t *testing.T, path string) []byte {
	t.Helper()
	objdump, err := exec.LookPath("objdump")
	if err != nil {
		t.Skip("no objdump to compare with")
	}
	objdumpOnce.Do(func() {
		objdumpOut, objdumpErr = exec.Command(objdump, "-d", "--insn-width=15", "-j", ".text", path).Output()
	})
	if objdumpErr != nil {
		t.Fatal(objdumpErr)
	}
	return objdumpOut
}

var (
	symRef = regexp.MustCompile(` <[^>]*>`)
	spaces = regexp.MustCompile(`\s+`)
)

// objdumpNormal reduces an instruction's text to what both sides show: no
// symbol, single spaces.
func objdumpNormal(s string) string {
	s = symRef.ReplaceAllString(s, "")
	return strings.TrimSpace(spaces.ReplaceAllString(s, " "))
}

// sampleInsns are objdump's instructions of .text at the addresses in
// says, less int3 (the padding between functions, most of .text's lines).
func sampleInsns(t *testing.T, path string, in func(uint64) bool) []objdumpInsn {
	var out []objdumpInsn
	sc := bufio.NewScanner(bytes.NewReader(objdumpText(t, path)))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		a, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(f[0], ":")), 16, 64)
		if err != nil || !in(a) {
			continue
		}
		text := objdumpNormal(f[2])
		if text == "int3" {
			continue
		}
		out = append(out, objdumpInsn{addr: a, encoding: strings.TrimSpace(f[1]), text: text})
	}
	return out
}

// TestDisassembleMatchesObjdump compares the text of thousands of the
// kernel's instructions with objdump's: windows spread over .text, entry
// code at its start among them.
func TestDisassembleMatchesObjdump(t *testing.T) {
	f, path := testVmlinux(t)
	text := f.Section(".text")
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	const windows, window = 256, 256
	in := func(a uint64) bool {
		off := a - text.Addr
		return off < 4096 || off%(text.Size/windows) < window
	}
	var d debugger
	var n, same int
	diffs := map[string]int{}
	for _, o := range sampleInsns(t, path, in) {
		off := o.addr - text.Addr
		got := d.Disassemble(code[off:min(off+maxInstruction, uint64(len(code)))], o.addr, 1, nil)
		if len(got) != 1 {
			t.Fatalf("%#x: %d instructions decoded", o.addr, len(got))
		}
		if got[0].Encoding != o.encoding {
			t.Errorf("%#x: encoding %s, objdump %s", o.addr, got[0].Encoding, o.encoding)
		}
		n++
		have := objdumpNormal(got[0].Text)
		if have == o.text {
			same++
			continue
		}
		op := strings.Fields(o.text)[0]
		if diffs[op] < 3 {
			t.Logf("%#x %s: %q, objdump %q", o.addr, o.encoding, have, o.text)
		}
		diffs[op]++
	}
	if n < 4000 {
		t.Fatalf("compared %d instructions, want thousands", n)
	}
	ratio := float64(same) / float64(n)
	t.Logf("%d of %d instructions (%.3f%%) read as objdump reads them; differing, by mnemonic: %v", same, n, 100*ratio, diffs)
	if ratio < 0.995 {
		t.Errorf("agreement with objdump %.4f, want at least 0.995", ratio)
	}
}
