// Package shell runs a command at a POSIX shell (BusyBox ash, dash, bash)
// that reads a guest's serial console, and tells its output, exit status
// and duration apart from the typed line's echo, the prompt and the shell's
// own noise, whatever the prompt looks like.
//
// Every typed byte costs: the guest echoes it through its UART, a fraction
// of a millisecond each under TCG. So the framing lives in a shell
// function, _qm, defined the first time a shell does not know it (one
// line, then the shell keeps it), and a call types only
//
//	_qm SEQ 'CMD'
//
// (CMD unquoted when it is one plain word). The function prints a start
// marker, runs CMD with "command eval" </dev/null, and prints an end marker
// with its exit status; an EXIT trap prints a third marker if CMD ends the
// shell. Each marker carries the function's nonce, random at its
// definition, and the call's sequence number; they are assembled by printf
// from separate words, so neither the echo nor a command's output (which
// cannot know the nonce) is mistaken for one, and a late marker of an
// earlier call never is. eval runs CMD in the shell itself, so cd and
// variables persist as if it had been typed; a syntax error in CMD is
// eval's error, and "command" keeps it from aborting the rest, as an
// interactive dash or ash would. stdin is /dev/null: a program that reads
// input ends instead of waiting. The start marker also carries the guest's
// uptime, read from /proc/uptime by the shell's builtin read (no fork):
// printk's clock runs about 20 ms ahead of it, so a timestamped line not
// older than it was printed during the command (see SplitKernel). The
// function leaves its variables (__qmn, __qms, __qmc, __qmu, __qmx) in the
// shell. Commands with control characters, non-ASCII bytes or long lines
// are carried in __qmc, piece by piece, so that no line exceeds what a line
// editor takes (BusyBox: 1,024 bytes) and no byte is taken for an editing
// key.
//
// A command past its timeout is interrupted with Ctrl-C, and a probe line
// checks that the shell answers again; a shell without a controlling
// terminal never sees a Ctrl-C, which the result says.
package shell

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// Console is where the shell runs: bytes typed to it, and its output.
type Console interface {
	Write(ctx context.Context, p []byte) (int, error)
	Buffer() *serial.Buffer
}

// WaitFunc waits on the console's output (serial.Buffer.WaitFor, or a
// caller's wrapper that also ends the wait when the guest stops).
type WaitFunc func(ctx context.Context, since int64, spec serial.Spec) (serial.Result, error)

// Request is a command to run.
type Request struct {
	Command string
	// Timeout bounds the whole run, from typing the line to the end
	// marker; past it the command is interrupted.
	Timeout time.Duration
	// Panic are the panic patterns of the waits (nil: serial's defaults).
	Panic []*regexp.Regexp
	// Wait replaces the console buffer's own WaitFor.
	Wait WaitFunc
	// Grace bounds how long the shell may take to answer after Ctrl-C
	// (default 2 s).
	Grace time.Duration
	// Newline ends each typed line (default "\r", the Enter key).
	Newline string
	// Seq numbers the call among the console's calls, 10 to 99 (two
	// digits to type; default: from the clock): a late marker of one of
	// the calls before is never taken for this one's.
	Seq int
}

// Result is how a command ran.
type Result struct {
	// Started says a shell answered: it printed the start marker.
	Started bool
	// From is where the typed line's echo begins; OutputStart and
	// OutputEnd delimit the command's output; Cursor is past the end
	// marker (or the end of the output when none came).
	From, OutputStart, OutputEnd, Cursor int64
	// Completed says the command ran to its end with ExitStatus.
	Completed  bool
	ExitStatus int
	// ShellExited says the command ended the shell (exit, or the shell
	// died): ExitStatus is the shell's.
	ShellExited bool
	// TimedOut says the timeout passed first; Interrupted that Ctrl-C
	// then brought the shell back, StillRunning that it did not within
	// the grace period.
	TimedOut, Interrupted, StillRunning bool
	// JobControl says the shell runs with job control ($- has m): without
	// it, it most likely has no controlling terminal and Ctrl-C reaches
	// nothing.
	JobControl bool
	// Uptime is the guest's uptime in seconds when the command started,
	// read from /proc/uptime by the start marker (a builtin read, no
	// fork); 0 where the guest has no /proc.
	Uptime float64
	// Duration is the time from the start marker to the end marker, as
	// the host saw them.
	Duration time.Duration
	// Wait is the last wait when it ended otherwise than on a marker
	// (Panicked, Finished, ...).
	Wait *serial.Result
}

// Error is a command that could not be typed.
var ErrCommand = errors.New("shell: command")

// maxLine bounds a typed line: BusyBox's line editor takes 1,024 bytes.
const maxLine = 700

