package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

func res(ps ...string) []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(ps))
	for i, p := range ps {
		out[i] = regexp.MustCompile(p)
	}
	return out
}

type waitForResult struct {
	r   Result
	err error
	d   time.Duration
}

func waitForAsync(ctx context.Context, b *Buffer, since int64, spec Spec) <-chan waitForResult {
	ch := make(chan waitForResult, 1)
	go func() {
		start := time.Now()
		r, err := b.WaitFor(ctx, since, spec)
		ch <- waitForResult{r, err, time.Since(start)}
	}()
	return ch
}

func recvFor(t *testing.T, ch <-chan waitForResult) waitForResult {
	t.Helper()
	return within10s(t, ch, "WaitFor")
}

// flags returns which of the exclusive outcome flags are set.
func flags(r Result) string {
	var f []string
	for _, x := range []struct {
		set  bool
		name string
	}{{r.Matched, "matched"}, {r.Panicked, "panicked"}, {r.Finished, "finished"}, {r.Idle, "idle"}, {r.TimedOut, "timedout"}} {
		if x.set {
			f = append(f, x.name)
		}
	}
	return strings.Join(f, ",")
}

// TestWaitForEachPattern: whichever of a list of patterns shows up is
// reported with its index, the text before it and its groups.
func TestWaitForEachPattern(t *testing.T) {
	ctx := testCtx(t)
	patterns := res(`login: `, `ip=(\d+\.\d+\.\d+\.\d+)`, `(?P<prompt>[a-z]+)> $`, `error (\d+): (\w+)`)
	for _, tc := range []struct {
		text   string
		index  int
		before string
		match  string
		groups []string
	}{
		{"Debian GNU/Linux 12 qemu ttyS0\r\n\r\nqemu login: ", 0, "Debian GNU/Linux 12 qemu ttyS0\r\n\r\nqemu ", "login: ", []string{}},
		{"dhcp: ip=10.0.2.15 gw=10.0.2.2\n", 1, "dhcp: ", "ip=10.0.2.15", []string{"10.0.2.15"}},
		{"qemu-mcp tiny kernel 1.0 (hart 0)\r\ntiny> ", 2, "qemu-mcp tiny kernel 1.0 (hart 0)\r\n", "tiny> ", []string{"tiny"}},
		{"mount: error 5: EIO\n", 3, "mount: ", "error 5: EIO", []string{"5", "EIO"}},
	} {
		b := NewBuffer()
		b.Write([]byte("old output, login: \n"))
		since := b.End()
		ch := waitForAsync(ctx, b, since, Spec{Patterns: patterns, Timeout: 5 * time.Second})
		time.Sleep(5 * time.Millisecond)
		for i := 0; i < len(tc.text); i += 3 { // dribble it in
			b.Write([]byte(tc.text[i:min(i+3, len(tc.text))]))
		}
		w := recvFor(t, ch)
		r := w.r
		if w.err != nil || flags(r) != "matched" || r.Index != tc.index || r.PanicIndex != -1 {
			t.Fatalf("%q: %s index %d, %v", tc.text, flags(r), r.Index, w.err)
		}
		if string(r.Before) != tc.before || string(r.Match) != tc.match || !slices.Equal(r.Groups, tc.groups) {
			t.Errorf("%q: before %q match %q groups %q", tc.text, r.Before, r.Match, r.Groups)
		}
		if r.Since != since || r.OutputStart != since || r.Lost || string(r.Output) != tc.before+tc.match ||
			r.Start != since+int64(len(tc.before)) || r.End != r.Cursor || r.Cursor != since+int64(len(tc.before)+len(tc.match)) {
			t.Errorf("%q: since %d output %q [%d, %d) cursor %d", tc.text, r.Since, r.Output, r.Start, r.End, r.Cursor)
		}
	}
}

