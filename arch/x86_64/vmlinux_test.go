package x86_64

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// The tests in this file check the decoder against a real x86-64 Linux
// kernel, the one scripts/build-linux leaves in the cache, and the host's
// GNU objdump's reading of it.

// testVmlinux opens the cached x86-64 vmlinux, skipping the test without it.
func testVmlinux(t *testing.T) (*elf.File, string) { return archtest.Vmlinux(t, "x86_64") }

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
	var agree archtest.Agreement
	for _, o := range insns {
		got := d.Disassemble(textCode(t, f, o.addr, maxInstruction), o.addr, 1, nil)
		if len(got) != 1 {
			t.Fatalf("%#x: %d instructions decoded", o.addr, len(got))
		}
		if got[0].Encoding != o.encoding {
			t.Errorf("%#x: encoding %s, objdump %s", o.addr, got[0].Encoding, o.encoding)
		}
		agree.Compare(t, o.addr, o.encoding, objdumpNormal(got[0].Text), o.text)
	}
	agree.Check(t, 0.995)
}

// TestScanPrologueVmlinux scans the starts of the kernel's functions: in
// those that push rbp and set it from rsp, the frame found once rbp is
// set has the caller's rbp and the return address where the pushes put
// them, and none is found before rbp is pushed; and rbp is set within
// PrologueScan bytes of nearly all of them.
func TestScanPrologueVmlinux(t *testing.T) {
	f, _ := testVmlinux(t)
	d := debugger{}
	var funcs, framed, within, wrong int
	for _, s := range textFuncs(t, f) {
		funcs++
		code := textCode(t, f, s.Value, int(min(s.Size, 512)))
		// Where rbp is pushed and set, by the instructions' text.
		push, set, off := -1, -1, 0
		for _, in := range d.Disassemble(code, s.Value, 200, nil) {
			end := off + len(strings.Fields(in.Encoding))
			switch {
			case in.Text == "push %rbp" && push < 0:
				push = off
			case in.Text == "mov %rsp,%rbp" && push >= 0 && set < 0:
				set = end
			}
			off = end
		}
		if set < 0 {
			continue
		}
		framed++
		if set <= d.PrologueScan() {
			within++
		}
		p := d.ScanPrologue(code[:set])
		// Registers pushed between rbp and the mov put rbp below the
		// caller's rbp's slot.
		k := 8 * int64(pushesBetween(d, code[push:set])-1)
		if !p.FPSet || p.FPPos != -16-k || !p.RASaved || p.RAOff != 8+k || p.FPOff != k || p.SPOff != p.FPPos {
			if wrong < 5 {
				t.Errorf("%s: %+v at +%#x", s.Name, p, set)
			}
			wrong++
		}
		if p := d.ScanPrologue(code[:push]); p.FPSet || p.FPStored || p.RASaved {
			t.Errorf("%s: %+v before rbp is pushed", s.Name, p)
		}
	}
	if funcs < 10000 {
		t.Fatalf("%d functions in .text, want many", funcs)
	}
	t.Logf("%d of %d functions (%.1f%%) push rbp and set it; %d (%.2f%%) of them within PrologueScan's %d bytes; %d scanned wrong",
		framed, funcs, 100*float64(framed)/float64(funcs), within, 100*float64(within)/float64(framed), d.PrologueScan(), wrong)
	if framed < funcs/2 {
		t.Errorf("only %d of %d functions have a frame pointer: is the kernel built with them?", framed, funcs)
	}
	if float64(within) < 0.99*float64(framed) {
		t.Errorf("rbp set within %d bytes in %d of %d functions, want 99%%", d.PrologueScan(), within, framed)
	}
}

// pushesBetween counts the pushes in code, the instructions between
// push %rbp and mov %rsp,%rbp.
func pushesBetween(d debugger, code []byte) int {
	n := 0
	for _, in := range d.Disassemble(code, 0, 100, nil) {
		if strings.HasPrefix(in.Text, "push ") {
			n++
		}
	}
	return n
}

// TestCallsMatchObjdump checks Call and CallBefore against objdump's
// calls in the sample: each call is one to Call, and the bytes before
// its return address end in one to CallBefore. It reports how often
// CallBefore takes the end of another instruction for a return address.
func TestCallsMatchObjdump(t *testing.T) {
	f, insns := objdumpSample(t)
	d := debugger{}
	var calls, others, falseCalls int
	for _, o := range insns {
		n := len(strings.Fields(o.encoding))
		isCall := strings.HasPrefix(o.text, "call ")
		gotN, call := d.Call(textCode(t, f, o.addr, maxInstruction))
		if call != isCall || call && gotN != n {
			t.Errorf("%#x %s: Call = %d, %v", o.addr, o.text, gotN, call)
		}
		end := o.addr + uint64(n)
		before := textCode(t, f, end-maxInstruction, maxInstruction)
		if isCall {
			calls++
			if !d.CallBefore(before) {
				t.Errorf("%#x %s: CallBefore(%x) = false", o.addr, o.text, before)
			}
			continue
		}
		others++
		if d.CallBefore(before) {
			falseCalls++
		}
	}
	if calls < 500 {
		t.Fatalf("%d calls in the sample, want hundreds", calls)
	}
	rate := float64(falseCalls) / float64(others)
	t.Logf("%d calls found; CallBefore says a call ends %d of %d other instructions (%.2f%%)", calls, falseCalls, others, 100*rate)
	if rate > 0.05 {
		t.Errorf("CallBefore takes %.1f%% of other instructions' ends for a call's", 100*rate)
	}
}
