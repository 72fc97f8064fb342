package debugger

import (
	"context"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// machine is a stopped hart as the architecture's verdicts read it.
type machine struct {
	s  *Session
	th *gdb.Thread
}

func (m machine) ReadRegister(ctx context.Context, name string) (uint64, error) {
	return m.th.ReadRegister(ctx, name)
}

func (m machine) ReadMemory(ctx context.Context, addr uint64, n int) ([]byte, error) {
	return m.th.ReadMemory(ctx, addr, n)
}

func (m machine) Translate(ctx context.Context, va uint64) (Walk, error) {
	return m.s.translate(ctx, m.th, va, nil)
}

// explain says why t happened, with the page walk of its address for page
// and access faults. The guest must be stopped.
func (s *Session) explain(ctx context.Context, th *gdb.Thread, t arch.Trap) (string, *Walk) {
	return s.d.Verdict(ctx, machine{s, th}, t)
}
