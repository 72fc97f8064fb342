package serial

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// randomBytes returns n deterministic pseudo-random bytes.
func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// writeChunks writes data to b in chunks of random sizes up to maxChunk.
func writeChunks(t testing.TB, b *Buffer, data []byte, maxChunk int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	for off := 0; off < len(data); {
		n := min(1+rng.IntN(maxChunk), len(data)-off)
		if k, err := b.Write(data[off : off+n]); k != n || err != nil {
			t.Errorf("Write: %d, %v", k, err)
			return
		}
		off += n
	}
}

// readAll pages through b from 0 to End with ReadPage and checks that no
// page reports a loss.
func readAll(t testing.TB, b *Buffer, page int) []byte {
	t.Helper()
	var got []byte
	for cur := int64(0); cur < b.End(); {
		p, err := b.ReadPage(cur, page)
		if err != nil || p.Lost != 0 || p.Start != cur || p.Next != cur+int64(len(p.Data)) || len(p.Data) == 0 {
			t.Fatalf("ReadPage(%d, %d): start %d next %d len %d lost %d err %v", cur, page, p.Start, p.Next, len(p.Data), p.Lost, err)
		}
		got = append(got, p.Data...)
		cur = p.Next
	}
	return got
}

func TestRingStoreModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, size := range []int{1, 2, 7, 100, 4096, 10000} {
		s := ringStore{size: size}
		var all []byte
		var views [][]byte // earlier views must never change
		var viewFrom []int64
		for range 400 {
			p := randomBytes(rng.IntN(2*size+3), rng.Uint64())
			s.append(p)
			all = append(all, p...)
			end := int64(len(all))
			if s.end() != end || s.oldest() != max(0, end-int64(size)) {
				t.Fatalf("size %d: end %d oldest %d, want %d %d", size, s.end(), s.oldest(), end, max(0, end-int64(size)))
			}
			from := s.oldest() + rng.Int64N(end-s.oldest()+1)
			v := s.view(from, end)
			if !bytes.Equal(v, all[from:end]) {
				t.Fatalf("size %d: view(%d, %d) wrong", size, from, end)
			}
			if cap(s.data) > 2*size && cap(s.data) > 4096 {
				t.Fatalf("size %d: array capacity %d", size, cap(s.data))
			}
			views, viewFrom = append(views, v), append(viewFrom, from)
		}
		for i, v := range views {
			if !bytes.Equal(v, all[viewFrom[i]:viewFrom[i]+int64(len(v))]) {
				t.Fatalf("size %d: view %d changed after later appends", size, i)
			}
		}
	}
}

// TestRingTranscriptReads: 1 MiB through a 64 KiB ring with a transcript;
// every read, from the ring, the file or both, is byte-exact, also while
// writing, after Finish and after Close.
func TestRingTranscriptReads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "captures", "sub", "serial-1-1.log")
	b, err := OpenBuffer(WithRingSize(64<<10), WithTranscript(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(dir, "captures"), filepath.Dir(path)} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, %v; want a 0700 directory", d, fi.Mode(), err)
		}
	}
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("transcript: %v, %v; want a 0600 file", fi.Mode(), err)
	}
	if b.TranscriptPath() != path {
		t.Fatalf("TranscriptPath %q", b.TranscriptPath())
	}
	want := randomBytes(1<<20, 7)

	// Readers page through while the writer writes.
	var wg sync.WaitGroup
	done := make(chan struct{})
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for {
				select {
				case <-done:
					return
				default:
				}
				since := rng.Int64N(b.End() + 1)
				p, err := b.ReadPage(since, 1+rng.IntN(100<<10))
				if err != nil || p.Lost != 0 || p.Start != since || !bytes.Equal(p.Data, want[since:p.Next]) {
					t.Errorf("concurrent ReadPage(%d): start %d next %d lost %d err %v, equal %v",
						since, p.Start, p.Next, p.Lost, err, bytes.Equal(p.Data, want[since:min(p.Next, int64(len(want)))]))
					return
				}
			}
		})
	}
	writeChunks(t, b, want, 20000, 8)
	close(done)
	wg.Wait()

	if b.End() != int64(len(want)) || b.Oldest() != int64(len(want)-64<<10) {
		t.Fatalf("End %d Oldest %d", b.End(), b.Oldest())
	}
	for _, page := range []int{1000, 64 << 10, 100 << 10, 0} {
		if got := readAll(t, b, page); !bytes.Equal(got, want) {
			t.Fatalf("paging by %d: %d bytes, not equal to the %d written", page, len(got), len(want))
		}
	}
	// A page spanning transcript and ring, and the old Read.
	since := b.Oldest() - 5000
	if data, next := b.Read(since, 10000); next != since+10000 || !bytes.Equal(data, want[since:next]) {
		t.Fatalf("Read across the ring's start: next %d", next)
	}

	b.Finish()
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("transcript after Finish: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Close removed the transcript: %v", err)
	}
	// Still readable after Close: the file is opened again for the read.
	if got := readAll(t, b, 300<<10); !bytes.Equal(got, want) {
		t.Fatal("reads after Close differ")
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("transcript after Close: %d bytes, %v", len(got), err)
	}
	// A replaced file is not read.
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadPage(0, 10); err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("ReadPage from a replaced transcript: %v", err)
	}
}

