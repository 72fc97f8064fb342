package serial

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"
	"unicode/utf8"
)

// defaultPanics are the patterns behind DefaultPanicPatterns. Every one
// has a literal prefix and cannot match across a line, so waits rescan only
// new data for them (see matcher).
// They are compiled on first use, off the server's start-up.
var defaultPanics = sync.OnceValue(func() []*regexp.Regexp {
	return []*regexp.Regexp{
		// Linux, and the tiny test kernel ("Kernel panic - not syncing:
		// requested by user").
		regexp.MustCompile(`Kernel panic - not syncing[^\r\n]*`),
		// Linux oopses: "Oops - illegal instruction [#1]" and "Oops [#1]"
		// (riscv die()), "Oops: 0000 [#1] SMP" (x86), "Internal error: Oops:
		// 96000004 [#1]" (arm64).
		regexp.MustCompile(`Oops[ :-][^\r\n]*\[#\d+\]`),
		// OpenSBI's fatal trap report (sbi_trap_error): "sbi_trap_error:
		// hart0: trap handler failed (error -2)", then the mcause/mepc dump.
		regexp.MustCompile(`sbi_trap_error: hart\d+: [^\r\n]*`),
		// U-Boot on RISC-V: "Unhandled exception: Illegal instruction" or
		// "Unhandled exception code: 16", then the EPC/RA/TVAL dump and the
		// line below.
		regexp.MustCompile(`Unhandled exception(?: code)?: [^\r\n]*`),
		// U-Boot's panic() on any architecture, also printed after the
		// exception dump above.
		regexp.MustCompile(`### ERROR ### Please RESET the board ###`),
		// U-Boot on ARM64: `"Synchronous Abort" handler, esr 0x96000004`.
		regexp.MustCompile(`"Synchronous Abort" handler[^\r\n]*`),
	}
})

// DefaultPanicPatterns returns (a new slice of) the patterns a wait watches
// for when [Spec].Panic is nil: what Linux, OpenSBI and U-Boot print when
// the guest dies of a fatal fault.
//
//   - Linux: "Kernel panic - not syncing..." (also the tiny test kernel's
//     "panic" command) and oopses ("Oops - illegal instruction [#1]",
//     "Oops [#1]", "Oops: 0000 [#1]", "Internal error: Oops: ... [#1]").
//   - OpenSBI: "sbi_trap_error: hartN: ..." (an M-mode trap it cannot
//     handle; a register dump follows).
//   - U-Boot: "Unhandled exception: <cause>" / "Unhandled exception code:
//     N" (RISC-V), "### ERROR ### Please RESET the board ###" (panic), and
//     "\"Synchronous Abort\" handler, esr ..." (ARM64).
//
// The firmware strings were checked against Debian's OpenSBI
// (opensbi-riscv64-generic-fw_dynamic.bin) and U-Boot
// (qemu-riscv64_smode/u-boot.bin) binaries. Patterns that take the rest of
// the line match what has arrived of it when the wait looks.
func DefaultPanicPatterns() []*regexp.Regexp {
	return append([]*regexp.Regexp(nil), defaultPanics()...)
}

