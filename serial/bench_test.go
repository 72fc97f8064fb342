package serial

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	floodSize  = 4 << 20
	floodChunk = 4 << 10
)

// floodData is 4 MiB of log-like lines whose only "MAGIC" (and only
// "login:") is in the last line.
var floodData = func() []byte {
	const tail = "login: MAGIC-END-TOKEN\n"
	var b []byte
	for i := 0; len(b) < floodSize; i++ {
		b = fmt.Appendf(b, "[%6d.%06d] kernel: message number %d with some filler text\n", i/1000, i%1000, i)
	}
	b = append(b[:floodSize-len(tail)-1], '\n')
	return append(b, tail...)
}()

// floodPatterns cover the three rescan strategies: bounded length (rescan
// only the last few bytes), line-local (rescan from the last newline), and
// neither (rescan from since, with and without a literal prefix for the
// regexp to skip to).
var floodPatterns = []struct{ name, re string }{
	{"bounded", `MAGIC-END-TOKEN`},
	{"line-local", `MAGIC-[A-Z]+-TOKEN`},
	{"full-prefix", `(?s)login:.*TOKEN`},
	{"full-noprefix", `[a-z]+:\s+MAGIC`},
}

// BenchmarkWaitFlood: one Wait from 0 for a pattern at the very end of
// 4 MiB written in 4 KiB chunks by another goroutine.
func BenchmarkWaitFlood(b *testing.B) {
	perFloodPattern(b, func(b *testing.B, re *regexp.Regexp) {
		buf := NewBuffer()
		started := make(chan struct{})
		go func() {
			<-started
			for off := 0; off < len(floodData); off += floodChunk {
				buf.Write(floodData[off:min(off+floodChunk, len(floodData))])
			}
		}()
		close(started)
		m, err := buf.Wait(context.Background(), 0, re, time.Minute)
		if err != nil || !m.Matched || m.Cursor < floodSize-30 {
			b.Fatalf("Wait: %v, matched %v, cursor %d", err, m.Matched, m.Cursor)
		}
	})
}

// BenchmarkRegexpFinal is the baseline: one plain regexp search over the
// final 4 MiB.
func BenchmarkRegexpFinal(b *testing.B) {
	perFloodPattern(b, func(b *testing.B, re *regexp.Regexp) {
		if re.FindSubmatchIndex(floodData) == nil {
			b.Fatal("no match")
		}
	})
}

// perFloodPattern runs one iteration of a benchmark over the flood as a
// sub-benchmark of each of floodPatterns.
func perFloodPattern(b *testing.B, iteration func(b *testing.B, re *regexp.Regexp)) {
	for _, p := range floodPatterns {
		re := regexp.MustCompile(p.re)
		b.Run(p.name, func(b *testing.B) {
			b.SetBytes(floodSize)
			for b.Loop() {
				iteration(b, re)
			}
		})
	}
}

// BenchmarkMatcherLockstep is the worst case for a waiter: it rescans after
// every 4 KiB chunk (a writer slower than the scan). "incremental" uses the
// suffix rescan where the pattern allows it, "from-since" rescans the whole
// window each time. full-noprefix is left out: rescanning from since with
// Go's NFA at a few MB/s would take minutes (1024 scans averaging 2 MiB).
func BenchmarkMatcherLockstep(b *testing.B) {
	for _, p := range floodPatterns {
		re := regexp.MustCompile(p.re)
		modes := []bool{false}
		if newMatcher(re).incremental {
			modes = []bool{true, false}
		} else if p.name == "full-noprefix" {
			continue
		}
		for _, incremental := range modes {
			name := p.name + "/from-since"
			if incremental {
				name = p.name + "/incremental"
			}
			b.Run(name, func(b *testing.B) {
				b.SetBytes(floodSize)
				for b.Loop() {
					m := newMatcher(re)
					m.incremental = m.incremental && incremental
					var loc []int
					for end := floodChunk; loc == nil && end <= len(floodData); end += floodChunk {
						loc = m.find(floodData[:end])
					}
					if loc == nil {
						b.Fatal("no match")
					}
				}
			})
		}
	}
}