// TestRingWithoutTranscript: reads before the ring report the loss.
func TestRingWithoutTranscript(t *testing.T) {
	b, err := OpenBuffer(WithRingSize(64 << 10))
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(1<<20, 9)
	writeChunks(t, b, want, 10000, 10)
	oldest := b.Oldest()
	if oldest != int64(len(want)-64<<10) {
		t.Fatalf("Oldest %d", oldest)
	}
	p, err := b.ReadPage(1000, 500)
	if err != nil || p.Lost != oldest-1000 || p.Start != oldest || p.Next != oldest+500 || !bytes.Equal(p.Data, want[oldest:oldest+500]) {
		t.Fatalf("ReadPage before the ring: start %d next %d lost %d err %v", p.Start, p.Next, p.Lost, err)
	}
	// The old Read gives what is there: data starts at next-len(data).
	data, next := b.Read(0, 0)
	if next != int64(len(want)) || !bytes.Equal(data, want[oldest:]) {
		t.Fatalf("Read(0, 0): %d bytes, next %d", len(data), next)
	}
	// Within the ring nothing is lost.
	if p, err := b.ReadPage(oldest+10, 0); err != nil || p.Lost != 0 || !bytes.Equal(p.Data, want[oldest+10:]) {
		t.Fatalf("ReadPage in the ring: lost %d err %v", p.Lost, err)
	}
	if b.TranscriptPath() != "" || b.TranscriptErr() != nil || b.Flush() != nil || b.Close() != nil {
		t.Fatal("transcript methods without a transcript")
	}
}

// failWriter passes ok bytes to w, then fails.
type failWriter struct {
	w  *os.File
	ok int
}

func (f *failWriter) Write(p []byte) (int, error) {
	n := min(len(p), f.ok)
	if n > 0 {
		n, _ = f.w.Write(p[:n])
		f.ok -= n
	}
	if n < len(p) {
		return n, errors.New("disk on fire")
	}
	return n, nil
}

