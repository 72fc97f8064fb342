package serial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
// number of readers can look at any range, and waits ([Buffer.WaitFor],
// [Buffer.Wait]) block until a regular expression matches in the data from
// a given offset on, woken by new data rather than by polling.
//
// Memory is bounded: the buffer keeps the most recent bytes (the ring,
// [DefaultRingSize] unless [WithRingSize] says otherwise) in memory. With a
// transcript ([WithTranscript]) every byte is also appended to a file whose
// byte offsets are the cursors, and reads of bytes that have left the ring
// are served from it, so nothing is lost. Without one (or once writing it
// failed), bytes older than the ring are gone; [Buffer.ReadPage] reports
// that. Waits only ever look at the ring.
//
// The zero value is an empty, usable buffer with the default ring and no
// transcript. All methods are safe for concurrent use.
type Buffer struct {
	// wmu serialises the writer side (Write, Flush, Finish, Close), and is
	// held across transcript writes so that mu is not.
	wmu sync.Mutex

	mu        sync.Mutex
	st        ringStore
	finished  bool
	lastWrite time.Time // when data last arrived (zero: never)
	// watches are the waits that sleep: a Write wakes only those whose
	// filter says the new bytes may end their wait (see watch), and Finish
	// wakes all. Writes nobody waits for cost nothing.
	watches map[*watch]struct{}

	tr     *transcript // nil without a transcript; set before first use
	closed bool        // Close has run (guarded by wmu)
	log    *slog.Logger
}

// NewBuffer returns an empty buffer with the default ring size and no
// transcript.
func NewBuffer() *Buffer { return &Buffer{} }

// OpenBuffer returns an empty buffer configured by opts: [WithRingSize],
// [WithTranscript] and [WithLogger] apply, other options are ignored. With
// a transcript it creates the file (see [WithTranscript]); call
// [Buffer.Close] when done with the buffer to release it.
func OpenBuffer(opts ...Option) (*Buffer, error) {
	cfg := newConfig(opts)
	return openBuffer(&cfg)
}

func openBuffer(cfg *config) (*Buffer, error) {
	b := &Buffer{st: ringStore{size: cfg.ringSize}, log: cfg.logger}
	if cfg.transcript != "" {
		tr, err := createTranscript(cfg.transcript)
		if err != nil {
			return nil, err
		}
		b.tr = tr
	}
	return b, nil
}

func (b *Buffer) logger() *slog.Logger {
	if b.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.log
}

// Write appends p (copied) to the buffer and wakes every waiter. It always
// writes all of p and returns len(p), nil, unless the buffer is finished, in
// which case it writes nothing and returns [ErrFinished]. Write makes Buffer
// an [io.Writer].
//
// With a transcript, Write appends to the file whatever has piled up once
// that reaches 64 KiB (or the ring size, if smaller), and always before the
// ring would evict a byte that is not in the file yet; [Buffer.Flush]
// writes the rest. A failing transcript write is logged and breaks the
// transcript (see [Buffer.TranscriptErr]); Write itself still succeeds.
func (b *Buffer) Write(p []byte) (int, error) {
	if _, ok := b.write(p); !ok {
		return 0, ErrFinished
	}
	return len(p), nil
}

// write is Write: ok is false if the buffer is finished; woke reports
// that the write woke a wait.
func (b *Buffer) write(p []byte) (woke, ok bool) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	if b.finished {
		b.mu.Unlock()
		return false, false
	}
	if len(p) == 0 {
		b.mu.Unlock()
		return false, true
	}
	if tr := b.tr; tr != nil && tr.err != nil && !time.Now().Before(tr.retryAt) {
		b.mu.Unlock()
		b.retryLocked()
		b.mu.Lock()
	}
	var pending []byte
	flush := false
	if tr := b.tr; tr != nil && tr.err == nil {
		end := b.st.end()
		threshold := min(transcriptChunk, b.st.capacity())
		if flush = end-tr.written+int64(len(p)) >= int64(threshold); flush {
			// [written, end) is still in the ring: everything older left
			// it only after being written (below).
			pending = b.st.view(tr.written, end)
		}
	}
	b.mu.Unlock()

	var n int
	var err error
	if flush {
		// Without b.mu: readers and waiters go on meanwhile. pending stays
		// valid (see ringStore); only this writer could change the ring.
		n, err = b.tr.write(pending, p)
	}

	b.mu.Lock()
	if flush {
		b.tr.written += int64(n)
		b.tr.size += int64(n)
		if err != nil {
			b.breakTranscriptLocked(err)
		}
	}
	b.st.append(p)
	b.lastWrite = time.Now()
	woke = b.wakeLocked(len(p))
	b.mu.Unlock()
	return woke, true
}

