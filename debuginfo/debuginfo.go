// Package debuginfo answers a debugger's questions about a RISC-V kernel ELF
// such as vmlinux: where a symbol lives, which function and source line an
// address belongs to, and which addresses a "file.c:LINE" breakpoint should
// use. It reads the ELF symbol table and the DWARF line tables lazily and one
// compilation unit at a time, so that opening a 76 MB vmlinux costs almost
// nothing, memory stays bounded (a few indexes plus a small cache of decoded
// line tables), and compressed debug sections work too. A File is safe for
// concurrent use.
package debuginfo

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// File is an opened ELF file. Its methods may be called from several
// goroutines at once.
type File struct {
	name string // base name, so that error messages say which file
	osf  *os.File
	elf  *elf.File

	closed atomic.Bool

	symOnce sync.Once
	syms    *symIndex
	symErr  error

	dwOnce sync.Once
	dw     *dwarfData
	dwErr  error

	unitsOnce sync.Once
	units     []unitRef
	unitsErr  error

	cuRangesOnce sync.Once
	cuRanges     *rangeIndex
	cuRangesErr  error

	filesOnce sync.Once
	files     *fileIndex
	filesErr  error

	lines lineCache

	statsMu sync.Mutex
	stats   Stats
}

// Stats says what indexing has cost so far. Indexes are built on first use,
// so zero durations mean "not needed yet".
type Stats struct {
	Symbols     int           // symbols indexed
	SymbolIndex time.Duration // reading and sorting the symbol table
	Units       int           // DWARF compilation units
	UnitIndex   time.Duration // DWARF setup: small sections, .debug_aranges, unit headers
	RangeIndex  time.Duration // CU address ranges from the DIEs, only when .debug_aranges does not answer
	FileIndex   time.Duration // scanning every unit's file table (first LineAddrs)
	Files       int           // distinct source paths in the line tables
	LineTables  int           // decoded line tables currently cached
	// BytesHeld approximates the memory the File retains: indexes, the
	// DWARF sections kept in memory and the cached line tables.
	BytesHeld int64
}

var errClosed = errors.New("debuginfo: file is closed")

// Open reads an ELF file lazily: opening only reads the ELF header and the
// section headers; the symbol table is indexed on the first symbol query and
// the DWARF line tables per compilation unit on the first line query that
// needs that unit.
func Open(path string) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open kernel ELF: %w", err)
	}
	f, err := OpenFile(osf)
	if err != nil {
		osf.Close()
		return nil, err
	}
	return f, nil
}

// OpenFile is Open for a descriptor the caller already opened, so that the
// caller can vet the path with its own policy first. On success the File owns
// osf and closes it in Close; on error the caller still owns it.
func OpenFile(osf *os.File) (*File, error) {
	name := filepath.Base(osf.Name())
	ef, err := elf.NewFile(osf)
	if err != nil {
		return nil, fmt.Errorf("%s is not a readable ELF file (%v): pass the kernel ELF with symbols (vmlinux), not a raw Image or .bin", name, err)
	}
	f := &File{name: name, osf: osf, elf: ef}
	f.lines.init(lineCacheBytes)
	return f, nil
}

// Close releases the file descriptor. Later queries fail.
func (f *File) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	return f.osf.Close()
}

// Machine is the ELF machine; a RISC-V kernel is elf.EM_RISCV, and callers
// should refuse others because their addresses mean nothing to this guest.
func (f *File) Machine() elf.Machine { return f.elf.Machine }

// Loaded says whether the n bytes at addr lie within one loadable segment
// of the ELF as loaded (its .bss included): the kernel image's code and
// data, mapped at the same place for the kernel's whole life (unlike the
// heap, vmalloc areas or modules).
func (f *File) Loaded(addr uint64, n int) bool {
	for _, p := range f.elf.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr-p.Vaddr <= p.Memsz && uint64(n) <= p.Memsz-(addr-p.Vaddr) {
			return true
		}
	}
	return false
}

// Stats reports indexing costs so far.
func (f *File) Stats() Stats {
	f.statsMu.Lock()
	s := f.stats
	f.statsMu.Unlock()
	n, b := f.lines.usage()
	s.LineTables = n
	s.BytesHeld += b
	return s
}

// timed runs build and says how long it took, for the Stats of an index.
func timed(build func()) time.Duration {
	start := time.Now()
	build()
	return time.Since(start)
}

func (f *File) addStats(fn func(*Stats)) {
	f.statsMu.Lock()
	fn(&f.stats)
	f.statsMu.Unlock()
}
