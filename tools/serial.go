package tools

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/tools/kit"
)

// WaitOptions are the wait and text arguments that qemu_boot, serial_send
// and serial_read share.
type WaitOptions struct {
	WaitFor       any      `json:"wait_for,omitempty" anyof:"string,[]string" jsonschema:"regex (Go RE2), or a list of them, to wait for on the console, matching the bytes as sent (lines end in \\r\\n: write \\r?\\n; $ is the end so far)"`
	IdleMS        int      `json:"idle_ms,omitempty" jsonschema:"also end the wait after this many ms of quiet (idle: true)"`
	PanicPatterns []string `json:"panic_patterns,omitempty" maxitems:"64" jsonschema:"regexes ending a wait with panicked: true; default kernel panics, Oops, OpenSBI/U-Boot traps, the profile's; [] for none"`
	MaxBytes      int      `json:"max_bytes,omitempty" jsonschema:"most output bytes (a longer output: its start and end, the middle in elided); default 16384 (qemu_boot 640), max 32768"`
	Raw           bool     `json:"raw,omitempty" jsonschema:"bytes as sent (base64 if not UTF-8), not cleaned text"`
}

// WaitResult is the part of a result that reports serial output and how a
// wait ended; qemu_boot, serial_send and serial_read share it. Each piece of
// console text is in it once (output); positions say the rest. Flags that
// are false are left out.
type WaitResult struct {
	Output      string   `json:"output" jsonschema:"serial output from output_start to cursor (text unless raw); with elided set, its start and its end around a marked gap"`
	Encoding    string   `json:"encoding,omitempty" jsonschema:"base64 when raw output was not valid UTF-8"`
	OutputStart int64    `json:"output_start" jsonschema:"cursor of the first byte of output"`
	Elided      *Span    `json:"elided,omitempty" jsonschema:"cursors of the middle left out of output to stay within max_bytes: read it with serial_read since start"`
	Truncated   bool     `json:"truncated,omitempty" jsonschema:"output was cut to max_bytes: read from the cursors given to see the rest"`
	Lost        bool     `json:"lost,omitempty" jsonschema:"bytes before output_start are gone for good (no transcript held them)"`
	Matched     bool     `json:"matched" jsonschema:"a wait_for pattern matched"`
	MatchIndex  *int     `json:"match_index,omitempty" jsonschema:"index of the pattern that matched in the wait_for list"`
	Match       string   `json:"match,omitempty" jsonschema:"the text that matched"`
	MatchStart  int64    `json:"match_start,omitempty" jsonschema:"cursor where the match begins"`
	EchoEnd     int64    `json:"echo_end,omitempty" jsonschema:"cursor where the guest's echo of the data sent ended: the wait searched from there"`
	Groups      []string `json:"groups,omitempty" jsonschema:"the match's capture groups"`
	Cursor      int64    `json:"cursor" jsonschema:"serial cursor after this result: just past the match, or the end; pass it as since to continue"`
	TimedOut    bool     `json:"timed_out,omitempty" jsonschema:"the timeout passed before anything else ended the wait"`
	Idle        bool     `json:"idle,omitempty" jsonschema:"the console was quiet for idle_ms"`
	Panicked    bool     `json:"panicked,omitempty" jsonschema:"a panic pattern matched: the guest crashed"`
	PanicMatch  string   `json:"panic_match,omitempty" jsonschema:"the panic line"`
	Exited      bool     `json:"exited,omitempty" jsonschema:"QEMU has exited"`
	ExitStatus  *int     `json:"exit_status,omitempty" jsonschema:"QEMU's exit status, once it exited (128+n when killed by signal n)"`
	Running     bool     `json:"running" jsonschema:"QEMU is running"`
	// Triage is what the debugger saw of a panic, on a guest booted with
	// gdb: true.
	Triage      *debugger.Triage `json:"triage,omitempty" jsonschema:"on a panic with the debugger attached: the hart that crashed, its pc, ra, sp, trap and symbolized backtrace, and the other harts"`
	TriageError string           `json:"triage_error,omitempty" jsonschema:"why there is no triage"`
	// DebugStop says the debugger holds the guest stopped: why the
	// console stayed quiet.
	DebugStop *debugger.StopInfo `json:"debug_stop,omitempty" jsonschema:"the debugger holds the guest stopped (a breakpoint, watchpoint, step or pause): where and why; debug_continue resumes it"`
	// TranscriptNote tells, once per change, that the transcript stopped
	// (a write failed: a full disk) or resumed, and what it lacks.
	TranscriptNote string `json:"transcript_note,omitempty"`
	// GuestEvent is the reset or shutdown that ended the wait.
	GuestEvent *instance.Event `json:"guest_event,omitempty"`
	// Tests summarises TAP or KTAP in the output waited through.
	Tests *instance.TestSummary `json:"tests,omitempty"`
}

