package serial

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// tinyKernel is the project's test kernel (testdata/images/tiny/README.md).
const tinyKernel = "../testdata/images/tiny.bin"

// floodPattern returns the first n bytes of the tiny kernel's flood
// pattern: 64-byte lines "%08d " + A + "\n".
func floodPattern(n int) []byte {
	const a = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR"
	b := make([]byte, 0, n+64)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%08d %s\n", i%100000000, a)
	}
	return b[:n]
}

// startTiny boots the tiny kernel under OpenSBI in a real QEMU attached
// to c, and kills that process (and only it) at cleanup.
func startTiny(t *testing.T, c *Console) (stop func()) {
	t.Helper()
	p := testguest.StartQEMU(t, "",
		"-M", "virt", "-m", "128M", "-bios", "default",
		"-display", "none", "-nodefaults",
		"-chardev", "pipe,id=s0,path="+c.Base(), "-serial", "chardev:s0",
		"-kernel", tinyKernel)
	return p.Kill
}

// TestRealQEMUTinyFlood boots the tiny kernel with a 256 KiB ring and a
// transcript, floods 4 MiB and reads all of it back byte-exact (mostly
// from the transcript), interrupts a flood with Ctrl-C, and has the
// kernel panic.
func TestRealQEMUTinyFlood(t *testing.T) {
	testguest.NeedQEMU(t)
	if _, err := os.Stat(tinyKernel); err != nil {
		t.Skipf("%s missing; skipping the real-QEMU test", tinyKernel)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "ser")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	transcript := filepath.Join(dir, "captures", fmt.Sprintf("serial-%d-1.log", os.Getpid()))
	c, err := Create(testBase(dir, os.Getpid()), WithRingSize(256<<10), WithTranscript(transcript))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	stop := startTiny(t, c)
	buf := c.Buffer()

	wait := func(since int64, timeout time.Duration, patterns ...string) Result {
		t.Helper()
		r, err := buf.WaitFor(ctx, since, Spec{Patterns: res(patterns...), Timeout: timeout, MaxOutput: 2000})
		if err != nil || !r.Matched {
			t.Fatalf("waiting for %q: %v; %s; output ends with:\n%s", patterns, err, flags(r), Clean(r.Output))
		}
		return r
	}
	send := func(s string) {
		t.Helper()
		if _, err := c.Write(ctx, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}

	r := wait(0, 20*time.Second, `tiny> $`)
	const n = 4 << 20
	send(fmt.Sprintf("flood %d\r", n))
	start := time.Now()
	r, err = buf.WaitFor(ctx, r.Cursor, Spec{
		Patterns:  res(fmt.Sprintf(`flood done %d\r\n`, n)),
		Timeout:   40 * time.Second,
		MaxOutput: 2000,
		Progress: func(p Progress) {
			t.Logf("flood: %d bytes, last line %q", p.Bytes, p.LastLine)
		},
	})
	if err != nil || !r.Matched {
		t.Fatalf("flood: %v, %s", err, flags(r))
	}
	t.Logf("flood of %d bytes took %v (%.2f MB/s)", n, time.Since(start), float64(n)/time.Since(start).Seconds()/1e6)
	if buf.Oldest() == 0 {
		t.Fatal("the ring kept everything: the test does not test the transcript")
	}

	// Everything from cursor 0, in pages, mostly from the transcript.
	var all []byte
	for cur := int64(0); cur < r.Cursor; {
		p, err := buf.ReadPage(cur, 100000)
		if err != nil || p.Lost != 0 || p.Start != cur {
			t.Fatalf("ReadPage(%d): lost %d start %d: %v", cur, p.Lost, p.Start, err)
		}
		all = append(all, p.Data...)
		cur = p.Next
	}
	all = all[:r.Cursor]
	echo := []byte(fmt.Sprintf("tiny> flood %d\r\n", n))
	i := bytes.Index(all, echo)
	if i < 0 || !bytes.HasPrefix(all, []byte("qemu-mcp tiny kernel 1.0 (hart ")) && !bytes.Contains(all[:i], []byte("qemu-mcp tiny kernel 1.0")) {
		t.Fatalf("banner or echo missing: %q", all[:min(len(all), 2000)])
	}
	body := all[i+len(echo):]
	tail := []byte(fmt.Sprintf("\r\nflood done %d\r\n", n))
	if len(body) != n+len(tail) || !bytes.HasSuffix(body, tail) {
		t.Fatalf("flood output is %d bytes, want %d + %q", len(body), n, tail)
	}
	if want := floodPattern(n); !bytes.Equal(body[:n], want) {
		k := 0
		for k < n && body[k] == want[k] {
			k++
		}
		t.Fatalf("flood output differs from the pattern at byte %d: %q", k, body[k:min(k+64, n)])
	}
	if err := buf.Flush(); err != nil {
		t.Fatal(err)
	}
	if file, err := os.ReadFile(transcript); err != nil || !bytes.HasPrefix(file, all) {
		t.Fatalf("transcript (%d bytes, %v) does not start with what was read", len(file), err)
	}

	// Ctrl-C stops a long flood.
	r = wait(r.Cursor, 10*time.Second, `tiny> $`)
	send("flood 1000000000\r")
	r = wait(r.Cursor, 20*time.Second, `00002000 abc`)
	send("\x03")
	r = wait(r.Cursor, 10*time.Second, `\r\n\^C\r\ntiny> $`)
	stopped := r.Cursor
	if q, err := buf.WaitFor(ctx, r.Cursor, Spec{Idle: 500 * time.Millisecond, Timeout: 10 * time.Second}); err != nil || !q.Idle || q.Cursor != stopped {
		t.Fatalf("output after Ctrl-C: %v, %s, %q", err, flags(q), q.Output)
	}
	t.Logf("Ctrl-C stopped the flood after %d bytes", stopped)

	// A kernel panic ends a wait early.
	send("panic\r")
	q, err := buf.WaitFor(ctx, stopped, Spec{Patterns: res(`never`), Timeout: 10 * time.Second})
	if err != nil || !q.Panicked || q.PanicIndex != 0 || q.PanicMatch != "Kernel panic - not syncing: requested by user" {
		t.Fatalf("panic: %v, %s, %q", err, flags(q), q.PanicMatch)
	}

	stop()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(transcript)
	if err != nil {
		t.Fatal(err)
	}
	if whole := readAll(t, buf, 1<<20); !bytes.Equal(file, whole) || int64(len(file)) != buf.End() {
		t.Fatalf("transcript %d bytes, buffer %d bytes: not equal", len(file), buf.End())
	}
}