// Spec says what [Buffer.WaitFor] waits for. A wait ends at the first of:
// a pattern or panic pattern matching (Matched, Panicked), the buffer
// being finished (Finished), the console being quiet for Idle (Idle), the
// timeout (TimedOut), and ctx being done (an error).
type Spec struct {
	// Patterns are the regular expressions to wait for; any one of them
	// ends the wait. If several match, the match that starts first wins,
	// and of matches starting at the same byte the lower index. Matches
	// are found as the data arrives: among the patterns that match in the
	// data seen when the wait first finds any match, that rule picks one
	// (a pattern that would match earlier only with more data does not
	// win). May be empty: the wait then ends only otherwise.
	Patterns []*regexp.Regexp
	// Panic are patterns that end the wait early with Panicked set: the
	// guest crashed. Nil means [DefaultPanicPatterns]; an empty non-nil
	// slice disables panic detection. A panic match competes with
	// Patterns by the same rule, and Patterns win ties, so waiting for
	// "Kernel panic" itself reports Matched. Once a panic pattern matches,
	// the wait gives the rest of that line up to half a second to arrive
	// (it ends as soon as a newline follows the match, or the output
	// ends), then matches that pattern again from the same start, so a
	// pattern ending in [^\r\n]* reports the whole line.
	Panic []*regexp.Regexp
	// Idle, if > 0, ends the wait with Idle set once no new output has
	// arrived for Idle, counted from the later of the start of the wait and
	// the arrival of the last byte (any byte, also before since). A quiet
	// console thus returns after Idle; one that keeps printing returns Idle
	// after it stops.
	Idle time.Duration
	// Timeout, if > 0, ends the wait with TimedOut set after that long. 0
	// means no time limit (ctx, a match, Idle or the end of the output end
	// the wait). < 0 means look once at the data that is there and return
	// at once (TimedOut if nothing matched and the buffer is not finished).
	// Just before giving up, the wait has one last look at the data.
	Timeout time.Duration
	// MaxOutput, if > 0, limits Result.Output to the last MaxOutput bytes
	// before Result.Cursor, but never cuts into the match. 0 means all of
	// it from since, read back from the transcript if it left the ring.
	MaxOutput int
	// Head, with MaxOutput, keeps up to Head of those bytes from the start
	// (since) instead of the end, in Result.Head: the output is then a
	// head and a tail, and the bytes between them are elided.
	Head int
	// Echo, if not empty, is the line just typed: when the output from
	// since starts with these exact bytes (the guest echoing what it was
	// sent), patterns are only searched after them, so a wait for what
	// was typed finds the guest's answer, not its echo. As soon as the
	// output differs from Echo, there is no echo and the search starts at
	// since; while it is a strict prefix of Echo, nothing is searched yet.
	Echo []byte
	// Progress, if not nil, is called every ProgressInterval (default one
	// second) while the wait waits, from the waiting goroutine with no lock
	// held; it should return quickly.
	Progress func(Progress)
	// ProgressInterval is the time between Progress calls; <= 0 means one
	// second.
	ProgressInterval time.Duration
	// Stop, when it is closed, ends the wait after one last look at the
	// data, with Stopped set unless that look finds a match: something
	// outside the console (the guest reset) made waiting pointless.
	Stop <-chan struct{}
}

// Progress is what [Spec].Progress is told while a wait waits.
type Progress struct {
	// Bytes is how much output arrived since the wait's since.
	Bytes int64
	// Cursor is the end of the output (End).
	Cursor int64
	// LastLine is the last line of output: the partial line at the end,
	// or, if the output ends with a newline, the last complete line
	// (without its line ending); "" if nothing arrived since since. It
	// has been through [Clean] and is at most about 256 bytes (its end).
	LastLine string
	// Elapsed is the time since the wait started.
	Elapsed time.Duration
}

// Result is what [Buffer.WaitFor] found. Exactly one of Matched, Panicked,
// Finished, Idle, TimedOut and Stopped is set.
type Result struct {
	// Since is where the search started: the requested since, clamped to
	// [0, End] when the wait began.
	Since int64
	// Cursor is just past the match (Matched, Panicked), or the end of the
	// data when the wait gave up: pass it as since to continue.
	Cursor int64
	// Output is a copy of the bytes [OutputStart, Cursor).
	Output []byte
	// Head is a copy of the bytes [Since, Since+len(Head)) when Spec.Head
	// kept the start of an output longer than Spec.MaxOutput; the bytes
	// [Since+len(Head), OutputStart) are elided. Nil otherwise.
	Head []byte
	// EchoEnd is where the guest's echo of Spec.Echo ended, or Since if
	// there was none.
	EchoEnd int64
	// OutputStart is Since unless MaxOutput cut the front of Output, or
	// the bytes after Since were lost (see Lost).
	OutputStart int64
	// Lost reports that bytes between Since and OutputStart are gone for
	// good: they left the ring and there is no transcript holding them.
	Lost bool

	// Matched reports that Patterns[Index] matched.
	Matched bool
	// Index is the index in Spec.Patterns of the pattern that matched, or
	// -1.
	Index int
	// Panicked reports that panic pattern PanicIndex matched.
	Panicked bool
	// PanicIndex is the index of the panic pattern that matched (in
	// Spec.Panic, or DefaultPanicPatterns), or -1.
	PanicIndex int
	// PanicMatch is the text that panic pattern matched ("" unless
	// Panicked).
	PanicMatch string
	// Finished reports that the buffer was finished (the guest exited)
	// without a match.
	Finished bool
	// Idle reports that the console was quiet for Spec.Idle.
	Idle bool
	// TimedOut reports that Spec.Timeout passed.
	TimedOut bool
	// Stopped reports that Spec.Stop was closed.
	Stopped bool

	// Start and End are the absolute offsets of the match that ended the
	// wait (Matched or Panicked); End == Cursor. Zero otherwise.
	Start, End int64
	// Before is the part of Output before the match (Output itself
	// without a match); Match is the match, the rest of Output. Both
	// share Output's memory.
	Before, Match []byte
	// Groups holds the text of the matching pattern's capture groups
	// 1..n; a group that did not take part is "". Nil without a match.
	Groups []string
}