// BenchmarkRoundTrip: one small message through the echo peer and back,
// "raw" with plain FIFO reads and writes, "console" through Console.Write
// and Buffer.Wait (with the drain goroutine in between).
func BenchmarkRoundTrip(b *testing.B) {
	msg := []byte("ping\n")
	b.Run("raw", func(b *testing.B) {
		base := filepath.Join(b.TempDir(), "raw")
		for _, suffix := range []string{".in", ".out"} {
			if err := unix.Mkfifo(base+suffix, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		p := openPeer(b, base)
		p.echo()
		in, err := os.OpenFile(base+".in", os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer in.Close()
		out, err := os.OpenFile(base+".out", os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		got := make([]byte, len(msg))
		for b.Loop() {
			if _, err := in.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(out, got); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("console", func(b *testing.B) {
		ctx := context.Background()
		c := newConsole(b)
		p := openPeer(b, c.Base())
		p.echo()
		re := regexp.MustCompile(`ping\n`)
		var cur int64
		for b.Loop() {
			if _, err := c.Write(ctx, msg); err != nil {
				b.Fatal(err)
			}
			m, err := c.Buffer().Wait(ctx, cur, re, 10*time.Second)
			if err != nil || !m.Matched {
				b.Fatalf("Wait: %+v, %v", m, err)
			}
			cur = m.Cursor
		}
	})
}

// BenchmarkBufferWriteFlood is the floor for BenchmarkWaitFlood: the same
// 4 MiB in 4 KiB chunks with nobody waiting.
func BenchmarkBufferWriteFlood(b *testing.B) {
	b.SetBytes(floodSize)
	for b.Loop() {
		buf := NewBuffer()
		for off := 0; off < len(floodData); off += floodChunk {
			buf.Write(floodData[off:min(off+floodChunk, len(floodData))])
		}
	}
}

// BenchmarkFloodThroughput: a writer goroutine writes 4 MiB in 4 KiB
// chunks into the output FIFO of a Console (1 MiB ring plus transcript),
// while a reader pages through it with ReadPage (blocking in WaitFor when
// it has caught up), until it has read all 4 MiB. The same run measures
// the raw ceiling: the same writes into a bare FIFO, copied to io.Discard
// with io.CopyBuffer and the drain's read size. Reported: both rates and
// their ratio (console/raw).
func BenchmarkFloodThroughput(b *testing.B) {
	var raw, console time.Duration
	n := 0
	got := make([]byte, 0, floodSize)
	for b.Loop() {
		raw += rawFlood(b)
		d, data := consoleFlood(b, got[:0])
		console += d
		if !bytes.Equal(data, floodData) {
			b.Fatalf("console read %d bytes, not equal to the %d written", len(data), len(floodData))
		}
		n++
	}
	mb := float64(n) * floodSize / 1e6
	rawRate, consoleRate := mb/raw.Seconds(), mb/console.Seconds()
	b.ReportMetric(consoleRate, "console-MB/s")
	b.ReportMetric(rawRate, "raw-MB/s")
	b.ReportMetric(consoleRate/rawRate, "ratio")
}

// floodWriter writes floodData to w in floodChunk pieces.
func floodWriter(w io.Writer) error {
	for off := 0; off < len(floodData); off += floodChunk {
		if _, err := w.Write(floodData[off:min(off+floodChunk, len(floodData))]); err != nil {
			return err
		}
	}
	return nil
}

// rawFlood times floodData through a bare FIFO into io.Discard.
func rawFlood(b *testing.B) time.Duration {
	path := filepath.Join(b.TempDir(), "raw")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		b.Fatal(err)
	}
	// Non-blocking open of the reader first, so the writer's open does not
	// block; the runtime poller then reads it like the console's drain.
	r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		err := floodWriter(w)
		w.Close()
		errc <- err
	}()
	// Wrapped so that io.Discard's ReadFrom (8 KiB reads) is not used.
	n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{r}, make([]byte, defaultReadSize))
	d := time.Since(start)
	if werr := <-errc; err != nil || werr != nil || n != floodSize {
		b.Fatalf("raw copy: %d bytes, %v, %v", n, err, werr)
	}
	return d
}

// consoleFlood times floodData through a Console with a 1 MiB ring and a
// transcript to a reader paging through it, and returns what it read
// (appended to got).
func consoleFlood(b *testing.B, got []byte) (time.Duration, []byte) {
	dir := b.TempDir()
	c, err := Create(testBase(dir, 1), WithRingSize(1<<20), WithTranscript(filepath.Join(dir, "captures", "serial-1-1.log")))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	out, err := os.OpenFile(c.OutPath(), os.O_RDWR, 0) // as QEMU opens it
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	ctx := context.Background()
	any := Spec{Patterns: []*regexp.Regexp{regexp.MustCompile(`(?s).`)}, Panic: []*regexp.Regexp{}, Timeout: 10 * time.Second}
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- floodWriter(out) }()
	buf := c.Buffer()
	for cur := int64(0); cur < floodSize; {
		p, err := buf.ReadPage(cur, defaultReadSize)
		if err != nil || p.Lost != 0 {
			b.Fatalf("ReadPage(%d): lost %d, %v", cur, p.Lost, err)
		}
		if len(p.Data) == 0 {
			if r, err := buf.WaitFor(ctx, cur, any); err != nil || !r.Matched {
				b.Fatalf("WaitFor(%d): %v", cur, err)
			}
			continue
		}
		got = append(got, p.Data...)
		cur = p.Next
	}
	d := time.Since(start)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return d, got
}