// Flush appends to the transcript what has been written to the buffer but
// not to the file yet, so a reader of the file sees everything. The console
// calls it shortly after its drain finds the pipe empty, and Finish and
// Close call it. Without a transcript it does nothing; once the transcript is
// broken it returns the error that broke it.
func (b *Buffer) Flush() error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	return b.flushLocked()
}

// flushLocked is Flush with b.wmu held.
func (b *Buffer) flushLocked() error {
	tr := b.tr
	if tr == nil || b.closed {
		return nil
	}
	b.mu.Lock()
	if err := tr.err; err != nil {
		b.mu.Unlock()
		if !b.retryLocked() {
			return b.TranscriptErr()
		}
		return nil
	}
	b.mu.Unlock()
	if err := b.writePending(); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.breakTranscriptLocked(err)
		return tr.err
	}
	return nil
}

// writePending appends to the transcript what the ring holds past the
// file's end. b.wmu must be held, b.mu not: the ring cannot change
// meanwhile, and readers go on.
func (b *Buffer) writePending() error {
	tr := b.tr
	b.mu.Lock()
	pending := b.st.view(tr.written, b.st.end())
	b.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	n, err := tr.write(pending, nil)
	b.mu.Lock()
	tr.written += int64(n)
	tr.size += int64(n)
	b.mu.Unlock()
	return err
}

// breakTranscriptLocked records a transcript write error: the file keeps
// the bytes before the cursor where it stopped, the ring keeps the output
// from there on, and writing is tried again every transcriptRetry (see
// retryLocked). b.mu must be held.
func (b *Buffer) breakTranscriptLocked(err error) {
	tr := b.tr
	tr.retryAt = time.Now().Add(transcriptRetry)
	if tr.err != nil {
		return // still stopped: said when it stopped
	}
	tr.err = fmt.Errorf("serial: transcript %s stopped at cursor %d: %w; output from there on is kept in memory (the last %d bytes) and written when the file can be written again", tr.path, tr.written, err, b.st.capacity())
	tr.stoppedAt = tr.written
	tr.events++
	b.logger().Error("serial: transcript write failed; output is kept in memory until it can be written",
		"path", tr.path, "cursor", tr.written, "err", err)
}

// retryLocked writes a stopped transcript again once its retry time has
// come: first, if output left the ring meanwhile, a marker line for that
// gap, then everything the ring holds that the file lacks. It reports
// whether the transcript is writing again. b.wmu must be held, b.mu not:
// the ring cannot change meanwhile.
func (b *Buffer) retryLocked() bool {
	tr := b.tr
	b.mu.Lock()
	if tr.err == nil {
		b.mu.Unlock()
		return true
	}
	if time.Now().Before(tr.retryAt) {
		b.mu.Unlock()
		return false
	}
	tr.retryAt = time.Now().Add(transcriptRetry)
	from, oldest, cause := tr.written, b.st.oldest(), errors.Unwrap(tr.err)
	b.mu.Unlock()
	if from < oldest {
		marker := fmt.Sprintf("\r\n[qemu-mcp: transcript gap: %d bytes of console output (cursors %d to %d) are lost: the transcript could not be written (%v) and the in-memory ring no longer held them]\r\n", oldest-from, from, oldest, cause)
		n, err := tr.write([]byte(marker), nil)
		b.mu.Lock()
		tr.size += int64(n)
		if err != nil {
			b.mu.Unlock()
			return false
		}
		tr.gaps = append(tr.gaps, Gap{From: from, To: oldest})
		tr.segs = append(tr.segs, seg{cursor: oldest, file: tr.size})
		tr.written = oldest
		b.mu.Unlock()
	}
	err := b.writePending()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		return false
	}
	b.logger().Warn("serial: transcript writing again", "path", tr.path, "stopped_at", tr.stoppedAt, "cursor", tr.written, "lost", tr.lostLocked())
	tr.err = nil
	tr.events++
	return true
}