func TestWaitForEarliestWins(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	b.Write([]byte("hello world, hello there"))
	for _, tc := range []struct {
		patterns []string
		index    int
		match    string
	}{
		{[]string{`world`, `hello`}, 1, "hello"},        // earliest position wins
		{[]string{`there`, `world`, `, h`}, 1, "world"}, // regardless of order
		{[]string{`hel+o`, `he`}, 0, "hello"},           // tie: lower index
		{[]string{`he`, `hel+o`}, 0, "he"},              // tie: lower index
		{[]string{`nope`, `o w`, `lo w`}, 2, "lo w"},    // starts first, though it ends later
		{[]string{`nope`, `(?s)d.*`, `d, `}, 1, "d, hello there"},
	} {
		r, err := b.WaitFor(ctx, 0, Spec{Patterns: res(tc.patterns...), Timeout: -1})
		if err != nil || !r.Matched || r.Index != tc.index || string(r.Match) != tc.match {
			t.Errorf("%q: %s index %d match %q, %v; want %d %q", tc.patterns, flags(r), r.Index, r.Match, err, tc.index, tc.match)
		}
	}
}

func TestWaitForTimeout(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("abc"))
	w := recvFor(t, waitForAsync(testCtx(t), b, 1, Spec{Patterns: res(`never`), Timeout: 150 * time.Millisecond}))
	if w.err != nil || flags(w.r) != "timedout" || string(w.r.Output) != "bc" || w.r.Cursor != 3 || w.r.Index != -1 || w.r.Groups != nil {
		t.Fatalf("%s %+v, %v", flags(w.r), w.r, w.err)
	}
	if w.d < 150*time.Millisecond || w.d > 5*time.Second {
		t.Fatalf("took %v", w.d)
	}
	// Timeout < 0 looks once.
	r, err := b.WaitFor(testCtx(t), 0, Spec{Patterns: res(`never`), Timeout: -1})
	if err != nil || flags(r) != "timedout" || string(r.Before) != "abc" {
		t.Fatalf("look once: %s %+v, %v", flags(r), r, err)
	}
}

// TestWaitForIdleQuiet: a quiet console returns Idle after about Idle, even
// if the last byte came long before.
func TestWaitForIdleQuiet(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("booted\n"))
	time.Sleep(300 * time.Millisecond) // longer ago than Idle: counts from the start of the wait
	w := recvFor(t, waitForAsync(testCtx(t), b, 0, Spec{Patterns: res(`never`), Idle: 200 * time.Millisecond}))
	if w.err != nil || flags(w.r) != "idle" || string(w.r.Output) != "booted\n" || w.r.Cursor != 7 {
		t.Fatalf("%s %+v, %v", flags(w.r), w.r, w.err)
	}
	if w.d < 200*time.Millisecond || w.d > 3*time.Second {
		t.Fatalf("idle wait took %v, want about 200ms", w.d)
	}
}

// TestWaitForIdleBusy: a console printing every 50 ms does not count as
// idle (200 ms) until it stops.
func TestWaitForIdleBusy(t *testing.T) {
	b := NewBuffer()
	const ticks = 16 // 800 ms of output
	stopped := make(chan time.Time, 1)
	go func() {
		for i := range ticks {
			b.Write(fmt.Appendf(nil, "tick %d\n", i))
			time.Sleep(50 * time.Millisecond)
		}
		stopped <- time.Now()
	}()
	w := recvFor(t, waitForAsync(testCtx(t), b, 0, Spec{Idle: 200 * time.Millisecond, Timeout: 8 * time.Second}))
	end := time.Now()
	if w.err != nil || flags(w.r) != "idle" {
		t.Fatalf("%s, %v", flags(w.r), w.err)
	}
	if !bytes.HasSuffix(w.r.Output, fmt.Appendf(nil, "tick %d\n", ticks-1)) {
		t.Fatalf("returned idle before the output stopped: %q", w.r.Output)
	}
	stop := <-stopped
	if q := end.Sub(stop); q < 100*time.Millisecond {
		// The last tick was written 50 ms before stop; idle is due 200 ms
		// after it.
		t.Fatalf("returned %v after the output stopped", q)
	}
}

