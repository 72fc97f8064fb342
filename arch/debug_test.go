package arch_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
)

// regs is a Reader of named registers; any other name fails.
type regs map[string]uint64

func (r regs) ReadRegister(_ context.Context, name string) (uint64, error) {
	if v, ok := r[name]; ok {
		return v, nil
	}
	return 0, errors.New("E14")
}

func (regs) ReadMemory(context.Context, uint64, int) ([]byte, error) { return nil, errors.New("E14") }

// ReadRegisters gives the values in the order asked, and an error naming
// the register that failed and where.
func TestReadRegisters(t *testing.T) {
	r := regs{"sepc": 0x80200000, "scause": 13, "sstatus": 0x120}
	got, err := arch.ReadRegisters(context.Background(), r, "in the trap vector", "scause", "sepc", "sstatus")
	if err != nil || !slices.Equal(got, []uint64{13, 0x80200000, 0x120}) {
		t.Errorf("ReadRegisters = %#x, %v", got, err)
	}
	_, err = arch.ReadRegisters(context.Background(), r, "in the trap vector", "sepc", "stval", "sstatus")
	if err == nil || err.Error() != "read stval in the trap vector: E14" {
		t.Errorf("a register the stub lacks: %v, want %q", err, "read stval in the trap vector: E14")
	}
}
