package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// peer plays QEMU: it opens <base>.in and <base>.out read-write, as QEMU's
// pipe chardev does.
type peer struct {
	in, out *os.File // in: bytes to the guest; out: bytes from the guest
	done    chan struct{}
}

func openPeer(t testing.TB, base string) *peer {
	t.Helper()
	in, err := os.OpenFile(base+".in", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(base+".out", os.O_RDWR, 0)
	if err != nil {
		in.Close()
		t.Fatal(err)
	}
	p := &peer{in: in, out: out}
	t.Cleanup(p.close)
	return p
}

// echo copies everything sent to the guest back as guest output, until
// the peer is closed.
func (p *peer) echo() {
	p.done = make(chan struct{})
	go func() {
		defer close(p.done)
		io.Copy(p.out, p.in)
	}()
}

// close closes the peer's ends (QEMU exiting) and waits for the echo.
func (p *peer) close() {
	p.in.Close()
	p.out.Close()
	if p.done != nil {
		<-p.done
	}
}

func newConsole(t testing.TB) *Console {
	t.Helper()
	c, err := Create(testBase(t.TempDir(), 4242))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func isFIFO(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeNamedPipe || fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("%s: mode %v, want a FIFO private to its owner", path, fi.Mode())
	}
}

func TestConsolePaths(t *testing.T) {
	dir := t.TempDir()
	c, err := Create(testBase(dir, 123), WithReadSize(100), WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Base() != filepath.Join(dir, "serial-123") || c.InPath() != c.Base()+".in" || c.OutPath() != c.Base()+".out" {
		t.Fatalf("paths %q %q %q", c.Base(), c.InPath(), c.OutPath())
	}
	isFIFO(t, c.InPath())
	isFIFO(t, c.OutPath())
	if c.Buffer() == nil || c.Buffer().End() != 0 {
		t.Fatal("bad buffer")
	}
}

// TestConsoleOutputBeforeRead writes more than a pipe holds before anyone
// reads the buffer: the drain must have kept it all, byte-exact.
func TestConsoleOutputBeforeRead(t *testing.T) {
	c := newConsole(t)
	p := openPeer(t, c.Base())
	want := make([]byte, 200<<10)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	want = append(want, "\x00END-OF-FLOOD\x00"...)
	p.out.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if n, err := p.out.Write(want); err != nil || n != len(want) {
		t.Fatalf("peer write: %d, %v (drain not draining?)", n, err)
	}
	m, err := c.Buffer().Wait(testCtx(t), 0, regexp.MustCompile(`\x00END-OF-FLOOD\x00`), 10*time.Second)
	if err != nil || !m.Matched || m.Cursor != int64(len(want)) {
		t.Fatalf("Wait: matched %v cursor %d err %v", m.Matched, m.Cursor, err)
	}
	var got []byte
	for cur := int64(0); cur < c.Buffer().End(); {
		data, next := c.Buffer().Read(cur, 7000)
		got = append(got, data...)
		cur = next
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes, not equal to the %d written", len(got), len(want))
	}
}

func TestConsoleEchoRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	p := openPeer(t, c.Base())
	p.echo()
	cur := c.Buffer().End()
	for _, cmd := range []string{"uname -a\r", "version\r", "echo done\r"} {
		if n, err := c.Write(ctx, []byte(cmd)); err != nil || n != len(cmd) {
			t.Fatalf("Write: %d, %v", n, err)
		}
		m, err := c.Buffer().Wait(ctx, cur, regexp.MustCompile(regexp.QuoteMeta(cmd)), 5*time.Second)
		if err != nil || !m.Matched || string(m.Output) != cmd {
			t.Fatalf("Wait for echo of %q: %+v, %v", cmd, m, err)
		}
		cur = m.Cursor
	}
	if n, err := c.Write(ctx, nil); n != 0 || err != nil {
		t.Fatalf("empty Write: %d, %v", n, err)
	}
}

// TestConsoleFinish: QEMU writes, exits (closes its ends); Finish puts
// every byte in the buffer and wakes a pending Wait with Finished.
func TestConsoleFinish(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	p := openPeer(t, c.Base())
	ch := waitAsync(ctx, c.Buffer(), 0, `never`, time.Minute)
	want := bytes.Repeat([]byte("last words of the guest\n"), 5000) // 120 KB
	if _, err := p.out.Write(want); err != nil {
		t.Fatal(err)
	}
	p.close()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx); err != nil {
		t.Fatalf("second Finish: %v", err)
	}
	if got, _ := c.Buffer().Read(0, 0); !bytes.Equal(got, want) {
		t.Fatalf("buffer has %d bytes, want %d", len(got), len(want))
	}
	r := recv(t, ch)
	if r.err != nil || !r.m.Finished || r.m.Cursor != int64(len(want)) {
		t.Fatalf("pending Wait: finished %v cursor %d err %v", r.m.Finished, r.m.Cursor, r.err)
	}
	if !c.Buffer().Finished() {
		t.Fatal("buffer not finished")
	}
}