func TestWaitForPanicDefault(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		text  string
		index int
		match string
	}{
		{"tiny> panic\r\nKernel panic - not syncing: requested by user\r\n", 0, "Kernel panic - not syncing: requested by user"},
		{"[    1.234] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n", 0, "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"},
		{"[   12.000] Oops - illegal instruction [#1]\n", 1, "Oops - illegal instruction [#1]"},
		{"[   12.000] Oops [#1]\n", 1, "Oops [#1]"},
		{"[   12.000] Internal error: Oops: 96000004 [#1] PREEMPT SMP\n", 1, "Oops: 96000004 [#1]"},
		{"sbi_trap_error: hart0: trap handler failed (error -2)\nsbi_trap_error: hart0: mcause=0x0000000000000005\n", 2, "sbi_trap_error: hart0: trap handler failed (error -2)"},
		{"Unhandled exception: Illegal instruction\nEPC: 000000008020000c RA: 0000000080200008 TVAL: 0000000000000000\n\n### ERROR ### Please RESET the board ###\n", 3, "Unhandled exception: Illegal instruction"},
		{"Unhandled exception code: 24\n", 3, "Unhandled exception code: 24"},
		{"resetting ...\n### ERROR ### Please RESET the board ###\n", 4, "### ERROR ### Please RESET the board ###"},
		{"\"Synchronous Abort\" handler, esr 0x96000004\n", 5, "\"Synchronous Abort\" handler, esr 0x96000004"},
	} {
		b := NewBuffer()
		b.Write([]byte("booting\n"))
		ch := waitForAsync(ctx, b, 0, Spec{Patterns: res(`login: `), Timeout: 5 * time.Second})
		b.Write([]byte(tc.text))
		w := recvFor(t, ch)
		r := w.r
		if w.err != nil || flags(r) != "panicked" || r.PanicIndex != tc.index || r.PanicMatch != tc.match || r.Index != -1 {
			t.Errorf("%q: %s panic %d %q, %v", tc.text, flags(r), r.PanicIndex, r.PanicMatch, w.err)
			continue
		}
		if string(r.Match) != tc.match || r.Cursor != r.End || !bytes.HasPrefix(r.Output, []byte("booting\n")) {
			t.Errorf("%q: match %q cursor %d end %d output %q", tc.text, r.Match, r.Cursor, r.End, r.Output)
		}
	}
	for _, re := range DefaultPanicPatterns() {
		if !newMatcher(re).incremental || !newMatcher(re).lineLocal {
			t.Errorf("default panic pattern %q would be rescanned from the start", re)
		}
	}
	if !regexp.MustCompile(`^Kernel`).MatchString(DefaultPanicPatterns()[0].String()) {
		t.Error("DefaultPanicPatterns order changed")
	}
}

func TestWaitForPanicCustomAndOff(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	b.Write([]byte("Kernel panic - not syncing: x\nFATAL: boom\nlogin: "))
	// Custom patterns replace the defaults.
	r, err := b.WaitFor(ctx, 0, Spec{Patterns: res(`never`), Panic: res(`xyz`, `FATAL: (\w+)`), Timeout: -1})
	if err != nil || flags(r) != "panicked" || r.PanicIndex != 1 || r.PanicMatch != "FATAL: boom" || r.Groups[0] != "boom" {
		t.Fatalf("custom panic: %s %d %q, %v", flags(r), r.PanicIndex, r.PanicMatch, err)
	}
	// An empty list disables panic detection.
	r, err = b.WaitFor(ctx, 0, Spec{Patterns: res(`login: `), Panic: []*regexp.Regexp{}, Timeout: -1})
	if err != nil || flags(r) != "matched" {
		t.Fatalf("panic detection off: %s, %v", flags(r), err)
	}
	// A pattern tying with a panic pattern wins; an earlier panic wins.
	r, err = b.WaitFor(ctx, 0, Spec{Patterns: res(`Kernel panic`), Timeout: -1})
	if err != nil || flags(r) != "matched" || r.Index != 0 {
		t.Fatalf("waiting for a panic: %s, %v", flags(r), err)
	}
	r, err = b.WaitFor(ctx, 0, Spec{Patterns: res(`login: `), Timeout: -1})
	if err != nil || flags(r) != "panicked" || r.PanicIndex != 0 || r.PanicMatch != "Kernel panic - not syncing: x" {
		t.Fatalf("panic before the pattern: %s %q, %v", flags(r), r.PanicMatch, err)
	}
	if _, err := b.WaitFor(ctx, 0, Spec{Panic: []*regexp.Regexp{nil}}); err == nil {
		t.Fatal("nil panic pattern accepted")
	}
	if _, err := b.WaitFor(ctx, 0, Spec{Patterns: []*regexp.Regexp{nil}}); err == nil {
		t.Fatal("nil pattern accepted")
	}
}

