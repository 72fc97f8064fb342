package debugger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/disasm"
)

// watch is a watchpoint and the value last seen in its bytes, which is the
// "old" value of the next write it catches.
type watch struct {
	Breakpoint
	value []byte
}

// Access is what a watchpoint caught: the instruction that accessed the
// data, and for a write the value before and after.
type Access struct {
	// Kind is the watchpoint's: write, read or access.
	Kind string `json:"kind"`
	// Data is the watched address and Length its size.
	Data   string `json:"data"`
	Length int    `json:"length"`
	// Insn is the accessing instruction: its address, function+offset,
	// file:line and disassembly. The stop is reported after the access,
	// so the pc is the instruction after it.
	Insn Where  `json:"insn_at"`
	Text string `json:"insn"`
	// Old and New are the watched bytes as a little-endian number before
	// and after the access (equal for a read).
	Old string `json:"old"`
	New string `json:"new"`
}

// Watch sets (or with remove clears) a data watchpoint at loc (a symbol,
// symbol+off or 0xADDRESS): kind is write (""), read or access; length 0
// means the symbol's size, up to 8 bytes.
func (s *Session) Watch(ctx context.Context, loc string, length int, kind string, remove bool) (Breakpoint, error) {
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return Breakpoint{}, err
	}
	k, ok := map[string]gdb.BreakKind{"write": gdb.WatchWrite, "": gdb.WatchWrite, "read": gdb.WatchRead, "access": gdb.WatchAccess}[kind]
	if !ok {
		return Breakpoint{}, fmt.Errorf("watch kind %q: want write, read or access", kind)
	}
	if kind == "" {
		kind = "write"
	}
	a := addrs[0]
	if length == 0 {
		length = 8
		if syms := s.cfg.Symbols; syms != nil {
			if l, ok := syms.Symbolize(a); ok && l.Offset == 0 {
				if sym, err := syms.Lookup(l.Function); err == nil && sym.Addr == a && sym.Size > 0 {
					length = int(min(sym.Size, 8))
				}
			}
		}
	}
	if length < 1 || length > 8 {
		return Breakpoint{}, fmt.Errorf("watch length %d: want 1 to 8 bytes", length)
	}
	defer s.begin()()
	w := &watch{Breakpoint: Breakpoint{Where: s.Where(a), Kind: kind, Length: length, kind: k}}
	w.File, w.Line = "", 0 // data has no source line
	err = s.stopped(ctx, func(c *gdb.Client) error {
		if remove {
			old, ok := s.watches[a]
			if !ok {
				return &NoBreakpointError{Where: hex(a), Watch: true}
			}
			if err := c.ClearBreakpoint(ctx, old.kind, a, old.Length); err != nil {
				return err
			}
			delete(s.watches, a)
			w = old
			return nil
		}
		if _, dup := s.watches[a]; dup {
			return fmt.Errorf("a watchpoint is already set at %s: remove it first to change it", hex(a))
		}
		v, err := c.ReadMemory(ctx, a, length)
		if err != nil {
			return fmt.Errorf("watch %s: the data cannot be read: %w", hex(a), err)
		}
		if err := c.SetBreakpoint(ctx, k, a, length); err != nil {
			var se *gdb.StubError
			if errors.As(err, &se) || errors.Is(err, gdb.ErrUnsupported) {
				return &WatchRefusedError{N: len(s.watches) + 1, Where: hex(a), Err: err}
			}
			return err
		}
		w.value = v
		s.watches[a] = w
		return nil
	})
	return w.Breakpoint, err
}

// watchStop describes what a watchpoint stop caught, updating the value
// the watchpoint remembers.
func (s *Session) watchStop(ctx context.Context, th *gdb.Thread, st gdb.Stop) (*Access, error) {
	var w *watch
	for a, x := range s.watches {
		if st.Addr >= a && st.Addr < a+uint64(x.Length) {
			w = x
		}
	}
	if w == nil {
		return nil, nil // not one of ours (a person's gdb, before)
	}
	return s.accessOf(ctx, th, w)
}

// accessOf describes the access that stopped th on watchpoint w, stepping
// over it where the stub stopped before it, and remembers the new value.
func (s *Session) accessOf(ctx context.Context, th *gdb.Thread, w *watch) (*Access, error) {
	a := w.Addr
	addr, _ := parseAddr(a)
	regs, err := th.ReadRegisters(ctx)
	if err != nil {
		return nil, err
	}
	hits := func(m mem) bool {
		ea := reg(regs, m.base) + uint64(m.imm)
		return ea < addr+uint64(w.Length) && ea+uint64(m.size) > addr
	}
	pc := regs["pc"]
	acc := &Access{Kind: w.Kind, Data: a, Length: w.Length}
	old := w.value
	// QEMU 7.2 stops before the access: the pc is the accessing
	// instruction, its address computed from the registers falls in the
	// watched bytes, and the data is not yet written. One step completes
	// it (the client lifts the watchpoints for that step), as gdb does.
	if code, _ := th.ReadMemory(ctx, pc, 4); len(code) >= 2 {
		if m, ok := memAccess(code); ok && hits(m) {
			acc.Insn = s.Where(pc)
			if in := disasm.Decode(code, pc, 1, s.symbolizer()); len(in) == 1 {
				acc.Text = in[0].Text
			}
			// Not written yet: the value before is here (a replay that
			// jumped in time knows no older one).
			if v, err := th.ReadMemory(ctx, addr, w.Length); err == nil {
				old = v
			}
			if err := s.stepAccess(ctx, th, pc); err != nil {
				return acc, err
			}
		}
	}
	if acc.Text == "" {
		// A stub that stops after the access: the accessing instruction
		// is the one before the pc, 4 or 2 bytes back; the one whose
		// address falls in the watched bytes, else a memory instruction
		// that ends at the pc.
		insnAt := uint64(0)
		code, _ := th.ReadMemory(ctx, pc-4, 4)
		for _, back := range []uint64{4, 2} {
			if len(code) < 4 {
				break
			}
			m, ok := memAccess(code[4-back:])
			if !ok || m.n != int(back) {
				continue
			}
			if insnAt == 0 || hits(m) {
				insnAt = pc - back
			}
		}
		if insnAt != 0 {
			acc.Insn = s.Where(insnAt)
			if in := disasm.Decode(code[4-(pc-insnAt):], insnAt, 1, s.symbolizer()); len(in) == 1 {
				acc.Text = in[0].Text
			}
		}
	}
	now, err := th.ReadMemory(ctx, addr, w.Length)
	if err != nil {
		return acc, err
	}
	acc.Old, acc.New = number(old), number(now)
	w.value = now
	return acc, nil
}

