package debuginfo

import (
	"container/list"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Location says where an address is: in which symbol, how far into it, and
// at which source line when the DWARF line table covers it.
type Location struct {
	Function string // the symbol's name as in the symbol table
	Offset   uint64 // addr - symbol address
	File     string // relative to the build directory when under it (kernel/sys.c), else the DWARF path; "" when unknown
	Line     int    // 0 when unknown
}

// LineMatch is the answer to "which addresses are FILE:LINE".
type LineMatch struct {
	File string // the DWARF path the query matched
	// Line is the line the addresses belong to: the requested one, or when
	// that line has no code (a comment, a declaration), the next line that
	// has, as gdb does.
	Line int
	// Addrs, ascending, holds one address per function containing code of
	// the line (a static inline function has one per caller it was inlined
	// into): the lowest, where a breakpoint catches the line first.
	Addrs []uint64
}

// lineCacheBytes bounds the decoded line tables kept; vmlinux's biggest
// unit decodes to well under 1 MiB, so this holds dozens of units.
const lineCacheBytes = 16 << 20

const (
	rowStmt = 1 << iota
)

type lineRow struct {
	addr uint64
	line uint32
	file uint16 // index into lineTable.files; noFile when unknown
	flag uint8
}

const noFile = math.MaxUint16

type lineSeq struct {
	lo, hi      uint64 // hi: the end_sequence address
	first, last int32  // rows[first:last], addresses ascending
}

// lineTable is one unit's decoded line program, compacted to 16 bytes a row.
type lineTable struct {
	files []string
	rows  []lineRow
	seqs  []lineSeq
	bytes int64
}

func cleanPath(p string) string {
	if p == "" {
		return ""
	}
	return path.Clean(strings.ReplaceAll(p, "\\", "/"))
}

// relPath is p relative to the unit's build directory when it is under it:
// "kernel/sys.c", as a kernel developer names the file, rather than where
// the build ran.
func relPath(p, compDir string) string {
	compDir = cleanPath(compDir)
	if compDir != "" && compDir != "." && strings.HasPrefix(p, compDir+"/") {
		return p[len(compDir)+1:]
	}
	return p
}

// lineProgram returns the unit's line program at off in .debug_line.
func (f *File) lineProgram(dw *dwarfData, off uint64) ([]byte, error) {
	if dw.lineMem != nil {
		if off >= uint64(len(dw.lineMem)) {
			return nil, fmt.Errorf("line program offset %#x beyond .debug_line", off)
		}
		total, err := unitLength(dw.lineMem[off:min(off+12, uint64(len(dw.lineMem)))], dw.order)
		if err != nil {
			return nil, err
		}
		if total > uint64(len(dw.lineMem))-off {
			return nil, fmt.Errorf("line program at %#x runs past the end of .debug_line", off)
		}
		return dw.lineMem[off : off+total], nil
	}
	size := dw.line.Size
	if off >= size {
		return nil, fmt.Errorf("line program offset %#x beyond .debug_line", off)
	}
	var hdr [12]byte
	n := min(12, size-off)
	if _, err := dw.line.ReadAt(hdr[:n], int64(off)); err != nil {
		return nil, err
	}
	total, err := unitLength(hdr[:n], dw.order)
	if err != nil {
		return nil, err
	}
	if total > size-off {
		return nil, fmt.Errorf("line program at %#x runs past the end of .debug_line", off)
	}
	b := make([]byte, total)
	if _, err := dw.line.ReadAt(b, int64(off)); err != nil {
		return nil, err
	}
	return b, nil
}

// lineReader opens the line program of unit u. It returns nil (and no
// error) for a unit without one.
func (f *File) lineReader(dw *dwarfData, u unitRef) (*dwarf.LineReader, string, error) {
	_, e, info, err := f.unitEntry(dw, u, nil, nil)
	if err != nil {
		return nil, "", err
	}
	stmt, ok := e.Val(dwarf.AttrStmtList).(int64)
	if !ok || stmt < 0 {
		return nil, "", nil
	}
	prog, err := f.lineProgram(dw, uint64(stmt))
	if err != nil {
		return nil, "", fmt.Errorf("read the line table of unit %#x of %s: %w", u.off, f.name, err)
	}
	d, err := dw.newData(info, prog, nil, nil)
	if err != nil {
		return nil, "", err
	}
	// The program was cut out of .debug_line, so it now starts at 0.
	e2 := *e
	e2.Field = slices.Clone(e.Field)
	for i := range e2.Field {
		if e2.Field[i].Attr == dwarf.AttrStmtList {
			e2.Field[i].Val = int64(0)
		}
	}
	lr, err := d.LineReader(&e2)
	if err != nil {
		return nil, "", fmt.Errorf("decode the line table of unit %#x of %s: %w", u.off, f.name, err)
	}
	compDir, _ := e.Val(dwarf.AttrCompDir).(string)
	return lr, compDir, nil
}

func (f *File) decodeLines(dw *dwarfData, u unitRef) (*lineTable, error) {
	lr, compDir, err := f.lineReader(dw, u)
	if err != nil {
		return nil, err
	}
	t := &lineTable{}
	if lr == nil {
		return t, nil
	}
	fileIdx := map[*dwarf.LineFile]uint16{}
	refresh := func() {
		files := lr.Files()
		t.files = t.files[:0]
		for i, lf := range files {
			name := ""
			if lf != nil {
				name = relPath(cleanPath(lf.Name), compDir)
				if i < noFile {
					fileIdx[lf] = uint16(i)
				}
			}
			t.files = append(t.files, name)
		}
	}
	refresh()
	var e dwarf.LineEntry
	seqStart := 0
	for {
		err := lr.Next(&e)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decode the line table of unit %#x of %s: %w", u.off, f.name, err)
		}
		if e.EndSequence {
			if len(t.rows) > seqStart {
				t.seqs = append(t.seqs, lineSeq{lo: t.rows[seqStart].addr, hi: e.Address, first: int32(seqStart), last: int32(len(t.rows))})
			}
			seqStart = len(t.rows)
			continue
		}
		r := lineRow{addr: e.Address, line: uint32(max(e.Line, 0)), file: noFile}
		if e.IsStmt {
			r.flag |= rowStmt
		}
		if e.File != nil {
			idx, ok := fileIdx[e.File]
			if !ok { // DW_LNE_define_file added one
				refresh()
				idx, ok = fileIdx[e.File]
			}
			if ok {
				r.file = idx
			}
		}
		t.rows = append(t.rows, r)
	}
	t.rows = slices.Clip(t.rows)
	t.bytes = int64(len(t.rows))*16 + int64(len(t.seqs))*24 + 64
	for _, s := range t.files {
		t.bytes += int64(len(s)) + 16
	}
	return t, nil
}

