package qcow2state

import (
	"encoding/binary"
	"fmt"
)

// The migration stream QEMU saves a machine in (migration/savevm.c): a
// header, the configuration, then sections. RAM is an iterable section
// ("ram"): started (setup: the RAM blocks and their sizes), continued in
// parts, ended; its data is records of pages. Every device's state comes
// after RAM's end, in full sections whose layout only the device knows:
// the reader stops at RAM's end, so it never needs them.
const (
	streamMagic   = 0x5145564d // "QEVM"
	streamVersion = 3

	secEOF           = 0x00
	secStart         = 0x01
	secPart          = 0x02
	secEnd           = 0x03
	secFull          = 0x04
	secSubsection    = 0x05
	secConfiguration = 0x07
	secFooter        = 0x7e

	ramSection = "ram"
	ramVersion = 4

	// RAM record flags, in the low bits of a record's first be64 (the
	// rest is a page's offset in its block). migration/ram.c.
	flagFull         = 0x01 // obsolete since 2009
	flagZero         = 0x02 // one fill byte follows
	flagMemSize      = 0x04 // the RAM blocks follow
	flagPage         = 0x08 // a page follows
	flagEOS          = 0x10 // the section's data ends
	flagContinue     = 0x20 // the page is in the last block named
	flagXBZRLE       = 0x40
	flagHook         = 0x80  // RDMA
	flagCompressPage = 0x100 // QEMU up to 9.0
	flagMultifdFlush = 0x200 // QEMU 8.0 and later, multifd only: nothing follows

	// defaultPageBits is the target page of RISC-V (and of any target
	// whose stream carries no target-page-bits subsection).
	defaultPageBits = 12

	// maxBlocks bounds what a damaged stream makes the index hold (a
	// riscv64 virt machine has four RAM blocks).
	maxBlocks = 1024
)

// reader reads the state's stream in order, through a small buffer: most
// records are a few bytes, and a page's 4 KiB that the index skips are not
// read at all.
type reader struct {
	m   *clusterMap
	buf []byte
	at  int64 // the stream offset of buf[0]
	pos int   // the next byte in buf
}

// readBuf is how much is read at once: a few hundred reads of a state of
// 17 MB (a Linux guest's), where one read a page took thousands.
const readBuf = 256 << 10

func (r *reader) offset() int64 { return r.at + int64(r.pos) }

// fill makes at least n bytes available at pos (n <= readBuf).
func (r *reader) fill(n int) error {
	if len(r.buf)-r.pos >= n {
		return nil
	}
	off := r.offset()
	if off+int64(n) > r.m.size {
		return damaged("the machine state ends inside a record at %d", off)
	}
	want := min(int64(readBuf), r.m.size-off)
	if int64(cap(r.buf)) < want {
		r.buf = make([]byte, 0, want)
	}
	r.buf = r.buf[:want]
	if err := r.m.readAt(r.buf, off); err != nil {
		return err
	}
	r.at, r.pos = off, 0
	return nil
}

func (r *reader) bytes(n int) ([]byte, error) {
	if err := r.fill(n); err != nil {
		return nil, err
	}
	b := r.buf[r.pos : r.pos+n]
	r.pos += n
	return b, nil
}

