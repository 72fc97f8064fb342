package serial

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testfs"
)

// readWithGaps pages through the buffer from 0, the gaps as zero bytes.
func readWithGaps(t *testing.T, b *Buffer) (got []byte, gaps []Gap) {
	t.Helper()
	for cur := int64(0); cur < b.End(); {
		p, err := b.ReadPage(cur, 50000)
		if err != nil {
			t.Fatal(err)
		}
		if p.Lost > 0 {
			gaps = append(gaps, Gap{From: p.Start - p.Lost, To: p.Start})
			got = append(got, make([]byte, p.Lost)...)
		}
		got = append(got, p.Data...)
		cur = p.Next
	}
	return got, gaps
}

// A transcript on a file system that fills up: it stops with the error, the
// ring keeps the output, and when space returns it resumes, first writing
// what the ring still holds. With a gap (more output than the ring while
// full) the file marks it and reads report it as lost; without one the
// file is complete.
func TestTranscriptFullDisk(t *testing.T) {
	defer func(d time.Duration) { transcriptRetry = d }(transcriptRetry)
	transcriptRetry = 50 * time.Millisecond
	for _, tc := range []struct {
		name      string
		whileFull int // bytes written while the disk is full
	}{{"gap", 300 << 10}, {"no gap", 40 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testfs.Tmpfs(t, 1<<20)
			path := filepath.Join(dir, "t.log")
			const ring = 64 << 10
			b, err := OpenBuffer(WithRingSize(ring), WithTranscript(path))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			want := randomBytes(600<<10, 21)
			writeChunks(t, b, want[:100<<10], 3000, 22)
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			free := testfs.Fill(t, dir, 0)
			// Fill to the brim, then what comes while it is full.
			k := 100 << 10
			for ; b.TranscriptErr() == nil && k < len(want)-tc.whileFull; k += 1000 {
				b.Write(want[k : k+1000])
				b.Flush()
			}
			st := b.TranscriptStatus()
			if st.Err == nil || !strings.Contains(st.Err.Error(), "no space left") || !strings.Contains(st.Err.Error(), fmt.Sprintf("stopped at cursor %d", st.StoppedAt)) {
				t.Fatalf("status %+v", st)
			}
			stopped := st.StoppedAt
			writeChunks(t, b, want[k:k+tc.whileFull], 3000, 23)
			k += tc.whileFull
			if b.Flush() == nil {
				t.Fatal("flush on a full disk succeeded")
			}
			oldest := b.Oldest()
			free()
			time.Sleep(2 * transcriptRetry)
			if err := b.Flush(); err != nil {
				t.Fatalf("flush once space returned: %v", err)
			}
			writeChunks(t, b, want[k:], 3000, 24)
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			st = b.TranscriptStatus()
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got, gaps := readWithGaps(t, b)
			if oldest <= stopped {
				// The ring still held everything: nothing lost.
				if st.Err != nil || len(st.Gaps) != 0 || !bytes.Equal(file, want) || !bytes.Equal(got, want) || len(gaps) != 0 {
					t.Fatalf("no gap: status %+v, file %d bytes (want %d), read gaps %v", st, len(file), len(want), gaps)
				}
				return
			}
			wantGap := Gap{From: stopped, To: oldest}
			if st.Err != nil || len(st.Gaps) != 1 || st.Gaps[0] != wantGap || st.Lost != oldest-stopped {
				t.Fatalf("status %+v, want the gap %+v", st, wantGap)
			}
			marker := fmt.Sprintf("[qemu-mcp: transcript gap: %d bytes of console output (cursors %d to %d) are lost", oldest-stopped, stopped, oldest)
			i := bytes.Index(file, []byte(marker))
			if i != int(stopped)+2 || !bytes.Equal(file[:stopped], want[:stopped]) {
				t.Fatalf("marker at %d, want %d", i, stopped+2)
			}
			rest := file[i:]
			rest = rest[bytes.Index(rest, []byte("]\r\n"))+3:]
			// Every byte the ring held when space returned is in the file.
			if !bytes.Equal(rest, want[oldest:]) {
				t.Fatalf("after the marker: %d bytes, want the %d from cursor %d", len(rest), len(want)-int(oldest), oldest)
			}
			if len(gaps) != 1 || gaps[0] != wantGap || !bytes.Equal(got[:stopped], want[:stopped]) || !bytes.Equal(got[oldest:], want[oldest:]) {
				t.Fatalf("reads: gaps %v, want %v", gaps, wantGap)
			}
			t.Logf("stopped at %d, resumed from %d: %d bytes lost, marked; %d bytes after it", stopped, oldest, oldest-stopped, len(rest))
		})
	}
}