// WaitFor waits from since on for what spec describes (see [Spec] and
// [Result]). Cancellation of ctx ends it at once with an error wrapping
// ctx.Err(), even if a match is there already. Nil patterns are an error.
//
// Waits only ever scan the ring (see [Buffer]): if since is older than
// the ring, the search starts at its oldest byte, and while the wait
// waits, bytes leaving the ring leave the search too, so a match in bytes
// already evicted is not found (and ^ or \A then anchor at the oldest byte
// still searched). The ring should be large compared with the output a
// wait must see. Output, by contrast, comes from the transcript too.
//
// Waiting costs nothing while no data arrives: a Write wakes all waiters,
// which each rescan once for however much data arrived since their last
// scan. Where a pattern allows it (no ^, \A or \b, and a bounded match
// length, no way to match a newline, or a literal prefix), the rescan
// starts from a safe point near the new data instead of at since, so a
// long flood costs time linear in its size; otherwise the rescan covers
// the whole window (at most the ring), and only the coalescing of
// wake-ups bounds the work.
func (b *Buffer) WaitFor(ctx context.Context, since int64, spec Spec) (Result, error) {
	panics := spec.Panic
	if panics == nil {
		panics = defaultPanics()
	}
	ms := make([]*matcher, 0, len(spec.Patterns)+len(panics))
	for i, re := range spec.Patterns {
		if re == nil {
			return Result{}, fmt.Errorf("serial: wait: pattern %d is nil", i)
		}
		ms = append(ms, newMatcher(re))
	}
	for i, re := range panics {
		if re == nil {
			return Result{}, fmt.Errorf("serial: wait: panic pattern %d is nil", i)
		}
		ms = append(ms, newMatcher(re))
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("serial: wait: %w", err)
	}

	start := time.Now()
	final := spec.Timeout < 0 // no more waiting: one last scan
	stopped := false
	var expired, idleC, tick <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(spec.Timeout)
		defer t.Stop()
		expired = t.C
	}
	var idleT *time.Timer
	if spec.Idle > 0 && !final {
		idleT = time.NewTimer(spec.Idle)
		defer idleT.Stop()
		idleC = idleT.C
	}
	if spec.Progress != nil && !final {
		iv := spec.ProgressInterval
		if iv <= 0 {
			iv = time.Second
		}
		tk := time.NewTicker(iv)
		defer tk.Stop()
		tick = tk.C
	}

	b.mu.Lock()
	since = b.clampLocked(since)
	b.mu.Unlock()
	w := waiter{b: b, spec: &spec, since: since, winStart: since, ms: ms, npat: len(spec.Patterns), echoDone: len(spec.Echo) == 0}
	sleep := &watch{wake: make(chan struct{}, 1)}
	defer b.forget(sleep)
	idle := false
	// A panic match waits up to panicLineGrace for the rest of its line.
	var (
		panicked  bool
		panicI    int
		panicLoc  []int  // relative to panicWin
		panicWin  []byte // the window it was found in
		graceC    <-chan time.Time
		graceOver bool
	)
	for {
		b.mu.Lock()
		end := b.st.end()
		evicted := false
		if o := b.st.oldest(); o > w.winStart {
			if panicked {
				evicted = true // unlikely: report what was found
			} else {
				w.rebase(b.st.runeAligned(o))
			}
		}
		var window []byte
		if !evicted {
			window = b.st.view(w.winStart, end)
			if !w.echoDone {
				window = w.skipEcho(window)
			}
		}
		finished := b.finished
		if !finished && !final && !idle && !graceOver {
			// Asleep from here on: the writer wakes this wait when new
			// bytes may end it (see watch).
			b.sleepLocked(sleep, w.filter(window, panicked))
		}
		b.mu.Unlock()

		if panicked {
			if evicted {
				return w.result(panicWin, panicI, panicLoc), nil
			}
			if bytes.IndexByte(window[panicLoc[0]:], '\n') >= 0 || finished || final || idle || graceOver {
				return w.result(window, panicI, w.rematch(window, panicI, panicLoc)), nil
			}
		} else if !w.echoDone {
			// The echo may still be arriving: nothing to search yet.
		} else if i, loc := w.scan(window); loc != nil {
			if i < w.npat || bytes.IndexByte(window[loc[0]:], '\n') >= 0 || finished || final {
				return w.result(window, i, loc), nil
			}
			panicked, panicI, panicLoc, panicWin = true, i, loc, window
			t := time.NewTimer(panicLineGrace)
			defer t.Stop()
			graceC = t.C
			continue
		}
		switch {
		case finished:
			r := w.result(window, -1, nil)
			r.Finished = true
			return r, nil
		case idle:
			r := w.result(window, -1, nil)
			r.Idle = true
			return r, nil
		case final:
			r := w.result(window, -1, nil)
			r.TimedOut, r.Stopped = !stopped, stopped
			return r, nil
		}
		select {
		case <-sleep.wake:
			if wokenHook != nil {
				wokenHook()
			}
		case <-expired:
			final = true
		case <-spec.Stop:
			final, stopped = true, true
		case <-idleC:
			b.mu.Lock()
			last := b.lastWrite
			b.mu.Unlock()
			if last.Before(start) {
				last = start
			}
			if d := time.Until(last.Add(spec.Idle)); d > 0 {
				idleT.Reset(d)
			} else {
				idle = true
			}
		case <-graceC:
			graceOver = true
		case <-tick:
			spec.Progress(b.progress(since, start))
		case <-ctx.Done():
			return Result{}, fmt.Errorf("serial: wait: %w", ctx.Err())
		}
	}
}

