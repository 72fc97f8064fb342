package debuginfo

import (
	"bufio"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// unitPrefixLen is how much of a compilation unit is read to decode its
// root DIE. The root DIE holds everything needed here (name, comp_dir,
// stmt_list, ranges) and is a few dozen bytes; reading only a prefix means
// .debug_info (46 MB in vmlinux) is never held in memory. A unit whose root
// DIE does not fit is read whole.
const unitPrefixLen = 512

// dwarfData holds what every DWARF query needs. Small sections stay in
// memory; .debug_info and .debug_line are read one unit at a time from the
// file, unless they are compressed (then random access would mean
// decompressing from the start each time).
type dwarfData struct {
	order binary.ByteOrder

	info           *elf.Section
	infoCompressed bool
	line           *elf.Section
	lineMem        []byte // all of .debug_line, when compressed

	abbrev, str, lineStr, strOffsets, addr []byte
	rangesSec, rngListsSec                 *elf.Section // only read when .debug_aranges does not answer

	aranges *rangeIndex // nil without .debug_aranges
}

// unitRef locates one unit in .debug_info.
type unitRef struct {
	off, size uint64 // size includes the length field
	prefix    []byte // the first bytes, kept only for compressed .debug_info
}

// cuRange maps an address range to the unit covering it.
type cuRange struct{ lo, hi, cu uint64 }

type rangeIndex struct {
	r     []cuRange // sorted by lo
	maxHi []uint64  // maxHi[i]: the largest hi in r[:i+1]
}

func newRangeIndex(r []cuRange) *rangeIndex {
	sort.Slice(r, func(i, j int) bool { return r[i].lo < r[j].lo })
	ix := &rangeIndex{r: r, maxHi: make([]uint64, len(r))}
	var m uint64
	for i := range r {
		m = max(m, r[i].hi)
		ix.maxHi[i] = m
	}
	return ix
}

// find returns the unit whose range starts closest below addr.
func (ix *rangeIndex) find(addr uint64) (uint64, bool) {
	if ix == nil {
		return 0, false
	}
	i := sort.Search(len(ix.r), func(i int) bool { return ix.r[i].lo > addr }) - 1
	for ; i >= 0 && ix.maxHi[i] > addr; i-- {
		if ix.r[i].hi > addr {
			return ix.r[i].cu, true
		}
	}
	return 0, false
}

func (f *File) errNoLines() error {
	return fmt.Errorf("%s has no DWARF line information (.debug_info/.debug_line): rebuild the kernel with CONFIG_DEBUG_INFO=y (e.g. CONFIG_DEBUG_INFO_DWARF4=y) and do not strip it", f.name)
}

func isCompressed(s *elf.Section) bool {
	return s.Flags&elf.SHF_COMPRESSED != 0 || strings.HasPrefix(s.Name, ".zdebug")
}

func (f *File) dwarf() (*dwarfData, error) {
	if f.closed.Load() {
		return nil, errClosed
	}
	f.dwOnce.Do(func() {
		var held int64
		d := timed(func() {
			f.dw, held, f.dwErr = f.loadDWARF()
		})
		f.addStats(func(s *Stats) { s.UnitIndex += d; s.BytesHeld += held })
	})
	return f.dw, f.dwErr
}

func (f *File) loadDWARF() (*dwarfData, int64, error) {
	secs := map[string]*elf.Section{}
	for _, s := range f.elf.Sections {
		switch {
		case strings.HasPrefix(s.Name, ".debug_"):
			secs[s.Name[len(".debug_"):]] = s
		case strings.HasPrefix(s.Name, ".zdebug_"):
			secs[s.Name[len(".zdebug_"):]] = s
		}
	}
	dw := &dwarfData{order: f.elf.ByteOrder, info: secs["info"], line: secs["line"], rangesSec: secs["ranges"], rngListsSec: secs["rnglists"]}
	if dw.info == nil || dw.line == nil || secs["abbrev"] == nil {
		return nil, 0, f.errNoLines()
	}
	if f.elf.Type == elf.ET_REL {
		// Object files need relocations applied to their DWARF; a kernel
		// image never does.
		return nil, 0, fmt.Errorf("%s is a relocatable object: give the linked kernel (vmlinux)", f.name)
	}
	var held int64
	load := func(name string) ([]byte, error) {
		s := secs[name]
		if s == nil {
			return nil, nil
		}
		b, err := s.Data()
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", s.Name, f.name, err)
		}
		held += int64(len(b))
		return b, nil
	}
	var err error
	for _, p := range []struct {
		name string
		dst  *[]byte
	}{{"abbrev", &dw.abbrev}, {"str", &dw.str}, {"line_str", &dw.lineStr}, {"str_offsets", &dw.strOffsets}, {"addr", &dw.addr}} {
		if *p.dst, err = load(p.name); err != nil {
			return nil, 0, err
		}
	}
	dw.infoCompressed = isCompressed(dw.info)
	if isCompressed(dw.line) {
		if dw.lineMem, err = load("line"); err != nil {
			return nil, 0, err
		}
	}
	if secs["aranges"] != nil {
		b, err := secs["aranges"].Data()
		if err != nil {
			return nil, 0, fmt.Errorf("read .debug_aranges of %s: %w", f.name, err)
		}
		r, err := parseAranges(b, dw.order)
		if err != nil {
			// Not fatal: the unit DIEs carry the same ranges.
			r = nil
		}
		if len(r) > 0 {
			dw.aranges = newRangeIndex(r)
			held += int64(len(r)) * (24 + 8)
		}
	}
	return dw, held, nil
}

