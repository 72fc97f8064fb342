package tools_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testfs"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

type health struct {
	Health   string   `json:"health"`
	Problems []string `json:"problems"`
}

type noted struct {
	waitFull
	TranscriptNote string `json:"transcript_note"`
}

// A flooding guest whose transcript's disk fills: server_info turns
// degraded with the reason, the next wait says once where the transcript
// stopped, the resource is served from memory and says what it cannot
// serve; when space returns the transcript resumes, marks the gap, and
// holds every byte the ring held.
func TestTranscriptFullDisk(t *testing.T) {
	disk := testfs.Tmpfs(t, 1<<20)
	const ring = 64 << 10
	s := newSessionWith(t, func(c *testConfig) {
		c.Captures, c.Snapshots, c.RingSize = filepath.Join(disk, "captures"), t.TempDir(), ring
	}, nil)
	var b struct {
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt}, &b)
	free := testfs.Fill(t, disk, 0)

	const n = 400000
	var w noted
	s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf("flood %d", n), "wait_for": fmt.Sprintf(`flood done %d\r\n`, n), "timeout": 60}, &w)
	if !w.Matched || !strings.Contains(w.TranscriptNote, "stopped at cursor") || !strings.Contains(w.TranscriptNote, "no space left") {
		t.Fatalf("flood on a full disk: matched %v, note %q", w.Matched, w.TranscriptNote)
	}
	var h health
	s.mustCall("server_info", nil, &h)
	if h.Health != "degraded" || !strings.Contains(strings.Join(h.Problems, "\n"), "transcript") {
		t.Fatalf("server_info on a full disk: %+v", h)
	}
	// Said once.
	s.mustCall("serial_send", map[string]any{"data": "echo a", "wait_for": `a\r\n`}, &w)
	if w.TranscriptNote != "" {
		t.Errorf("note repeated: %q", w.TranscriptNote)
	}
	res, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: tools.TranscriptURI})
	if err != nil || !strings.Contains(res.Contents[0].Text, "this text comes from memory") || !strings.Contains(res.Contents[0].Text, "cannot be served") ||
		!strings.Contains(res.Contents[0].Text, "tiny> echo a") {
		t.Fatalf("resource on a full disk: %v\n%.600s", err, res.Contents[0].Text)
	}

	free()
	// The drain tries again every second while the guest is quiet.
	deadline := time.Now().Add(10 * time.Second)
	for s.mustCall("server_info", nil, &h); h.Health != "ok" && time.Now().Before(deadline); s.mustCall("server_info", nil, &h) {
		time.Sleep(100 * time.Millisecond)
	}
	if h.Health != "ok" {
		t.Fatalf("server_info once space returned: %+v", h)
	}
	s.mustCall("serial_send", map[string]any{"data": "echo b", "wait_for": `b\r\n`}, &w)
	if !strings.Contains(w.TranscriptNote, "written again") || !strings.Contains(w.TranscriptNote, "lacks cursors") {
		t.Fatalf("note once space returned: %q", w.TranscriptNote)
	}
	var from, to int64
	if _, err := fmt.Sscanf(w.TranscriptNote[strings.Index(w.TranscriptNote, "lacks cursors"):], "lacks cursors %d to %d", &from, &to); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the idle flush
	file, err := os.ReadFile(b.Transcript)
	if err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("[qemu-mcp: transcript gap: %d bytes of console output (cursors %d to %d) are lost", to-from, from, to)
	i := bytes.Index(file, []byte(marker))
	if i != int(from)+2 {
		t.Fatalf("gap marker at %d, want %d:\n%.300s", i, from+2, file[max(0, i):])
	}
	after := file[i:]
	after = after[bytes.Index(after, []byte("]\r\n"))+3:]
	// Every byte from the gap's end on (what the ring held when space
	// returned, and since) is in the file, as serial_read gives it.
	var raw []byte
	for cur := to; ; {
		var r noted
		s.mustCall("serial_read", map[string]any{"since": cur, "max_bytes": 32768, "raw": true}, &r)
		d := []byte(r.Output)
		if r.Encoding == "base64" {
			d, _ = base64.StdEncoding.DecodeString(r.Output)
		}
		raw = append(raw, d...)
		if r.Cursor == cur {
			break
		}
		cur = r.Cursor
	}
	if !bytes.Equal(after, raw) || to-from <= 0 || int(to-from) > n {
		t.Fatalf("after the marker: %d bytes; the console from %d on: %d bytes", len(after), to, len(raw))
	}
	t.Logf("transcript stopped at %d, resumed from %d: %d bytes lost (marked), %d bytes written after the marker", from, to, to-from, len(after))
}
