package debugger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Walk is a page-table walk of one virtual address, as the MMU does it;
// Level one step of it.
type (
	Walk  = arch.Walk
	Level = arch.Level
)

// Translate walks addr (a location) through the page table whose root is
// root (the architecture's translation register's value), or when root
// is nil through the current one of hart (LastHart: the hart of the last
// stop); on is that hart.
func (s *Session) Translate(ctx context.Context, hart int, loc string, root *uint64) (w Walk, on int, err error) {
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return Walk{}, 0, err
	}
	on, err = s.onHart(ctx, hart, func(th *gdb.Thread) (err error) {
		w, err = s.translate(ctx, th, addrs[0], root)
		return err
	})
	return w, on, err
}

func (s *Session) translate(ctx context.Context, th *gdb.Thread, va uint64, root *uint64) (Walk, error) {
	if root != nil && s.d.Root() == "" {
		return Walk{}, &NoRootError{Arch: s.cfg.Arch.Name()}
	}
	reg := func(name string) (uint64, error) {
		if root != nil && name == s.d.Root() {
			return *root, nil
		}
		v, err := th.ReadRegister(ctx, name)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", name, err)
		}
		return v, nil
	}
	// Entries are read at physical addresses; the stub reads those only
	// in its physical mode, turned on at the first entry read.
	var physical bool
	defer func() {
		if physical {
			th.Client().SetPhysicalMemory(context.WithoutCancel(ctx), false)
		}
	}()
	return s.d.Walk(va, reg, func(pa uint64) (uint64, error) {
		if !physical {
			if err := th.Client().SetPhysicalMemory(ctx, true); err != nil {
				if errors.Is(err, gdb.ErrUnsupported) {
					return 0, errors.New("this QEMU's gdbstub cannot read physical memory (Qqemu.PhyMemMode), which a page walk needs")
				}
				return 0, err
			}
			physical = true
		}
		b, err := th.ReadMemory(ctx, pa, 8)
		if err != nil {
			return 0, err
		}
		if len(b) < 8 {
			return 0, fmt.Errorf("read %d of the 8 bytes at physical %s", len(b), hex(pa))
		}
		return binary.LittleEndian.Uint64(b), nil
	})
}