// Span is a range of serial cursors [start, end).
type Span struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// summary is the text content of a result: one line that says how the wait
// ended and where the output is; the output itself is in the structured
// content once.
func (w WaitResult) summary(pattern string) string {
	var b strings.Builder
	switch {
	case w.Matched:
		fmt.Fprintf(&b, "matched %q at cursor %d", w.Match, w.MatchStart)
	case w.DebugStop != nil:
		fmt.Fprintf(&b, "the debugger holds the guest stopped (%s at %s), so %s did not come: debug_continue resumes it",
			w.DebugStop.Reason, w.DebugStop.Where().String(), pattern)
	case w.GuestEvent != nil && !w.Panicked:
		fmt.Fprintf(&b, "%s while this call waited for %s", eventText(*w.GuestEvent), pattern)
		if w.Exited {
			fmt.Fprintf(&b, "; QEMU exited (status %d)", deref(w.ExitStatus))
		}
	case w.Panicked:
		w.writePanic(&b)
	case w.Exited:
		fmt.Fprintf(&b, "guest exited (status %d) before %s appeared", deref(w.ExitStatus), pattern)
	case w.Idle:
		b.WriteString("console idle")
	case w.TimedOut:
		fmt.Fprintf(&b, "timed out waiting for %s", pattern)
	default:
		b.WriteString("output read")
	}
	fmt.Fprintf(&b, "; output %d..%d", w.OutputStart, w.Cursor)
	if w.Elided != nil {
		fmt.Fprintf(&b, " with %d..%d elided", w.Elided.Start, w.Elided.End)
	}
	if w.Lost {
		fmt.Fprintf(&b, "; output before cursor %d is lost", w.OutputStart)
	}
	fmt.Fprintf(&b, "; next read from cursor %d\n", w.Cursor)
	if w.Panicked && w.Triage != nil {
		for _, o := range w.Triage.Others {
			fmt.Fprintf(&b, "  %s\n", o.Line())
		}
	}
	if w.TranscriptNote != "" {
		fmt.Fprintf(&b, "NOTE: %s\n", w.TranscriptNote)
	}
	if w.Tests != nil {
		b.WriteString(w.Tests.String() + "\n")
	}
	return b.String()
}

// writePanic writes the summary's account of a panic: the line that
// matched, and the triage's hart, culprit, verdict and backtrace.
func (w WaitResult) writePanic(b *strings.Builder) {
	fmt.Fprintf(b, "PANIC: %s", w.PanicMatch)
	t := w.Triage
	if t == nil {
		return
	}
	if len(t.Others) > 0 {
		fmt.Fprintf(b, "; on hart %d", t.Hart)
		if t.Processor != nil && *t.Processor != t.Hart {
			fmt.Fprintf(b, " (cpu %d)", *t.Processor)
		}
	}
	if t.Culprit != nil {
		fmt.Fprintf(b, "; in %s", t.Culprit.String())
	}
	if t.Verdict != "" {
		fmt.Fprintf(b, "; %s", t.Verdict)
	}
	// The frames from the culprit down: those above it are the
	// crash being reported (printk, panic), which the console shows.
	var fns []string
	from := 0
	for i, f := range t.Backtrace.Frames {
		if t.Culprit != nil && f.Addr == t.Culprit.Addr {
			from = i
			break
		}
	}
	for _, f := range t.Backtrace.Frames[from:] {
		if f.Function != "" {
			fns = append(fns, f.Function)
		}
	}
	if len(fns) > 10 {
		fns = append(fns[:10], "...")
	}
	fmt.Fprintf(b, "; backtrace: %s", strings.Join(fns, " < "))
}