func TestWaitForFinished(t *testing.T) {
	b := NewBuffer()
	ch := waitForAsync(testCtx(t), b, 0, Spec{Patterns: res(`never`), Idle: time.Minute})
	b.Write([]byte("Powering off\r\n"))
	b.Finish()
	w := recvFor(t, ch)
	if w.err != nil || flags(w.r) != "finished" || string(w.r.Output) != "Powering off\r\n" {
		t.Fatalf("%s %q, %v", flags(w.r), w.r.Output, w.err)
	}
}

func TestWaitForCancel(t *testing.T) {
	b := NewBuffer()
	ctx, cancel := context.WithCancel(testCtx(t))
	ch := waitForAsync(ctx, b, 0, Spec{Patterns: res(`never`), Idle: time.Minute, Progress: func(Progress) {}})
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	cancel()
	w := recvFor(t, ch)
	if !errors.Is(w.err, context.Canceled) {
		t.Fatalf("after cancel: %s, %v", flags(w.r), w.err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned %v after cancel", d)
	}
}

// TestWaitForProgress: Progress is called about once a second while a
// wait waits, with the output's last line.
func TestWaitForProgress(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("before the wait\r\n"))
	since := b.End()
	var mu sync.Mutex
	var calls []Progress
	go func() {
		time.Sleep(100 * time.Millisecond)
		b.Write([]byte("first line\r\nsecond line\r\nthird, partial"))
	}()
	start := time.Now()
	r, err := b.WaitFor(testCtx(t), since, Spec{
		Patterns: res(`never`),
		Timeout:  2500 * time.Millisecond,
		Progress: func(p Progress) {
			mu.Lock()
			calls = append(calls, p)
			mu.Unlock()
		},
	})
	d := time.Since(start)
	if err != nil || !r.TimedOut {
		t.Fatalf("%s, %v", flags(r), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 {
		t.Fatalf("%d Progress calls in %v, want at least 2", len(calls), d)
	}
	for _, p := range calls {
		if p.Bytes != b.End()-since || p.Cursor != b.End() || p.LastLine != "third, partial" || p.Elapsed < 900*time.Millisecond {
			t.Errorf("Progress %+v", p)
		}
	}
}

func TestLastLine(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "",
		"one\r\ntwo\r\n":          "two",
		"one\ntwo\nthr":           "thr",
		"one\r\n":                 "one",
		"a\n\x1b[32mgreen\x1b[0m": "green",
		"x\n10%\r55%":             "55%",
		"a\r":                     "a",
		strings.Repeat("é", 200):  strings.Repeat("é", 128),
	} {
		if got := lastLine([]byte(in)); got != want {
			t.Errorf("lastLine(%q) = %q, want %q", in, got, want)
		}
	}
	long := "x" + strings.Repeat("é", 200)
	if got := lastLine([]byte(long)); !utf8.ValidString(got) || len(got) > lastLineMax {
		t.Errorf("lastLine of a long line: %q", got)
	}
}

func TestWaitForMaxOutput(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("0123456789abcdefMATCH-xyz"))
	r, err := b.WaitFor(testCtx(t), 0, Spec{Patterns: res(`MATCH`), MaxOutput: 8, Timeout: -1})
	if err != nil || string(r.Output) != "def"+"MATCH" || r.OutputStart != 13 || string(r.Before) != "def" || r.Lost || r.Since != 0 {
		t.Fatalf("MaxOutput 8: %q from %d, before %q, %v", r.Output, r.OutputStart, r.Before, err)
	}
	r, err = b.WaitFor(testCtx(t), 0, Spec{Patterns: res(`MATCH`), MaxOutput: 2, Timeout: -1})
	if err != nil || string(r.Output) != "MATCH" || r.OutputStart != 16 || len(r.Before) != 0 {
		t.Fatalf("MaxOutput 2 never cuts the match: %q, %v", r.Output, err)
	}
	r, err = b.WaitFor(testCtx(t), 0, Spec{Patterns: res(`never`), MaxOutput: 4, Timeout: -1})
	if err != nil || string(r.Output) != "-xyz" || r.OutputStart != 21 {
		t.Fatalf("MaxOutput without a match: %q, %v", r.Output, err)
	}
}

