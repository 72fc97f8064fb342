package debugger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// MaxMemory bounds one memory read.
const MaxMemory = 64 << 10

// pageSize is the granule a read skips by when a page is unmapped.
const pageSize = 4096

// Memory is bytes read from the guest, with the ranges that could not be
// read (unmapped, or outside RAM) marked.
type Memory struct {
	// Hart is the hart whose MMU translated a virtual address.
	Hart     int
	Addr     uint64
	Data     []byte // len = requested length; unreadable bytes are 0
	Physical bool
	// Unreadable are [start, end) ranges, in order.
	Unreadable []Range
	// Where symbolizes Addr when it is in the kernel's image.
	Where Where
}

// Range is a half-open address range.
type Range struct {
	Start, End uint64
}

func (r Range) String() string { return hex(r.Start) + "-" + hex(r.End) }

func (m Memory) unreadable(a uint64) bool {
	for _, r := range m.Unreadable {
		if a >= r.Start && a < r.End {
			return true
		}
	}
	return false
}

// Memory reads length bytes at loc (a symbol, symbol+off or 0xADDRESS);
// virtual addresses go through the MMU of hart (LastHart: the hart of
// the last stop) as the stub sees them, physical ones through QEMU's
// memory map.
func (s *Session) Memory(ctx context.Context, hart int, loc string, length int, physical bool) (Memory, error) {
	if length <= 0 || length > MaxMemory {
		return Memory{}, fmt.Errorf("length %d: want 1 to %d bytes", length, MaxMemory)
	}
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return Memory{}, err
	}
	m := Memory{Addr: addrs[0], Physical: physical}
	if m.Addr+uint64(length) < m.Addr {
		return Memory{}, fmt.Errorf("%s + %d bytes wraps past the end of the address space", hex(m.Addr), length)
	}
	if !physical {
		m.Where = s.Where(m.Addr)
	}
	m.Hart, err = s.onHart(ctx, hart, func(th *gdb.Thread) (err error) {
		c := th.Client()
		if physical {
			if err := c.SetPhysicalMemory(ctx, true); err != nil {
				if errors.Is(err, gdb.ErrUnsupported) {
					return ErrNoPhysical
				}
				return err
			}
			defer c.SetPhysicalMemory(context.WithoutCancel(ctx), false)
		}
		m.Data, m.Unreadable, err = readAround(ctx, th, m.Addr, length)
		return err
	})
	return m, err
}

// readAround reads n bytes at addr, skipping to the next page whenever the
// stub refuses one, so one unmapped page does not hide the rest.
func readAround(ctx context.Context, th *gdb.Thread, addr uint64, n int) ([]byte, []Range, error) {
	out := make([]byte, 0, n)
	var bad []Range
	for len(out) < n {
		a := addr + uint64(len(out))
		b, err := th.ReadMemory(ctx, a, n-len(out))
		out = append(out, b...)
		if err == nil {
			break
		}
		var me *gdb.MemoryError
		if !errors.As(err, &me) || ctx.Err() != nil {
			return nil, nil, err
		}
		start := a + uint64(len(b))
		end := min((start/pageSize+1)*pageSize, addr+uint64(n))
		if k := len(bad); k > 0 && bad[k-1].End == start {
			bad[k-1].End = end
		} else {
			bad = append(bad, Range{start, end})
		}
		out = append(out, make([]byte, end-start)...)
	}
	return out, bad, nil
}

// HexdumpLine is the length of one line of Hexdump, newline included.
const HexdumpLine = len("0000000000000000  ") + 16*3 + 1 + len(" |") + 16 + len("|\n")

// Hexdump formats the bytes from offset off as 16-byte lines, "addr  hex
// |ascii|", with unreadable bytes as "??". A run of identical lines
// collapses to one "*" line, as hexdump(1) does. It stops before a line
// would pass limit bytes of text and returns the offset reached.
func (m Memory) Hexdump(off, limit int) (text string, next int) {
	var b strings.Builder
	var prev []byte
	starred := false
	for off < len(m.Data) {
		line := m.Data[off:min(off+16, len(m.Data))]
		a := m.Addr + uint64(off)
		same := prev != nil && len(line) == 16 && string(line) == string(prev) &&
			!m.unreadable(a) && !m.unreadable(a+15) && off+16 < len(m.Data)
		if same {
			if !starred {
				if b.Len()+2 > limit {
					break
				}
				b.WriteString("*\n")
				starred = true
			}
			off += 16
			continue
		}
		if b.Len()+HexdumpLine > limit {
			break
		}
		starred = false
		fmt.Fprintf(&b, "%016x  ", a)
		for i := range 16 {
			switch {
			case i >= len(line):
				b.WriteString("   ")
			case m.unreadable(a + uint64(i)):
				b.WriteString("?? ")
			default:
				fmt.Fprintf(&b, "%02x ", line[i])
			}
			if i == 7 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(" |")
		for i, c := range line {
			switch {
			case m.unreadable(a + uint64(i)):
				b.WriteByte(' ')
			case c >= 0x20 && c < 0x7f:
				b.WriteByte(c)
			default:
				b.WriteByte('.')
			}
		}
		b.WriteString("|\n")
		prev = line
		off += 16
	}
	return b.String(), off
}