// parseAranges decodes .debug_aranges (DWARF 2-5 share the format), the
// cheapest way from an address to its unit: no .debug_info is touched.
func parseAranges(b []byte, order binary.ByteOrder) ([]cuRange, error) {
	var out []cuRange
	for off := 0; off < len(b); {
		if len(b)-off < 4 {
			return out, errors.New("truncated .debug_aranges header")
		}
		start := off
		length := uint64(order.Uint32(b[off:]))
		off += 4
		dwarf64 := false
		if length == 0xffffffff {
			if len(b)-off < 8 {
				return out, errors.New("truncated .debug_aranges header")
			}
			length = order.Uint64(b[off:])
			off += 8
			dwarf64 = true
		}
		if length > uint64(len(b)-off) {
			return out, errors.New("truncated .debug_aranges set")
		}
		end := off + int(length)
		set := b[:end]
		if end-off < 2 {
			return out, errors.New("truncated .debug_aranges set")
		}
		off += 2 // version
		var cu uint64
		if dwarf64 {
			if end-off < 8 {
				return out, errors.New("truncated .debug_aranges set")
			}
			cu = order.Uint64(set[off:])
			off += 8
		} else {
			if end-off < 4 {
				return out, errors.New("truncated .debug_aranges set")
			}
			cu = uint64(order.Uint32(set[off:]))
			off += 4
		}
		if end-off < 2 {
			return out, errors.New("truncated .debug_aranges set")
		}
		asize, ssize := int(set[off]), int(set[off+1])
		off += 2
		if asize != 4 && asize != 8 {
			return out, fmt.Errorf("unsupported address size %d in .debug_aranges", asize)
		}
		tuple := 2*asize + ssize
		// Tuples are aligned to their own size from the start of the set.
		if r := (off - start) % tuple; r != 0 {
			off += tuple - r
		}
		for ; off+tuple <= end; off += tuple {
			p := set[off+ssize:]
			var lo, n uint64
			if asize == 8 {
				lo, n = order.Uint64(p), order.Uint64(p[8:])
			} else {
				lo, n = uint64(order.Uint32(p)), uint64(order.Uint32(p[4:]))
			}
			if lo == 0 && n == 0 {
				break
			}
			if n > 0 {
				out = append(out, cuRange{lo: lo, hi: lo + n, cu: cu})
			}
		}
		off = end
	}
	return out, nil
}

// unitList lists the units of .debug_info by reading only their length
// fields (or, compressed, by one streaming pass that keeps each unit's
// prefix).
func (f *File) unitList() ([]unitRef, error) {
	dw, err := f.dwarf()
	if err != nil {
		return nil, err
	}
	f.unitsOnce.Do(func() {
		var held int64
		d := timed(func() {
			if dw.infoCompressed {
				f.units, f.unitsErr = scanUnitsStream(dw)
			} else {
				f.units, f.unitsErr = scanUnitsAt(dw)
			}
			if f.unitsErr != nil {
				f.unitsErr = fmt.Errorf("read the unit headers of %s (.debug_info looks corrupt): %w", f.name, f.unitsErr)
			}
			for _, u := range f.units {
				held += int64(16+24) + int64(len(u.prefix))
			}
		})
		f.addStats(func(s *Stats) { s.UnitIndex += d; s.Units = len(f.units); s.BytesHeld += held })
	})
	return f.units, f.unitsErr
}

