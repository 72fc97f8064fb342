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

// printShows is QEMU printing s, after which the console shows want.
func (c *console) printShows(s, want string) {
	c.t.Helper()
	c.print(s)
	c.shows(want)
}

// syncHolds syncs the pump, after which the buffer holds exactly want
// without waiting for the follower.
func (c *console) syncHolds(want string) {
	c.t.Helper()
	c.p.sync()
	c.holds(want)
}

// at checks that the pump's stream position is want.
func (c *console) at(want int64) {
	c.t.Helper()
	if got := c.p.position(); got != want {
		c.t.Errorf("position %d, want %d", got, want)
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
	c.printShows("qemu-mcp tiny", "qemu-mcp tiny")
	c.print(" kernel 1.0\r\n")
	c.printShows("tiny> ", "qemu-mcp tiny kernel 1.0\r\ntiny> ")
	c.at(int64(len("qemu-mcp tiny kernel 1.0\r\ntiny> ")))
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
	c.syncHolds(string(big))
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
	c.printShows("boot\r\ntiny> ", "boot\r\ntiny> ")

	c.p.reset(0)
	if fi, err := os.Stat(c.path); err != nil || fi.Size() != 0 {
		t.Fatalf("the console file after a reset: %v %v, want it empty", fi, err)
	}
	c.at(0)
	c.print("boot\r\n")
	c.syncHolds("boot\r\ntiny> ")
	c.printShows("tiny> echo hi\r\n", "boot\r\ntiny> echo hi\r\n")
	c.at(int64(len("boot\r\ntiny> echo hi\r\n")))
}

// A reset to a start point within the stream (a checkpoint's console
// position) counts the file's bytes from there.
func TestPumpResetToBase(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.printShows("0123456789", "0123456789")
	c.p.reset(4)
	c.printShows("456789ab", "0123456789ab")
	c.at(12)
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
	c.printShows("0123", "0123")
	c.p.reset(10)
	c.printShows("abc", "0123456789abc")
	c.at(13)
	// Back to the start, the same again adds nothing.
	c.p.reset(0)
	c.printShows("0123456789abcd", "0123456789abcd")
}

// Without the recording's console (its server died while it recorded),
// what a load ahead skipped cannot be shown, but what follows is.
func TestPumpLoadAheadWithoutTheRecordingsConsole(t *testing.T) {
	t.Parallel()
	c := newConsoleOf(t, recorded{path: filepath.Join(t.TempDir(), "console.log")})
	c.printShows("0123", "0123")
	c.p.reset(10)
	c.printShows("abc", "0123abc")
	c.p.reset(0)
	c.printShows("0123456789abcd", "0123abcd")
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
	c.printShows("0123", "0123")
	c.p.reset(12)
	c.printShows("cd", "012389abcd")
}