// TestTranscriptWriteFailure: a failing transcript is logged and marked
// broken; the ring goes on, what the file has stays readable, and the gap
// is reported.
func TestTranscriptWriteFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.log")
	var logged bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil))
	b, err := OpenBuffer(WithRingSize(64<<10), WithTranscript(path), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(1<<20, 11)
	writeChunks(t, b, want[:200<<10], 5000, 12)
	const okBytes = 50000
	b.wmu.Lock()
	b.tr.w = &failWriter{w: b.tr.f, ok: okBytes}
	b.wmu.Unlock()
	before := b.tr.written // the writer is idle: no race
	writeChunks(t, b, want[200<<10:], 5000, 13)

	terr := b.TranscriptErr()
	if terr == nil || !strings.Contains(terr.Error(), "disk on fire") {
		t.Fatalf("TranscriptErr = %v", terr)
	}
	logMu.Lock()
	if !strings.Contains(logged.String(), "transcript write failed") {
		t.Errorf("nothing logged: %q", logged.String())
	}
	logMu.Unlock()
	inFile := before + okBytes
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want[:inFile]) {
		t.Fatalf("transcript: %d bytes, %v; want the first %d", len(got), err, inFile)
	}
	// The ring is intact.
	oldest := b.Oldest()
	if b.End() != int64(len(want)) || oldest != int64(len(want)-64<<10) {
		t.Fatalf("End %d Oldest %d", b.End(), oldest)
	}
	// Reading from 0: the file's bytes, then the gap, then the ring.
	var pages []Page
	for cur := int64(0); cur < b.End(); {
		p, err := b.ReadPage(cur, 30000)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, p)
		cur = p.Next
	}
	var got []byte
	var lost int64
	for _, p := range pages {
		if p.Lost > 0 {
			if lost != 0 || p.Start != oldest || int64(len(got)) != inFile {
				t.Fatalf("loss reported at %d (lost %d) after %d bytes", p.Start, p.Lost, len(got))
			}
			lost = p.Lost
			got = append(got, make([]byte, p.Lost)...)
		}
		got = append(got, p.Data...)
	}
	if lost != oldest-inFile {
		t.Fatalf("lost %d, want %d", lost, oldest-inFile)
	}
	if !bytes.Equal(got[:inFile], want[:inFile]) || !bytes.Equal(got[oldest:], want[oldest:]) {
		t.Fatal("pages differ from what was written")
	}
	// Writing goes on; Flush reports the breakage.
	if n, err := b.Write([]byte("more")); n != 4 || err != nil {
		t.Fatalf("Write after breakage: %d, %v", n, err)
	}
	if err := b.Flush(); err == nil {
		t.Fatal("Flush on a broken transcript succeeded")
	}
	m, err := b.Wait(testCtx(t), oldest, regexp.MustCompile(`more\z`), time.Second)
	if err != nil || !m.Matched {
		t.Fatalf("Wait on the ring after breakage: %+v, %v", m.Matched, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestTranscriptRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "old.log")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.log")
	if err := os.Symlink(filepath.Join(dir, "target.log"), link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{existing, link} {
		if _, err := OpenBuffer(WithTranscript(path)); !errors.Is(err, fs.ErrExist) {
			t.Errorf("OpenBuffer over %s: %v", path, err)
		}
	}
	if data, _ := os.ReadFile(existing); string(data) != "keep me" {
		t.Fatalf("existing transcript changed: %q", data)
	}
	if _, err := os.Lstat(filepath.Join(dir, "target.log")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("symlink followed")
	}
	// Create fails too, and leaves no FIFOs behind.
	if _, err := Create(testBase(dir, 5), WithTranscript(existing)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create with an existing transcript: %v", err)
	}
	for _, suffix := range []string{".in", ".out"} {
		if _, err := os.Lstat(filepath.Join(dir, "serial-5"+suffix)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("FIFO %s left behind: %v", suffix, err)
		}
	}
}

// TestConsoleTranscript: a console with a small ring and a transcript;
// the transcript is complete soon after the guest goes quiet (without
// Finish), after Finish and after Close, and the buffer reads back
// byte-exact after Close.
func TestConsoleTranscript(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "captures", fmt.Sprintf("serial-%d-1.log", os.Getpid()))
	c, err := Create(testBase(dir, 77), WithRingSize(64<<10), WithTranscript(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := openPeer(t, c.Base())
	want := append(randomBytes(1<<20, 13), "\nEND-OF-OUTPUT\n"...)
	flood := want[:len(want):len(want)]
	go func() {
		for off := 0; off < len(flood); off += 4096 {
			p.out.Write(flood[off:min(off+4096, len(flood))])
		}
	}()
	m, err := c.Buffer().Wait(ctx, 0, regexp.MustCompile(`END-OF-OUTPUT\n`), 10*time.Second)
	if err != nil || !m.Matched || m.Cursor != int64(len(want)) {
		t.Fatalf("Wait: matched %v cursor %d err %v", m.Matched, m.Cursor, err)
	}
	// Wait's Output comes from the transcript where the ring lost it.
	if m.Since != 0 || !bytes.Equal(m.Output, want) {
		t.Fatalf("Wait output: since %d, %d bytes, equal %v", m.Since, len(m.Output), bytes.Equal(m.Output, want))
	}
	// The drain flushes when the pipe runs empty.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := os.ReadFile(path)
		if err == nil && bytes.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transcript incomplete while the guest is quiet: %d of %d bytes, %v", len(got), len(want), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := readAll(t, c.Buffer(), 50000); !bytes.Equal(got, want) {
		t.Fatal("paged reads differ")
	}
	tail := []byte("last words\n")
	p.out.Write(tail)
	want = append(want[:len(want):len(want)], tail...)
	p.close()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("transcript after Finish: %d bytes, %v", len(got), err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("transcript after Close: %d bytes, %v", len(got), err)
	}
	if got := readAll(t, c.Buffer(), 0); !bytes.Equal(got, want) {
		t.Fatal("reads after Close differ")
	}
}