// lostLocked is how many bytes the gaps hold.
func (t *transcript) lostLocked() int64 {
	var n int64
	for _, g := range t.gaps {
		n += g.To - g.From
	}
	return n
}

// TranscriptStatus is the transcript's health: whether it is stopped by a
// write error, since where, and what it has lost for good.
type TranscriptStatus struct {
	Path string
	// Err is the write error the transcript is stopped by, nil while it
	// writes; StoppedAt the cursor where it stopped.
	Err       error
	StoppedAt int64
	// Gaps are the cursor ranges it lacks for good (marked in it), Lost
	// their total.
	Gaps []Gap
	Lost int64
	// Events counts stops and resumptions: a reader that saw another
	// count has news.
	Events int
}

// TranscriptStatus returns the transcript's health; the zero value without
// a transcript.
func (b *Buffer) TranscriptStatus() TranscriptStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	tr := b.tr
	if tr == nil {
		return TranscriptStatus{}
	}
	return TranscriptStatus{Path: tr.path, Err: tr.err, StoppedAt: tr.stoppedAt, Gaps: append([]Gap(nil), tr.gaps...), Lost: tr.lostLocked(), Events: tr.events}
}

// transcriptStopped tells the drain to keep retrying while the guest is
// quiet.
func (b *Buffer) transcriptStopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tr != nil && b.tr.err != nil
}

// TranscriptPath returns the transcript file's path, or "" without one.
func (b *Buffer) TranscriptPath() string {
	if b.tr == nil {
		return ""
	}
	return b.tr.path
}

// TranscriptErr returns the error that broke the transcript, if writing it
// failed: from then on the file holds only the bytes before the failure,
// and output is kept in the ring only. It returns nil if all is well or
// there is no transcript.
func (b *Buffer) TranscriptErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tr == nil {
		return nil
	}
	return b.tr.err
}

// End returns the total number of bytes written so far, which is the
// offset the next byte will get.
func (b *Buffer) End() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.end()
}

// Oldest returns the offset of the oldest byte still in memory (the ring).
// Waits only see bytes from there on; older ones can only be read, and only
// from the transcript.
func (b *Buffer) Oldest() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.oldest()
}

// Page is the result of [Buffer.ReadPage]: the bytes [Start, Next), exactly
// as the guest printed them.
type Page struct {
	// Data is a copy of the bytes [Start, Next).
	Data []byte
	// Start is the cursor of Data[0]. It is the requested since (clamped
	// to [0, End]) unless bytes were lost, and then the first byte after
	// the loss.
	Start int64
	// Next is the cursor just past Data: pass it as since to the next
	// read.
	Next int64
	// Lost is how many bytes from since on are gone (evicted from the ring
	// with no transcript holding them) and skipped: Start - since.
	Lost int64
}

// ReadPage returns up to max bytes (max <= 0: no limit) from since on: the
// bytes [Start, Next), with Next <= End. Bytes still in the ring come from
// memory, older ones from the transcript (a pread at the same offset), so
// a page is byte-exact whichever served it. A since beyond End is clamped
// to End (giving no data), a negative since to 0. ReadPage never consumes
// data.
//
// If bytes from since on are lost (no transcript, or it broke before
// they were written), the page starts at the first byte still held, and
// Lost says how many were skipped; a page never spans a gap, so it can end
// early, just before one (the next read then reports it). An error reading
// the transcript is returned with the part of the page read before it.
func (b *Buffer) ReadPage(since int64, max int) (Page, error) {
	return b.readPage(since, max, math.MaxInt64, false)
}