// Run types req.Command at the shell on con and waits for it (see the
// package comment). The caller serialises calls on one console.
func Run(ctx context.Context, con Console, req Request) (Result, error) {
	if strings.TrimSpace(req.Command) == "" {
		return Result{}, fmt.Errorf("%w is empty: give a shell command such as uname -a", ErrCommand)
	}
	if strings.IndexByte(req.Command, 0) >= 0 {
		return Result{}, fmt.Errorf("%w contains a NUL byte, which no shell takes", ErrCommand)
	}
	wait := req.Wait
	if wait == nil {
		wait = con.Buffer().WaitFor
	}
	grace := req.Grace
	if grace <= 0 {
		grace = 2 * time.Second
	}
	nl := req.Newline
	if nl == "" {
		nl = "\r"
	}
	seq := req.Seq
	if seq <= 0 {
		seq = 10 + int(time.Now().UnixNano()%90)
	}
	call := Call(req.Command, seq)
	start := time.Now()
	deadline := start.Add(req.Timeout)
	buf := con.Buffer()
	res := Result{From: buf.End()}
	typeLines := func(lines []string) error {
		var typed []byte
		for _, l := range lines {
			typed = append(typed, l...)
			typed = append(typed, nl...)
		}
		wctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		if _, err := con.Write(wctx, typed); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return fmt.Errorf("type the command: %w (the guest does not read its console)", err)
		}
		return nil
	}
	if err := typeLines(call); err != nil {
		return res, err
	}
	ss := strconv.Itoa(seq)
	startRE := regexp.MustCompile(`qm([0-9a-f]{6})\.` + ss + `:S([A-Za-z]*):([0-9.]*)\r?\n`)
	spec := func(pats ...*regexp.Regexp) serial.Spec {
		return serial.Spec{Patterns: pats, Panic: req.Panic, Timeout: max(time.Until(deadline), time.Millisecond), MaxOutput: 64}
	}

	w, err := wait(ctx, res.From, spec(startRE, missingRE))
	if err != nil {
		return res, err
	}
	if w.Matched && w.Index == 1 {
		// A shell without the function (a new one, or the first call):
		// define it and call again.
		since := w.End
		if err := typeLines(append([]string{Definition(newNonce())}, call...)); err != nil {
			return res, err
		}
		if w, err = wait(ctx, since, spec(startRE)); err != nil {
			return res, err
		}
	}
	if !w.Matched {
		res.Cursor = w.Cursor
		res.Wait = &w
		res.TimedOut = w.TimedOut
		return res, nil
	}
	res.Started = true
	res.OutputStart, res.Cursor = w.End, w.End
	res.JobControl = strings.ContainsRune(w.Groups[1], 'm')
	res.Uptime, _ = strconv.ParseFloat(w.Groups[2], 64)
	q := regexp.QuoteMeta("qm" + w.Groups[0] + "." + ss + ":")
	endRE := regexp.MustCompile(q + `E(\d+)\r?\n`)
	exitRE := regexp.MustCompile(q + `X(\d+)\r?\n`)
	began := time.Now()

	w, err = wait(ctx, res.OutputStart, spec(endRE, exitRE))
	if err != nil {
		return res, err
	}
	if w.Matched {
		res.Duration = time.Since(began)
		res.OutputEnd, res.Cursor = w.Start, w.End
		res.ExitStatus, _ = strconv.Atoi(w.Groups[0])
		res.Completed = w.Index == 0
		res.ShellExited = w.Index == 1
		return res, nil
	}
	res.OutputEnd, res.Cursor = w.Cursor, w.Cursor
	res.Duration = time.Since(began)
	res.Wait = &w
	if !w.TimedOut {
		return res, nil // a panic, the guest's end, an event: the caller says
	}
	res.TimedOut = true
	return interrupt(ctx, con, wait, res, grace, nl)
}

// interrupt sends Ctrl-C and checks with a probe line that the shell
// answers again; the probe also lifts the EXIT trap the interrupted line
// never got to.
func interrupt(ctx context.Context, con Console, wait WaitFunc, res Result, grace time.Duration, nl string) (Result, error) {
	wctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	if _, err := con.Write(wctx, []byte{0x03}); err != nil {
		res.StillRunning = true
		return res, nil
	}
	// Let the shell take the interrupt before it reads the probe: the
	// terminal discards typed-ahead input when it delivers SIGINT.
	buf := con.Buffer()
	at := buf.End()
	if _, err := wait(ctx, at, serial.Spec{Idle: 30 * time.Millisecond, Timeout: 300 * time.Millisecond, Panic: []*regexp.Regexp{}, MaxOutput: 1}); err != nil {
		return res, err
	}
	nonce := newNonce()
	probe := "trap - 0;printf 'qm%s:R\\n' " + nonce + nl
	if _, err := con.Write(wctx, []byte(probe)); err != nil {
		res.StillRunning = true
		return res, nil
	}
	re := regexp.MustCompile(regexp.QuoteMeta("qm"+nonce+":R") + `\r?\n`)
	w, err := wait(ctx, at, serial.Spec{Patterns: []*regexp.Regexp{re}, Timeout: grace, Panic: []*regexp.Regexp{}, MaxOutput: 1})
	if err != nil {
		return res, err
	}
	if w.Matched {
		res.Interrupted = true
		res.Cursor = w.End
	} else {
		res.StillRunning = true
	}
	return res, nil
}

func newNonce() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// missingRE is a shell's answer to a call of a function it does not
// have: ash "sh: _qm: not found", dash "dash: 1: _qm: not found",
// bash "bash: _qm: command not found".
var missingRE = regexp.MustCompile(`_qm: (?:command )?not found`)

