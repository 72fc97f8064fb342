package serial

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// interactive reports whether the drain reads through the netpoller now.
func (c *Console) interactive() bool {
	c.npMu.Lock()
	defer c.npMu.Unlock()
	return c.np != nil
}

// waitMode waits until the drain is in the mode wanted.
func waitMode(t *testing.T, c *Console, interactive bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for c.interactive() != interactive {
		if time.Now().After(deadline) {
			t.Fatalf("the drain is not in %s mode after %v", map[bool]string{true: "interactive", false: "flood"}[interactive], within)
		}
		time.Sleep(time.Millisecond)
	}
}

// modes returns the switches of c's drain between modes, as they happen
// (true: into flood mode).
func modes(t *testing.T, c *Console) <-chan bool {
	ch := make(chan bool, 100)
	h := func(cc *Console, flood bool) {
		if cc == c {
			ch <- flood
		}
	}
	modeHook.Store(&h)
	t.Cleanup(func() { modeHook.Store(nil) })
	return ch
}

// nextMode waits for c's drain's next switch and checks it.
func nextMode(t *testing.T, ch <-chan bool, flood bool, within time.Duration) {
	t.Helper()
	select {
	case got := <-ch:
		if got != flood {
			t.Fatalf("the drain switched to flood=%v, want flood=%v", got, flood)
		}
	case <-time.After(within):
		t.Fatalf("the drain did not switch to flood=%v within %v", flood, within)
	}
}

// floodUntilSwitch writes 512-byte pieces (put(k) writes the k-th) 50 us
// apart until the drain switches to flood mode: a flood that ends before
// the drain's first read is read in one piece, and rightly is not one.
func floodUntilSwitch(t *testing.T, switches <-chan bool, put func(k int)) {
	t.Helper()
	for k := 0; k < 20000; k++ {
		put(k)
		time.Sleep(50 * time.Microsecond)
		select {
		case flood := <-switches:
			if !flood {
				t.Fatal("the drain left flood mode without having entered it")
			}
			return
		default:
		}
	}
	t.Fatal("the drain did not enter flood mode during 10 MB of output")
}

// The drain reads interactive output through the netpoller, goes to
// poll(2) with naps when a flood starts, and back once the output has been
// quiet for floodQuiet; not a byte is lost or reordered across the
// switches, and Sync and Close work in both modes.
func TestDrainModes(t *testing.T) {
	ctx := testCtx(t)
	c := newConsole(t)
	switches := modes(t, c)
	p := openPeer(t, c.Base())
	waitMode(t, c, true, 2*time.Second)
	var want []byte
	put := func(b []byte) {
		t.Helper()
		if _, err := p.out.Write(b); err != nil {
			t.Fatal(err)
		}
		want = append(want, b...)
	}
	// An echo, a byte at a time as QEMU's UART writes it: interactive.
	for _, b := range []byte("echo hi\r\nhi\r\ntiny> ") {
		put([]byte{b})
		time.Sleep(50 * time.Microsecond)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-switches:
		t.Fatal("an echo's bytes made the drain leave interactive mode")
	default:
	}
	for round := range 3 {
		// A flood: many bytes within burstWindow, until the drain
		// notices.
		floodUntilSwitch(t, switches, func(k int) { put(bytes.Repeat([]byte{'a' + byte((round*64+k)%26)}, 512)) })
		put([]byte("during the flood\n"))
		if err := c.Sync(ctx); err != nil {
			t.Fatalf("sync in flood mode: %v", err)
		}
		if end := c.Buffer().End(); end != int64(len(want)) {
			t.Fatalf("round %d: after a sync in flood mode the buffer ends at %d, %d bytes were written", round, end, len(want))
		}
		// Quiet: back to interactive.
		nextMode(t, switches, false, floodQuiet+2*time.Second)
		waitMode(t, c, true, 2*time.Second)
		put([]byte("after the flood\n"))
		if err := c.Sync(ctx); err != nil {
			t.Fatalf("sync in interactive mode: %v", err)
		}
		if end := c.Buffer().End(); end != int64(len(want)) {
			t.Fatalf("round %d: after a sync in interactive mode the buffer ends at %d, %d bytes were written", round, end, len(want))
		}
	}
	if got, _ := c.Buffer().Read(0, 0); !bytes.Equal(got, want) {
		t.Fatal("the buffer is not what was written, in order")
	}
	// Close while the drain is parked in the netpoller returns at once.
	closeWithin(t, c, "parked in the netpoller")
}