// transcriptStopped says that a transcript stopped, where, and what is
// kept meanwhile.
func transcriptStopped(st serial.TranscriptStatus) string {
	return fmt.Sprintf("its transcript %s stopped at cursor %d (%v): output from there on is kept only in memory, the last %d MiB, and written once the file can be written again (free space); serial_read still reads it",
		st.Path, st.StoppedAt, errors.Unwrap(st.Err), serial.DefaultRingSize>>20)
}

// transcriptNote tells a session, once per change, that the guest's
// transcript stopped or resumed and what it lacks; st is its state.
func (s *Server) transcriptNote(req *mcp.CallToolRequest, in *instance.Instance, st serial.TranscriptStatus) string {
	if st.Events == 0 {
		return ""
	}
	k := cursorKey{session(req), in}
	s.cursorMu.Lock()
	if s.noted == nil {
		s.noted = map[cursorKey]int{}
	}
	seen := s.noted[k]
	s.noted[k] = st.Events
	s.cursorMu.Unlock()
	if seen == st.Events {
		return ""
	}
	if st.Err != nil {
		return "the console " + transcriptStopped(st)
	}
	if len(st.Gaps) == 0 {
		return fmt.Sprintf("the console transcript %s is written again after it stopped at cursor %d; nothing was lost", st.Path, st.StoppedAt)
	}
	var gaps []string
	for _, g := range st.Gaps {
		gaps = append(gaps, fmt.Sprintf("%d to %d", g.From, g.To))
	}
	return fmt.Sprintf("the console transcript %s is written again after it stopped at cursor %d; it lacks cursors %s (%d bytes, marked in it): they left memory while it could not be written",
		st.Path, st.StoppedAt, strings.Join(gaps, ", "), st.Lost)
}

// eventText says what a guest event means: "the guest reset (guest-reset)".
func eventText(e instance.Event) string {
	what := map[string]string{"RESET": "the guest reset", "SHUTDOWN": "the guest shut down", "GUEST_PANICKED": "the guest panicked"}[e.Event]
	if what == "" {
		what = "QMP event " + e.Event
	}
	if r := e.Reason(); r != "" {
		what += " (" + r + ")"
	}
	return what + fmt.Sprintf(" at cursor %d", e.Cursor)
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// patterns turns wait_for (a string or a list of strings) into regexps.
func patterns(v any) ([]*regexp.Regexp, string, error) {
	var srcs []string
	switch v := v.(type) {
	case nil:
	case string:
		if v != "" {
			srcs = []string{v}
		}
	case []string:
		srcs = v
	case []any:
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, "", fmt.Errorf("wait_for[%d]: want a string, got %T", i, e)
			}
			srcs = append(srcs, s)
		}
	default:
		return nil, "", fmt.Errorf("wait_for: want a regular expression or a list of them, got %T", v)
	}
	if len(srcs) > maxPatterns {
		return nil, "", fmt.Errorf("wait_for: %d patterns, more than the limit of %d", len(srcs), maxPatterns)
	}
	res := make([]*regexp.Regexp, len(srcs))
	for i, s := range srcs {
		if len(s) > kit.DefaultMaxString {
			return nil, "", fmt.Errorf("wait_for[%d]: a pattern of %d bytes, more than the limit of %d", i, len(s), kit.DefaultMaxString)
		}
		re, err := compileWait(s)
		if err != nil {
			return nil, "", err
		}
		res[i] = re
	}
	var desc string
	if len(srcs) == 1 {
		desc = fmt.Sprintf("%q", srcs[0])
	} else if len(srcs) > 1 {
		desc = "any of " + fmt.Sprintf("%q", srcs)
	}
	return res, desc, nil
}

