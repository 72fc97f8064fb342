package serial

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"
)

// ErrFinished is returned by [Buffer.Write] once [Buffer.Finish] has been
// called: a finished buffer takes no more data.
var ErrFinished = errors.New("serial: buffer finished")

// errNilRegexp is returned by [Buffer.Wait] when called without a pattern.
var errNilRegexp = errors.New("serial: wait: nil regexp")

// Buffer is an append-only log of console output addressed by absolute byte
// offsets ("cursors") counted from 0. Reading never consumes anything: any
// number of readers can look at any range, and [Buffer.Wait] blocks until a
// regular expression matches in the data from a given offset on, woken by
// new data rather than by polling.
//
// The zero value is an empty, usable buffer. All methods are safe for
// concurrent use.
type Buffer struct {
	mu       sync.Mutex
	st       memStore
	finished bool
	// changed is closed (and set to nil) by every Write and by Finish, which
	// broadcasts to all waiters. It is created lazily by the first waiter
	// that needs it, so writes nobody waits for allocate nothing.
	changed chan struct{}
}

// NewBuffer returns an empty buffer.
func NewBuffer() *Buffer { return &Buffer{} }

// Write appends p (copied) to the buffer and wakes every waiter. It always
// writes all of p and returns len(p), nil, unless the buffer is finished, in
// which case it writes nothing and returns [ErrFinished]. Write makes Buffer
// an [io.Writer].
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.finished {
		return 0, ErrFinished
	}
	if len(p) == 0 {
		return 0, nil
	}
	b.st.append(p)
	b.broadcastLocked()
	return len(p), nil
}

// End returns the total number of bytes written so far, which is the
// offset the next byte will get.
func (b *Buffer) End() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.end()
}

// Read returns a copy of the bytes [since, min(End, since+max)) and the
// offset just past them, to be passed as since to the next Read. A since
// beyond End is clamped to End (giving no data), a negative since to 0;
// max <= 0 means no limit. Read never consumes data.
func (b *Buffer) Read(since int64, max int) (data []byte, next int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	since = b.clampLocked(since)
	end := b.st.end()
	if max > 0 && end-since > int64(max) {
		end = since + int64(max)
	}
	return append([]byte(nil), b.st.view(since, end)...), end
}

// Finish records that no more data will come: later Writes fail with
// [ErrFinished], and pending and future Waits that find no match return with
// Match.Finished set instead of waiting. Finish is idempotent.
func (b *Buffer) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.finished {
		b.finished = true
		b.broadcastLocked()
	}
}

// Finished reports whether [Buffer.Finish] has been called.
func (b *Buffer) Finished() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.finished
}

// Match is the result of [Buffer.Wait].
//
// Exactly one of Matched, TimedOut and Finished is set. When Matched is
// false, Output holds everything from Since to the end of the data at the
// time Wait gave up and Cursor is that end.
type Match struct {
	// Since is the offset the search started at (the requested since,
	// clamped to [0, End]). Output starts there.
	Since int64
	// Output is a copy of the bytes from Since up to and including the end
	// of the match (or up to the end of the data, without a match).
	Output []byte
	// Cursor is the offset just past Output: pass it as since to the next
	// Wait or Read to continue after the match.
	Cursor int64
	// Matched reports that the pattern matched.
	Matched bool
	// TimedOut reports that the timeout passed without a match.
	TimedOut bool
	// Finished reports that the buffer was finished (no more data can
	// come) without a match.
	Finished bool
	// Start and End are the absolute offsets of the match [Start, End);
	// they are meaningful only when Matched is set.
	Start, End int64
	// Groups holds the text of the pattern's capture groups 1..n (the whole
	// match is not included; it is Output[Start-Since:]). A group that did
	// not take part in the match is "". Nil when not Matched.
	Groups []string
}