// find returns the row covering addr: the last row at or below it in the
// sequence containing it (several rows at one address: the last wins, the
// earlier ones cover no bytes).
func (t *lineTable) find(addr uint64) (lineRow, bool) {
	for _, s := range t.seqs {
		if addr < s.lo || addr >= s.hi {
			continue
		}
		rows := t.rows[s.first:s.last]
		i := sort.Search(len(rows), func(i int) bool { return rows[i].addr > addr }) - 1
		if i >= 0 {
			return rows[i], true
		}
	}
	return lineRow{}, false
}

// lineTable returns the decoded table of the unit at cuOff, from the cache
// when possible. Callers scanning many units pass cache=false so that one
// query over a header file does not flush everything else.
func (f *File) lineTable(cuOff uint64, cache bool) (*lineTable, error) {
	if t := f.lines.get(cuOff); t != nil {
		return t, nil
	}
	dw, err := f.dwarf()
	if err != nil {
		return nil, err
	}
	u, err := f.unitAt(cuOff)
	if err != nil {
		return nil, err
	}
	t, err := f.decodeLines(dw, u)
	if err != nil {
		return nil, err
	}
	if cache {
		f.lines.put(cuOff, t)
	}
	return t, nil
}

// Symbolize names addr: the symbol containing it and the offset into it,
// plus the source line when the DWARF line table covers addr. ok is false
// when no symbol covers addr.
func (f *File) Symbolize(addr uint64) (Location, bool) {
	ix, err := f.symbols()
	if err != nil {
		return Location{}, false
	}
	i := ix.at(addr)
	if i < 0 {
		return Location{}, false
	}
	s := &ix.syms[i]
	loc := Location{Function: s.name, Offset: addr - s.addr}
	// DWARF problems only cost the line: the symbol is still right.
	if cu, ok, err := f.cuFor(addr); err == nil && ok {
		if t, err := f.lineTable(cu, true); err == nil {
			if r, ok := t.find(addr); ok && r.line > 0 && int(r.file) < len(t.files) {
				loc.File, loc.Line = t.files[r.file], int(r.line)
			}
		}
	}
	return loc, true
}