func compileWait(pattern string) (*regexp.Regexp, error) {
	if pattern == "" {
		return nil, errors.New("wait_for: an empty pattern matches at once: give a regular expression")
	}
	if re := compiled.get(pattern); re != nil {
		return re, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("wait_for %s is not a valid regular expression (Go RE2 syntax): %w", kit.Quote(pattern), err)
	}
	compiled.put(pattern, re)
	return re, nil
}

// patternCache keeps compiled wait patterns by their source: an agent
// waits for its prompt again and again, and compiling it cost a tenth of
// a short wait's CPU. A *regexp.Regexp is safe for concurrent use. It is
// bounded: past maxCompiled it starts afresh.
type patternCache struct {
	mu sync.Mutex
	m  map[string]*regexp.Regexp
}

const maxCompiled = 256

var compiled patternCache

func (c *patternCache) get(src string) *regexp.Regexp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[src]
}

func (c *patternCache) put(src string, re *regexp.Regexp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCompiled {
		c.m = make(map[string]*regexp.Regexp)
	}
	c.m[src] = re
}

// maxPatterns bounds a wait_for list.
const maxPatterns = 64

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

// checkMaxBytes validates a max_bytes argument, where 0 means def; a
// client whose view holds less (see readers) gets at most limit, the rest
// a cursor away.
func checkMaxBytes(v, def, limit int) (int, error) {
	switch {
	case v > kit.MaxPage:
		return 0, fmt.Errorf("max_bytes %d: at most %d a result (a client refuses larger results); page with the cursors instead", v, kit.MaxPage)
	case v < 0:
		return 0, fmt.Errorf("max_bytes %d: want a positive number", v)
	case v == 0:
		v = def
	}
	return min(v, limit), nil
}

// waitPlan is a validated wait: what to wait for, how long, what to report.
type waitPlan struct {
	spec serial.Spec
	desc string
	raw  bool
	max  int
}

// active reports whether the call waits at all.
func (p waitPlan) active() bool { return len(p.spec.Patterns) > 0 || p.spec.Idle > 0 }

// plan validates the shared wait arguments; extra are the boot profile's
// panic patterns, added to the defaults unless panic_patterns is given.
func (s *Server) plan(req *mcp.CallToolRequest, o WaitOptions, timeout float64, def time.Duration, defMax int, extra []*regexp.Regexp) (waitPlan, error) {
	pats, desc, err := patterns(o.WaitFor)
	if err != nil {
		return waitPlan{}, err
	}
	t, err := seconds("timeout", timeout, def)
	if err != nil {
		return waitPlan{}, err
	}
	if o.IdleMS < 0 {
		return waitPlan{}, fmt.Errorf("idle_ms %d: want a positive number", o.IdleMS)
	}
	maxBytes, err := checkMaxBytes(o.MaxBytes, defMax, s.budget(req).Page)
	if err != nil {
		return waitPlan{}, err
	}
	p := waitPlan{spec: serial.Spec{Patterns: pats, Idle: time.Duration(o.IdleMS) * time.Millisecond, Timeout: t, MaxOutput: maxBytes}, desc: desc, raw: o.Raw, max: maxBytes}
	if !o.Raw {
		// A quarter for the start: what a long output began with is often
		// as telling as how it ended.
		p.spec.Head = maxBytes / 4
	}
	if desc == "" && p.spec.Idle > 0 {
		p.desc = "idle"
	}
	switch {
	case o.PanicPatterns != nil:
		p.spec.Panic = make([]*regexp.Regexp, 0, len(o.PanicPatterns))
		for i, src := range o.PanicPatterns {
			re, err := regexp.Compile(src)
			if err != nil {
				return waitPlan{}, fmt.Errorf("panic_patterns[%d] %q: %w", i, src, err)
			}
			p.spec.Panic = append(p.spec.Panic, re)
		}
	default:
		if len(extra) > 0 {
			p.spec.Panic = append(serial.DefaultPanicPatterns(), extra...)
		}
	}
	return p, nil
}

