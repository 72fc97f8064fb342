package tools

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// WaitResult is the part of a result that reports serial output and how a
// wait ended; qemu_boot, serial_send and serial_read share it.
type WaitResult struct {
	Output      string `json:"output" jsonschema:"serial output (from output_start up to the match, or to the end when nothing matched)"`
	OutputStart int64  `json:"output_start" jsonschema:"cursor of the first byte of output"`
	Truncated   bool   `json:"truncated" jsonschema:"output was cut to max_bytes; read from output_start or cursor to see the rest"`
	Matched     bool   `json:"matched" jsonschema:"wait_for matched"`
	Match       string `json:"match,omitempty" jsonschema:"the text that matched wait_for"`
	Cursor      int64  `json:"cursor" jsonschema:"serial cursor after this result: pass it as since to continue"`
	TimedOut    bool   `json:"timed_out" jsonschema:"the timeout passed before wait_for matched"`
	Exited      bool   `json:"exited" jsonschema:"QEMU has exited"`
	ExitStatus  *int   `json:"exit_status,omitempty" jsonschema:"QEMU's exit status, once it exited (128+n when killed by signal n)"`
	Running     bool   `json:"running" jsonschema:"QEMU is running"`
}

func (w WaitResult) summary(pattern string) string {
	var b strings.Builder
	switch {
	case w.Matched:
		fmt.Fprintf(&b, "matched %q (cursor %d)\n", pattern, w.Cursor)
	case w.TimedOut:
		fmt.Fprintf(&b, "timed out waiting for %q (cursor %d)\n", pattern, w.Cursor)
	case w.Exited:
		fmt.Fprintf(&b, "guest exited (status %d) before %q appeared (cursor %d)\n", deref(w.ExitStatus), pattern, w.Cursor)
	default:
		fmt.Fprintf(&b, "cursor %d\n", w.Cursor)
	}
	if w.Truncated {
		fmt.Fprintf(&b, "[output truncated: it starts at cursor %d]\n", w.OutputStart)
	}
	b.WriteString(w.Output)
	return b.String()
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

func compileWait(pattern string) (*regexp.Regexp, error) {
	if pattern == "" {
		return nil, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("wait_for %q is not a valid regular expression (Go RE2 syntax): %w", pattern, err)
	}
	return re, nil
}

// seconds converts a timeout argument, where 0 means the default.
func seconds(name string, v float64, def time.Duration) (time.Duration, error) {
	switch {
	case v == 0:
		return def, nil
	case v < 0 || math.IsNaN(v) || math.IsInf(v, 0):
		return 0, fmt.Errorf("%s %v: want a positive number of seconds", name, v)
	case v > 24*3600:
		return 0, fmt.Errorf("%s %v: at most 86400 seconds", name, v)
	}
	return time.Duration(v * float64(time.Second)), nil
}

// text turns guest bytes into valid UTF-8 for JSON.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

const defaultMaxBytes = 64 << 10

// wait waits on m's console from since for re and records where it ended as
// the server's read cursor. Timing out is a normal result, not an error.
func (s *Server) wait(ctx context.Context, m *qemu.Machine, since int64, re *regexp.Regexp, timeout time.Duration, maxBytes int) (WaitResult, error) {
	res, err := m.Console().Buffer().Wait(ctx, since, re, timeout)
	if err != nil {
		return WaitResult{}, fmt.Errorf("wait for %q: %w", re, err)
	}
	w := WaitResult{Matched: res.Matched, TimedOut: res.TimedOut, Cursor: res.Cursor, OutputStart: since}
	out := res.Output
	if maxBytes <= 0 {
		maxBytes = defaultMaxBytes
	}
	if len(out) > maxBytes {
		// Keep the end: what led up to the match is what an agent needs.
		cut := len(out) - maxBytes
		out = out[cut:]
		w.OutputStart += int64(cut)
		w.Truncated = true
	}
	w.Output = text(out)
	if res.Matched {
		w.Match = text(res.Output[res.Start-since : res.End-since])
	}
	if res.Finished {
		// The buffer is finished just before Done closes.
		<-m.Done()
	}
	s.setExit(&w, m)
	s.mu.Lock()
	s.readCursor = w.Cursor
	s.mu.Unlock()
	return w, nil
}

func (s *Server) setExit(w *WaitResult, m *qemu.Machine) {
	if exit, ok := m.Exited(); ok {
		w.Exited = true
		code := exit.Code
		w.ExitStatus = &code
		return
	}
	w.Running = true
}

// SendInput is serial_send's arguments.
type SendInput struct {
	Data    string  `json:"data" jsonschema:"text to type on the serial console; control characters pass through (\u0003 is Ctrl-C)"`
	Newline string  `json:"newline,omitempty" jsonschema:"line ending sent after each line: cr (default), lf, crlf or none"`
	WaitFor string  `json:"wait_for,omitempty" jsonschema:"regular expression to wait for in the output that follows the send; default: the boot profile's prompt, if any"`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"seconds to wait for wait_for; default 30"`
}

// SendOutput is serial_send's result.
type SendOutput struct {
	Written int `json:"written" jsonschema:"bytes written to the console"`
	WaitResult
}

var newlines = map[string]string{"": "\r", "cr": "\r", "lf": "\n", "crlf": "\r\n", "none": ""}

func (s *Server) send(ctx context.Context, _ *mcp.CallToolRequest, in SendInput) (*mcp.CallToolResult, SendOutput, error) {
	if in.WaitFor == "" {
		s.mu.Lock()
		in.WaitFor = s.prompt
		s.mu.Unlock()
	}
	nl, ok := newlines[in.Newline]
	if !ok {
		return nil, SendOutput{}, fmt.Errorf("newline %q: want cr, lf, crlf or none", in.Newline)
	}
	re, err := compileWait(in.WaitFor)
	if err != nil {
		return nil, SendOutput{}, err
	}
	timeout, err := seconds("timeout", in.Timeout, 30*time.Second)
	if err != nil {
		return nil, SendOutput{}, err
	}
	m, err := s.running()
	if err != nil {
		return nil, SendOutput{}, err
	}
	// Each line gets the chosen ending, so "a\nb" types two lines the way a
	// person at the console would.
	data := in.Data
	if nl != "\n" {
		data = strings.ReplaceAll(strings.ReplaceAll(data, "\r\n", "\n"), "\n", nl)
	}
	data += nl
	from := m.Console().Buffer().End()
	n, err := m.Console().Write(ctx, []byte(data))
	if err != nil {
		return nil, SendOutput{}, fmt.Errorf("write to serial console: %w (wrote %d of %d bytes)", err, n, len(data))
	}
	out := SendOutput{Written: n}
	if re == nil {
		out.Cursor = from
		out.OutputStart = from
		s.setExit(&out.WaitResult, m)
		return textResult(fmt.Sprintf("wrote %d bytes; output from cursor %d on is waiting for serial_read", n, from)), out, nil
	}
	out.WaitResult, err = s.wait(ctx, m, from, re, timeout, 0)
	if err != nil {
		return nil, SendOutput{}, err
	}
	return textResult(fmt.Sprintf("wrote %d bytes; ", n) + out.WaitResult.summary(in.WaitFor)), out, nil
}

// ReadInput is serial_read's arguments.
type ReadInput struct {
	Since    *int64  `json:"since,omitempty" jsonschema:"cursor to read from; default where the last read or wait ended"`
	WaitFor  string  `json:"wait_for,omitempty" jsonschema:"regular expression to wait for; without it the read returns at once"`
	Timeout  float64 `json:"timeout,omitempty" jsonschema:"seconds to wait for wait_for; default 5"`
	MaxBytes int     `json:"max_bytes,omitempty" jsonschema:"most bytes of output to return; default 65536"`
}

func (s *Server) read(ctx context.Context, _ *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, WaitResult, error) {
	re, err := compileWait(in.WaitFor)
	if err != nil {
		return nil, WaitResult{}, err
	}
	timeout, err := seconds("timeout", in.Timeout, 5*time.Second)
	if err != nil {
		return nil, WaitResult{}, err
	}
	if in.MaxBytes < 0 {
		return nil, WaitResult{}, fmt.Errorf("max_bytes %d: want a positive number", in.MaxBytes)
	}
	m := s.current()
	if m == nil {
		return nil, WaitResult{}, fmt.Errorf("no guest has been booted: call qemu_boot first")
	}
	s.mu.Lock()
	since := s.readCursor
	s.mu.Unlock()
	if in.Since != nil {
		if *in.Since < 0 {
			return nil, WaitResult{}, fmt.Errorf("since %d: cursors start at 0", *in.Since)
		}
		since = *in.Since
	}
	buf := m.Console().Buffer()
	if end := buf.End(); since > end {
		since = end
	}
	if re != nil {
		w, err := s.wait(ctx, m, since, re, timeout, in.MaxBytes)
		if err != nil {
			return nil, WaitResult{}, err
		}
		return textResult(w.summary(in.WaitFor)), w, nil
	}
	max := in.MaxBytes
	if max == 0 {
		max = defaultMaxBytes
	}
	data, next := buf.Read(since, max)
	w := WaitResult{Output: text(data), OutputStart: since, Cursor: next, Truncated: next < buf.End()}
	s.setExit(&w, m)
	s.mu.Lock()
	s.readCursor = next
	s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d bytes from cursor %d to %d", len(data), since, next)
	if w.Truncated {
		fmt.Fprintf(&b, " (more follows: read again from cursor %d)", next)
	}
	if w.Exited {
		fmt.Fprintf(&b, "; guest exited with status %d", *w.ExitStatus)
	}
	b.WriteString("\n")
	b.WriteString(w.Output)
	return textResult(b.String()), w, nil
}
