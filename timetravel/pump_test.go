package timetravel

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// console is a replay's console file as QEMU writes it (appending), and
// the pump that copies it into a buffer.
type console struct {
	t    *testing.T
	path string
	f    *os.File
	buf  *serial.Buffer
	p    *pump
}

func newConsole(t *testing.T) *console { return newConsoleOf(t, recorded{}) }

// newConsoleOf is a console whose recording printed rec.
func newConsoleOf(t *testing.T, rec recorded) *console {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rrcon.log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	buf := serial.NewBuffer()
	p, err := newPump(path, buf, discard(), rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return &console{t: t, path: path, f: f, buf: buf, p: p}
}

// print is QEMU printing s.
func (c *console) print(s string) {
	c.t.Helper()
	if _, err := c.f.WriteString(s); err != nil {
		c.t.Fatal(err)
	}
}

// shows waits until the buffer holds exactly want (the pump follows the
// file by itself), and fails the test if it does not within a few seconds.
func (c *console) shows(want string) {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := c.buf.Read(0, 1<<20)
		if string(got) == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("console shows %q, want %q", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holds checks that the buffer holds exactly want now.
func (c *console) holds(want string) {
	c.t.Helper()
	if got, _ := c.buf.Read(0, 1<<20); string(got) != want {
		c.t.Fatalf("console holds %q, want %q", got, want)
	}
}

// What QEMU appends to the console file reaches the buffer by itself, in
// order, however it is cut into writes.
func TestPumpFollowsTheFile(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.print("qemu-mcp tiny")
	c.shows("qemu-mcp tiny")
	c.print(" kernel 1.0\r\n")
	c.print("tiny> ")
	c.shows("qemu-mcp tiny kernel 1.0\r\ntiny> ")
	if got := c.p.position(); got != int64(len("qemu-mcp tiny kernel 1.0\r\ntiny> ")) {
		t.Errorf("position %d after %d bytes", got, len("qemu-mcp tiny kernel 1.0\r\ntiny> "))
	}
}

// A file larger than one read is copied whole.
func TestPumpCopiesMoreThanOneRead(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	big := make([]byte, 100<<10+17)
	for k := range big {
		big[k] = 'a' + byte(k%26)
	}
	c.print(string(big))
	c.p.sync()
	c.holds(string(big))
}

// sync copies at once what the file has: a caller that syncs sees what
// QEMU printed before, without waiting for the follower.
func TestPumpSync(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	for k := range 50 {
		s := string(rune('a' + k%26))
		c.print(s)
		c.p.sync()
		if got, _ := c.buf.Read(int64(k), 10); string(got) != s {
			t.Fatalf("after sync %d: byte %q, want %q", k, got, s)
		}
	}
}

// Going back to the start makes QEMU print the same bytes again: the
// console shows them once, and what QEMU prints past what it had printed
// before comes after them. The file starts over at each reset.
func TestPumpResetShowsReprintedBytesOnce(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.print("boot\r\ntiny> ")
	c.shows("boot\r\ntiny> ")

	c.p.reset(0)
	if fi, err := os.Stat(c.path); err != nil || fi.Size() != 0 {
		t.Fatalf("the console file after a reset: %v %v, want it empty", fi, err)
	}
	if got := c.p.position(); got != 0 {
		t.Errorf("position %d after a reset to 0", got)
	}
	c.print("boot\r\n")
	c.p.sync()
	c.holds("boot\r\ntiny> ")
	c.print("tiny> echo hi\r\n")
	c.shows("boot\r\ntiny> echo hi\r\n")
	if got := c.p.position(); got != int64(len("boot\r\ntiny> echo hi\r\n")) {
		t.Errorf("position %d, want the stream's %d", got, len("boot\r\ntiny> echo hi\r\n"))
	}
}

// A reset to a start point within the stream (a checkpoint's console
// position) counts the file's bytes from there.
func TestPumpResetToBase(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.print("0123456789")
	c.shows("0123456789")
	c.p.reset(4)
	c.print("456789ab")
	c.shows("0123456789ab")
	if got := c.p.position(); got != 12 {
		t.Errorf("position %d, want 12", got)
	}
}

// What QEMU printed before a reset, and not yet copied, is kept: the reset
// reads the file before it empties it.
func TestPumpResetKeepsWhatWasPrinted(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.print("printed just before the load")
	c.p.reset(0)
	c.holds("printed just before the load")
}

// After close nothing more is copied, and a second close does nothing;
// close copies what the file had.
func TestPumpClose(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.print("last words")
	c.p.close()
	c.holds("last words")
	c.print(" unseen")
	c.p.sync()
	// Longer than the follower's poll.
	time.Sleep(300 * time.Millisecond)
	c.holds("last words")
	c.p.close()
}

// A console file that does not exist cannot be followed.
func TestPumpNeedsItsFile(t *testing.T) {
	t.Parallel()
	if _, err := newPump(filepath.Join(t.TempDir(), "none"), serial.NewBuffer(), discard(), recorded{}); err == nil {
		t.Fatal("a pump on a missing file started")
	}
}

// A load of a start point past the furthest the replay reached (a
// checkpoint an earlier replay kept) skips output: the console fills it
// in from what the recording printed, and shows what QEMU prints from
// there on.
func TestPumpLoadAhead(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "console.log")
	const all = "0123456789abcdef"
	if err := os.WriteFile(path, []byte(all), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newConsoleOf(t, recorded{path: path, end: int64(len(all))})
	c.print("0123")
	c.shows("0123")
	c.p.reset(10)
	c.print("abc")
	c.shows("0123456789abc")
	if got := c.p.position(); got != 13 {
		t.Errorf("position %d, want 13", got)
	}
	// Back to the start, the same again adds nothing.
	c.p.reset(0)
	c.print("0123456789abcd")
	c.shows("0123456789abcd")
}

// Without the recording's console (its server died while it recorded),
// what a load ahead skipped cannot be shown, but what follows is.
func TestPumpLoadAheadWithoutTheRecordingsConsole(t *testing.T) {
	t.Parallel()
	c := newConsoleOf(t, recorded{path: filepath.Join(t.TempDir(), "console.log")})
	c.print("0123")
	c.shows("0123")
	c.p.reset(10)
	c.print("abc")
	c.shows("0123abc")
	c.p.reset(0)
	c.print("0123456789abcd")
	c.shows("0123abcd")
}

// A recording's console.log that lost its start (the console's ring
// dropped it) holds the stream's last bytes: they fill what they can.
func TestPumpLoadAheadFromATruncatedConsole(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(path, []byte("89abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newConsoleOf(t, recorded{path: path, end: 16})
	c.print("0123")
	c.shows("0123")
	c.p.reset(12)
	c.print("cd")
	c.shows("012389abcd")
}