// Read returns a copy of the bytes [next-len(data), next), starting at since
// and ending at min(End, since+max); max <= 0 means no limit. A since beyond
// End is clamped to End (giving no data), a negative since to 0. Read never
// consumes data. Bytes that left the ring come from the transcript, so the
// result is exact. Should bytes from since on be lost (see
// [Buffer.ReadPage], which reports it), data starts at the first byte
// still held, and data can end early before a later gap; a failing
// transcript read is logged and treated as such a loss. So data always
// holds the bytes [next-len(data), next) as the guest printed them.
func (b *Buffer) Read(since int64, max int) (data []byte, next int64) {
	p, _ := b.readPage(since, max, math.MaxInt64, true)
	return p.Data, p.Next
}

// readPage implements ReadPage. The page ends at or before hardEnd. With
// skipErrors, a transcript read error counts as a loss of those bytes.
func (b *Buffer) readPage(since int64, max int, hardEnd int64, skipErrors bool) (Page, error) {
	since = min(since, hardEnd)
	b.mu.Lock()
	since = b.clampLocked(since)
	b.mu.Unlock()
	limitFrom := func(start, end int64) int64 {
		l := min(end, hardEnd)
		if max > 0 && l-start > int64(max) {
			l = start + int64(max)
		}
		return l
	}
	page := Page{Start: since, Next: since}
	cur := since
	limit := int64(-1) // set once the start is known
	for {
		b.mu.Lock()
		end, oldest := b.st.end(), b.st.oldest()
		if limit < 0 {
			limit = limitFrom(cur, end)
		}
		if cur >= limit {
			b.mu.Unlock()
			page.Next = cur
			return page, nil
		}
		if cur >= oldest {
			page.Data = append(page.Data, b.st.view(cur, limit)...)
			b.mu.Unlock()
			page.Next = limit
			return page, nil
		}
		var inFile int64 // bytes [0, inFile) are in the transcript, but gaps
		var off int64    // cur's offset in the file
		var gap Gap
		inGap, gapAfter := false, false
		if b.tr != nil {
			inFile = b.tr.written
			gap, inGap, gapAfter = b.tr.gapAt(cur)
			if !inGap {
				off = b.tr.fileOffset(cur)
			}
		}
		b.mu.Unlock()

		if cur < inFile && inGap {
			// Lost for good while the transcript could not be written.
			if len(page.Data) > 0 {
				page.Next = cur
				return page, nil
			}
			page.Lost += gap.To - cur
			cur = gap.To
			page.Start = cur
			limit = limitFrom(cur, end)
			continue
		}
		if cur < inFile {
			to := min(limit, inFile)
			if gapAfter {
				to = min(to, gap.From)
			}
			n := len(page.Data)
			page.Data = append(page.Data, make([]byte, to-cur)...)
			err := b.tr.readAt(page.Data[n:], off)
			if err == nil {
				cur = to
				continue
			}
			page.Data = page.Data[:n]
			if !skipErrors {
				page.Next = cur
				return page, err
			}
			b.logger().Warn("serial: reading the transcript failed; treating those bytes as lost", "err", err)
			inFile = cur // and fall through to the loss below
		}
		// Bytes [cur, oldest) are lost; so, if the transcript read failed,
		// are the readable ones before them.
		if len(page.Data) > 0 {
			page.Next = cur
			return page, nil
		}
		page.Lost += oldest - cur
		cur = oldest
		page.Start = cur
		limit = limitFrom(cur, end)
	}
}

// Finish records that no more data will come: later Writes fail with
// [ErrFinished], and pending and future waits that find no match return
// with Finished set instead of waiting. It flushes the transcript first.
// Finish is idempotent.
func (b *Buffer) Finish() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.finishLocked()
}

func (b *Buffer) finishLocked() {
	if b.tr != nil {
		// One more try, whenever the last one was: nothing more comes.
		b.mu.Lock()
		b.tr.retryAt = time.Time{}
		b.mu.Unlock()
	}
	_ = b.flushLocked() // a failure was logged and stops the transcript
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.finished {
		b.finished = true
		for w := range b.watches {
			w.notify()
		}
	}
}