// wokenHook, if set (by tests), is called whenever a write wakes a wait.
var wokenHook func()

// waiter is the state of one WaitFor.
type waiter struct {
	b        *Buffer
	spec     *Spec
	since    int64
	winStart int64      // offset of the window's first byte
	ms       []*matcher // Patterns, then panic patterns
	npat     int        // len(Patterns)
	echoDone bool       // the echo of Spec.Echo was skipped, or there is none
	echoEnd  int64
}

// filter is what the writer checks before waking this wait, given the
// window it has seen (see watch). It errs only towards waking:
//   - a pattern can only match where its literal prefix is
//     (regexp.LiteralPrefix): while no pattern's prefix has been in the
//     window, new bytes can end the wait only if they complete one;
//   - while the echo of Spec.Echo is still arriving, the wait's state
//     changes only when the output stops following the echo; once the
//     echo is whole, the prefixes are looked for in what follows it, so
//     that an echo and its answer wake the wait once, not twice.
//
// Anything else (a pattern without a literal prefix, a prefix seen
// already, a panic line waiting for its end) wakes the wait on every
// write, as before.
func (w *waiter) filter(window []byte, panicked bool) func([]byte, int64, int) bool {
	if panicked {
		return nil
	}
	// The patterns' literal prefixes: a pattern can match only where its
	// prefix is. nil: some pattern has none (or one too long to see).
	var prefixes [][]byte
	for _, m := range w.ms {
		if len(m.prefix) == 0 || len(m.prefix) > watchTail {
			prefixes = nil
			break
		}
		prefixes = append(prefixes, m.prefix)
	}
	// completes says whether the n bytes just written (the end of recent)
	// may complete a prefix that starts at or after index lo of recent.
	completes := func(recent []byte, n, lo int) bool {
		for _, p := range prefixes {
			if bytes.Contains(recent[max(0, lo, len(recent)-n-len(p)+1):], p) {
				return true
			}
		}
		return false
	}
	if !w.echoDone {
		echo := w.spec.Echo
		start := w.winStart // the echo's first byte is at start
		echoEnd := start + int64(len(echo))
		return func(recent []byte, end int64, n int) bool {
			if n > len(recent) {
				return true // the ring dropped some: let the wait see
			}
			from := end - int64(n)
			for i, c := range recent[len(recent)-n:] {
				k := from + int64(i) - start
				if k < 0 {
					continue
				}
				if k >= int64(len(echo)) {
					break
				}
				if echo[k] != c {
					return true // no echo after all: the wait decides
				}
			}
			if end < echoEnd {
				return false // the echo is still arriving
			}
			if prefixes == nil {
				return true
			}
			// The echo is whole. The wait, woken now, would skip it and
			// find nothing to match unless the bytes after it hold a
			// prefix: the same filter goes on for them, and the wait
			// is woken once, by the write that may end it.
			return completes(recent, n, int(echoEnd-(end-int64(len(recent)))))
		}
	}
	if prefixes == nil {
		return nil
	}
	for _, p := range prefixes {
		if bytes.Contains(window, p) {
			return nil
		}
	}
	return func(recent []byte, _ int64, n int) bool {
		// recent holds what the ring has of the watchTail bytes before
		// the write: a prefix the write completes starts there (waits
		// see only the ring).
		return completes(recent, n, 0)
	}
}