// TestConsoleFinishReadsPipe makes sure the bytes are still in the pipe
// when Finish runs (the drain is stopped first), so Finish's own FIONREAD
// loop must move them.
func TestConsoleFinishReadsPipe(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	p := openPeer(t, c.Base())
	p.out.Write([]byte("early\n"))
	if _, err := c.Buffer().Wait(ctx, 0, regexp.MustCompile(`early\n`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.lifeMu.Lock()
	c.stopDrain()
	c.lifeMu.Unlock()
	ch := waitAsync(ctx, c.Buffer(), 0, `never`, time.Minute)
	tail := bytes.Repeat([]byte("0123456789abcdef"), 3000) // 48000 bytes, fits in the pipe
	if _, err := p.out.Write(tail); err != nil {
		t.Fatal(err)
	}
	p.close()
	if c.Buffer().End() != 6 {
		t.Fatalf("drain still running: End %d", c.Buffer().End())
	}
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Buffer().Read(0, 0)
	if want := append([]byte("early\n"), tail...); !bytes.Equal(got, want) {
		t.Fatalf("buffer has %d bytes, want %d", len(got), len(want))
	}
	if r := recv(t, ch); r.err != nil || !r.m.Finished {
		t.Fatalf("pending Wait: %+v, %v", r.m, r.err)
	}
}

func TestConsoleClose(t *testing.T) {
	ctx := testCtx(t)
	c, err := Create(testBase(t.TempDir(), 1))
	if err != nil {
		t.Fatal(err)
	}
	ch := waitAsync(ctx, c.Buffer(), 0, `never`, time.Minute)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{c.InPath(), c.OutPath()} {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s still there: %v", path, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if r := recv(t, ch); r.err != nil || !r.m.Finished {
		t.Fatalf("Wait pending at Close: %+v, %v", r.m, r.err)
	}
	if _, err := c.Write(ctx, []byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if err := c.Finish(ctx); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Finish after Close: %v", err)
	}
}

// TestConsoleCloseLeavesReplacedPath: Close removes only the FIFO it made.
func TestConsoleCloseLeavesReplacedPath(t *testing.T) {
	c, err := Create(testBase(t.TempDir(), 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(c.InPath(), c.InPath()+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.InPath(), []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err == nil {
		t.Fatal("Close reported no problem with a replaced FIFO")
	}
	if data, err := os.ReadFile(c.InPath()); err != nil || string(data) != "precious" {
		t.Fatalf("replacement damaged: %q, %v", data, err)
	}
	if _, err := os.Lstat(c.OutPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("out FIFO not removed: %v", err)
	}
}

func TestCreateRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("do not touch"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "serial-7")
	if err := os.Symlink(victim, base+".in"); err != nil {
		t.Fatal(err)
	}
	c, err := Create(testBase(dir, 7))
	if err == nil {
		c.Close()
		t.Fatal("Create accepted a planted symlink")
	}
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("error %v does not wrap fs.ErrExist", err)
	}
	if data, err := os.ReadFile(victim); err != nil || string(data) != "do not touch" {
		t.Fatalf("victim changed: %q, %v", data, err)
	}
	if fi, err := os.Lstat(base + ".in"); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Fatalf("symlink removed or changed: %v, %v", fi, err)
	}
	if _, err := os.Lstat(base + ".out"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf(".out left behind: %v", err)
	}
}

func TestCreateRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "serial-8")
	// Leftovers of an earlier run.
	for _, path := range []string{base + ".in", base + ".out"} {
		if err := unix.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Create(testBase(dir, 8)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create over existing FIFOs: %v", err)
	}
	for _, path := range []string{base + ".in", base + ".out"} {
		isFIFO(t, path)
	}

	// Only .out exists: the .in made meanwhile is removed again, .out kept.
	base = filepath.Join(dir, "serial-9")
	if err := os.WriteFile(base+".out", []byte("log"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(testBase(dir, 9)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create over existing .out: %v", err)
	}
	if _, err := os.Lstat(base + ".in"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf(".in left behind: %v", err)
	}
	if data, err := os.ReadFile(base + ".out"); err != nil || string(data) != "log" {
		t.Fatalf(".out changed: %q, %v", data, err)
	}
}

func TestCreateBadDir(t *testing.T) {
	if _, err := Create(testBase(filepath.Join(t.TempDir(), "missing"), 1)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Create in missing dir: %v", err)
	}
}

// TestConsoleWriteFullPipe: nobody reads the guest's input, so the pipe
// fills and Write must give up when its context does.
func TestConsoleWriteFullPipe(t *testing.T) {
	c := newConsole(t)
	big := make([]byte, 1<<20)

	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	n, err := c.Write(ctx, big)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write to full pipe: %d, %v", n, err)
	}
	if n <= 0 || n >= len(big) {
		t.Fatalf("Write wrote %d bytes, want a partial write", n)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Write took %v", d)
	}

	// Cancellation without a deadline works too.
	cctx, ccancel := context.WithCancel(testCtx(t))
	time.AfterFunc(50*time.Millisecond, ccancel)
	if n, err := c.Write(cctx, big); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("Write cancelled: %d, %v", n, err)
	}

	// A later Write with a live context is not hit by a stale deadline:
	// once a reader appears it goes through.
	in, err := os.OpenFile(c.InPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	go io.Copy(io.Discard, in)
	if n, err := c.Write(testCtx(t), big); err != nil || n != len(big) {
		t.Fatalf("Write after draining: %d, %v", n, err)
	}
}

// TestConsoleCloseUnblocksWrite: Close does not wait for a stuck Write; the
// Write fails.
func TestConsoleCloseUnblocksWrite(t *testing.T) {
	c, err := Create(testBase(t.TempDir(), 3))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(context.Background(), make([]byte, 1<<20))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("stuck Write returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Write")
	}
}

// TestCheckFIFO checks the post-open verification directly.
func TestCheckFIFO(t *testing.T) {
	if err := checkFIFO("x", syscall.S_IFREG|0o600, uint32(os.Getuid())); err == nil {
		t.Error("regular file accepted")
	}
	if err := checkFIFO("x", syscall.S_IFIFO|0o600, uint32(os.Getuid()+1)); err == nil {
		t.Error("foreign owner accepted")
	}
	if err := checkFIFO("x", syscall.S_IFIFO|0o600, uint32(os.Getuid())); err != nil {
		t.Error(err)
	}
}

// TestConsoleWriteQueuedHonoursCtx: a Write queued behind a stuck one gives
// up with its own context.
func TestConsoleWriteQueuedHonoursCtx(t *testing.T) {
	c := newConsole(t)
	stuck, cancelStuck := context.WithCancel(testCtx(t))
	defer cancelStuck()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Write(stuck, make([]byte, 1<<20))
	}()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	if n, err := c.Write(ctx, []byte("x")); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Write: %d, %v", n, err)
	}
	cancelStuck()
	<-done
}

