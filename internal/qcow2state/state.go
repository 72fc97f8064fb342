package qcow2state

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// State is the RAM of one machine state saved in a qcow2 image, indexed
// page by page: a read costs one read of the file. It is safe for
// concurrent reads.
type State struct {
	f  *os.File // nil when made with New
	id fileID
	m  *clusterMap
	ix *index
}

// Block is a RAM block of the saved machine ("riscv_virt_board.ram").
type Block struct {
	Name   string
	Length uint64
}

// Open indexes the machine state tagged tag in the qcow2 image at path,
// which it keeps open (read-only) until Close.
func Open(path, tag string) (*State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	id, err := identify(f)
	if err == nil {
		var s *State
		if s, err = New(f, id.size, tag); err == nil {
			s.f, s.id = f, id
			return s, nil
		}
	}
	f.Close()
	return nil, fmt.Errorf("%s: %w", path, err)
}

// New indexes the machine state tagged tag in the qcow2 image r of size
// bytes.
func New(r io.ReaderAt, size int64, tag string) (*State, error) {
	h, err := readHeader(r, size)
	if err != nil {
		return nil, err
	}
	sn, err := findSnapshot(r, h, size, tag)
	if err != nil {
		return nil, err
	}
	m, err := newClusterMap(r, h, size, sn)
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", tag, err)
	}
	ix, err := parse(m)
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", tag, err)
	}
	return &State{m: m, ix: ix}, nil
}

// Close closes the image.
func (s *State) Close() error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// Blocks lists the saved machine's RAM blocks, in the stream's order.
func (s *State) Blocks() []Block {
	out := make([]Block, len(s.ix.blocks))
	for i, b := range s.ix.blocks {
		out[i] = Block{Name: b.name, Length: b.length}
	}
	return out
}

// Read reads len(p) bytes of RAM block name at offset off, as saved.
func (s *State) Read(name string, off uint64, p []byte) error {
	return s.ix.read(s.m, name, off, p)
}

// ReadPhysical reads len(p) bytes of guest-physical memory at pa, as
// saved, where regions (the machine's RAM in its physical address space,
// ParseFlatView) place the RAM blocks.
func (s *State) ReadPhysical(regions []Region, pa uint64, p []byte) error {
	for len(p) > 0 {
		r, ok := regionAt(regions, pa)
		if !ok {
			return fmt.Errorf("%w: physical address %#x is not RAM", ErrNoPage, pa)
		}
		b := s.blockOf(r.Name)
		if b == "" {
			return fmt.Errorf("%w: no RAM block holds memory region %q (at physical %#x)", ErrNoPage, r.Name, pa)
		}
		n := min(uint64(len(p)), r.Start+r.Size-pa)
		if err := s.Read(b, r.Offset+(pa-r.Start), p[:n]); err != nil {
			return err
		}
		p, pa = p[n:], pa+n
	}
	return nil
}

// blockOf is the RAM block of memory region mr: named after it, or, for a
// device's region, "<device path>/<region>".
func (s *State) blockOf(mr string) string {
	if _, ok := s.ix.byName[mr]; ok {
		return mr
	}
	found := ""
	for _, b := range s.ix.blocks {
		if n := len(b.name) - len(mr); n > 0 && b.name[n-1] == '/' && b.name[n:] == mr {
			if found != "" {
				return "" // two devices' regions of that name: which is it?
			}
			found = b.name
		}
	}
	return found
}

// fileID tells whether a path still names the file that was indexed.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func identify(f *os.File) (fileID, error) {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}, err
	}
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
	}
	return id, nil
}

func identifyPath(path string) (fileID, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileID{}, err
	}
	defer f.Close()
	return identify(f)
}

// Cache keeps up to a number of indexed states open, the least recently
// used closed first. A file that changed since it was indexed (or a new
// file at its path) is indexed again; a state that could not be indexed is
// remembered as such until its file changes.
type Cache struct {
	max int

	mu      sync.Mutex
	entries map[cacheKey]*cacheEntry
	tick    uint64
	closed  bool
}

// ErrClosed is a use of a closed cache.
var ErrClosed = errors.New("the cache of saved states is closed")

type cacheKey struct{ path, tag string }

type cacheEntry struct {
	st   *State
	err  error
	id   fileID
	used uint64
}

// NewCache is a cache of up to n states (at least 1).
func NewCache(n int) *Cache {
	return &Cache{max: max(n, 1), entries: map[cacheKey]*cacheEntry{}}
}

// Use runs f on the state tagged tag in the image at path, indexing it
// first if it is not cached. The state is the cache's: f must not keep it.
func (c *Cache) Use(path, tag string, f func(*State) error) error {
	id, err := identifyPath(path)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	k := cacheKey{path, tag}
	e := c.entries[k]
	if e != nil && e.id != id {
		c.drop(k, e)
		e = nil
	}
	if e == nil {
		e = &cacheEntry{id: id}
		e.st, e.err = Open(path, tag)
		if e.st != nil {
			e.id = e.st.id
		}
		c.evict()
		c.entries[k] = e
	}
	c.tick++
	e.used = c.tick
	if e.err != nil {
		return e.err
	}
	return f(e.st)
}

// evict makes room for one more entry.
func (c *Cache) evict() {
	for len(c.entries) >= c.max {
		var oldest cacheKey
		var oe *cacheEntry
		for k, e := range c.entries {
			if oe == nil || e.used < oe.used {
				oldest, oe = k, e
			}
		}
		c.drop(oldest, oe)
	}
}

func (c *Cache) drop(k cacheKey, e *cacheEntry) {
	if e.st != nil {
		e.st.Close()
	}
	delete(c.entries, k)
}

// Forget closes and drops the states cached of the image at path (its
// file was removed: the space is freed once no one holds it open).
func (c *Cache) Forget(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.entries {
		if k.path == path {
			c.drop(k, e)
		}
	}
}

// Close closes every cached state; the cache is not used again.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for k, e := range c.entries {
		c.drop(k, e)
	}
}
