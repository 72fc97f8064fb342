package tools_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/tools"
)

type waitFull struct {
	waitOut
	MatchIndex *int     `json:"match_index"`
	Match      string   `json:"match"`
	MatchStart int64    `json:"match_start"`
	EchoEnd    int64    `json:"echo_end"`
	Groups     []string `json:"groups"`
	Idle       bool     `json:"idle"`
	Panicked   bool     `json:"panicked"`
	PanicMatch string   `json:"panic_match"`
	Encoding   string   `json:"encoding"`
	Lost       bool     `json:"lost"`
}

// Every way a wait can end, through the tools.
func TestWaitOutcomes(t *testing.T) {
	s := newSession(t)
	s.bootTiny()

	// A list of patterns: each one can be the one that matches.
	var w waitFull
	// Patterns see the bytes as they came: lines end in \r\n.
	// The wait starts after the guest's echo of "echo beta": it matches
	// the answer.
	s.mustCall("serial_send", map[string]any{"data": "echo beta", "wait_for": []string{`alpha`, `(b)e(t)a\r\n(t)`}}, &w)
	if !w.Matched || w.MatchIndex == nil || *w.MatchIndex != 1 || w.Match != "beta\nt" || strings.Join(w.Groups, ",") != "b,t,t" ||
		w.EchoEnd != w.OutputStart+int64(len("echo beta")) || w.MatchStart != w.EchoEnd+2 {
		t.Errorf("second pattern: %+v", w)
	}
	// That match ended mid-line: let the rest of it arrive before the next send.
	s.mustCall("serial_read", map[string]any{"wait_for": prompt, "timeout": 10}, nil)
	s.mustCall("serial_send", map[string]any{"data": "echo alpha", "wait_for": []string{`alpha\r\ntiny`, `beta`}}, &w)
	if !w.Matched || w.MatchIndex == nil || *w.MatchIndex != 0 || w.Match != "alpha\ntiny" || w.MatchStart != w.OutputStart+int64(len("echo alpha\r\n")) {
		t.Errorf("first pattern: %+v", w)
	}

	// Idle: the console goes quiet after the prompt.
	start := time.Now()
	s.mustCall("serial_send", map[string]any{"data": "help", "idle_ms": 300, "timeout": 10}, &w)
	if !w.Idle || w.Matched || w.TimedOut || !strings.Contains(w.Output, "commands: help echo panic flood poweroff exit") {
		t.Errorf("idle: %+v", w)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 5*time.Second {
		t.Errorf("idle wait took %v", el)
	}

	// Timeout.
	s.mustCall("serial_read", map[string]any{"wait_for": "never", "timeout": 0.2}, &w)
	if !w.TimedOut || w.Matched || w.MatchIndex != nil {
		t.Errorf("timeout: %+v", w)
	}

	// Cancellation: the client gives up, the wait stops at once.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	start = time.Now()
	_, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "serial_read", Arguments: map[string]any{"wait_for": "never", "timeout": 60}})
	cancel()
	if err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("cancelled wait: err %v after %v", err, time.Since(start))
	}
	// The server is still serving afterwards.
	s.mustCall("serial_send", map[string]any{"data": "echo after-cancel", "wait_for": `after-cancel\r\n`, "timeout": 10}, &w)
	if !w.Matched {
		t.Errorf("after cancel: %+v", w)
	}

	// Panic: the guest crashes while we wait for something else.
	s.mustCall("serial_send", map[string]any{"data": "panic", "wait_for": "never", "timeout": 10}, &w)
	if !w.Panicked || w.PanicMatch != "Kernel panic - not syncing: requested by user" || w.TimedOut {
		t.Errorf("panic: %+v", w)
	}

	// Exit: the guest powers off during a wait.
	s.mustCall("qemu_boot", map[string]any{"restart": true, "wait_for": prompt}, nil)
	s.mustCall("serial_send", map[string]any{"data": "exit 5", "wait_for": "never", "timeout": 10}, &w)
	if !w.Exited || w.ExitStatus == nil || *w.ExitStatus != 5 || w.TimedOut {
		t.Errorf("exit: %+v", w)
	}
}

// Text mode strips what a terminal would interpret; raw mode gives the
// bytes. The tiny kernel echoes a backspace as "\b \b".
func TestCleanAndRaw(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	var w waitFull
	s.mustCall("serial_send", map[string]any{"data": "echo abX\x7fc", "wait_for": `abc\r?\n`}, &w)
	if w.Output != "echo abc\nabc\n" {
		t.Errorf("clean output %q", w.Output)
	}
	s.mustCall("serial_read", map[string]any{"since": w.OutputStart, "max_bytes": 64, "raw": true}, &w)
	if !strings.HasPrefix(w.Output, "echo abX\b \bc\r\nabc\r\n") || w.Encoding != "" {
		t.Errorf("raw output %q (encoding %q)", w.Output, w.Encoding)
	}
}