// unitLength decodes an initial length field; hdr must hold 12 bytes or
// the rest of the section.
func unitLength(hdr []byte, order binary.ByteOrder) (total uint64, err error) {
	if len(hdr) < 4 {
		return 0, errors.New("truncated unit length")
	}
	l := uint64(order.Uint32(hdr))
	switch {
	case l == 0xffffffff:
		if len(hdr) < 12 {
			return 0, errors.New("truncated unit length")
		}
		return 12 + order.Uint64(hdr[4:]), nil
	case l >= 0xfffffff0:
		return 0, fmt.Errorf("reserved unit length %#x", l)
	}
	return 4 + l, nil
}

func scanUnitsAt(dw *dwarfData) ([]unitRef, error) {
	var units []unitRef
	size := dw.info.Size
	var hdr [12]byte
	for off := uint64(0); off < size; {
		n := min(uint64(len(hdr)), size-off)
		if _, err := dw.info.ReadAt(hdr[:n], int64(off)); err != nil {
			return units, err
		}
		total, err := unitLength(hdr[:n], dw.order)
		if err != nil {
			return units, fmt.Errorf("at offset %#x: %w", off, err)
		}
		if total > size-off {
			return units, fmt.Errorf("unit at %#x runs past the end of .debug_info", off)
		}
		if total > 4 { // zero-length units are padding
			units = append(units, unitRef{off: off, size: total})
		}
		off += total
	}
	return units, nil
}

func scanUnitsStream(dw *dwarfData) ([]unitRef, error) {
	r := bufio.NewReaderSize(dw.info.Open(), 1<<16)
	var units []unitRef
	size := dw.info.Size
	for off := uint64(0); off < size; {
		hdr := make([]byte, min(unitPrefixLen, size-off))
		if _, err := io.ReadFull(r, hdr[:min(4, len(hdr))]); err != nil {
			return units, err
		}
		if dw.order.Uint32(hdr) == 0xffffffff && len(hdr) >= 12 {
			if _, err := io.ReadFull(r, hdr[4:12]); err != nil {
				return units, err
			}
		}
		total, err := unitLength(hdr, dw.order)
		if err != nil {
			return units, fmt.Errorf("at offset %#x: %w", off, err)
		}
		if total > size-off {
			return units, fmt.Errorf("unit at %#x runs past the end of .debug_info", off)
		}
		read := uint64(4)
		if dw.order.Uint32(hdr) == 0xffffffff {
			read = 12
		}
		keep := min(total, uint64(len(hdr)))
		if _, err := io.ReadFull(r, hdr[read:keep]); err != nil {
			return units, err
		}
		if _, err := r.Discard(int(total - keep)); err != nil {
			return units, err
		}
		if total > 4 {
			units = append(units, unitRef{off: off, size: total, prefix: hdr[:keep:keep]})
		}
		off += total
	}
	return units, nil
}

func (f *File) unitAt(off uint64) (unitRef, error) {
	units, err := f.unitList()
	if err != nil {
		return unitRef{}, err
	}
	i := sort.Search(len(units), func(i int) bool { return units[i].off >= off })
	if i == len(units) || units[i].off != off {
		return unitRef{}, fmt.Errorf("%s: no compilation unit at .debug_info offset %#x", f.name, off)
	}
	return units[i], nil
}

// unitBytes returns the start of a unit (or all of it) with its length
// field rewritten to match, so debug/dwarf decodes it as a complete
// one-unit .debug_info.
func (f *File) unitBytes(dw *dwarfData, u unitRef, full bool) ([]byte, error) {
	n := min(u.size, unitPrefixLen)
	if full {
		n = u.size
	}
	var b []byte
	switch {
	case uint64(len(u.prefix)) >= n:
		b = slices.Clone(u.prefix[:n])
	case !dw.infoCompressed:
		b = make([]byte, n)
		if _, err := dw.info.ReadAt(b, int64(u.off)); err != nil {
			return nil, fmt.Errorf("read unit at %#x of %s: %w", u.off, f.name, err)
		}
	default:
		// A root DIE longer than the kept prefix: decompress up to the
		// unit once more. Rare enough not to deserve more memory.
		r := dw.info.Open()
		if _, err := r.Seek(int64(u.off), io.SeekStart); err != nil {
			return nil, err
		}
		b = make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("read unit at %#x of %s: %w", u.off, f.name, err)
		}
	}
	if dw.order.Uint32(b) == 0xffffffff {
		dw.order.PutUint64(b[4:], uint64(len(b)-12))
	} else {
		dw.order.PutUint32(b, uint32(len(b)-4))
	}
	return b, nil
}

