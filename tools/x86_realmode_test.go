package tools_test

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// An x86_64 vCPU in real mode (a replay halted at its first instruction,
// the reset vector) reads sensibly, or the tool says why it cannot: the
// registers name the mode, the backtrace is the pc alone and says why,
// the disassembly at the pc is refused naming the mode, and the walk
// says paging is off. Its pc, an offset in a real-mode segment, is named
// by no kernel symbol (Linux's vmlinux has per-CPU symbols down there).
func TestX86RealMode(t *testing.T) {
	lin := testguest.ArchLinux(t, x86_64.Arch)
	s, _ := archSession(t, x86_64.Arch, func(c *testConfig) { c.AllowPaths = []string{lin.Dir} })
	s.mustCall("qemu_boot", map[string]any{"arch": "x86_64", "record": "rm", "wait_for": prompt, "timeout": 30}, nil)
	s.mustCall("qemu_shutdown", nil, nil)
	s.mustCall("qemu_boot", map[string]any{"replay": "rm", "symbols": lin.Vmlinux, "restart": true}, nil)

	var regs struct {
		PC          whereOut `json:"pc"`
		Translation string   `json:"translation"`
	}
	res := s.call("debug_registers", nil, &regs)
	if res.IsError || !strings.Contains(regs.Translation, "real mode (CR0.PE=0)") || regs.PC.Addr != "0xfff0" || regs.PC.Function != "" {
		t.Errorf("registers at the reset vector: %s", text(res))
	}
	var bt struct {
		backtraceOut
		End string `json:"end"`
	}
	res = s.call("debug_backtrace", nil, &bt)
	if res.IsError || len(bt.Frames) != 1 || bt.Frames[0].Function != "" || !strings.Contains(bt.End, "16-bit real mode (CR0.PE=0: the pc is IP, at CS:IP f000:fff0)") ||
		!strings.Contains(text(res), "16-bit real mode") {
		t.Errorf("backtrace at the reset vector: %s", text(res))
	}
	s.wantError("debug_disassemble", map[string]any{"count": 4}, "the hart runs 16-bit real mode")
	res = s.call("debug_translate", map[string]any{"address": "0xfff0"}, nil)
	if res.IsError || !strings.HasSuffix(strings.TrimSpace(strings.SplitN(text(res), "\n", 2)[0]), "physical 0xfff0") {
		t.Errorf("walk with paging off: %s", text(res))
	}
}