// srcFile is one source path seen in the line tables, and the units whose
// file tables list it.
type srcFile struct {
	path  string   // cleaned DWARF path
	rel   string   // path relative to the unit's comp_dir ("kernel/sys.c"), or path
	units []uint32 // indexes into File.units
}

type fileIndex struct {
	files []srcFile // sorted by path
}

func (f *File) fileIndex() (*fileIndex, error) {
	return unitIndex(f, &f.filesOnce, &f.files, &f.filesErr, f.buildFileIndex, func(fi *fileIndex, err error, d time.Duration) {
		if err != nil {
			return
		}
		var held int64
		for _, s := range fi.files {
			held += int64(len(s.path)) + 2*16 + 24 + int64(cap(s.units))*4
			if s.rel != s.path {
				held += int64(len(s.rel))
			}
		}
		f.addStats(func(s *Stats) { s.FileIndex = d; s.Files = len(fi.files); s.BytesHeld += held })
	})
}

func (f *File) buildFileIndex(dw *dwarfData, units []unitRef) (*fileIndex, error) {
	byPath := map[string]int{}
	var files []srcFile
	haveLines := false
	for ui, u := range units {
		lr, compDir, err := f.lineReader(dw, u)
		if err != nil {
			return nil, err
		}
		if lr == nil {
			continue
		}
		haveLines = true
		for _, lf := range lr.Files() {
			if lf == nil {
				continue
			}
			p := cleanPath(lf.Name)
			k, ok := byPath[p]
			if !ok {
				k = len(files)
				byPath[p] = k
				files = append(files, srcFile{path: p, rel: relPath(p, compDir)})
			}
			if n := len(files[k].units); n == 0 || files[k].units[n-1] != uint32(ui) {
				files[k].units = append(files[k].units, uint32(ui))
			}
		}
	}
	if !haveLines {
		return nil, f.errNoLines()
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	for i := range files {
		files[i].units = slices.Clip(files[i].units)
	}
	return &fileIndex{files: files}, nil
}

// match resolves what a person typed ("sys.c", "kernel/sys.c", a full
// path) to one source file: an exact path (full, or relative to the build
// directory) wins; otherwise a unique suffix at a path component boundary.
func (fi *fileIndex) match(q, elfName string) (*srcFile, error) {
	q = cleanPath(q)
	q = strings.TrimPrefix(q, "./")
	if q == "" || q == "." {
		return nil, errors.New("empty source file name: give a file such as kernel/sys.c")
	}
	var exact, suffix []*srcFile
	for i := range fi.files {
		s := &fi.files[i]
		switch {
		case s.path == q || s.rel == q:
			exact = append(exact, s)
		case strings.HasSuffix(s.path, "/"+q):
			suffix = append(suffix, s)
		}
	}
	cands := exact
	if len(cands) == 0 {
		cands = suffix
	}
	switch {
	case len(cands) == 1:
		return cands[0], nil
	case len(cands) > 1:
		names := make([]string, 0, 5)
		for _, s := range cands[:min(5, len(cands))] {
			names = append(names, s.rel)
		}
		more := ""
		if len(cands) > 5 {
			more = fmt.Sprintf(" and %d more", len(cands)-5)
		}
		return nil, fmt.Errorf("%q matches %d source files in %s: %s%s; give more of the path", q, len(cands), elfName, strings.Join(names, ", "), more)
	}
	base := path.Base(q)
	var same []string
	for i := range fi.files {
		if path.Base(fi.files[i].path) == base && len(same) < 5 {
			same = append(same, fi.files[i].rel)
		}
	}
	if len(same) > 0 {
		return nil, fmt.Errorf("no source file %q in the line tables of %s; files named %s: %s", q, elfName, base, strings.Join(same, ", "))
	}
	return nil, fmt.Errorf("no source file %q in the line tables of %s (%d files known; the file may have no code in this build, or its unit was built without -g)", q, elfName, len(fi.files))
}

// LineAddrs resolves a FILE:LINE breakpoint to addresses. file is matched
// against the DWARF paths by suffix ("sys.c", "kernel/sys.c", or the full
// path); when that is ambiguous the error lists the candidates. Only
// is_stmt rows count, the ones a compiler marks as a line's beginning.
func (f *File) LineAddrs(file string, line int) (LineMatch, error) {
	if line < 1 {
		return LineMatch{}, fmt.Errorf("line %d: lines start at 1", line)
	}
	fi, err := f.fileIndex()
	if err != nil {
		return LineMatch{}, err
	}
	src, err := fi.match(file, f.name)
	if err != nil {
		return LineMatch{}, err
	}
	units, err := f.unitList()
	if err != nil {
		return LineMatch{}, err
	}
	type hit struct {
		addr uint64
		unit uint32
		seq  int
	}
	best, last := math.MaxInt, 0
	var hits []hit
	cache := len(src.units) <= 8
	for _, ui := range src.units {
		t, err := f.lineTable(units[ui].off, cache)
		if err != nil {
			return LineMatch{}, err
		}
		want := make([]bool, len(t.files))
		found := false
		for i, p := range t.files {
			if p == src.path || p == src.rel {
				want[i], found = true, true
			}
		}
		if !found {
			continue
		}
		for si, s := range t.seqs {
			for _, r := range t.rows[s.first:s.last] {
				if r.flag&rowStmt == 0 || int(r.file) >= len(want) || !want[r.file] || r.line == 0 {
					continue
				}
				// Rows of functions the linker discarded keep a tombstone
				// address (0 or -1): no place for a breakpoint.
				if !f.inCode(r.addr) {
					continue
				}
				l := int(r.line)
				last = max(last, l)
				if l < line || l > best {
					continue
				}
				if l < best {
					best, hits = l, hits[:0]
				}
				hits = append(hits, hit{addr: r.addr, unit: ui, seq: si})
			}
		}
	}
	if best == math.MaxInt {
		if last == 0 {
			return LineMatch{}, fmt.Errorf("%s has no code in %s (the line tables mention it but no instruction comes from it)", src.rel, f.name)
		}
		return LineMatch{}, fmt.Errorf("%s has no code at or after line %d in %s (its last line with code is %d)", src.rel, line, f.name, last)
	}
	// One address per function: a line spread over several blocks (a loop
	// header) should stop once, at its first instruction.
	type key struct {
		sym  int
		unit uint32
		seq  int
	}
	ix, _ := f.symbols()
	lowest := map[key]uint64{}
	for _, h := range hits {
		k := key{sym: -1, unit: h.unit, seq: h.seq}
		if ix != nil {
			if s := ix.at(h.addr); s >= 0 {
				k = key{sym: s}
			}
		}
		if a, ok := lowest[k]; !ok || h.addr < a {
			lowest[k] = h.addr
		}
	}
	m := LineMatch{File: src.rel, Line: best}
	for _, a := range lowest {
		m.Addrs = append(m.Addrs, a)
	}
	slices.Sort(m.Addrs)
	return m, nil
}

// lineCache is an LRU of decoded line tables, bounded by bytes.
type lineCache struct {
	mu    sync.Mutex
	ll    *list.List // of *cacheEntry, most recent first
	m     map[uint64]*list.Element
	bytes int64
	max   int64
}

type cacheEntry struct {
	cu uint64
	t  *lineTable
}

func (c *lineCache) init(limit int64) {
	c.ll = list.New()
	c.m = map[uint64]*list.Element{}
	c.max = limit
}

func (c *lineCache) get(cu uint64) *lineTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[cu]; ok {
		c.ll.MoveToFront(el)
		return el.Value.(*cacheEntry).t
	}
	return nil
}

func (c *lineCache) put(cu uint64, t *lineTable) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[cu]; ok {
		return // another goroutine decoded it too
	}
	c.m[cu] = c.ll.PushFront(&cacheEntry{cu, t})
	c.bytes += t.bytes
	for c.bytes > c.max && c.ll.Len() > 1 {
		el := c.ll.Back()
		e := el.Value.(*cacheEntry)
		c.ll.Remove(el)
		delete(c.m, e.cu)
		c.bytes -= e.t.bytes
	}
}

func (c *lineCache) usage() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len(), c.bytes
}

// inCode reports whether addr is inside an executable section of the image.
func (f *File) inCode(addr uint64) bool {
	for _, s := range f.elf.Sections {
		if s.Flags&(elf.SHF_ALLOC|elf.SHF_EXECINSTR) == elf.SHF_ALLOC|elf.SHF_EXECINSTR && addr >= s.Addr && addr-s.Addr < s.Size {
			return true
		}
	}
	return false
}
