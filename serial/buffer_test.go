package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"
)

// testCtx returns a context that ends well before the test binary's own
// timeout, so a hang shows up as a failure of the test that hung.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestBufferRead(t *testing.T) {
	var b Buffer // zero value is usable
	if got, next := b.Read(0, 10); len(got) != 0 || next != 0 {
		t.Fatalf("empty Read = %q, %d", got, next)
	}
	b.Write([]byte("hello "))
	b.Write([]byte("world"))
	if b.End() != 11 {
		t.Fatalf("End = %d, want 11", b.End())
	}
	for _, tc := range []struct {
		since    int64
		max      int
		want     string
		wantNext int64
	}{
		{0, 0, "hello world", 11},
		{0, 5, "hello", 5},
		{5, 3, " wo", 8},
		{3, 100, "lo world", 11},
		{11, 10, "", 11},
		{50, 10, "", 11}, // clamped to End
		{-4, 4, "hell", 4},
		{4, -1, "o world", 11},
	} {
		got, next := b.Read(tc.since, tc.max)
		if string(got) != tc.want || next != tc.wantNext {
			t.Errorf("Read(%d, %d) = %q, %d; want %q, %d", tc.since, tc.max, got, next, tc.want, tc.wantNext)
		}
	}
	// Read returns a copy.
	got, _ := b.Read(0, 5)
	got[0] = 'J'
	if again, _ := b.Read(0, 5); string(again) != "hello" {
		t.Fatalf("Read aliases the buffer: %q", again)
	}
	// Reading is not consuming.
	if again, _ := b.Read(0, 0); string(again) != "hello world" {
		t.Fatalf("second full Read = %q", again)
	}
	var _ io.Writer = &b
}

func TestBufferWriteCopies(t *testing.T) {
	b := NewBuffer()
	p := []byte("abc")
	b.Write(p)
	p[0] = 'X'
	if got, _ := b.Read(0, 0); string(got) != "abc" {
		t.Fatalf("buffer aliases the caller's slice: %q", got)
	}
}

func TestBufferFinish(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("x"))
	if b.Finished() {
		t.Fatal("Finished before Finish")
	}
	b.Finish()
	b.Finish()
	if !b.Finished() {
		t.Fatal("not Finished after Finish")
	}
	if n, err := b.Write([]byte("y")); n != 0 || !errors.Is(err, ErrFinished) {
		t.Fatalf("Write after Finish = %d, %v", n, err)
	}
	if b.End() != 1 {
		t.Fatalf("End = %d", b.End())
	}
}

// waitAsync runs Wait in a goroutine and returns a channel with its result.
type waitResult struct {
	m   Match
	err error
}

func waitAsync(ctx context.Context, b *Buffer, since int64, re string, timeout time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	rx := regexp.MustCompile(re)
	go func() {
		m, err := b.Wait(ctx, since, rx, timeout)
		ch <- waitResult{m, err}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	return within10s(t, ch, "Wait")
}

// within10s returns what ch delivers, failing the test if the call named
// what has not delivered it within 10 s.
func within10s[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal(what + " did not return")
		var zero T
		return zero
	}
}

func TestWaitImmediateMatch(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("boot ok\nlogin: "))
	m, err := b.Wait(testCtx(t), 0, regexp.MustCompile(`login: `), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Matched || m.TimedOut || m.Finished {
		t.Fatalf("flags: %+v", m)
	}
	if string(m.Output) != "boot ok\nlogin: " || m.Cursor != 15 || m.Start != 8 || m.End != 15 || m.Since != 0 {
		t.Fatalf("match = %+v", m)
	}
	if len(m.Groups) != 0 {
		t.Fatalf("Groups = %q", m.Groups)
	}
}

