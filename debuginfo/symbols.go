package debuginfo

import (
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unsafe"
)

// Symbol is one entry of the ELF symbol table.
type Symbol struct {
	Name string
	Addr uint64
	// Size is st_size, or for a label without one (assembly), the distance
	// to the next symbol in its section, which is what a disassembler wants.
	Size uint64
	// Func is true for code: STT_FUNC, or an untyped label in an executable
	// section.
	Func bool
}

type symbol struct {
	name      string
	addr, end uint64 // end is exclusive; for labels, the next symbol's address
	size      uint64 // st_size
	sect      int    // section header index; -1 for SHN_ABS
	typ       elf.SymType
	bind      elf.SymBind
	code      bool
}

type sectSyms struct {
	lo, hi      uint64 // the section's address range
	first, last int    // syms[first:last]
}

type symIndex struct {
	syms   []symbol // sorted by section, then address
	maxEnd []uint64 // maxEnd[i]: the largest end in syms[group start..i], to stop walking back early
	byName []int32  // indexes into syms, sorted by name
	sects  []sectSyms
	bytes  int64
}

func (f *File) symbols() (*symIndex, error) {
	if f.closed.Load() {
		return nil, errClosed
	}
	f.symOnce.Do(func() {
		d := timed(func() {
			f.syms, f.symErr = buildSymIndex(f.elf, f.name)
		})
		if f.symErr == nil {
			f.addStats(func(s *Stats) {
				s.Symbols = len(f.syms.syms)
				s.SymbolIndex = d
				s.BytesHeld += f.syms.bytes
			})
		}
	})
	return f.syms, f.symErr
}

// ignoredName drops names that are not places a person would name: RISC-V
// assembler temporaries (.L...) and the $x/$d mapping symbols that only mark
// where code and data start. The kernel links the EFI stub (and, in later
// versions, position-independent early code) with every symbol renamed
// __efistub_X or __pi_X, temporaries included: 40,000 of them in 6.1's
// vmlinux, which would otherwise name addresses inside the stub.
func ignoredName(n string) bool {
	for _, p := range []string{"__efistub_", "__pi_"} {
		n = strings.TrimPrefix(n, p)
	}
	return n == "" || strings.HasPrefix(n, ".L") || strings.HasPrefix(n, "$x") || strings.HasPrefix(n, "$d")
}