// With a small ring, old output is served from the transcript, byte-exact,
// and the transcript is also an MCP resource.
func TestTranscriptBeyondRing(t *testing.T) {
	s := newSessionWith(t, func(c *testConfig) { c.RingSize = 16 << 10 }, nil)
	cs := s.cs
	var b struct {
		Transcript string `json:"transcript"`
	}
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt}, &b)
	const n = 200000
	var w waitFull
	s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf("flood %d", n), "wait_for": fmt.Sprintf(`flood done %d\r\n`, n), "timeout": 60}, &w)
	if !w.Matched || !w.Truncated {
		t.Fatalf("flood: matched %v truncated %v", w.Matched, w.Truncated)
	}
	// Page through everything from cursor 0 (far behind the 16 KiB ring).
	var all strings.Builder
	cursor := int64(0)
	for cursor < w.Cursor {
		var r waitFull
		s.mustCall("serial_read", map[string]any{"since": cursor, "max_bytes": 32768, "raw": true}, &r)
		if r.Lost || r.OutputStart != cursor {
			t.Fatalf("read from %d: lost %v, start %d", cursor, r.Lost, r.OutputStart)
		}
		all.WriteString(r.Output)
		cursor = r.Cursor
	}
	out := all.String()
	i := strings.Index(out, fmt.Sprintf("flood %d\r\n", n))
	if i < 0 {
		t.Fatal("flood command echo not found")
	}
	data := out[i+len(fmt.Sprintf("flood %d\r\n", n)):]
	for off := 0; off < n; off += 64 {
		line := fmt.Sprintf("%08d abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR\n", off/64)
		want := line[:min(64, n-off)]
		if data[off:off+len(want)] != want {
			t.Fatalf("byte %d: %q, want %q", off, data[off:off+len(want)], want)
		}
	}
	// The transcript file and the resource hold the same output: the
	// file within moments (it is written at most 64 KiB or 0.1 s behind
	// the console, 10 ms once the guest is quiet), the resource at once.
	var file []byte
	var err error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		file, err = os.ReadFile(b.Transcript)
		if err == nil && strings.HasPrefix(string(file), out[:len(out)-1]) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !strings.HasPrefix(string(file), out[:len(out)-1]) {
		t.Errorf("transcript file %s, 1 s after the reads: %v (%d bytes, read %d)", b.Transcript, err, len(file), len(out))
	}
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: tools.TranscriptURI})
	if err != nil || len(res.Contents) != 1 || !strings.Contains(res.Contents[0].Text, fmt.Sprintf("flood done %d\n", n)) {
		t.Errorf("transcript resource: %v", err)
	}
	// Transcripts are kept after shutdown.
	s.mustCall("qemu_shutdown", nil, nil)
	if _, err := os.Stat(b.Transcript); err != nil {
		t.Errorf("transcript removed: %v", err)
	}
}

// Long waits send progress notifications when the client asks for them.
func TestProgressNotifications(t *testing.T) {
	var got atomic.Int32
	var last atomic.Value
	s := newSessionWith(t, nil, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			got.Add(1)
			last.Store(req.Params.Message)
		},
	})
	cs := s.cs
	s.bootTiny()
	params := &mcp.CallToolParams{Name: "serial_send", Arguments: map[string]any{"data": "echo waiting", "wait_for": "never", "timeout": 2.5}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("call: %v %v", err, res)
	}
	// Notifications may arrive after the result.
	deadline := time.Now().Add(3 * time.Second)
	for got.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := got.Load(); n < 2 {
		t.Fatalf("%d progress notifications during a 2.5 s wait, want at least 2", n)
	}
	if msg, _ := last.Load().(string); !strings.Contains(msg, "bytes") {
		t.Errorf("progress message %q", msg)
	}
}

// Ctrl-C reaches U-Boot and stops its autoboot.
func TestCtrlCStopsUBootAutoboot(t *testing.T) {
	s, _ := bootUBoot(t, nil)
	var w waitFull
	s.mustCall("serial_send", map[string]any{"data": "\u0003", "newline": "none", "wait_for": []string{`=> $`, `Starting kernel|BOOTP|scanning bus`}, "timeout": 10}, &w)
	if !w.Matched || w.MatchIndex == nil || *w.MatchIndex != 0 {
		t.Fatalf("Ctrl-C did not stop autoboot: %+v", w)
	}
}
