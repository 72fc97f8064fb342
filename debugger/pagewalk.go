package debugger

import (
	"context"
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
	var rv uint64
	if root != nil {
		rv = *root
	} else {
		v, err := th.ReadRegister(ctx, s.d.Root())
		if err != nil {
			return Walk{}, fmt.Errorf("read %s: %w", s.d.Root(), err)
		}
		rv = v
	}
	if !s.d.Translates(rv) {
		return s.d.Walk(va, rv, nil)
	}
	if err := th.Client().SetPhysicalMemory(ctx, true); err != nil {
		if errors.Is(err, gdb.ErrUnsupported) {
			return Walk{}, errors.New("this QEMU's gdbstub cannot read physical memory (Qqemu.PhyMemMode), which a page walk needs")
		}
		return Walk{}, err
	}
	defer th.Client().SetPhysicalMemory(context.WithoutCancel(ctx), false)
	return s.d.Walk(va, rv, func(pa uint64) (uint64, error) {
		b, err := th.ReadMemory(ctx, pa, 8)
		if err != nil {
			return 0, err
		}
		return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56, nil
	})
}