func buildSymIndex(ef *elf.File, name string) (*symIndex, error) {
	raw, err := ef.Symbols()
	if errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("%s has no symbol table (it was stripped): use the unstripped vmlinux from the kernel build tree", name)
	}
	if err != nil {
		return nil, fmt.Errorf("read the symbol table of %s: %w", name, err)
	}
	ix := &symIndex{syms: make([]symbol, 0, len(raw))}
	for _, s := range raw {
		typ, bind := elf.ST_TYPE(s.Info), elf.ST_BIND(s.Info)
		if typ == elf.STT_SECTION || typ == elf.STT_FILE || typ == elf.STT_TLS || ignoredName(s.Name) {
			continue
		}
		sym := symbol{name: s.Name, addr: s.Value, size: s.Size, end: s.Value + s.Size, sect: -1, typ: typ, bind: bind}
		switch {
		case s.Section == elf.SHN_ABS:
			// Kept for Lookup (assembler constants such as UART_BASE), but
			// never used to name an address.
		case s.Section == elf.SHN_UNDEF || s.Section >= elf.SHN_LORESERVE || int(s.Section) >= len(ef.Sections):
			continue
		default:
			sec := ef.Sections[s.Section]
			if sec.Flags&elf.SHF_ALLOC == 0 {
				continue
			}
			sym.sect = int(s.Section)
			sym.code = typ == elf.STT_FUNC || (typ == elf.STT_NOTYPE && sec.Flags&elf.SHF_EXECINSTR != 0)
		}
		ix.syms = append(ix.syms, sym)
	}
	syms := ix.syms
	sort.Slice(syms, func(i, j int) bool {
		if syms[i].sect != syms[j].sect {
			return syms[i].sect < syms[j].sect
		}
		return syms[i].addr < syms[j].addr
	})

	ix.maxEnd = make([]uint64, len(syms))
	for first := 0; first < len(syms); {
		last := first
		for last < len(syms) && syms[last].sect == syms[first].sect {
			last++
		}
		if sect := syms[first].sect; sect >= 0 {
			sec := ef.Sections[sect]
			secEnd := sec.Addr + sec.Size
			next := last // first symbol with a larger address than syms[i]
			for i := last - 1; i >= first; i-- {
				for next > i+1 && syms[next-1].addr > syms[i].addr {
					next--
				}
				if syms[i].size == 0 {
					// Assembly labels carry no size: they run to the next
					// label, or to the end of the section.
					end := secEnd
					if next < last {
						end = syms[next].addr
					}
					syms[i].end = max(end, syms[i].addr)
				}
			}
			if sec.Flags&elf.SHF_TLS == 0 {
				ix.sects = append(ix.sects, sectSyms{lo: sec.Addr, hi: secEnd, first: first, last: last})
			}
		}
		var m uint64
		for i := first; i < last; i++ {
			m = max(m, syms[i].end)
			ix.maxEnd[i] = m
		}
		first = last
	}

	ix.byName = make([]int32, len(syms))
	for i := range ix.byName {
		ix.byName[i] = int32(i)
	}
	sort.Slice(ix.byName, func(i, j int) bool { return syms[ix.byName[i]].name < syms[ix.byName[j]].name })

	ix.bytes = int64(cap(syms))*int64(unsafe.Sizeof(symbol{})) + int64(len(syms))*(8+4)
	for i := range syms {
		ix.bytes += int64(len(syms[i].name))
	}
	return ix, nil
}

func (s *symbol) export() Symbol {
	return Symbol{Name: s.name, Addr: s.addr, Size: s.end - s.addr, Func: s.code}
}

// nameRange is the span of byName holding exactly name.
func (ix *symIndex) nameRange(name string) (int, int) {
	lo := sort.Search(len(ix.byName), func(i int) bool { return ix.syms[ix.byName[i]].name >= name })
	hi := lo
	for hi < len(ix.byName) && ix.syms[ix.byName[hi]].name == name {
		hi++
	}
	return lo, hi
}

// Lookup finds a symbol by its exact name. Several symbols can share a name
// (static functions in different files); Lookup prefers a global one, then
// one in a section over an absolute one, then the lowest address. LookupAll
// returns them all.
func (f *File) Lookup(name string) (Symbol, error) {
	all, err := f.LookupAll(name)
	if err != nil {
		return Symbol{}, err
	}
	return all[0], nil
}

// LookupAll returns every symbol called name, the preferred one first (see
// Lookup).
func (f *File) LookupAll(name string) ([]Symbol, error) {
	if name == "" {
		return nil, errors.New("empty symbol name: give a function or variable name such as start_kernel")
	}
	ix, err := f.symbols()
	if err != nil {
		return nil, err
	}
	lo, hi := ix.nameRange(name)
	if lo == hi {
		if sug := ix.suggest(name, 5); len(sug) > 0 {
			return nil, fmt.Errorf("symbol %q not found in %s; similar names: %s", name, f.name, strings.Join(sug, ", "))
		}
		return nil, fmt.Errorf("symbol %q not found in %s and no similar name either (names are exact and case-sensitive)", name, f.name)
	}
	idx := append([]int32(nil), ix.byName[lo:hi]...)
	rank := func(s *symbol) int {
		r := 0
		switch s.bind {
		case elf.STB_GLOBAL:
		case elf.STB_WEAK:
			r += 1
		default:
			r += 2
		}
		if s.sect < 0 {
			r += 4
		}
		return r
	}
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := &ix.syms[idx[i]], &ix.syms[idx[j]]
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra < rb
		}
		return a.addr < b.addr
	})
	out := make([]Symbol, len(idx))
	for i, k := range idx {
		out[i] = ix.syms[k].export()
	}
	return out, nil
}