// TestWaitForRing: waits see only the ring; Output comes from the
// transcript (or says it is lost).
func TestWaitForRing(t *testing.T) {
	ctx := testCtx(t)
	filler := bytes.Repeat([]byte("filler line of the flood\n"), 10000) // 250 KB
	for _, withTranscript := range []bool{false, true} {
		opts := []Option{WithRingSize(64 << 10)}
		if withTranscript {
			opts = append(opts, WithTranscript(filepath.Join(t.TempDir(), "t.log")))
		}
		b, err := OpenBuffer(opts...)
		if err != nil {
			t.Fatal(err)
		}
		b.Write([]byte("MARK early\n"))
		b.Write(filler)
		// A match that left the ring is not found.
		r, err := b.WaitFor(ctx, 0, Spec{Patterns: res(`MARK`), Timeout: -1})
		if err != nil || flags(r) != "timedout" {
			t.Fatalf("evicted match: %s, %v", flags(r), err)
		}
		// A wait that started before the flood, with a window growing past
		// the ring, finds the match at the end; with MaxOutput 0 the
		// output is all there with a transcript.
		since := b.End()
		ch := waitForAsync(ctx, b, since, Spec{Patterns: res(`MARK late`, `(?m)^never$`), Timeout: 10 * time.Second})
		var want []byte
		for i := range 20 {
			chunk := fmt.Appendf(nil, "%d %s", i, filler[:20000+i])
			want = append(want, chunk...)
			b.Write(chunk)
		}
		b.Write([]byte("MARK late\n"))
		want = append(want, "MARK late"...)
		w := recvFor(t, ch)
		r = w.r
		if w.err != nil || flags(r) != "matched" || r.Index != 0 || r.Cursor != since+int64(len(want)) {
			t.Fatalf("transcript %v: %s cursor %d, %v", withTranscript, flags(r), r.Cursor, w.err)
		}
		if withTranscript {
			if r.Lost || r.OutputStart != since || !bytes.Equal(r.Output, want) {
				t.Fatalf("output from the transcript: lost %v start %d, %d bytes", r.Lost, r.OutputStart, len(r.Output))
			}
		} else {
			if !r.Lost || r.OutputStart < r.Cursor-64<<10 || int64(len(r.Output)) != r.Cursor-r.OutputStart || !bytes.HasSuffix(want, r.Output) {
				t.Fatalf("output without transcript: lost %v start %d (oldest %d), %d bytes", r.Lost, r.OutputStart, b.Oldest(), len(r.Output))
			}
		}
		// The old Wait gives the whole output where it can.
		m, err := b.Wait(ctx, since, regexp.MustCompile(`MARK late`), time.Second)
		if err != nil || !m.Matched || m.Since != r.OutputStart || !bytes.Equal(m.Output, r.Output) || m.Start != r.Start {
			t.Fatalf("Wait: %+v, %v", m.Matched, err)
		}
		b.Close()
	}
}