func (r *reader) u8() (byte, error) {
	b, err := r.bytes(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) peek() (byte, error) {
	if err := r.fill(1); err != nil {
		return 0, err
	}
	return r.buf[r.pos], nil
}

// skipIf consumes the next byte if it is b, and says whether it did.
func (r *reader) skipIf(b byte) (bool, error) {
	next, err := r.peek()
	if err != nil || next != b {
		return false, err
	}
	r.pos++
	return true, nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (r *reader) u64() (uint64, error) {
	b, err := r.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// str reads a string of a one-byte length.
func (r *reader) str() (string, error) {
	n, err := r.u8()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(int(n))
	return string(b), err
}

// skip passes n bytes, reading them only if they are in the buffer.
func (r *reader) skip(n int64) error {
	off := r.offset()
	if n < 0 || off+n > r.m.size {
		return damaged("the machine state ends inside a record at %d", off)
	}
	if int64(len(r.buf)-r.pos) >= n {
		r.pos += int(n)
		return nil
	}
	r.at, r.pos, r.buf = off+n, 0, r.buf[:0]
	return nil
}

// block is a RAM block of the saved machine, and where its pages are in
// the stream.
type block struct {
	name   string
	length uint64
	// data holds, by page number, the stream offset of a page's bytes,
	// or ^fill for a page filled with one byte other than 0. zero marks
	// the pages saved as zeros: a bitmap, dense (most of a guest's pages
	// are zero records) unless the block is too big for the index's
	// budget, then sparse (a damaged stream may claim any length). A page
	// in neither was not saved.
	data   map[uint64]int64
	dense  []uint64
	sparse map[uint64]uint64
	// inData marks the pages data holds, with a dense zero bitmap: a
	// zero record (most are) then costs no map lookup.
	inData []uint64
}

// forget takes page p out of data.
func (b *block) forget(p uint64) {
	if b.inData != nil {
		w, bit := p/64, uint64(1)<<(p%64)
		if b.inData[w]&bit == 0 {
			return
		}
		b.inData[w] &^= bit
	}
	delete(b.data, p)
}

// keep puts page p's place into data.
func (b *block) keep(p uint64, v int64) {
	if b.inData != nil {
		b.inData[p/64] |= 1 << (p % 64)
	}
	b.data[p] = v
}

func (b *block) setZero(p uint64, on bool) {
	w, bit := p/64, uint64(1)<<(p%64)
	switch {
	case b.dense != nil && on:
		b.dense[w] |= bit
	case b.dense != nil:
		b.dense[w] &^= bit
	case on:
		b.sparse[w] |= bit
	case b.sparse[w]&bit != 0:
		b.sparse[w] &^= bit
		if b.sparse[w] == 0 {
			delete(b.sparse, w)
		}
	}
}

func (b *block) isZero(p uint64) bool {
	w, bit := p/64, uint64(1)<<(p%64)
	if b.dense != nil {
		return b.dense[w]&bit != 0
	}
	return b.sparse[w]&bit != 0
}

// index is what parsing a state's stream found: its RAM blocks and pages.
type index struct {
	pageBits uint
	blocks   []*block
	byName   map[string]*block
	// last is the block the last page named: a page may continue it in
	// a later section (QEMU's loader keeps it across sections too).
	last *block
}

// parse indexes the RAM of the stream m holds.
func parse(m *clusterMap) (*index, error) {
	r := &reader{m: m}
	ix := &index{pageBits: defaultPageBits, byName: map[string]*block{}}
	if v, err := r.u32(); err != nil {
		return nil, err
	} else if v != streamMagic {
		return nil, damaged("the machine state does not start with QEMU's stream magic (%#x)", v)
	}
	if v, err := r.u32(); err != nil {
		return nil, err
	} else if v != streamVersion {
		return nil, unsupported("migration stream version %d", v)
	}
	ramID := int64(-1)
	for {
		typ, err := r.u8()
		if err != nil {
			return nil, err
		}
		switch typ {
		case secConfiguration:
			if err := ix.configuration(r); err != nil {
				return nil, err
			}
		case secStart, secFull:
			id, err := r.u32()
			if err != nil {
				return nil, err
			}
			name, err := r.str()
			if err != nil {
				return nil, err
			}
			if _, err := r.u32(); err != nil { // instance
				return nil, err
			}
			version, err := r.u32()
			if err != nil {
				return nil, err
			}
			if typ != secStart || name != ramSection || ramID >= 0 {
				// A device's state before RAM's end, or a second live
				// section: no layout to skip it by.
				return nil, unsupported("a %q section (type %d) before the RAM's end", name, typ)
			}
			if version != ramVersion {
				return nil, unsupported("RAM section version %d", version)
			}
			ramID = int64(id)
			if err := ix.ram(r, true); err != nil {
				return nil, err
			}
			if err := footer(r, id); err != nil {
				return nil, err
			}
		case secPart, secEnd:
			id, err := r.u32()
			if err != nil {
				return nil, err
			}
			if int64(id) != ramID {
				return nil, unsupported("section %d continued before the RAM's end (the RAM is section %d)", id, ramID)
			}
			if err := ix.ram(r, false); err != nil {
				return nil, err
			}
			if err := footer(r, id); err != nil {
				return nil, err
			}
			if typ == secEnd {
				return ix, nil
			}
		case secEOF:
			return nil, damaged("the machine state ends before its RAM does")
		default:
			return nil, unsupported("migration stream record %#x", typ)
		}
	}
}

// footer reads a section's footer, if the stream has them (QEMU's
// send-section-footer, on for every machine type since 2.6).
func footer(r *reader, id uint32) error {
	if r.offset() == r.m.size {
		return nil // RAM's end ends the stream: nothing more is read
	}
	if ok, err := r.skipIf(secFooter); !ok {
		return err
	}
	got, err := r.u32()
	if err != nil {
		return err
	}
	if got != id {
		return damaged("section %d ends with the footer of section %d", id, got)
	}
	return nil
}

// configuration reads the configuration: the machine type, then
// subsections.
func (ix *index) configuration(r *reader) error {
	n, err := r.u32()
	if err != nil {
		return err
	}
	if n > 256 {
		return damaged("a machine type name of %d bytes", n)
	}
	if _, err := r.bytes(int(n)); err != nil {
		return err
	}
	for {
		if ok, err := r.skipIf(secSubsection); !ok {
			return err
		}
		name, err := r.str()
		if err != nil {
			return err
		}
		if _, err := r.u32(); err != nil { // version
			return err
		}
		switch name {
		case "configuration/target-page-bits":
			bits, err := r.u32()
			if err != nil {
				return err
			}
			if bits < 10 || bits > 16 {
				return unsupported("target pages of %d bits", bits)
			}
			ix.pageBits = uint(bits)
		case "configuration/capabilities":
			// Only the capabilities that change the stream are listed
			// (x-ignore-shared, mapped-ram): none is understood here.
			count, err := r.u32()
			if err != nil {
				return err
			}
			var names []string
			for range min(count, 64) {
				c, err := r.str()
				if err != nil {
					return err
				}
				names = append(names, c)
			}
			return unsupported("migration capabilities %v", names)
		case "configuration/uuid":
			if _, err := r.bytes(16); err != nil {
				return err
			}
		default:
			return unsupported("configuration subsection %q", name)
		}
	}
}

// ram reads a RAM section's data up to its end of section record; setup
// is the section's start, which names the RAM blocks.
func (ix *index) ram(r *reader, setup bool) error {
	page := uint64(1) << ix.pageBits
	for {
		v, err := r.u64()
		if err != nil {
			return err
		}
		flags, addr := v&(page-1), v&^(page-1)
		switch {
		case flags == flagMemSize:
			if !setup || len(ix.blocks) > 0 {
				return damaged("RAM blocks named twice")
			}
			if err := ix.memSize(r, addr); err != nil {
				return err
			}
		case flags&^flagContinue == flagZero || flags&^flagContinue == flagPage:
			b := ix.last
			if flags&flagContinue == 0 {
				name, err := r.str()
				if err != nil {
					return err
				}
				if b = ix.byName[name]; b == nil {
					return damaged("a page of RAM block %q, which the state does not name", name)
				}
			} else if b == nil {
				return damaged("a page continuing no RAM block")
			}
			ix.last = b
			if addr+page > b.length || addr+page < addr {
				return damaged("page %#x past the end of RAM block %q (%#x bytes)", addr, b.name, b.length)
			}
			p := addr >> ix.pageBits
			if flags&flagZero != 0 {
				fill, err := r.u8()
				if err != nil {
					return err
				}
				b.setZero(p, fill == 0)
				if fill == 0 {
					b.forget(p)
				} else {
					b.keep(p, ^int64(fill))
				}
				continue
			}
			b.setZero(p, false)
			b.keep(p, r.offset())
			if err := r.skip(int64(page)); err != nil {
				return err
			}
		case flags == flagEOS:
			return nil
		case flags == flagMultifdFlush:
		default:
			return unsupported("RAM record flags %#x%s", flags, flagNames(flags))
		}
	}
}

func flagNames(f uint64) string {
	switch {
	case f&flagXBZRLE != 0:
		return " (an XBZRLE page)"
	case f&flagCompressPage != 0:
		return " (a compressed page)"
	case f&flagHook != 0:
		return " (an RDMA hook)"
	case f&flagFull != 0:
		return " (the obsolete full flag)"
	}
	return ""
}

// memSize reads the RAM blocks: total is the sum of their lengths.
func (ix *index) memSize(r *reader, total uint64) error {
	// What the dense bitmaps of zero pages may take: a bit a page, up
	// to a quarter of the state's size (a 256 MiB guest's is 8 KiB).
	budget := max(uint64(r.m.size)/4, 1<<20)
	for total > 0 {
		name, err := r.str()
		if err != nil {
			return err
		}
		length, err := r.u64()
		if err != nil {
			return err
		}
		if length > total {
			return damaged("RAM block %q of %d bytes, more than the %d left of the total", name, length, total)
		}
		if len(ix.blocks) >= maxBlocks {
			return unsupported("more than %d RAM blocks", maxBlocks)
		}
		if _, dup := ix.byName[name]; dup || name == "" {
			return damaged("RAM block %q named twice (or unnamed)", name)
		}
		b := &block{name: name, length: length, data: map[uint64]int64{}}
		words := (length>>ix.pageBits + 63) / 64
		if 2*words*8 <= budget {
			b.dense, b.inData, budget = make([]uint64, words), make([]uint64, words), budget-2*words*8
		} else {
			b.sparse = map[uint64]uint64{}
		}
		ix.blocks = append(ix.blocks, b)
		ix.byName[name] = b
		total -= length
	}
	return nil
}

// read copies length bytes of block b at off into p.
func (ix *index) read(m *clusterMap, name string, off uint64, p []byte) error {
	b := ix.byName[name]
	if b == nil {
		return fmt.Errorf("%w: no RAM block %q", ErrNoPage, name)
	}
	if off > b.length || uint64(len(p)) > b.length-off {
		return fmt.Errorf("%w: %d bytes at %#x are past the end of RAM block %q (%#x bytes)", ErrNoPage, len(p), off, name, b.length)
	}
	page := uint64(1) << ix.pageBits
	for len(p) > 0 {
		pg, in := off>>ix.pageBits, off&(page-1)
		n := min(uint64(len(p)), page-in)
		switch v, ok := b.data[pg]; {
		case ok && v >= 0:
			if err := m.readAt(p[:n], v+int64(in)); err != nil {
				return err
			}
		case ok:
			fill := byte(^v)
			for i := range p[:n] {
				p[i] = fill
			}
		case b.isZero(pg):
			clear(p[:n])
		default:
			return fmt.Errorf("%w: page %#x of RAM block %q was not saved", ErrNoPage, pg<<ix.pageBits, name)
		}
		p, off = p[n:], off+n
	}
	return nil
}