// at returns the index of the symbol that names addr: among the symbols of
// the section holding addr that cover it, the one starting closest below it
// (the innermost), -1 if none.
func (ix *symIndex) at(addr uint64) int {
	for _, g := range ix.sects {
		if addr < g.lo || addr >= g.hi {
			continue
		}
		syms := ix.syms
		i := g.first + sort.Search(g.last-g.first, func(i int) bool { return syms[g.first+i].addr > addr }) - 1
		for ; i >= g.first && ix.maxEnd[i] > addr; i-- {
			if syms[i].end <= addr {
				continue
			}
			best := i
			for j := i - 1; j >= g.first && syms[j].addr == syms[i].addr; j-- {
				if syms[j].end > addr && betterName(&syms[j], &syms[best]) {
					best = j
				}
			}
			return best
		}
	}
	return -1
}

// rank is v's place in preferred, best first; anything else ranks last.
func rank[T comparable](v T, preferred []T) int {
	if i := slices.Index(preferred, v); i >= 0 {
		return i
	}
	return len(preferred)
}

// betterName picks, among symbols at one address, the name a person expects:
// a sized function over a label, global over local, and for aliases such as
// sys_newuname / __se_sys_newuname the one with fewer leading underscores.
func betterName(a, b *symbol) bool {
	types := []elf.SymType{elf.STT_FUNC, elf.STT_OBJECT}
	if ra, rb := rank(a.typ, types), rank(b.typ, types); ra != rb {
		return ra < rb
	}
	if (a.size == 0) != (b.size == 0) {
		return a.size != 0
	}
	binds := []elf.SymBind{elf.STB_GLOBAL, elf.STB_WEAK}
	if ra, rb := rank(a.bind, binds), rank(b.bind, binds); ra != rb {
		return ra < rb
	}
	ua, ub := len(a.name)-len(strings.TrimLeft(a.name, "_")), len(b.name)-len(strings.TrimLeft(b.name, "_"))
	if ua != ub {
		return ua < ub
	}
	if len(a.name) != len(b.name) {
		return len(a.name) < len(b.name)
	}
	return a.name < b.name
}

// suggest lists up to n names close to the missing one: case-insensitive
// equals, then typos (small edit distance), then names containing it.
func (ix *symIndex) suggest(q string, n int) []string {
	type cand struct {
		name  string
		score int
	}
	lq := strings.ToLower(q)
	maxD := min(1+len(q)/4, 4)
	var best []cand
	add := func(c cand) {
		i := sort.Search(len(best), func(i int) bool {
			return best[i].score > c.score || (best[i].score == c.score && best[i].name > c.name)
		})
		if i >= n {
			return
		}
		best = append(best, cand{})
		copy(best[i+1:], best[i:])
		best[i] = c
		if len(best) > n {
			best = best[:n]
		}
	}
	prev := ""
	for k, idx := range ix.byName {
		name := ix.syms[idx].name
		if k > 0 && name == prev {
			continue
		}
		prev = name
		ln := strings.ToLower(name)
		switch {
		case ln == lq:
			add(cand{name, 0})
		case abs(len(ln)-len(lq)) <= maxD && editDistance(ln, lq, maxD) <= maxD:
			add(cand{name, 3 * editDistance(ln, lq, maxD)})
		case strings.Contains(ln, lq):
			add(cand{name, 4 + min(len(ln)-len(lq), 1000)})
		}
	}
	out := make([]string, len(best))
	for i, c := range best {
		out[i] = c.name
	}
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// editDistance is the Levenshtein distance of a and b, or limit+1 once it is
// known to exceed limit (which keeps scanning 100k names cheap).
func editDistance(a, b string, limit int) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c = 1 + min(prev[j-1], prev[j], cur[j-1])
			}
			cur[j] = c
			rowMin = min(rowMin, c)
		}
		if rowMin > limit {
			return limit + 1
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit+1)
}
