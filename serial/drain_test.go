package serial

import (
	"bytes"
	"os"
	"testing"
	"time"
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
		// notices (one that ends before the drain's first read is
		// read in one piece, and rightly is not one).
		for k := 0; ; k++ {
			put(bytes.Repeat([]byte{'a' + byte((round*64+k)%26)}, 512))
			time.Sleep(50 * time.Microsecond)
			select {
			case flood := <-switches:
				if !flood {
					t.Fatal("the drain left flood mode without having entered it")
				}
			default:
				if k < 20000 {
					continue
				}
				t.Fatal("the drain did not enter flood mode during 10 MB of output")
			}
			break
		}
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
	dir := t.TempDir()
	tr := dir + "/transcript.log"
	c, err := Create(testBase(dir, 1), WithTranscript(tr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := openPeer(t, c.Base())
	waitMode(t, c, true, 2*time.Second)
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