func TestWaitSpansWrites(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	b.Write([]byte("noise Hit any "))
	ch := waitAsync(ctx, b, 0, `Hit any key to stop`, 10*time.Second)
	time.Sleep(20 * time.Millisecond) // let it block (not required for correctness)
	b.Write([]byte("key to "))
	b.Write([]byte("stop autoboot"))
	r := recv(t, ch)
	if r.err != nil || !r.m.Matched {
		t.Fatalf("Wait = %+v, %v", r.m, r.err)
	}
	if string(r.m.Output) != "noise Hit any key to stop" || r.m.Start != 6 || r.m.Cursor != 25 {
		t.Fatalf("match = %q start %d cursor %d", r.m.Output, r.m.Start, r.m.Cursor)
	}
}

func TestWaitSinceIgnoresEarlierText(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("$ old prompt\n"))
	since := b.End()
	b.Write([]byte("output\n$ "))
	m, err := b.Wait(testCtx(t), since, regexp.MustCompile(`\$ `), 0)
	if err != nil || !m.Matched {
		t.Fatalf("Wait = %+v, %v", m, err)
	}
	if m.Since != since || string(m.Output) != "output\n$ " || m.Start != since+7 {
		t.Fatalf("match = %+v", m)
	}
	// ^ anchors at since.
	m, err = b.Wait(testCtx(t), since, regexp.MustCompile(`^output`), 0)
	if err != nil || !m.Matched || m.Start != since {
		t.Fatalf("anchored Wait = %+v, %v", m, err)
	}
	// A match only before since is not found.
	m, err = b.Wait(testCtx(t), since, regexp.MustCompile(`old`), 0)
	if err != nil || m.Matched || !m.TimedOut {
		t.Fatalf("Wait for earlier text = %+v, %v", m, err)
	}
}

func TestWaitGroups(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("ip=10.0.2.15 mask=24\n"))
	m, err := b.Wait(testCtx(t), 0, regexp.MustCompile(`ip=(\d+\.\d+\.\d+\.\d+)(?: gw=(\S+))? mask=(?P<mask>\d+)`), time.Second)
	if err != nil || !m.Matched {
		t.Fatalf("Wait = %+v, %v", m, err)
	}
	want := []string{"10.0.2.15", "", "24"}
	if fmt.Sprint(m.Groups) != fmt.Sprint(want) || len(m.Groups) != 3 {
		t.Fatalf("Groups = %q, want %q", m.Groups, want)
	}
}

func TestWaitTimeout(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("abc"))
	go func() {
		time.Sleep(10 * time.Millisecond)
		b.Write([]byte("def"))
	}()
	start := time.Now()
	m, err := b.Wait(testCtx(t), 1, regexp.MustCompile(`never`), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Wait took %v", d)
	}
	if m.Matched || !m.TimedOut || m.Finished || string(m.Output) != "bcdef" || m.Cursor != 6 || m.Groups != nil {
		t.Fatalf("timeout result = %+v", m)
	}
}

func TestWaitCheckOnce(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("abc"))
	for _, timeout := range []time.Duration{0, -time.Second} {
		m, err := b.Wait(testCtx(t), 0, regexp.MustCompile(`x`), timeout)
		if err != nil || !m.TimedOut || string(m.Output) != "abc" || m.Cursor != 3 {
			t.Fatalf("Wait(timeout %v) = %+v, %v", timeout, m, err)
		}
		m, err = b.Wait(testCtx(t), 0, regexp.MustCompile(`b`), timeout)
		if err != nil || !m.Matched || m.Cursor != 2 {
			t.Fatalf("Wait(timeout %v) = %+v, %v", timeout, m, err)
		}
	}
}

func TestWaitFinished(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	b.Write([]byte("partial"))
	ch := waitAsync(ctx, b, 0, `never`, time.Minute)
	time.Sleep(10 * time.Millisecond)
	b.Write([]byte(" tail"))
	b.Finish()
	r := recv(t, ch)
	if r.err != nil || r.m.Matched || r.m.TimedOut || !r.m.Finished {
		t.Fatalf("Wait = %+v, %v", r.m, r.err)
	}
	if string(r.m.Output) != "partial tail" || r.m.Cursor != 12 {
		t.Fatalf("Output %q Cursor %d", r.m.Output, r.m.Cursor)
	}
	// On a finished buffer a match still wins, and no match returns at once.
	m, err := b.Wait(ctx, 0, regexp.MustCompile(`tail`), time.Minute)
	if err != nil || !m.Matched {
		t.Fatalf("Wait on finished buffer = %+v, %v", m, err)
	}
	m, err = b.Wait(ctx, 0, regexp.MustCompile(`nope`), time.Minute)
	if err != nil || !m.Finished {
		t.Fatalf("Wait on finished buffer = %+v, %v", m, err)
	}
}