// stepAccess steps th past the instruction at pc, which the stub stopped
// before. QEMU can end that step where it began, the store not run, on a
// debug event its watchpoint code still had pending; the write would then
// read as unchanged. A step that did not move is tried again, twice at
// most.
func (s *Session) stepAccess(ctx context.Context, th *gdb.Thread, pc uint64) error {
	for try := 1; ; try++ {
		st, err := th.Step(ctx)
		if err != nil {
			return fmt.Errorf("step over the access: %w", err)
		}
		now, err := th.ReadRegister(ctx, "pc")
		if err != nil {
			return fmt.Errorf("step over the access: read pc: %w", err)
		}
		if now != pc {
			return nil
		}
		if try == 3 {
			return fmt.Errorf("step over the access at %s: %d steps did not move the hart (last stop %s); the value shown may be from before the write", hex(pc), try, st.Raw)
		}
		s.cfg.Logger.Debug("debugger: a step over a watched access did not move; stepping again", "pc", hex(pc), "stop", st.Raw)
	}
}

// number reads b as a little-endian number.
func number(b []byte) string {
	var x [8]byte
	copy(x[:], b)
	return hex(binary.LittleEndian.Uint64(x[:]))
}

// reg is register n (x0..x31) of a 'g' read.
func reg(regs map[string]uint64, n int) uint64 {
	if n <= 0 || n > len(abiNames) {
		return 0
	}
	v, _ := gpr(regs, abiNames[n-1])
	return v
}

// mem is a load, store or AMO: its length, base register, offset and
// access size.
type mem struct {
	n, base, size int
	imm           int64
	store         bool
}

// memAccess decodes the memory access that code starts with, if it is one.
func memAccess(code []byte) (mem, bool) {
	if len(code) < 2 {
		return mem{}, false
	}
	x := uint32(binary.LittleEndian.Uint16(code))
	if x&3 != 3 { // compressed
		f3 := x >> 13
		r := func(lo uint) int { return 8 + int(x>>lo&7) }
		switch x & 3 {
		case 0: // c.lw c.ld c.sw c.sd c.fld c.fsd, base rs1'
			w := int64(x>>10&7)<<3 | int64(x>>6&1)<<2 | int64(x>>5&1)<<6 // lw/sw
			d := int64(x>>10&7)<<3 | int64(x>>5&3)<<6                    // ld/sd/fld/fsd
			switch f3 {
			case 2:
				return mem{n: 2, base: r(7), size: 4, imm: w}, true
			case 6:
				return mem{n: 2, base: r(7), size: 4, imm: w, store: true}, true
			case 1, 3:
				return mem{n: 2, base: r(7), size: 8, imm: d}, true
			case 5, 7:
				return mem{n: 2, base: r(7), size: 8, imm: d, store: true}, true
			}
		case 2: // c.lwsp c.ldsp c.fldsp c.swsp c.sdsp c.fsdsp, base sp
			switch f3 {
			case 2:
				return mem{n: 2, base: 2, size: 4, imm: int64(x>>12&1)<<5 | int64(x>>4&7)<<2 | int64(x>>2&3)<<6}, x>>7&0x1f != 0
			case 1, 3:
				return mem{n: 2, base: 2, size: 8, imm: int64(x>>12&1)<<5 | int64(x>>5&3)<<3 | int64(x>>2&7)<<6}, f3 == 1 || x>>7&0x1f != 0
			case 6:
				return mem{n: 2, base: 2, size: 4, imm: int64(x>>9&0xf)<<2 | int64(x>>7&3)<<6, store: true}, true
			case 5, 7:
				return mem{n: 2, base: 2, size: 8, imm: int64(x>>10&7)<<3 | int64(x>>7&7)<<6, store: true}, true
			}
		}
		return mem{}, false
	}
	if len(code) < 4 {
		return mem{}, false
	}
	x = binary.LittleEndian.Uint32(code)
	rs1, f3 := int(x>>15&0x1f), x>>12&7
	switch x & 0x7f {
	case 0x03, 0x07: // loads, FP loads
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), imm: signExtend(int64(x>>20), 12)}, true
	case 0x23, 0x27: // stores, FP stores
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), imm: signExtend(int64(x>>25)<<5|int64(x>>7&0x1f), 12), store: true}, true
	case 0x2f: // AMOs, LR/SC
		return mem{n: 4, base: rs1, size: 1 << (f3 & 3), store: x>>27 != 2}, true
	}
	return mem{}, false
}