// Definition is the line that defines the framing function with nonce
// (6 hex digits): see the package comment.
func Definition(nonce string) string {
	return "__qmn=" + nonce + ";_qm(){ __qms=$__qmn.$1;__qmc=$2;set --;" +
		"trap \"printf 'qm%s:X%d\\n' $__qms \\$?\" 0;__qmu=;{ read __qmu __qmx;} 2>/dev/null </proc/uptime;" +
		"printf 'qm%s:S%s:%s\\n' $__qms \"$-\" \"$__qmu\";" +
		"command eval \"$__qmc\" </dev/null;printf 'qm%s:E%d\\n' $__qms $?;trap - 0;unset __qmc;}"
}

// Call returns the lines that run command as call seq of the framing
// function. Most commands fit one line; others are carried in the
// variable __qmc, a piece a line.
func Call(command string, seq int) []string {
	n := strconv.Itoa(seq)
	if plainWord(command) {
		return []string{"_qm " + n + " " + command}
	}
	if typeable(command) && len(command) < maxLine && !strings.Contains(command, "\n") {
		return []string{"_qm " + n + " '" + quote(command) + "'"}
	}
	var lines []string
	first := true
	assign := func(expr string) {
		if first {
			lines = append(lines, "__qmc="+expr)
			first = false
		} else {
			lines = append(lines, "__qmc=$__qmc"+expr)
		}
	}
	if typeable(command) {
		// Printable text with newlines: each piece single-quoted, a
		// newline kept inside the quotes (the shell reads on).
		for _, piece := range pieces(command, func(s string) int { return len(quote(s)) }) {
			assign("'" + quote(piece) + "'")
		}
	} else {
		// Anything else through printf's octal escapes: one fork a
		// piece, only for such commands.
		for _, piece := range pieces(command, func(s string) int { return len(octal(s)) }) {
			lines = append(lines, "__qmp=$(printf '"+octal(piece)+"x')")
			assign("${__qmp%x}")
		}
		lines = append(lines, "unset __qmp")
	}
	return append(lines, "_qm "+n+" \"$__qmc\"")
}

// plainWord reports whether s is one word that needs no quotes (true,
// uname, ./run-tests): every byte typed is echoed, and costs.
func plainWord(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-' || c == '+' || c == ':' || c == ',' || c == '@') {
			return false
		}
	}
	return true
}

// typeable reports whether every byte of s can be typed as it is: printable
// ASCII and newlines (no editing keys, no bytes a line editor may not take).
func typeable(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\n') || c >= 0x7f {
			return false
		}
	}
	return true
}

// quote escapes s for single quotes.
func quote(s string) string { return strings.ReplaceAll(s, "'", `'\''`) }

// octal escapes s for a printf format in single quotes.
func octal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '%':
			b.WriteString("%%")
		case c == '\'' || c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, `\%03o`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// pieces cuts s into pieces whose encoded size stays under maxLine, at
// rune boundaries, and after each newline (a line of its own when typed).
func pieces(s string, size func(string) int) []string {
	var out []string
	for len(s) > 0 {
		n := 0
		for n < len(s) {
			_, w := utf8.DecodeRuneInString(s[n:])
			if n > 0 && size(s[:n+w]) > maxLine-40 {
				break
			}
			n += w
			if s[n-1] == '\n' {
				break
			}
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// KernelMessage is a kernel log line that landed in a command's output.
type KernelMessage struct {
	// Cursor is where it starts in the console.
	Cursor int64  `json:"cursor"`
	Text   string `json:"text"`
}

var stampRE = regexp.MustCompile(`\[\s*(\d+\.\d{6})\] `)

// SplitKernel takes out of out (the console bytes from offset at) the
// kernel messages that printk printed during the command, which carry a
// timestamp (printk.time) not older than uptime, the guest's uptime when
// the command started: older timestamped lines are the command's own
// output (dmesg). Without timestamps kernel messages cannot be told apart
// and stay in the output.
func SplitKernel(out []byte, at int64, uptime float64) ([]byte, []KernelMessage) {
	if uptime <= 0 || !stampRE.Match(out) {
		return out, nil
	}
	var keep []byte
	var msgs []KernelMessage
	rest := out
	pos := at
	for len(rest) > 0 {
		loc := stampRE.FindSubmatchIndex(rest)
		if loc == nil {
			break
		}
		ts, _ := strconv.ParseFloat(string(rest[loc[2]:loc[3]]), 64)
		lineEnd := bytes.IndexByte(rest[loc[0]:], '\n')
		end := len(rest)
		if lineEnd >= 0 {
			end = loc[0] + lineEnd + 1
		}
		if ts+0.000001 < uptime {
			keep = append(keep, rest[:end]...)
		} else {
			keep = append(keep, rest[:loc[0]]...)
			msgs = append(msgs, KernelMessage{Cursor: pos + int64(loc[0]), Text: strings.TrimRight(string(rest[loc[0]:end]), "\r\n")})
		}
		pos += int64(end)
		rest = rest[end:]
	}
	return append(keep, rest...), msgs
}