// skipEcho decides, once the window tells, whether the output starts with
// the echo of Spec.Echo, and moves the window past it. The matchers have
// searched nothing yet, so the window can start later without them
// shifting.
func (w *waiter) skipEcho(window []byte) []byte {
	echo := w.spec.Echo
	n := min(len(window), len(echo))
	switch {
	case !bytes.Equal(window[:n], echo[:n]):
		w.echoDone, w.echoEnd = true, w.winStart // no echo
	case n == len(echo):
		w.echoDone, w.echoEnd = true, w.winStart+int64(n)
		w.winStart += int64(n)
		return window[n:]
	}
	return window
}

// rebase moves the window start forward to off (a rune boundary) because
// the ring evicted the bytes before it.
func (w *waiter) rebase(off int64) {
	delta := int(off - w.winStart)
	for _, m := range w.ms {
		m.shift(delta)
	}
	w.winStart = off
}

// scan returns the index (into w.ms) and submatch indexes of the match
// that ends the wait, or nil: the one starting first, the lower index on a
// tie.
func (w *waiter) scan(window []byte) (int, []int) {
	best := -1
	var bestLoc []int
	for i, m := range w.ms {
		if loc := m.find(window); loc != nil && (bestLoc == nil || loc[0] < bestLoc[0]) {
			best, bestLoc = i, loc
		}
	}
	return best, bestLoc
}

// rematch runs panic pattern i again from the start of its earlier match
// loc, over window, which has grown since: a pattern that takes the rest of
// the line gets what has arrived of it meanwhile.
func (w *waiter) rematch(window []byte, i int, loc []int) []int {
	at := loc[0]
	again := w.ms[i].re.FindSubmatchIndex(window[at:])
	if again == nil || again[0] != 0 {
		return loc // cannot happen without look-behind assertions
	}
	for k, v := range again {
		if v >= 0 {
			again[k] = v + at
		}
	}
	return again
}

