package serial

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// transcriptChunk is how much output the writer lets pile up in the ring
// before it appends it to the transcript; larger writes go to the file
// at once. It is capped at the ring size so that nothing leaves the ring
// before it is in the file.
const transcriptChunk = 64 << 10

// transcript is the file that receives every byte a Buffer is given, in
// order, so that byte offset == cursor. Writes come only from the buffer's
// writer (under Buffer.wmu); reads (pread) may come from anyone. written
// and err are guarded by Buffer.mu.
type transcript struct {
	path     string
	dev, ino uint64

	// fmu keeps f open while a reader uses it; release takes it
	// exclusively.
	fmu sync.RWMutex
	f   *os.File  // nil once released; reads then reopen path
	w   io.Writer // where writes go: f (tests substitute a failing one)

	// written is the cursor the next byte written to the file has:
	// cursors [0, written) are in the file, except those in gaps.
	written int64
	// size is the file's size: the bytes written plus gap markers.
	size int64
	// segs map cursors to file offsets: a cursor c from segs[k].cursor on
	// (up to the next one) is at segs[k].file + c - segs[k].cursor. A new
	// segment starts after each gap and its marker.
	segs []seg
	// gaps are cursor ranges that left the ring before they could be
	// written: lost for good, and marked in the file where they were.
	gaps []Gap
	// err is the write error the transcript is stopped by, if any;
	// stoppedAt the cursor where it stopped, retryAt when to try again.
	err       error
	stoppedAt int64
	retryAt   time.Time
	// events counts stops and resumptions.
	events int
}

type seg struct{ cursor, file int64 }

// Gap is a range of cursors [From, To) that the transcript lacks: output
// that left the in-memory ring while the transcript could not be written.
type Gap struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// transcriptRetry is how often a stopped transcript is tried again.
var transcriptRetry = time.Second

// fileOffset maps cursor c (not in a gap) to its offset in the file.
func (t *transcript) fileOffset(c int64) int64 {
	s := t.segs[0]
	for _, x := range t.segs[1:] {
		if x.cursor > c {
			break
		}
		s = x
	}
	return s.file + c - s.cursor
}

// gapAt returns the gap holding cursor c, or the first gap after it.
func (t *transcript) gapAt(c int64) (g Gap, inside, after bool) {
	for _, g := range t.gaps {
		if c < g.From {
			return g, false, true
		}
		if c < g.To {
			return g, true, false
		}
	}
	return Gap{}, false, false
}

// createTranscript creates the transcript file: parent directories 0700
// (existing ones are left as they are), the file itself 0600, exclusively
// (it must not exist) and without following a symlink.
func createTranscript(path string) (*transcript, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("serial: transcript: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("serial: transcript: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("serial: transcript: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || fi.Size() != 0 {
		// O_EXCL made it; this cannot happen.
		f.Close()
		return nil, fmt.Errorf("serial: transcript %s: not the empty regular file just created", path)
	}
	return &transcript{path: path, dev: uint64(st.Dev), ino: uint64(st.Ino), f: f, w: f, segs: []seg{{0, 0}}}, nil
}

// write appends a then b to the file and returns how many bytes went in.
// Only the buffer's writer calls it, and never after release.
func (t *transcript) write(a, b []byte) (int, error) {
	n, err := t.w.Write(a)
	if err != nil || len(b) == 0 {
		return n, err
	}
	m, err := t.w.Write(b)
	return n + m, err
}

// readAt fills p from file offset off, which with p must lie within the
// bytes written. After release it opens the file again (read-only, no symlinks)
// and checks that the path still names the same file.
func (t *transcript) readAt(p []byte, off int64) error {
	t.fmu.RLock()
	if f := t.f; f != nil {
		_, err := f.ReadAt(p, off)
		t.fmu.RUnlock()
		return t.readErr(err)
	}
	t.fmu.RUnlock()
	f, err := os.OpenFile(t.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return t.readErr(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return t.readErr(err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || uint64(st.Dev) != t.dev || uint64(st.Ino) != t.ino {
		return fmt.Errorf("serial: transcript %s was replaced", t.path)
	}
	_, err = f.ReadAt(p, off)
	return t.readErr(err)
}

func (t *transcript) readErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("serial: transcript %s is shorter than what was written to it", t.path)
	default:
		return fmt.Errorf("serial: transcript: %w", err)
	}
}

// release closes the file. Only the buffer's writer side calls it.
func (t *transcript) release() error {
	t.fmu.Lock()
	defer t.fmu.Unlock()
	if t.f == nil {
		return nil
	}
	err := t.f.Close()
	t.f, t.w = nil, nil
	if err != nil {
		return fmt.Errorf("serial: transcript: %w", err)
	}
	return nil
}
