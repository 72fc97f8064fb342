package debugger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
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
	hits := func(m arch.MemAccess) bool {
		base, _ := s.gpr(regs, m.Base)
		ea := base + uint64(m.Offset)
		return ea < addr+uint64(w.Length) && ea+uint64(m.Size) > addr
	}
	pc := regs[s.regs.PC]
	maxLen := uint64(s.d.MaxInstruction())
	acc := &Access{Kind: w.Kind, Data: a, Length: w.Length}
	old := w.value
	// QEMU 7.2 stops before the access: the pc is the accessing
	// instruction, its address computed from the registers falls in the
	// watched bytes, and the data is not yet written. One step completes
	// it (the client lifts the watchpoints for that step), as gdb does.
	if code, _ := th.ReadMemory(ctx, pc, int(maxLen)); len(code) >= 2 {
		if m, ok := s.d.Access(code); ok && hits(m) {
			acc.Insn = s.Where(pc)
			if in := s.d.Disassemble(code, pc, 1, s.symbolizer()); len(in) == 1 {
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
		// is the one before the pc, up to the longest instruction's
		// length back (RISC-V: 4 or 2 bytes; x86: 1 to 15); the one whose address
		// falls in the watched bytes, else a memory instruction that ends
		// at the pc.
		insnAt := uint64(0)
		code, _ := th.ReadMemory(ctx, pc-maxLen, int(maxLen))
		step := uint64(s.d.MinInstruction())
		for back := maxLen; back >= step; back -= step {
			if uint64(len(code)) < maxLen {
				break
			}
			m, ok := s.d.Access(code[maxLen-back:])
			if !ok || m.Len != int(back) {
				continue
			}
			if insnAt == 0 || hits(m) {
				insnAt = pc - back
			}
		}
		if insnAt != 0 {
			acc.Insn = s.Where(insnAt)
			if in := s.d.Disassemble(code[maxLen-(pc-insnAt):], insnAt, 1, s.symbolizer()); len(in) == 1 {
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