// TestMatcherShift checks rescans after the window start moves forward
// (as the ring evicts) against a plain scan of the current window.
func TestMatcherShift(t *testing.T) {
	patterns := []string{
		`abc`, `a.c`, `a\nb`, `b$`, `(?m)b$`, `c\z`, `ab*`, `ab+c`, `a|ab`, `(a)(b)?c`, `[^\n]+ok`,
		`a.*c`, `(?s)a.*c`, `é`, `.é.`, `\x{FFFD}`, `[^a]`, `..`, `(?i)k+`, `a{2,3}`, `\d+\n`, `ok$`,
		`(?s)ab.*c`, `éa[^b]*c`, `^a`, `\bok`, `(?s)ok.*\z`,
	}
	alphabet := [][]byte{
		[]byte("a"), []byte("b"), []byte("c"), []byte("\n"), []byte("ok"), []byte("é"), []byte("K"),
		[]byte("x"), []byte("1"), {0xc3}, {0xa9}, {0xff}, {0x80, 0x80, 0x80, 0x80}, []byte("€"),
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, pat := range patterns {
		re := regexp.MustCompile(pat)
		for iter := range 150 {
			var text []byte
			for range rng.IntN(60) {
				text = append(text, alphabet[rng.IntN(len(alphabet))]...)
			}
			m := newMatcher(re)
			start, end := 0, 0
			for {
				window := text[start:end]
				got := m.find(window)
				want := re.FindSubmatchIndex(window)
				if !slices.Equal(got, want) {
					t.Fatalf("%q iter %d on %q[%d:%d]: got %v, want %v", pat, iter, text, start, end, got, want)
				}
				if got != nil || end == len(text) {
					break
				}
				end = min(len(text), end+1+rng.IntN(5))
				if rng.IntN(2) == 0 && end > start {
					// Evict from the front, to a rune-aligned point as
					// ringStore.runeAligned picks it.
					s := ringStore{data: text[:end]}
					next := s.runeAligned(int64(start + rng.IntN(end-start+1)))
					m.shift(int(next) - start)
					start = int(next)
				}
			}
		}
	}
}

// TestWaitForPanicLine: a panic line arriving a few bytes at a time is
// reported whole; one that never ends is reported after the grace.
func TestWaitForPanicLine(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	ch := waitForAsync(ctx, b, 0, Spec{Patterns: res(`login: `), Timeout: 5 * time.Second})
	line := "Kernel panic - not syncing: VFS: Unable to mount root fs\r\n"
	b.Write([]byte("[ 1.0] " + line[:30]))
	time.Sleep(50 * time.Millisecond)
	for i := 30; i < len(line); i += 4 {
		b.Write([]byte(line[i:min(i+4, len(line))]))
		time.Sleep(time.Millisecond)
	}
	b.Write([]byte("---[ end Kernel panic ]---\r\n"))
	w := recvFor(t, ch)
	if w.err != nil || !w.r.Panicked || w.r.PanicMatch != strings.TrimSuffix(line, "\r\n") || w.r.Cursor != w.r.End || string(w.r.Before) != "[ 1.0] " {
		t.Fatalf("%s %q cursor %d, %v", flags(w.r), w.r.PanicMatch, w.r.Cursor, w.err)
	}
	if w.d > 2*time.Second {
		t.Fatalf("took %v", w.d)
	}

	b = NewBuffer()
	b.Write([]byte("Unhandled exception: Ill"))
	w = recvFor(t, waitForAsync(ctx, b, 0, Spec{Timeout: 5 * time.Second}))
	if w.err != nil || !w.r.Panicked || w.r.PanicMatch != "Unhandled exception: Ill" || w.d < panicLineGrace {
		t.Fatalf("unfinished panic line: %s %q after %v, %v", flags(w.r), w.r.PanicMatch, w.d, w.err)
	}
	// Looking once does not wait for the line.
	r, err := b.WaitFor(ctx, 0, Spec{Timeout: -1})
	if err != nil || !r.Panicked {
		t.Fatalf("look once: %s, %v", flags(r), err)
	}
}

// A wait given the line just typed searches after the guest's echo of it,
// so waiting for what was typed finds the answer; without an echo it
// searches from since; a partial echo holds the search back.
func TestWaitForSkipsEcho(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("before "))
	since := b.End()
	ch := waitForAsync(context.Background(), b, since, Spec{Patterns: res(`zz-42`), Echo: []byte("echo zz-42"), Timeout: 5 * time.Second})
	b.Write([]byte("echo zz"))
	time.Sleep(20 * time.Millisecond)
	b.Write([]byte("-42\r\n"))
	time.Sleep(20 * time.Millisecond)
	b.Write([]byte("zz-42\r\ntiny> "))
	r := recvFor(t, ch).r
	if !r.Matched || r.Start != since+int64(len("echo zz-42\r\n")) || r.EchoEnd != since+int64(len("echo zz-42")) {
		t.Fatalf("matched the echo, or nothing: %+v", r)
	}
	if string(r.Output) != "echo zz-42\r\nzz-42" {
		t.Errorf("output %q: it keeps the echo", r.Output)
	}

	// No echo: the output differs at once, the search starts at since.
	since = b.End()
	b.Write([]byte("zz-42 answered without an echo"))
	r, err := b.WaitFor(context.Background(), since, Spec{Patterns: res(`zz-42`), Echo: []byte("echo zz-42"), Timeout: -1})
	if err != nil || !r.Matched || r.Start != since || r.EchoEnd != since {
		t.Fatalf("no echo: %+v %v", r, err)
	}
}