// Wait waits until re matches in the data starting at offset since and
// returns the match; see [Match] for the fields. The search is leftmost-first
// (or leftmost-longest if re.Longest was called) over the bytes received so
// far, re-run when new data arrives, so the first match found is returned
// even if later data would have matched differently (for example `ab*`
// returns as soon as the "a" is there, and `$` or `\z` match at the current
// end of the data).
//
// Wait gives up after timeout, which is a normal result (Match.TimedOut),
// as is the buffer being finished without a match (Match.Finished). A
// timeout <= 0 checks once, without waiting. Cancellation of ctx is an
// error: Wait then returns an error wrapping ctx.Err(). A nil re is an
// error.
//
// Waiting costs nothing while no data arrives: a Write wakes all waiters,
// which each rescan once for however much data arrived since their last
// scan. Where the pattern allows it (no ^, \A or \b, and a bounded match
// length, no way to match a newline, or a literal prefix), the rescan starts
// from a safe point near the new data instead of at since, so a long flood
// costs time linear in its size; otherwise (or while a literal prefix seen
// early has not yet led to a match) the rescan starts at since, and only
// the coalescing of wake-ups bounds the work.
func (b *Buffer) Wait(ctx context.Context, since int64, re *regexp.Regexp, timeout time.Duration) (Match, error) {
	if re == nil {
		return Match{}, errNilRegexp
	}
	if err := ctx.Err(); err != nil {
		return Match{}, fmt.Errorf("serial: wait: %w", err)
	}
	final := timeout <= 0
	var expired <-chan time.Time
	if !final {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}

	m := newMatcher(re)
	b.mu.Lock()
	since = b.clampLocked(since)
	b.mu.Unlock()
	for {
		b.mu.Lock()
		end := b.st.end()
		// The view is stable after unlocking: stored bytes are never
		// modified in place (see memStore.view), so the scan runs without
		// holding up writers.
		window := b.st.view(since, end)
		finished := b.finished
		var changed chan struct{}
		if !finished && !final {
			if b.changed == nil {
				b.changed = make(chan struct{})
			}
			changed = b.changed
		}
		b.mu.Unlock()

		if loc := m.find(window); loc != nil {
			return matched(since, window, loc), nil
		}
		if finished || final {
			return Match{
				Since:    since,
				Output:   append([]byte(nil), window...),
				Cursor:   end,
				TimedOut: !finished,
				Finished: finished,
			}, nil
		}
		select {
		case <-changed:
		case <-expired:
			// One last look at whatever arrived meanwhile.
			final = true
		case <-ctx.Done():
			return Match{}, fmt.Errorf("serial: wait: %w", ctx.Err())
		}
	}
}

// matched builds the Match for a submatch index slice loc relative to
// window, which starts at absolute offset since.
func matched(since int64, window []byte, loc []int) Match {
	res := Match{
		Since:   since,
		Output:  append([]byte(nil), window[:loc[1]]...),
		Cursor:  since + int64(loc[1]),
		Matched: true,
		Start:   since + int64(loc[0]),
		End:     since + int64(loc[1]),
		Groups:  make([]string, len(loc)/2-1),
	}
	for i := range res.Groups {
		if s, e := loc[2*i+2], loc[2*i+3]; s >= 0 {
			res.Groups[i] = string(window[s:e])
		}
	}
	return res
}

// clampLocked clamps an offset to [0, End]. b.mu must be held.
func (b *Buffer) clampLocked(off int64) int64 {
	// With a bounded store this would clamp to the oldest retained offset.
	return min(max(off, 0), b.st.end())
}

// broadcastLocked wakes all current waiters. b.mu must be held.
func (b *Buffer) broadcastLocked() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// memStore is the storage behind a Buffer: every byte ever written, in
// memory. It is the seam where a bounded store (a ring of recent output plus
// an on-disk transcript) will go; Buffer uses only these methods, always with
// Buffer.mu held.
type memStore struct {
	data []byte
}

// append adds p at the end. It grows the array by doubling rather than by
// append's gentler factor for large slices, which halves the copying for a
// long flood.
func (s *memStore) append(p []byte) {
	if need := len(s.data) + len(p); need > cap(s.data) {
		grown := make([]byte, len(s.data), max(need, 2*cap(s.data), 4096))
		copy(grown, s.data)
		s.data = grown
	}
	s.data = append(s.data, p...)
}

// end returns the offset just past the last byte stored.
func (s *memStore) end() int64 { return int64(len(s.data)) }

// view returns the bytes [from, to), which must lie within the stored
// range, without copying. The result must not be modified. Because memStore
// never changes a stored byte (append may move data to a new array but
// leaves the old one intact), the view stays valid and unchanged after
// Buffer.mu is released; Wait relies on that to scan without the lock. A
// store that overwrites old data must keep that promise differently (for
// example by returning a copy).
func (s *memStore) view(from, to int64) []byte {
	return s.data[from:to:to]
}
