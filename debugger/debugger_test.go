package debugger

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// A guest of an architecture the debugger does not know says so, before
// anything connects to its stub.
func TestUnsupportedArch(t *testing.T) {
	s := New(Config{
		Arch: noDebugger{arm64.Arch},
		Dial: func(context.Context) (*gdb.Client, error) {
			t.Error("dialled the stub of an unsupported architecture")
			return nil, errors.New("no stub")
		},
		Running: func(context.Context) (bool, error) {
			t.Error("asked whether an unsupported architecture's guest runs")
			return false, nil
		},
	})
	_, err := s.Registers(context.Background(), LastHart)
	var u *arch.UnsupportedError
	if !errors.As(err, &u) || err.Error() != "the debugger does not support fake64 guests yet" {
		t.Errorf("registers of an aarch64 guest: %v", err)
	}
	if _, _, err := s.Backtrace(context.Background(), LastHart, 8); !errors.As(err, &u) {
		t.Errorf("backtrace of an aarch64 guest: %v", err)
	}
}

// noDebugger is an architecture the debugger does not support.
type noDebugger struct{ arch.Arch }

func (noDebugger) Name() string            { return "fake64" }
func (noDebugger) Debugger() arch.Debugger { return nil }

func TestHexdump(t *testing.T) {
	data := make([]byte, 80)
	copy(data, "Linux version 6.1")
	m := Memory{Addr: 0xffffffff80a00000, Data: data,
		Unreadable: []Range{{0xffffffff80a00040, 0xffffffff80a00050}}}
	got, next := m.Hexdump(0, 1<<20)
	want := "ffffffff80a00000  4c 69 6e 75 78 20 76 65  72 73 69 6f 6e 20 36 2e  |Linux version 6.|\n" +
		"ffffffff80a00010  31 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |1...............|\n" +
		"ffffffff80a00020  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|\n" +
		"*\n" +
		"ffffffff80a00040  ?? ?? ?? ?? ?? ?? ?? ??  ?? ?? ?? ?? ?? ?? ?? ??  |                |\n"
	if got != want || next != 80 {
		t.Errorf("hexdump (next %d):\n%s\nwant:\n%s", next, got, want)
	}
	if n := len(strings.SplitAfter(want, "\n")[0]); n != HexdumpLine {
		t.Errorf("a line is %d bytes, HexdumpLine says %d", n, HexdumpLine)
	}
	// A limit cuts at a line, and next says where to go on.
	got, next = m.Hexdump(0, 2*HexdumpLine)
	if strings.Count(got, "\n") != 2 || next != 32 {
		t.Errorf("limited hexdump: next %d\n%s", next, got)
	}
}
