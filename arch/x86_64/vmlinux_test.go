package x86_64

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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
	symRef = regexp.MustCompile(` <[^>]*>`)
	spaces = regexp.MustCompile(`\s+`)
)

// objdumpNormal reduces an instruction's text to what both sides show: no
// symbol, single spaces.
func objdumpNormal(s string) string {
	s = symRef.ReplaceAllString(s, "")
	return strings.TrimSpace(spaces.ReplaceAllString(s, " "))
}

// textFuncs are the functions of .text, by address.
func textFuncs(t *testing.T, f *elf.File) []elf.Symbol {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	var out []elf.Symbol
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 && s.Value >= text.Addr && s.Value+s.Size <= text.Addr+text.Size {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Value < out[j].Value })
	return out
}

var (
	sampleOnce sync.Once
	sample     []objdumpInsn
	sampleErr  error
)

// objdumpSample is objdump's reading of windows spread over .text, each
// 4 KiB from a function's start (where objdump and a decoder agree on
// where instructions begin), less int3 (the padding between functions,
// most of .text's bytes), read once for all tests.
func objdumpSample(t *testing.T) (*elf.File, []objdumpInsn) {
	t.Helper()
	f, path := testVmlinux(t)
	objdump, err := exec.LookPath("objdump")
	if err != nil {
		t.Skip("no objdump to compare with")
	}
	funcs := textFuncs(t, f)
	text := f.Section(".text")
	sampleOnce.Do(func() {
		const windows, window = 24, 4096
		next, end := 0, uint64(0)
		for k := range windows {
			from := max(text.Addr+uint64(k)*(text.Size/windows), end)
			for next < len(funcs) && funcs[next].Value < from {
				next++
			}
			if next == len(funcs) {
				break
			}
			start := funcs[next].Value
			out, err := exec.Command(objdump, "-d", "--insn-width=15", "-j", ".text",
				fmt.Sprintf("--start-address=%#x", start), fmt.Sprintf("--stop-address=%#x", start+window), path).Output()
			if err != nil {
				sampleErr = err
				return
			}
			end = start + window
			for _, in := range parseObjdump(out) {
				// objdump cuts the instruction the window's end is in,
				// and reads its bytes one at a time.
				if in.addr+maxInstruction <= end {
					sample = append(sample, in)
				}
			}
		}
	})
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	return f, sample
}

// parseObjdump reads objdump -d --insn-width=15's instructions, less
// int3.
func parseObjdump(out []byte) []objdumpInsn {
	var insns []objdumpInsn
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		a, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(f[0], ":")), 16, 64)
		if err != nil {
			continue
		}
		text := objdumpNormal(f[2])
		if text == "int3" {
			continue
		}
		insns = append(insns, objdumpInsn{addr: a, encoding: strings.TrimSpace(f[1]), text: text})
	}
	return insns
}

var (
	textOnce sync.Once
	textData []byte
	textErr  error
)

// textCode is the code of .text at addr, up to n bytes.
func textCode(t *testing.T, f *elf.File, addr uint64, n int) []byte {
	t.Helper()
	text := f.Section(".text")
	textOnce.Do(func() { textData, textErr = text.Data() })
	if textErr != nil {
		t.Fatal(textErr)
	}
	code := textData
	off := addr - text.Addr
	return code[off:min(off+uint64(n), uint64(len(code)))]
}

// TestDisassembleMatchesObjdump compares the text of thousands of the
// kernel's instructions with objdump's: windows spread over .text.
func TestDisassembleMatchesObjdump(t *testing.T) {
	f, insns := objdumpSample(t)
	var d debugger
	var n, same int
	diffs := map[string]int{}
	for _, o := range insns {
		got := d.Disassemble(textCode(t, f, o.addr, maxInstruction), o.addr, 1, nil)
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
