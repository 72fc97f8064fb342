package serial

import "unicode/utf8"

// DefaultRingSize is how many of the most recent bytes of output a [Buffer]
// keeps in memory unless [WithRingSize] says otherwise.
const DefaultRingSize = 4 << 20

// ringStore is the in-memory part of a Buffer: the most recent size bytes
// written (the "ring"), addressed by absolute offsets. Buffer uses it only
// with Buffer.mu held.
//
// It is not a circular array: bytes are appended to a linear array with
// room for up to twice the ring, and when that is full the newest bytes
// (at most size) are copied to a fresh array. So a view of any range is one
// contiguous slice, and a stored byte is never modified in place (appends
// write only past every existing view, and compaction leaves the old array
// to whoever still looks at it). Views therefore stay valid and unchanged
// after Buffer.mu is released; waits scan them without the lock. Each
// compaction copies at most size bytes after at least size new bytes were
// appended, so the copying costs at most one extra copy per byte; memory
// use is up to about twice the ring size (plus arrays that scans still
// hold).
//
// The ring holds exactly the offsets [oldest, end): bytes still in the
// array but older than that count as evicted, so what the ring holds does
// not depend on the array's history.
type ringStore struct {
	size int    // ring size; 0 means DefaultRingSize
	base int64  // offset of data[0]
	data []byte // bytes [base, end)
}

func (s *ringStore) capacity() int {
	if s.size <= 0 {
		return DefaultRingSize
	}
	return s.size
}

// end returns the offset just past the last byte written.
func (s *ringStore) end() int64 { return s.base + int64(len(s.data)) }

// oldest returns the offset of the oldest byte in the ring.
func (s *ringStore) oldest() int64 {
	return max(s.base, s.end()-int64(s.capacity()))
}

// append adds p at the end, evicting the oldest bytes beyond the ring
// size.
func (s *ringStore) append(p []byte) {
	size := s.capacity()
	if len(p) >= size {
		// Only p's last size bytes stay; a fresh array keeps old views
		// intact.
		end := s.end() + int64(len(p))
		d := make([]byte, size, 2*size)
		copy(d, p[len(p)-size:])
		s.data, s.base = d, end-int64(size)
		return
	}
	if need := len(s.data) + len(p); need > cap(s.data) {
		keep := min(len(s.data), size-len(p))
		// Grow by doubling while the ring fills (a buffer that never sees
		// much output never allocates much), up to twice the ring.
		c := min(max(2*cap(s.data), keep+len(p), 4096), 2*size)
		d := make([]byte, keep, c)
		copy(d, s.data[len(s.data)-keep:])
		s.base += int64(len(s.data) - keep)
		s.data = d
	}
	s.data = append(s.data, p...)
}

// view returns the bytes [from, to), which must lie within [base, end),
// without copying. The result must not be modified; it stays valid after
// Buffer.mu is released (see ringStore).
func (s *ringStore) view(from, to int64) []byte {
	return s.data[from-s.base : to-s.base : to-s.base]
}

// runeAligned returns the first offset q in [off, min(off+3, end)] at
// which Go's regexp, decoding from any earlier rune boundary, starts a
// rune: a byte that is not a UTF-8 continuation byte, or one preceded by
// utf8.UTFMax-1 continuation bytes (see runeStart). Waits move the start
// of their window to such a point when the ring evicts it, so the bytes
// after it decode as before. off must be in [oldest, end].
func (s *ringStore) runeAligned(off int64) int64 {
	v := s.view(off, min(off+utf8.UTFMax-1, s.end()))
	for i, c := range v {
		if utf8.RuneStart(c) {
			return off + int64(i)
		}
	}
	return off + int64(len(v))
}
