package timetravel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// guestUART plays a recording guest on the far end of a console's FIFOs,
// as QEMU's pipe chardev opens them: it reads what is typed, a write at a
// time, and answers each with what echo says.
type guestUART struct {
	mu     sync.Mutex
	writes [][]byte // what each read of the input FIFO got
	took   []byte
	done   chan struct{}
	in     *os.File
}

// startGuest opens con's FIFOs from the guest's side and answers each read
// of input with echo(what was read, all bytes read before it).
func startGuest(t *testing.T, con *serial.Console, echo func(p, before []byte) []byte) *guestUART {
	t.Helper()
	in, err := os.OpenFile(con.InPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(con.OutPath(), os.O_RDWR, 0)
	if err != nil {
		in.Close()
		t.Fatal(err)
	}
	g := &guestUART{done: make(chan struct{}), in: in}
	go func() {
		defer close(g.done)
		b := make([]byte, 256)
		for {
			n, err := in.Read(b)
			if err != nil {
				return
			}
			p := append([]byte(nil), b[:n]...)
			g.mu.Lock()
			before := append([]byte(nil), g.took...)
			g.writes = append(g.writes, p)
			g.took = append(g.took, p...)
			g.mu.Unlock()
			if e := echo(p, before); len(e) > 0 {
				out.Write(e)
			}
		}
	}()
	t.Cleanup(func() {
		in.Close()
		<-g.done
		out.Close()
	})
	return g
}

// reads is what each read of the guest's input got, and all it got.
func (g *guestUART) reads() ([]string, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, w := range g.writes {
		out = append(out, string(w))
	}
	return out, string(g.took)
}

// typeAll types in, all of which the guest must take.
func typeAll(t *testing.T, ctx context.Context, con *serial.Console, in string) {
	t.Helper()
	n, err := TypePaced(ctx, con, []byte(in))
	if err != nil || n != len(in) {
		t.Fatalf("TypePaced = %d, %v; want %d, nil", n, err, len(in))
	}
}

// typeUnechoed types in to a guest that takes only its first taken bytes
// and then stops echoing; it is the NoEchoError that says so.
func typeUnechoed(t *testing.T, ctx context.Context, con *serial.Console, in string, taken int) *NoEchoError {
	t.Helper()
	n, err := TypePaced(ctx, con, []byte(in))
	var ne *NoEchoError
	if n != taken || !errors.As(err, &ne) || !errors.Is(err, ErrNoEcho) {
		t.Fatalf("TypePaced = %d, %v; want %d and a NoEchoError", n, err, taken)
	}
	return ne
}

// deafAfter answers as tinyEcho for the first n bytes the guest reads,
// and echoes nothing after them.
func deafAfter(n int) func(p, before []byte) []byte {
	return func(p, before []byte) []byte {
		if len(before) >= n {
			return nil
		}
		return tinyEcho(p, before)
	}
}

func newSerial(t *testing.T) *serial.Console {
	t.Helper()
	con, err := serial.Create(filepath.Join(t.TempDir(), "serial"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	return con
}

// tinyEcho answers as the tiny kernel's line editor: printable bytes
// echoed, a line ending echoed as a new line (an LF right after a CR is
// ignored), other control characters not echoed.
func tinyEcho(p, before []byte) []byte {
	var e []byte
	prev := byte(0)
	if len(before) > 0 {
		prev = before[len(before)-1]
	}
	for _, c := range p {
		switch {
		case c == '\n' && prev == '\r':
		case c == '\r' || c == '\n':
			e = append(e, "\r\n"...)
		case c >= 0x20 && c < 0x7f:
			e = append(e, c)
		}
		prev = c
	}
	return e
}

// A guest that echoes what it is given takes all of it, chunk by chunk,
// each after it echoed the last.
func TestTypePacedTakesAll(t *testing.T) {
	// A shell that answers Ctrl-C with "^C" and a new line.
	ctrlC := func(p, before []byte) []byte {
		if bytes.Equal(p, []byte{3}) {
			return []byte("^C\r\n")
		}
		return tinyEcho(p, before)
	}
	for _, c := range []struct {
		name  string
		echo  func(p, before []byte) []byte
		in    string
		reads []string
		shows string // what the console shows, where the case says
	}{
		// Four bytes at a time, a line ending alone.
		{"chunks", tinyEcho, "echo hello\rhelp\r", []string{"echo", " hel", "lo", "\r", "help", "\r"}, "echo hello\r\nhelp\r\n"},
		// A line ending that starts a chunk goes alone, as does one after
		// text: its echo is a new line, which is all that is waited for.
		// Control characters are taken once the guest printed anything
		// after them.
		{"line endings and controls", ctrlC, "\nab\n\x03", []string{"\n", "ab", "\n", "\x03"}, ""},
		// A CR LF pair is one line ending: a guest that ends the line at
		// the CR and ignores the LF after it (the tiny kernel, many line
		// editors) echoes one new line for both, and takes them.
		{"CR LF", tinyEcho, "echo\r\nhelp\r\n", []string{"echo", "\r\n", "help", "\r\n"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			con := newSerial(t)
			g := startGuest(t, con, c.echo)
			typeAll(t, ctx, con, c.in)
			if reads, took := g.reads(); took != c.in || !slices.Equal(reads, c.reads) {
				t.Errorf("the guest read %q (%q), want %q", reads, took, c.reads)
			}
			if out, _ := con.Buffer().Read(0, 1<<10); c.shows != "" && string(out) != c.shows {
				t.Errorf("the console shows %q, want %q", out, c.shows)
			}
		})
	}
}

// A guest that echoes nothing takes nothing: the first chunk is the one
// not echoed, and no more is typed.
func TestTypePacedNoEcho(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	con := newSerial(t)
	g := startGuest(t, con, func(p, before []byte) []byte { return nil })
	ne := typeUnechoed(t, ctx, con, "echo hi\r", 0)
	if ne.From != 0 || string(ne.Chunk) != "echo" || ne.Within != echoWait {
		t.Errorf("NoEchoError %+v, want bytes 0..4 (\"echo\") within %v", ne, echoWait)
	}
	if _, took := g.reads(); took != "echo" {
		t.Errorf("the guest was given %q after it echoed nothing", took)
	}
}

// A guest that stops echoing part way took the bytes before the chunk it
// did not echo: From says where that chunk starts.
func TestTypePacedPartialEcho(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	con := newSerial(t)
	g := startGuest(t, con, deafAfter(8))
	in := "echo hello world\r"
	ne := typeUnechoed(t, ctx, con, in, 8)
	if ne.From != 8 || string(ne.Chunk) != "lo w" {
		t.Errorf("NoEchoError from %d chunk %q, want from 8 chunk \"lo w\"", ne.From, ne.Chunk)
	}
	if _, took := g.reads(); took != "echo hello w" {
		t.Errorf("the guest was given %q", took)
	}
}

// Cancelling the call ends the wait for an echo at once, with what was
// taken so far.
func TestTypePacedCancelled(t *testing.T) {
	t.Parallel()
	con := newSerial(t)
	g := startGuest(t, con, deafAfter(4))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, took := g.reads(); len(took) > 4 {
				cancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	t0 := time.Now()
	n, err := TypePaced(ctx, con, []byte("echo hello\r"))
	if n != 4 || !errors.Is(err, context.Canceled) || errors.Is(err, ErrNoEcho) {
		t.Fatalf("TypePaced = %d, %v; want 4 and the cancellation", n, err)
	}
	if d := time.Since(t0); d >= echoWait {
		t.Errorf("the cancelled call returned after %v, no sooner than the echo's wait", d)
	}
}

// Nothing to type is nothing taken.
func TestTypePacedNothing(t *testing.T) {
	t.Parallel()
	con := newSerial(t)
	g := startGuest(t, con, tinyEcho)
	if n, err := TypePaced(testContext(t), con, nil); n != 0 || err != nil {
		t.Fatalf("TypePaced(nil) = %d, %v", n, err)
	}
	if reads, _ := g.reads(); len(reads) != 0 {
		t.Errorf("the guest read %q", reads)
	}
}