// Close finishes the buffer (see [Buffer.Finish]) and closes the
// transcript file. The buffer stays readable, transcript included: reads
// of bytes that left the ring open the file again for the read (and fail
// if the path no longer names the same file). Close never removes the
// transcript. It is idempotent.
func (b *Buffer) Close() error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.finishLocked()
	if b.closed {
		return nil
	}
	b.closed = true
	if b.tr == nil {
		return nil
	}
	return b.tr.release()
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
	// Since is the offset Output starts at: the requested since, clamped to
	// [0, End], unless output from there on was lost (see
	// [Buffer.ReadPage]), and then the first byte still held.
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
// returns the match; see [Match] for the fields. It is [Buffer.WaitFor]
// with the one pattern, no panic detection, and the whole output from
// since (read back from the transcript for bytes that left the ring).
//
// The search is leftmost-first (or leftmost-longest if re.Longest was
// called) over the bytes received so far, re-run when new data arrives, so
// the first match found is returned even if later data would have matched
// differently (for example `ab*` returns as soon as the "a" is there, and
// `$` or `\z` match at the current end of the data). Only bytes in the ring
// are searched (see [Buffer.WaitFor]).
//
// Wait gives up after timeout, which is a normal result (Match.TimedOut),
// as is the buffer being finished without a match (Match.Finished). A
// timeout <= 0 checks once, without waiting. Cancellation of ctx is an
// error: Wait then returns an error wrapping ctx.Err(). A nil re is an
// error.
func (b *Buffer) Wait(ctx context.Context, since int64, re *regexp.Regexp, timeout time.Duration) (Match, error) {
	if re == nil {
		return Match{}, errNilRegexp
	}
	if timeout <= 0 {
		timeout = -1 // WaitFor's "look once"
	}
	r, err := b.WaitFor(ctx, since, Spec{
		Patterns: []*regexp.Regexp{re},
		Panic:    []*regexp.Regexp{},
		Timeout:  timeout,
	})
	if err != nil {
		return Match{}, err
	}
	m := Match{
		Since:    r.OutputStart,
		Output:   r.Output,
		Cursor:   r.Cursor,
		Matched:  r.Matched,
		TimedOut: r.TimedOut,
		Finished: r.Finished,
	}
	if r.Matched {
		m.Start, m.End, m.Groups = r.Start, r.End, r.Groups
	}
	return m, nil
}

// clampLocked clamps an offset to [0, End]. b.mu must be held.
func (b *Buffer) clampLocked(off int64) int64 {
	return min(max(off, 0), b.st.end())
}

// watch is a sleeping wait's wake-up. QEMU's UART writes the console a
// byte at a time, so waking every wait for every byte would cost a
// goroutine switch per byte, mostly for nothing: a wait for "\r\ntiny> $"
// can only end once a ' ' arrived. So each sleeping wait leaves a filter
// that the writer runs on the new bytes (under b.mu, in the writer's
// goroutine) and is woken only when the filter says its wait may end, or
// its state may change (see waiter.filter). The filter may err only
// towards waking.
type watch struct {
	wake chan struct{} // capacity 1: a wake-up pending
	// filter reports whether the n bytes just written, the end of recent
	// (which holds up to watchTail bytes more before them, when the ring
	// has them), may end the wait; end is the offset just past recent.
	// Nil means always.
	filter func(recent []byte, end int64, n int) bool
}

// watchTail is how many bytes before a write its filters see: a literal
// that the write completes starts at most this far back.
const watchTail = 256

func (w *watch) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// sleepLocked registers (or updates) w with filter. b.mu must be held.
func (b *Buffer) sleepLocked(w *watch, filter func([]byte, int64, int) bool) {
	if b.watches == nil {
		b.watches = map[*watch]struct{}{}
	}
	w.filter = filter
	b.watches[w] = struct{}{}
}

// sleeping reports whether a wait sleeps on b (for tests).
func (b *Buffer) sleeping() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watches) > 0
}

// forget removes w.
func (b *Buffer) forget(w *watch) {
	b.mu.Lock()
	delete(b.watches, w)
	b.mu.Unlock()
}

// wakeLocked wakes the waits the n bytes just appended may end. b.mu must
// be held.
func (b *Buffer) wakeLocked(n int) (woke bool) {
	if len(b.watches) == 0 {
		return false
	}
	end := b.st.end()
	recent := b.st.view(max(b.st.oldest(), end-int64(n)-watchTail), end)
	for w := range b.watches {
		if w.filter == nil || w.filter(recent, end, n) {
			w.notify()
			woke = true
		}
	}
	return woke
}
