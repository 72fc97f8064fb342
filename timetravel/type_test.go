package timetravel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// guest is the far end of a console: it reads what the server types, and
// echoes the bytes echo lets through.
type guest struct {
	mu    sync.Mutex
	reads []string
}

func startGuest(t *testing.T, echo func(typed int, b []byte) []byte) (*serial.Console, *guest) {
	t.Helper()
	dir, err := os.MkdirTemp("", "tt") // short: a FIFO's path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	base := filepath.Join(dir, "con")
	con, err := serial.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	in, err := os.OpenFile(base+".in", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(base+".out", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); out.Close() })
	g := &guest{}
	go func() {
		b := make([]byte, 64)
		typed := 0
		for {
			n, err := in.Read(b)
			if err != nil {
				return
			}
			g.mu.Lock()
			g.reads = append(g.reads, string(b[:n]))
			g.mu.Unlock()
			if e := echo(typed, b[:n]); len(e) > 0 {
				out.Write(e)
			}
			typed += n
		}
	}()
	return con, g
}

func (g *guest) got() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.reads...)
}

// A recording guest is given input a few bytes at a time, each after it
// echoed the last, and a line ending alone: all of it is taken.
func TestTypePacedEchoed(t *testing.T) {
	con, g := startGuest(t, func(_ int, b []byte) []byte {
		return []byte(strings.ReplaceAll(string(b), "\r", "\r\n"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := TypePaced(ctx, con, []byte("echo hello\r"))
	if err != nil || n != 11 {
		t.Fatalf("TypePaced: %d %v", n, err)
	}
	reads := g.got()
	if strings.Join(reads, "") != "echo hello\r" {
		t.Fatalf("the guest read %q", reads)
	}
	for _, r := range reads {
		if len(r) > typeChunk || (strings.Contains(r, "\r") && r != "\r") {
			t.Errorf("the guest was given %q at once (reads %q)", r, reads)
		}
	}
}

// A guest that stops echoing is given nothing more, and the error says
// which bytes it took and which chunk it did not echo.
func TestTypePacedStopsWithoutEcho(t *testing.T) {
	con, g := startGuest(t, func(typed int, b []byte) []byte {
		if typed >= typeChunk {
			return nil
		}
		return b
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	n, err := TypePaced(ctx, con, []byte("abcdefgh\r"))
	var ne *NoEchoError
	if !errors.As(err, &ne) || !errors.Is(err, ErrNoEcho) {
		t.Fatalf("TypePaced: %d %v", n, err)
	}
	if n != 4 || ne.From != 4 || string(ne.Chunk) != "efgh" || ne.Within != echoWait {
		t.Errorf("took %d; error %+v", n, ne)
	}
	if !strings.Contains(err.Error(), `bytes 4..8 ("efgh")`) {
		t.Errorf("the error does not name the chunk: %v", err)
	}
	if d := time.Since(start); d < echoWait || d > echoWait+3*time.Second {
		t.Errorf("gave up after %v, want about %v", d, echoWait)
	}
	if got := strings.Join(g.got(), ""); got != "abcdefgh" {
		t.Errorf("the guest was given %q", got)
	}
}

// A caller that gives up ends the typing at once.
func TestTypePacedCancelled(t *testing.T) {
	con, _ := startGuest(t, func(int, []byte) []byte { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	n, err := TypePaced(ctx, con, []byte("abcdefgh"))
	if err == nil || n != 0 {
		t.Fatalf("TypePaced after cancel: %d %v", n, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the cancelled typing took %v", d)
	}
}
