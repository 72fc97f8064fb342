package timetravel

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// console is what the buffer shows, whole.
func console(t *testing.T, b *serial.Buffer) string {
	t.Helper()
	p, err := b.ReadPage(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return string(p.Data)
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// The console shows a replay's output once, up to the furthest point the
// replay reached: going back and printing the same bytes again adds
// nothing, and what comes after the furthest point is added once the
// replay passes it. A start from a checkpoint goes on from the console
// position the checkpoint saved.
func TestPumpShowsEachByteOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	buf := serial.NewBuffer()
	p, err := newPump(path, buf, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()

	appendTo(t, path, "OpenSBI\r\n")
	appendTo(t, path, "tiny> ")
	p.sync()
	if got := console(t, buf); got != "OpenSBI\r\ntiny> " {
		t.Fatalf("after the first run: %q", got)
	}
	if p.position() != 15 {
		t.Errorf("position %d, want 15", p.position())
	}
	// Back to the start: QEMU prints the same again, and a little less.
	p.reset(0)
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Errorf("the console file was not emptied at the reset: %d bytes", fi.Size())
	}
	appendTo(t, path, "OpenSBI\r\n")
	p.sync()
	if got := console(t, buf); got != "OpenSBI\r\ntiny> " {
		t.Fatalf("after a replay from the start: %q", got)
	}
	// Past the furthest point: the new bytes only.
	appendTo(t, path, "tiny> echo 7\r\n")
	p.sync()
	if got := console(t, buf); got != "OpenSBI\r\ntiny> echo 7\r\n" {
		t.Fatalf("past the furthest point: %q", got)
	}
	// A checkpoint saved at console position 9 ("OpenSBI\r\n" printed).
	p.reset(9)
	appendTo(t, path, "tiny> echo 7\r\n7\r\n")
	p.sync()
	if got := console(t, buf); got != "OpenSBI\r\ntiny> echo 7\r\n7\r\n" {
		t.Fatalf("from a checkpoint: %q", got)
	}
	if p.position() != 9+17 {
		t.Errorf("position %d, want %d", p.position(), 9+17)
	}
}

// The pump follows what QEMU writes without being asked (inotify), and
// closing it reads what is left first; a second close does nothing.
func TestPumpFollowsAndCloses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	buf := serial.NewBuffer()
	p, err := newPump(path, buf, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, "hello\r\n")
	deadline := time.Now().Add(5 * time.Second)
	for console(t, buf) != "hello\r\n" {
		if time.Now().After(deadline) {
			t.Fatalf("the pump did not follow the file: %q", console(t, buf))
		}
		time.Sleep(5 * time.Millisecond)
	}
	appendTo(t, path, "bye\r\n")
	p.close()
	if got := console(t, buf); got != "hello\r\nbye\r\n" {
		t.Errorf("after close: %q", got)
	}
	p.close()
	appendTo(t, path, "more")
	p.sync()
	if got := console(t, buf); got != "hello\r\nbye\r\n" {
		t.Errorf("a closed pump read on: %q", got)
	}
}

func TestNewPumpMissingFile(t *testing.T) {
	if _, err := newPump(filepath.Join(t.TempDir(), "none"), serial.NewBuffer(), slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a pump of a missing file started")
	}
}