// With Head, an output longer than MaxOutput is its start and its end,
// the match whole in the end, and the middle elided.
func TestWaitForHeadAndTail(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte(strings.Repeat("a", 100) + strings.Repeat("m", 1000) + strings.Repeat("z", 100) + "DONE"))
	r, err := b.WaitFor(context.Background(), 0, Spec{Patterns: res(`DONE`), MaxOutput: 200, Head: 50, Timeout: -1})
	if err != nil || !r.Matched {
		t.Fatal(r, err)
	}
	if string(r.Head) != strings.Repeat("a", 50) || r.OutputStart != r.Cursor-150 || !strings.HasSuffix(string(r.Output), "zDONE") || len(r.Output) != 150 {
		t.Errorf("head %q, output from %d (%d bytes) %q", r.Head, r.OutputStart, len(r.Output), r.Output)
	}
	// Short enough: all of it, no head.
	r, _ = b.WaitFor(context.Background(), 1100, Spec{Patterns: res(`DONE`), MaxOutput: 200, Head: 50, Timeout: -1})
	if r.Head != nil || r.OutputStart != 1100 || len(r.Output) != 104 {
		t.Errorf("short output: head %q, from %d, %d bytes", r.Head, r.OutputStart, len(r.Output))
	}
}

// Closing Spec.Stop ends a wait at once, with a last look at the data: a
// match there still wins.
func TestWaitForStop(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("booting\r\n"))
	stop := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(stop)
	}()
	t0 := time.Now()
	r, err := b.WaitFor(context.Background(), 0, Spec{Patterns: res(`prompt`), Timeout: 5 * time.Second, Stop: stop})
	if err != nil || !r.Stopped || r.TimedOut || r.Matched || time.Since(t0) > time.Second || string(r.Output) != "booting\r\n" {
		t.Fatalf("%+v %v after %v", r, err, time.Since(t0))
	}
	b.Write([]byte("prompt"))
	r, err = b.WaitFor(context.Background(), 0, Spec{Patterns: res(`prompt`), Timeout: 5 * time.Second, Stop: stop})
	if err != nil || !r.Matched || r.Stopped {
		t.Fatalf("a match wins over a stop: %+v %v", r, err)
	}
}