// render turns guest bytes into what the agent reads: clean text by
// default, or the bytes themselves.
func render(b []byte, raw bool) (string, string) {
	if raw {
		text, enc := serial.Raw(b)
		if enc == "utf-8" {
			enc = ""
		}
		return text, enc
	}
	return serial.Clean(b), ""
}

// defaultMaxBytes keeps a result with a full page of output near 16 KiB
// of text, about 5,000 tokens: well inside the 25,000 a client such as
// Claude Code accepts, with room for the other fields.
const defaultMaxBytes = 16 << 10

// wait runs plan on the guest's console from since and records where it
// ended as the session's read cursor. Timing out is a normal result, not
// an error; a stop of the guest ends it at once with an error.
func (s *Server) wait(ctx context.Context, req *mcp.CallToolRequest, in *instance.Instance, since int64, p waitPlan) (WaitResult, error) {
	wd, err := in.Await(ctx, since, waitSpec(ctx, req, p))
	if err != nil {
		return WaitResult{}, fmt.Errorf("wait for %s: %w", p.desc, err)
	}
	return s.waitResult(req, in, wd, p.raw), nil
}

// waitSpec is p's wait, telling a client that asked for progress how the
// output grows.
func waitSpec(ctx context.Context, req *mcp.CallToolRequest, p waitPlan) serial.Spec {
	spec := p.spec
	if req == nil || req.Session == nil {
		return spec
	}
	if tok := req.Params.GetProgressToken(); tok != nil {
		sess := req.Session
		spec.Progress = func(pr serial.Progress) {
			// Best effort: a client that stopped listening must not
			// stall the wait.
			_ = sess.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: tok,
				Progress:      float64(pr.Bytes),
				Message:       fmt.Sprintf("%d bytes, %s: %s", pr.Bytes, pr.Elapsed.Round(time.Second), serial.Clean([]byte(pr.LastLine))),
			})
		}
	}
	return spec
}

// waitResult is a wait's end as the session reads it; its cursor becomes
// the session's.
func (s *Server) waitResult(req *mcp.CallToolRequest, in *instance.Instance, wd instance.Waited, raw bool) WaitResult {
	w := WaitResult{
		Matched: wd.Matched, TimedOut: wd.TimedOut, Idle: wd.Idle,
		Panicked: wd.Panicked, PanicMatch: wd.PanicMatch, Cursor: wd.End,
		OutputStart: wd.Start, Lost: wd.Lost, Truncated: wd.Truncated,
		Groups: wd.Groups, GuestEvent: wd.Event, Tests: wd.Tests, EchoEnd: wd.EchoEnd,
		Triage: wd.Triage, DebugStop: wd.DebugStop,
	}
	w.Output, w.Encoding, w.Elided = excerptText(wd.Excerpt, raw)
	if wd.Matched {
		i := wd.Index
		w.MatchIndex = &i
		w.Match, _ = render(wd.Match, raw)
		w.MatchStart = wd.MatchStart
	}
	setExit(&w, wd.Exit)
	if wd.TriageErr != nil {
		w.TriageError = wd.TriageErr.Error()
	}
	w.TranscriptNote = s.transcriptNote(req, in, wd.Transcript)
	s.setCursor(req, in, w.Cursor)
	return w
}