// result builds the Result for window (which starts at w.winStart) and the
// match loc of matcher i, or without a match for loc == nil.
func (w *waiter) result(window []byte, i int, loc []int) Result {
	r := Result{Since: w.since, Index: -1, PanicIndex: -1}
	r.Cursor = w.winStart + int64(len(window))
	if loc != nil {
		r.Start, r.End = w.winStart+int64(loc[0]), w.winStart+int64(loc[1])
		r.Cursor = r.End
	}
	outStart := w.since
	if keep := int64(w.spec.MaxOutput); keep > 0 && r.Cursor-outStart > keep {
		outStart = r.Cursor - keep
	}
	if loc != nil {
		outStart = min(outStart, r.Start)
	}
	r.EchoEnd = w.since
	if w.echoEnd > 0 {
		r.EchoEnd = w.echoEnd
	}
	if head := int64(w.spec.Head); head > 0 && outStart > w.since {
		// Keep the start too, and elide the middle. The tail still holds
		// the whole match, so it may be longer than MaxOutput-Head.
		head = min(head, int64(w.spec.MaxOutput)-1)
		tailStart := r.Cursor - (int64(w.spec.MaxOutput) - head)
		if loc != nil {
			tailStart = min(tailStart, r.Start)
		}
		if w.since+head < tailStart {
			if h, hs, _ := w.b.collect(w.since, w.since+head); hs == w.since {
				r.Head = h
			}
			outStart = tailStart
		} else {
			outStart = w.since // it all fits: nothing to elide
		}
	}
	var out []byte
	if outStart < w.winStart {
		// Bytes that left the ring (or were never searched): from the
		// transcript, if it has them.
		out, outStart, r.Lost = w.b.collect(outStart, w.winStart)
		out = append(out, window[:r.Cursor-w.winStart]...)
	} else {
		out = append([]byte(nil), window[outStart-w.winStart:r.Cursor-w.winStart]...)
	}
	r.Output, r.OutputStart = out, outStart
	r.Before = out
	if loc == nil {
		return r
	}
	split := r.Start - outStart
	r.Before, r.Match = out[:split:split], out[split:]
	r.Groups = make([]string, len(loc)/2-1)
	for g := range r.Groups {
		if s, e := loc[2*g+2], loc[2*g+3]; s >= 0 {
			r.Groups[g] = string(window[s:e])
		}
	}
	if i < w.npat {
		r.Matched, r.Index = true, i
	} else {
		r.Panicked, r.PanicIndex = true, i-w.npat
		r.PanicMatch = string(r.Match)
	}
	return r
}

// collect returns the longest run of bytes ending at to that can still be
// read from [from, to), where it starts, and whether bytes were lost on
// the way (a failing transcript read counts as a loss; it is logged).
func (b *Buffer) collect(from, to int64) ([]byte, int64, bool) {
	var data []byte
	start, cur, lost := from, from, false
	for cur < to {
		p, _ := b.readPage(cur, 0, to, true)
		if p.Lost > 0 {
			lost = true
			if p.Start >= to {
				return nil, to, true
			}
			data, start = data[:0], p.Start
		}
		data = append(data, p.Data...)
		if p.Next <= cur {
			return nil, to, true // cannot happen: every page gets further
		}
		cur = p.Next
	}
	return data, start, lost
}

// panicLineGrace is how long a wait that found a panic waits for the rest
// of the line (a guest printing through QEMU's UART arrives a few bytes at
// a time).
const panicLineGrace = 500 * time.Millisecond

// lastLineMax bounds Progress.LastLine.
const lastLineMax = 256

// progress reports a waiting WaitFor's progress.
func (b *Buffer) progress(since int64, start time.Time) Progress {
	b.mu.Lock()
	end := b.st.end()
	from := max(since, b.st.oldest(), end-4096)
	tail := b.st.view(from, end)
	b.mu.Unlock()
	return Progress{Bytes: end - since, Cursor: end, LastLine: lastLine(tail), Elapsed: time.Since(start)}
}

// lastLine returns the last complete or partial line of tail, cleaned and
// cut to its last lastLineMax bytes.
func lastLine(tail []byte) string {
	tail = bytes.TrimRight(tail, "\r")
	if t, ok := bytes.CutSuffix(tail, []byte("\n")); ok {
		tail = bytes.TrimRight(t, "\r")
	}
	if i := bytes.LastIndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	if len(tail) > lastLineMax {
		cut := len(tail) - lastLineMax
		for cut < len(tail) && !utf8.RuneStart(tail[cut]) {
			cut++
		}
		tail = tail[cut:]
	}
	return Clean(tail)
}