// A wait is woken by the write that may end it, not by every byte: the
// prompt's last byte, which completes the pattern's prefix (not the end of
// the guest's echo of the typed line too). Written a byte at a time, as
// QEMU's UART writes it.
func TestWaitWokenRarely(t *testing.T) {
	woken := countWakes(t)
	b := NewBuffer()
	b.Write([]byte("tiny> "))
	since := b.End()
	done := sleepingWait(t, b, since, Spec{
		Patterns: []*regexp.Regexp{regexp.MustCompile(`e12\r\ntiny> $`)},
		Echo:     []byte("echo e12"),
		Timeout:  10 * time.Second,
	})
	out := "echo e12\r\ne12\r\ntiny> "
	for i := range len(out) {
		b.Write([]byte{out[i]})
		time.Sleep(200 * time.Microsecond) // the waiter runs between bytes
	}
	r := <-done
	if !r.Matched || r.EchoEnd != since+8 || r.Start != since+10 {
		t.Fatalf("result %+v", r)
	}
	// The ' ' that completes the pattern's prefix.
	if n := woken.Load(); n != 1 {
		t.Errorf("woken %d times for %d bytes, want once", n, len(out))
	}
	t.Logf("woken %d times for %d bytes", woken.Load(), len(out))
}

// A wait whose pattern has no literal prefix is woken by every write: the
// filter may only err towards waking.
func TestWaitWithoutPrefixWokenByEveryWrite(t *testing.T) {
	b := NewBuffer()
	done := sleepingWait(t, b, 0, Spec{Patterns: []*regexp.Regexp{regexp.MustCompile(`[a-c]{3}`)}, Timeout: 10 * time.Second})
	for _, c := range "xxabc" {
		b.Write([]byte{byte(c)})
	}
	if r := <-done; !r.Matched || string(r.Match) != "abc" {
		t.Fatalf("result %+v", r)
	}
}

// Once the echo is whole, the wait is woken only by what follows it: a
// pattern's prefix inside the echo does not wake it, the echo and its
// answer arriving in one write wake it once, and output that is not the
// echo at all wakes it at once so the wait can decide.
func TestWaitWokenAfterEcho(t *testing.T) {
	woken := countWakes(t)
	run := func(echo, pattern string, writes []string) (Result, int32) {
		t.Helper()
		woken.Store(0)
		b := NewBuffer()
		done := sleepingWait(t, b, b.End(), Spec{
			Patterns: []*regexp.Regexp{regexp.MustCompile(pattern)},
			Echo:     []byte(echo),
			Timeout:  2 * time.Second,
		})
		for _, w := range writes {
			b.Write([]byte(w))
			time.Sleep(time.Millisecond)
		}
		return <-done, woken.Load()
	}
	// "hi" is in the echo "echo hi": only the answer's "hi" wakes.
	r, n := run("echo hi", `hi\r\n`, []string{"e", "c", "h", "o", " ", "h", "i", "\r", "\n", "h", "i", "\r", "\n"})
	if !r.Matched || r.Start != 9 || n != 1 {
		t.Fatalf("a prefix in the echo: matched %v at %d, woken %d times; want a match at 9, woken once", r.Matched, r.Start, n)
	}
	r, n = run("echo hi", `hi\r\n`, []string{"echo hi\r\nhi\r\n"})
	if !r.Matched || r.Start != 9 || n != 1 {
		t.Fatalf("echo and answer in one write: matched %v at %d, woken %d times; want a match at 9, woken once", r.Matched, r.Start, n)
	}
	// No echo: the first byte that differs wakes the wait, which then
	// matches from the start.
	r, _ = run("echo hi", `hi\r\n`, []string{"h", "i", "\r", "\n"})
	if !r.Matched || r.Start != 0 || r.EchoEnd != 0 {
		t.Fatalf("no echo: %+v", r)
	}
}

// countWakes counts, until the test ends, how often a sleeping wait is
// woken.
func countWakes(t *testing.T) *atomic.Int32 {
	var woken atomic.Int32
	wokenHook = func() { woken.Add(1) }
	t.Cleanup(func() { wokenHook = nil })
	return &woken
}

// sleepingWait starts b.WaitFor(since, spec) and, once the wait is asleep,
// returns the channel its result will come on.
func sleepingWait(t *testing.T, b *Buffer, since int64, spec Spec) <-chan Result {
	t.Helper()
	done := make(chan Result, 1)
	go func() {
		r, err := b.WaitFor(context.Background(), since, spec)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	for !b.sleeping() {
		time.Sleep(time.Millisecond)
	}
	return done
}
