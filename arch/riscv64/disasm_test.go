package riscv64

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// Every instruction of the tiny kernel is decoded, and the instruction
// boundaries and encodings are the ones binutils' objdump finds.
func TestTinyKernelText(t *testing.T) {
	f, err := elf.Open("../../testdata/images/tiny.elf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	sym := func(a uint64) (string, uint64, bool) {
		best, bestAddr := "", uint64(0)
		for _, s := range syms {
			if s.Value <= a && s.Value >= bestAddr && s.Section < elf.SHN_LORESERVE && s.Name != "" && !strings.HasPrefix(s.Name, ".L") {
				best, bestAddr = s.Name, s.Value
			}
		}
		return best, a - bestAddr, best != ""
	}
	insts := debugger{}.Disassemble(code, text.Addr, len(code), sym)
	var wfi, targets int
	for _, in := range insts {
		if !in.Known {
			t.Errorf("%#x: %s not decoded", in.Addr, in.Text)
		}
		if in.Text == "wfi" {
			wfi++
		}
		if in.Target != "" {
			targets++
		}
	}
	if wfi != 2 || targets < 50 {
		t.Errorf("%d instructions, %d wfi, %d named branch targets", len(insts), wfi, targets)
	}

	objdump, err := exec.LookPath("riscv64-unknown-elf-objdump")
	if err != nil {
		t.Skip("riscv64-unknown-elf-objdump not found: run scripts/deps (installs gcc-riscv64-unknown-elf); decoding was checked, the comparison with binutils was not")
	}
	out, err := exec.Command(objdump, "-d", "-j", ".text", "../../testdata/images/tiny.elf").Output()
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ addr, enc string }
	var want []row
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "    80200000:	00002297          	auipc	t0,0x2"
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && strings.HasSuffix(fields[0], ":") && len(fields[1]) >= 4 && !strings.HasPrefix(fields[1], "<") && fields[1] != "file" {
			want = append(want, row{strings.TrimSuffix(fields[0], ":"), fields[1]})
		}
	}
	for i, in := range insts {
		if i >= len(want) || fmt.Sprintf("%x", in.Addr) != want[i].addr || in.Encoding != want[i].enc {
			t.Fatalf("instruction %d: %#x %s, objdump %v", i, in.Addr, in.Encoding, want[i:min(i+3, len(want))])
		}
	}
	if len(want) != len(insts) {
		t.Fatalf("%d instructions decoded, objdump finds %d (the rest: %v)", len(insts), len(want), want[len(insts):])
	}
}

// The privileged instructions riscv64asm does not know, and a CSR access.
func TestPrivileged(t *testing.T) {
	words := map[uint32]string{
		0x30200073: "mret", 0x10200073: "sret", 0x10500073: "wfi",
		0x12000073: "sfence.vma", 0x12050073: "sfence.vma a0", 0x12b50073: "sfence.vma a0,a1",
		0x18029073: "csrw satp,t0", 0x00000073: "ecall", 0x00100073: "ebreak",
	}
	for w, want := range words {
		b := binary.LittleEndian.AppendUint32(nil, w)
		got := debugger{}.Disassemble(b, 0x1000, 1, nil)
		if len(got) != 1 || !got[0].Known || got[0].Text != want {
			t.Errorf("%#08x: %+v, want %q", w, got, want)
		}
	}
}