// excerptText renders an excerpt as the agent reads it; a start kept
// before an elided middle is clean text, and the gap is marked where it
// reads, with the call that reads the middle.
func excerptText(ex instance.Excerpt, raw bool) (text, encoding string, elided *Span) {
	text, encoding = render(ex.Tail, raw)
	if ex.Elided == nil {
		return text, encoding, nil
	}
	elided = &Span{Start: ex.Elided.Start, End: ex.Elided.End}
	if ex.Head != nil {
		head, _ := render(ex.Head, false)
		text = fmt.Sprintf("%s\n[... %d bytes elided: serial_read since %d ...]\n%s", head, ex.Elided.Len(), ex.Elided.Start, text)
	}
	return text, encoding, elided
}

func setExit(w *WaitResult, exit *qemu.Exit) {
	if exit == nil {
		w.Running = true
		return
	}
	w.Exited = true
	code := exit.Code
	w.ExitStatus = &code
}

// SendInput is serial_send's arguments.
type SendInput struct {
	Data        string  `json:"data" max:"65536" jsonschema:"text to type on the serial console; control characters pass through (\\u0003 is Ctrl-C); each line gets the newline"`
	Newline     string  `json:"newline,omitempty" default:"cr" jsonschema:"line ending sent after each line: cr (default), lf, crlf or none"`
	CharDelayMS int     `json:"char_delay_ms,omitempty" jsonschema:"milliseconds between bytes, for guests without a UART FIFO that drop fast input"`
	MatchEcho   bool    `json:"match_echo,omitempty" jsonschema:"let wait_for match the guest's echo of the first line sent; by default the wait starts after that echo"`
	Timeout     float64 `json:"timeout,omitempty" default:"30" jsonschema:"seconds to wait for wait_for"`
	Target
	WaitOptions
}

// SendOutput is serial_send's result.
type SendOutput struct {
	Written int `json:"written" jsonschema:"bytes written to the console"`
	// Paced says the guest records: the data went a few bytes at a time,
	// each after the guest echoed the last, and written is what it took.
	Paced bool `json:"paced,omitempty"`
	WaitResult
}

var newlines = map[string]string{"": "\r", "cr": "\r", "lf": "\n", "crlf": "\r\n", "none": ""}

func (s *Server) send(ctx context.Context, req *mcp.CallToolRequest, in SendInput) (*mcp.CallToolResult, SendOutput, error) {
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, SendOutput{}, err
	}
	if in.WaitFor == nil && inst.Spec().Prompt != "" {
		in.WaitFor = inst.Spec().Prompt
	}
	nl, ok := newlines[in.Newline]
	if !ok {
		return nil, SendOutput{}, fmt.Errorf("newline %q: want cr, lf, crlf or none", in.Newline)
	}
	if in.CharDelayMS < 0 || in.CharDelayMS > 1000 {
		return nil, SendOutput{}, fmt.Errorf("char_delay_ms %d: want 0 to 1000", in.CharDelayMS)
	}
	p, err := s.plan(req, in.WaitOptions, in.Timeout, 30*time.Second, defaultMaxBytes, inst.Spec().Panics)
	if err != nil {
		return nil, SendOutput{}, err
	}
	input := instance.Input{Data: in.Data, Ending: nl, CharDelay: time.Duration(in.CharDelayMS) * time.Millisecond,
		Timeout: p.spec.Timeout, Who: "serial_send", MatchEcho: in.MatchEcho}
	if p.active() {
		spec := waitSpec(ctx, req, p)
		input.Wait = &spec
	}
	sent, err := inst.Send(ctx, input)
	if we := (*instance.WaitError)(nil); errors.As(err, &we) {
		return nil, SendOutput{}, fmt.Errorf("wait for %s: %w", p.desc, we.Err)
	}
	if err != nil {
		return nil, SendOutput{}, err
	}
	out := SendOutput{Written: sent.Written, Paced: sent.Paced}
	if !p.active() {
		out.Cursor, out.OutputStart = sent.End, sent.Start
		setExit(&out.WaitResult, sent.Exit)
		return textResult(fmt.Sprintf("wrote %d bytes; output from cursor %d on is waiting for serial_read", sent.Written, sent.Start)), out, nil
	}
	out.WaitResult = s.waitResult(req, inst, sent.Waited, p.raw)
	return textResult(fmt.Sprintf("wrote %d bytes; ", sent.Written) + out.WaitResult.summary(p.desc)), out, nil
}