func TestWaitCancel(t *testing.T) {
	b := NewBuffer()
	ctx, cancel := context.WithCancel(testCtx(t))
	ch := waitAsync(ctx, b, 0, `never`, time.Minute)
	time.Sleep(10 * time.Millisecond)
	cancel()
	r := recv(t, ch)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Wait after cancel = %+v, %v", r.m, r.err)
	}
	// Already cancelled: error even though the pattern would match.
	b.Write([]byte("x"))
	if _, err := b.Wait(ctx, 0, regexp.MustCompile(`x`), time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with cancelled ctx: %v", err)
	}
	// A ctx deadline is an error too (unlike the timeout argument).
	dctx, dcancel := context.WithTimeout(testCtx(t), 20*time.Millisecond)
	defer dcancel()
	if _, err := b.Wait(dctx, 0, regexp.MustCompile(`never`), time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past ctx deadline: %v", err)
	}
}

func TestWaitNilRegexp(t *testing.T) {
	if _, err := NewBuffer().Wait(testCtx(t), 0, nil, time.Second); err == nil {
		t.Fatal("nil regexp accepted")
	}
}

func TestWaitSinceClamped(t *testing.T) {
	b := NewBuffer()
	b.Write([]byte("abc"))
	ctx := testCtx(t)
	ch := waitAsync(ctx, b, 100, `c`, 10*time.Second) // since > End: only new data counts
	time.Sleep(10 * time.Millisecond)
	b.Write([]byte("xyc"))
	r := recv(t, ch)
	if r.err != nil || !r.m.Matched || r.m.Since != 3 || r.m.Start != 5 || string(r.m.Output) != "xyc" {
		t.Fatalf("Wait = %+v, %v", r.m, r.err)
	}
}

func TestManyWaitersOneWrite(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	const n = 100
	chans := make([]<-chan waitResult, n)
	for i := range chans {
		chans[i] = waitAsync(ctx, b, 0, `go(\d)`, 10*time.Second)
	}
	time.Sleep(20 * time.Millisecond)
	b.Write([]byte("ready, go7!"))
	for i, ch := range chans {
		r := recv(t, ch)
		if r.err != nil || !r.m.Matched || r.m.Groups[0] != "7" || r.m.Cursor != 10 {
			t.Fatalf("waiter %d: %+v, %v", i, r.m, r.err)
		}
	}
}

// TestBufferConcurrent exercises writers, readers and waiters together;
// run with -race.
func TestBufferConcurrent(t *testing.T) {
	ctx := testCtx(t)
	b := NewBuffer()
	const writers, lines = 4, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				b.Write(fmt.Appendf(nil, "w%d line %d\n", w, i))
			}
		})
	}
	// Readers follow the buffer with cursors.
	for range 2 {
		wg.Go(func() {
			var cur int64
			var got bytes.Buffer
			for cur < b.End() || got.Len() == 0 {
				data, next := b.Read(cur, 1000)
				got.Write(data)
				cur = next
			}
		})
	}
	// Waiters wait for each writer's last line.
	results := make(chan waitResult, writers)
	for w := range writers {
		go func() {
			m, err := b.Wait(ctx, 0, regexp.MustCompile(fmt.Sprintf(`w%d line %d\n`, w, lines-1)), 10*time.Second)
			results <- waitResult{m, err}
		}()
	}
	wg.Wait()
	for range writers {
		r := <-results
		if r.err != nil || !r.m.Matched {
			t.Fatalf("waiter: %+v, %v", r.m, r.err)
		}
	}
	all, _ := b.Read(0, 0)
	if c := bytes.Count(all, []byte("\n")); c != writers*lines {
		t.Fatalf("%d lines, want %d", c, writers*lines)
	}
}