// newData builds a dwarf.Data over one unit. Only that unit's abbreviation
// table gets parsed, which is what keeps this cheap compared with
// elf.File.DWARF (which parses every unit's table and holds all sections).
func (dw *dwarfData) newData(info, line, ranges, rngLists []byte) (*dwarf.Data, error) {
	d, err := dwarf.New(dw.abbrev, nil, nil, info, line, nil, ranges, dw.str)
	if err != nil {
		return nil, err
	}
	for _, s := range []struct {
		name string
		b    []byte
	}{{".debug_addr", dw.addr}, {".debug_line_str", dw.lineStr}, {".debug_str_offsets", dw.strOffsets}, {".debug_rnglists", rngLists}} {
		if s.b != nil {
			if err := d.AddSection(s.name, s.b); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// unitEntry decodes a unit's root DIE, from its prefix when that suffices.
func (f *File) unitEntry(dw *dwarfData, u unitRef, ranges, rngLists []byte) (*dwarf.Data, *dwarf.Entry, []byte, error) {
	var lastErr error
	for _, full := range []bool{false, true} {
		if full && u.size <= unitPrefixLen {
			break
		}
		info, err := f.unitBytes(dw, u, full)
		if err != nil {
			return nil, nil, nil, err
		}
		d, err := dw.newData(info, nil, ranges, rngLists)
		if err != nil {
			lastErr = err
			continue
		}
		e, err := d.Reader().Next()
		if err == nil && e != nil {
			return d, e, info, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errors.New("no root DIE")
	}
	return nil, nil, nil, fmt.Errorf("decode the compilation unit at .debug_info offset %#x of %s: %w", u.off, f.name, lastErr)
}

// cuFor finds the unit whose code covers addr: .debug_aranges first, then
// (built once, only if needed) the ranges of every unit's root DIE.
func (f *File) cuFor(addr uint64) (uint64, bool, error) {
	dw, err := f.dwarf()
	if err != nil {
		return 0, false, err
	}
	if cu, ok := dw.aranges.find(addr); ok {
		return cu, true, nil
	}
	ix, err := f.dieRanges()
	if err != nil {
		return 0, false, err
	}
	cu, ok := ix.find(addr)
	return cu, ok, nil
}

// dwarfUnits is the DWARF data and its unit list, which every index
// built over the units needs.
func (f *File) dwarfUnits() (*dwarfData, []unitRef, error) {
	dw, err := f.dwarf()
	if err != nil {
		return nil, nil, err
	}
	units, err := f.unitList()
	return dw, units, err
}

// unitIndex is an index built over the DWARF units, once: once guards v
// and verr, which hold what build made of them; note records the build's
// time and what the index holds in the stats.
func unitIndex[T any](f *File, once *sync.Once, v *T, verr *error, build func(*dwarfData, []unitRef) (T, error), note func(T, error, time.Duration)) (T, error) {
	dw, units, err := f.dwarfUnits()
	if err != nil {
		var zero T
		return zero, err
	}
	once.Do(func() {
		d := timed(func() { *v, *verr = build(dw, units) })
		note(*v, *verr, d)
	})
	return *v, *verr
}

func (f *File) dieRanges() (*rangeIndex, error) {
	return unitIndex(f, &f.cuRangesOnce, &f.cuRanges, &f.cuRangesErr, f.buildDIERanges, func(r *rangeIndex, _ error, d time.Duration) {
		var held int64
		if r != nil {
			held = int64(len(r.r)) * 32
		}
		f.addStats(func(s *Stats) { s.RangeIndex = d; s.BytesHeld += held })
	})
}

func (f *File) buildDIERanges(dw *dwarfData, units []unitRef) (*rangeIndex, error) {
	// The range sections are needed only here, so they are read for the
	// scan and dropped afterwards.
	var ranges, rngLists []byte
	var err error
	if dw.rangesSec != nil {
		if ranges, err = dw.rangesSec.Data(); err != nil {
			return nil, fmt.Errorf("read .debug_ranges of %s: %w", f.name, err)
		}
	}
	if dw.rngListsSec != nil {
		if rngLists, err = dw.rngListsSec.Data(); err != nil {
			return nil, fmt.Errorf("read .debug_rnglists of %s: %w", f.name, err)
		}
	}
	var out []cuRange
	for _, u := range units {
		d, e, _, err := f.unitEntry(dw, u, ranges, rngLists)
		if err != nil {
			return nil, err
		}
		if e.Tag != dwarf.TagCompileUnit && e.Tag != dwarf.TagPartialUnit {
			continue
		}
		rs, err := d.Ranges(e)
		if err != nil {
			continue // a unit with broken ranges should not hide the others
		}
		for _, r := range rs {
			if r[1] > r[0] {
				out = append(out, cuRange{lo: r[0], hi: r[1], cu: u.off})
			}
		}
	}
	return newRangeIndex(out), nil
}