// ReadInput is serial_read's arguments.
type ReadInput struct {
	Since   *int64  `json:"since,omitempty" jsonschema:"cursor to read from; default where the last read or wait ended; output older than the in-memory ring comes from the transcript"`
	Timeout float64 `json:"timeout,omitempty" default:"5" jsonschema:"seconds to wait for wait_for or idle_ms"`
	Target
	WaitOptions
}

func (s *Server) read(ctx context.Context, req *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, WaitResult, error) {
	inst, err := s.instance(in.Target)
	if err != nil {
		return nil, WaitResult{}, err
	}
	if inst.Console() == nil {
		return nil, WaitResult{}, fmt.Errorf("guest %q has no console: its boot did not start QEMU; call qemu_boot", inst.Name())
	}
	p, err := s.plan(req, in.WaitOptions, in.Timeout, 5*time.Second, defaultMaxBytes, inst.Spec().Panics)
	if err != nil {
		return nil, WaitResult{}, err
	}
	since := s.cursor(req, inst)
	if in.Since != nil {
		if *in.Since < 0 {
			return nil, WaitResult{}, fmt.Errorf("since %d: cursors start at 0", *in.Since)
		}
		since = *in.Since
	}
	if p.active() {
		w, err := s.wait(ctx, req, inst, since, p)
		if err != nil {
			return nil, WaitResult{}, err
		}
		return textResult(w.summary(p.desc)), w, nil
	}
	ex, err := inst.Read(since, p.max, !p.raw)
	if err != nil {
		return nil, WaitResult{}, err
	}
	w := WaitResult{OutputStart: ex.Start, Cursor: ex.End, Lost: ex.Lost, Truncated: ex.Truncated}
	w.Output, w.Encoding = render(ex.Tail, p.raw)
	setExit(&w, ex.Exit)
	w.TranscriptNote = s.transcriptNote(req, inst, ex.Transcript)
	s.setCursor(req, inst, w.Cursor)
	return textResult(readText(w, ex.LostBytes())), w, nil
}

// readText is the text content of a read that did not wait.
func readText(w WaitResult, lost int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d bytes from cursor %d to %d", w.Cursor-w.OutputStart, w.OutputStart, w.Cursor)
	if lost > 0 {
		fmt.Fprintf(&b, " (%d bytes before it were lost)", lost)
	}
	if w.Truncated {
		fmt.Fprintf(&b, " (more follows: read again from cursor %d)", w.Cursor)
	}
	if w.Exited {
		fmt.Fprintf(&b, "; guest exited with status %d", *w.ExitStatus)
	}
	b.WriteString("\n")
	if w.TranscriptNote != "" {
		fmt.Fprintf(&b, "NOTE: %s\n", w.TranscriptNote)
	}
	return b.String()
}

func (s *Server) registerSerial(ms *mcp.Server) {
	add(s, ms, tool("serial_send", "Send to serial console", mutating,
		"Type data and a newline on the guest's serial console, optionally waiting for a regex in its answer (after the echo of the line). Nothing is consumed: a long output is its start and end, elided giving the middle's cursors for serial_read."), s.send)
	add(s, ms, tool("serial_read", "Read serial console", reading,
		"Read console output from a cursor (default: where the last read ended), max_bytes a page: pass the result's cursor as since to page on; nothing is consumed. wait_for waits for a regex; a timeout is a result with timed_out true."), s.read)
}