// closeWithin closes c and fails if that takes more than a few seconds:
// the drain, where, did not stop.
func closeWithin(t *testing.T, c *Console, where string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Close did not stop the drain %s", where)
	}
}

// Close stops a drain that naps in flood mode.
func TestDrainCloseDuringFlood(t *testing.T) {
	c := newConsole(t)
	p := openPeer(t, c.Base())
	stop := make(chan struct{})
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		b := bytes.Repeat([]byte{'x'}, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := p.out.Write(b); err != nil {
				return
			}
		}
	}()
	waitMode(t, c, false, 2*time.Second)
	closeWithin(t, c, "during a flood")
	close(stop)
	p.close()
	<-flooding
}

// The transcript is flushed after idleFlushDelay of quiet in interactive
// mode too, so a reader of the file sees the output soon after the guest
// goes quiet.
func TestDrainInteractiveIdleFlush(t *testing.T) {
	c, p, tr := transcribed(t)
	if _, err := p.out.Write([]byte("tiny> ")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, _ := os.ReadFile(tr)
		if string(b) == "tiny> " {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the transcript holds %q 2 s after the guest went quiet", b)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !c.interactive() {
		t.Fatal("the drain left interactive mode for a prompt")
	}
}

// A guest that prints a line every few milliseconds, never quiet for
// idleFlushDelay, still has its output in the transcript within about
// flushMaxAge: before, the file trailed by up to transcriptChunk.
func TestDrainSteadyOutputFlushes(t *testing.T) {
	_, p, tr := transcribed(t)
	// The lag is the age of the oldest line the file does not hold yet.
	var sentAt []time.Time
	var worst time.Duration
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(3 * time.Millisecond) {
		if _, err := fmt.Fprintf(p.out, "heartbeat %d\n", len(sentAt)); err != nil {
			t.Fatal(err)
		}
		sentAt = append(sentAt, time.Now())
		b, _ := os.ReadFile(tr)
		if have := bytes.Count(b, []byte("\n")); have < len(sentAt) {
			worst = max(worst, time.Since(sentAt[have]))
		}
	}
	t.Logf("%d lines; the transcript trailed by at most %v", len(sentAt), worst)
	if worst > 500*time.Millisecond { // flushMaxAge, and room for a busy host
		t.Errorf("the transcript trailed steady output by %v", worst)
	}
}

// transcribed is a console with a transcript (its path tr) and the peer
// that plays QEMU, the drain waiting in interactive mode.
func transcribed(t *testing.T) (c *Console, p *peer, tr string) {
	t.Helper()
	dir := t.TempDir()
	tr = dir + "/transcript.log"
	c, err := Create(testBase(dir, 1), WithTranscript(tr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p = openPeer(t, c.Base())
	waitMode(t, c, true, 2*time.Second)
	return c, p, tr
}

// rawPeer plays QEMU with plain descriptors, outside the test process's
// netpoller, so that what is in an epoll set is the drain's doing.
func rawPeer(t *testing.T, base string) (out int) {
	t.Helper()
	in, err := unix.Open(base+".in", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err = unix.Open(base+".out", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(in)
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(in); unix.Close(out) })
	return out
}

// typeSlowly writes s a byte per write(2), as QEMU's UART does.
func typeSlowly(t *testing.T, fd int, s string) {
	t.Helper()
	for _, b := range []byte(s) {
		if _, err := unix.Write(fd, []byte{b}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// watching reports whether the drain waits on an inotify watch now.
func (c *Console) watching() bool {
	c.npMu.Lock()
	defer c.npMu.Unlock()
	return c.np != nil && c.np.Name() == "inotify"
}

// polledFIFOs lists the descriptors of this process's epoll sets that
// refer to the inode ino.
func polledFIFOs(t *testing.T, ino uint64) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range ents {
		if link, _ := os.Readlink("/proc/self/fd/" + e.Name()); link != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			var tfd int
			var events, data, pos, lino uint64
			if n, _ := fmt.Sscanf(line, "tfd: %d events: %x data: %x pos:%d ino:%x", &tfd, &events, &data, &pos, &lino); n == 5 && lino == ino {
				found = append(found, fmt.Sprintf("epoll %s: fd %d", e.Name(), tfd))
			}
		}
	}
	return found
}

// The drain learns of interactive output from an inotify watch: the
// output FIFO is in no epoll set, so Linux does not wake its readers on
// every one of QEMU's writes, and an echo still reaches a waiting call at
// once (well within watchGuard), through both modes.
func TestDrainLeavesPipeUnpolled(t *testing.T) {
	if fd, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
		t.Skipf("no inotify instance here (%v): the drain waits on the FIFO, which TestDrainWatchFallbacks tests", err)
	} else {
		unix.Close(fd)
	}
	ctx := testCtx(t)
	c := newConsole(t)
	switches := modes(t, c)
	out := rawPeer(t, c.Base())
	var st unix.Stat_t
	if err := unix.Stat(c.Base()+".out", &st); err != nil {
		t.Fatal(err)
	}
	waitMode(t, c, true, 2*time.Second)
	if !c.watching() {
		t.Fatal("the drain does not wait on an inotify watch")
	}
	echo := func(tok string) {
		t.Helper()
		start := c.Buffer().End()
		t0 := time.Now()
		typeSlowly(t, out, "echo "+tok+"\r\n"+tok+"\r\ntiny> ")
		m, err := c.Buffer().Wait(ctx, start, regexp.MustCompile(tok+`\r\ntiny> $`), 2*time.Second)
		if err != nil || !m.Matched {
			t.Fatalf("the echo of %s did not reach the wait: %+v %v", tok, m, err)
		}
		if d := time.Since(t0); d > watchGuard {
			t.Fatalf("the echo of %s took %v: the drain did not wake on the watch", tok, d)
		}
	}
	echo("one")
	if p := polledFIFOs(t, st.Ino); len(p) > 0 {
		t.Fatalf("the output FIFO is in an epoll set: %v", p)
	}
	// A flood closes the watch; quiet opens a new one.
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 32)
	floodUntilSwitch(t, switches, func(int) {
		if _, err := unix.Write(out, chunk); err != nil {
			t.Fatal(err)
		}
	})
	nextMode(t, switches, false, floodQuiet+2*time.Second)
	waitMode(t, c, true, 2*time.Second)
	echo("two")
	if !c.watching() {
		t.Fatal("after a flood the drain does not wait on an inotify watch")
	}
	if p := polledFIFOs(t, st.Ino); len(p) > 0 {
		t.Fatalf("after a flood the output FIFO is in an epoll set: %v", p)
	}
	closeWithin(t, c, "waiting on the watch")
}

// Where the watch cannot be had (here: its file is missing), or does not
// report the FIFO's writes (here: it watches another file), the drain
// waits on the FIFO itself; the output arrives whole and in order either
// way, in the second case at most about watchGuard late, once.
func TestDrainWatchFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(dir string) string
		late time.Duration
	}{
		{"no watch", func(dir string) string { return filepath.Join(dir, "missing") }, watchGuard / 2},
		{"a watch that reports nothing", func(dir string) string {
			p := filepath.Join(dir, "other")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, 2*watchGuard + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			path := tc.path(t.TempDir())
			h := func(int) string { return path }
			watchPath.Store(&h)
			t.Cleanup(func() { watchPath.Store(nil) })
			c := newConsole(t)
			out := rawPeer(t, c.Base())
			t0 := time.Now()
			typeSlowly(t, out, "hello\r\n")
			m, err := c.Buffer().Wait(ctx, 0, regexp.MustCompile(`hello\r\n$`), 5*time.Second)
			if err != nil || !m.Matched {
				t.Fatalf("the output did not arrive: %+v %v", m, err)
			}
			if d := time.Since(t0); d > tc.late {
				t.Fatalf("the output took %v, want at most %v", d, tc.late)
			}
			waitMode(t, c, true, 2*time.Second)
			if c.watching() {
				t.Fatal("the drain still waits on the watch")
			}
			// From now on the FIFO wakes it at once.
			t0 = time.Now()
			start := c.Buffer().End()
			typeSlowly(t, out, "again\r\n")
			if m, err := c.Buffer().Wait(ctx, start, regexp.MustCompile(`again\r\n$`), 5*time.Second); err != nil || !m.Matched {
				t.Fatalf("the output did not arrive: %+v %v", m, err)
			}
			if d := time.Since(t0); d > watchGuard/2 {
				t.Fatalf("waiting on the FIFO, the output took %v", d)
			}
			if got, _ := c.Buffer().Read(0, 0); string(got) != "hello\r\nagain\r\n" {
				t.Fatalf("buffer %q", got)
			}
			closeWithin(t, c, "waiting on the FIFO")
		})
	}
}