// TestConsoleWriteSlow: one byte at a time with the delay in between, all
// of them arriving in order.
func TestConsoleWriteSlow(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	p := openPeer(t, c.Base())
	p.echo()
	msg := []byte("slow\x03\r")
	start := time.Now()
	n, err := c.WriteSlow(ctx, msg, 40*time.Millisecond)
	d := time.Since(start)
	if n != len(msg) || err != nil {
		t.Fatalf("WriteSlow: %d, %v", n, err)
	}
	if min := time.Duration(len(msg)-1) * 40 * time.Millisecond; d < min || d > min+5*time.Second {
		t.Fatalf("WriteSlow of %d bytes took %v, want about %v", len(msg), d, min)
	}
	m, err := c.Buffer().Wait(ctx, 0, regexp.MustCompile(`slow\x03\r`), 5*time.Second)
	if err != nil || !m.Matched || m.Cursor != int64(len(msg)) {
		t.Fatalf("echo: %q, %v", m.Output, err)
	}
	// No delay: a plain Write.
	if n, err := c.WriteSlow(ctx, []byte("fast"), 0); n != 4 || err != nil {
		t.Fatalf("WriteSlow without delay: %d, %v", n, err)
	}
}

// TestConsoleWriteSlowCancel: cancelling stops WriteSlow between bytes.
func TestConsoleWriteSlowCancel(t *testing.T) {
	c := newConsole(t)
	p := openPeer(t, c.Base())
	p.echo()
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	n, err := c.WriteSlow(ctx, bytes.Repeat([]byte("x"), 100), 20*time.Millisecond)
	if !errors.Is(err, context.Canceled) || n < 1 || n >= 100 {
		t.Fatalf("cancelled WriteSlow: %d, %v", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	// What went out went out whole: n bytes are echoed, no more.
	m, err := c.Buffer().WaitFor(testCtx(t), 0, Spec{Idle: 200 * time.Millisecond, Timeout: 5 * time.Second})
	if err != nil || !m.Idle || m.Cursor != int64(n) {
		t.Fatalf("echoed %d bytes (%s), wrote %d: %v", m.Cursor, flags(m), n, err)
	}
	// An already cancelled context writes nothing.
	if n, err := c.WriteSlow(ctx, []byte("y"), time.Millisecond); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("WriteSlow with a cancelled context: %d, %v", n, err)
	}
}

// testBase is the FIFOs' base path for test console n in dir.
func testBase(dir string, n int) string { return filepath.Join(dir, fmt.Sprintf("serial-%d", n)) }

// Sync returns with everything written to the output pipe before it in
// the buffer, in order, also during a flood (the drain naps then), and at
// once after Finish.
func TestConsoleSync(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	p := openPeer(t, c.Base())
	var want []byte
	for k := range 200 {
		// Enough at once to set off the drain's burst naps.
		line := bytes.Repeat([]byte{'a' + byte(k%26)}, 700)
		if _, err := p.out.Write(line); err != nil {
			t.Fatal(err)
		}
		want = append(want, line...)
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if end := c.Buffer().End(); end != int64(len(want)) {
			t.Fatalf("sync %d: the buffer ends at %d, %d bytes were written", k, end, len(want))
		}
		// A line of the console's own, as a restore's marker.
		mark := []byte("[mark]")
		c.Buffer().Write(mark)
		want = append(want, mark...)
	}
	if got, _ := c.Buffer().Read(0, 0); !bytes.Equal(got, want) {
		t.Fatal("the buffer is not what was written, in order")
	}
	p.close()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("after Finish: %v", err)
	}
}
