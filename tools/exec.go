package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
)

// ExecInput is guest_exec's arguments.
type ExecInput struct {
	Command  string  `json:"command" max:"65536" jsonschema:"shell command, run as if typed at the guest's shell prompt (cd and variables persist); stdin is empty"`
	Timeout  float64 `json:"timeout,omitempty" default:"30" jsonschema:"seconds; past it the command gets Ctrl-C"`
	MaxBytes int     `json:"max_bytes,omitempty" jsonschema:"most output bytes returned (default 16384, max 32768); longer: start and end, middle in elided"`
	Raw      bool    `json:"raw,omitempty" jsonschema:"bytes as sent (base64 if not UTF-8), not cleaned text"`
	Target
}

// ExecOutput is guest_exec's result.
type ExecOutput struct {
	ExitStatus     *int                     `json:"exit_status,omitempty"`
	Output         string                   `json:"output"`
	Encoding       string                   `json:"encoding,omitempty"`
	OutputStart    int64                    `json:"output_start"`
	OutputEnd      int64                    `json:"output_end"`
	Elided         *Span                    `json:"elided,omitempty"`
	Truncated      bool                     `json:"truncated,omitempty"`
	Cursor         int64                    `json:"cursor"`
	DurationMS     float64                  `json:"duration_ms"`
	TimedOut       bool                     `json:"timed_out,omitempty"`
	Interrupted    bool                     `json:"interrupted,omitempty"`
	StillRunning   bool                     `json:"still_running,omitempty"`
	ShellExited    bool                     `json:"shell_exited,omitempty"`
	NoShell        bool                     `json:"no_shell,omitempty"`
	Hint           string                   `json:"hint,omitempty"`
	KernelMessages []instance.KernelMessage `json:"kernel_messages,omitempty"`
	Tests          *instance.TestSummary    `json:"tests,omitempty"`
	Panicked       bool                     `json:"panicked,omitempty"`
	PanicMatch     string                   `json:"panic_match,omitempty"`
	GuestEvent     *instance.Event          `json:"guest_event,omitempty"`
	QEMUExited     bool                     `json:"qemu_exited,omitempty"`
	QEMUExitStatus *int                     `json:"qemu_exit_status,omitempty"`
}

func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	timeout, err := seconds("timeout", in.Timeout, 30*time.Second)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	maxBytes, err := checkMaxBytes(in.MaxBytes, defaultMaxBytes, s.budget(req).Page)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	ran, err := inst.Exec(ctx, instance.Command{Line: in.Command, Timeout: timeout, MaxOutput: maxBytes, KeepHead: !in.Raw})
	if err != nil {
		return nil, ExecOutput{}, fmt.Errorf("guest_exec: %w", err)
	}
	out := execResult(ran, in.Raw)
	out.Hint = execHint(ran.ShellResult, timeout)
	if ran.Event != nil && !ran.Completed {
		out.Hint = eventText(*ran.Event) + " while the command ran"
	}
	s.setCursor(req, inst, out.Cursor)
	return textResult(execText(in.Command, out)), out, nil
}

// execResult is how the command ran, as the agent reads it.
func execResult(ran instance.Ran, raw bool) ExecOutput {
	res := ran.ShellResult
	out := ExecOutput{OutputStart: res.OutputStart, OutputEnd: res.OutputEnd, Cursor: res.Cursor, GuestEvent: ran.Event,
		DurationMS: float64(res.Duration.Microseconds()) / 1000, TimedOut: res.TimedOut, Interrupted: res.Interrupted,
		StillRunning: res.StillRunning, ShellExited: res.ShellExited, NoShell: ran.NoShell}
	if res.Completed || res.ShellExited {
		code := res.ExitStatus
		out.ExitStatus = &code
	}
	if w := res.Wait; w != nil && w.Panicked {
		out.Panicked, out.PanicMatch = true, w.PanicMatch
	}
	if exit := ran.Output.Exit; exit != nil {
		out.QEMUExited = true
		code := exit.Code
		out.QEMUExitStatus = &code
	}
	if res.Started {
		out.Output, out.Encoding, out.Elided = excerptText(ran.Output, raw)
		out.Truncated, out.KernelMessages, out.Tests = ran.Output.Truncated, ran.Output.KernelMessages, ran.Output.Tests
	}
	return out
}

// execHint says what to do when the command did not simply end.
func execHint(res instance.ShellResult, timeout time.Duration) string {
	switch {
	case !res.Started && res.Wait != nil && res.Wait.Finished:
		return "QEMU exited before a shell answered"
	case !res.Started && res.Wait != nil && res.Wait.Panicked:
		return "the kernel panicked before a shell answered"
	case !res.Started:
		return fmt.Sprintf("no shell answered at the console within %v: the kernel may still be booting (serial_read with wait_for its prompt), a program may hold the console, or it runs no POSIX shell; the typed line stays in the console's input, so a shell that reads it later runs it (serial_send \"\\u0003\" discards it at a shell prompt)", timeout)
	case res.StillRunning && !res.JobControl:
		return "Ctrl-C did not reach the command: the shell runs without job control, most likely without a controlling terminal (start it with setsid cttyhack sh, or getty); the command still runs and its output keeps arriving (serial_read from cursor); run long commands with timeout N CMD, or restart the guest"
	case res.StillRunning:
		return "the shell did not answer within 2 s of Ctrl-C: the command ignores SIGINT or keeps the shell busy; its output keeps arriving (serial_read from cursor); serial_send \"\\u0003\" or \"\\u001c\" (SIGQUIT) again, or restart the guest"
	case res.TimedOut:
		return "timed out: the command got Ctrl-C and the shell answers again; give a longer timeout, or run it in the background (CMD > /tmp/log 2>&1 &)"
	case res.ShellExited:
		return "the command ended the shell; the guest's init may start another (serial_read shows what follows)"
	}
	return ""
}

// execText is the text content: the exit status and the output, for
// readers that see only text.
func execText(command string, o ExecOutput) string {
	var b strings.Builder
	switch {
	case o.NoShell:
		b.WriteString("no shell answered")
	case o.ShellExited:
		fmt.Fprintf(&b, "the shell exited with status %d", *o.ExitStatus)
	case o.ExitStatus != nil:
		fmt.Fprintf(&b, "exit status %d in %.1f ms", *o.ExitStatus, o.DurationMS)
	case o.TimedOut && o.Interrupted:
		fmt.Fprintf(&b, "timed out after %.1f s; interrupted with Ctrl-C, the shell answers again", o.DurationMS/1000)
	case o.TimedOut:
		fmt.Fprintf(&b, "timed out after %.1f s; still running", o.DurationMS/1000)
	case o.Panicked:
		fmt.Fprintf(&b, "PANIC: %s", o.PanicMatch)
	case o.GuestEvent != nil:
		b.WriteString(eventText(*o.GuestEvent))
	case o.QEMUExited:
		fmt.Fprintf(&b, "QEMU exited (status %d)", deref(o.QEMUExitStatus))
	default:
		b.WriteString("ended")
	}
	if o.Hint != "" && o.ExitStatus == nil {
		b.WriteString(": " + o.Hint)
	}
	fmt.Fprintf(&b, "; output %d..%d", o.OutputStart, o.OutputEnd)
	if o.Elided != nil {
		fmt.Fprintf(&b, " with %d..%d elided", o.Elided.Start, o.Elided.End)
	}
	fmt.Fprintf(&b, "; next read from cursor %d\n", o.Cursor)
	if o.Tests != nil {
		b.WriteString(o.Tests.String() + "\n")
	}
	for _, k := range o.KernelMessages {
		fmt.Fprintf(&b, "kernel: %s\n", k.Text)
	}
	if o.Output != "" {
		b.WriteString(o.Output)
		if !strings.HasSuffix(o.Output, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}

func (s *Server) registerExec(ms *mcp.Server) {
	add(s, ms, tool("guest_exec", "Run in guest", mutating,
		"Run a shell command at the guest's console shell (any POSIX shell, any prompt) and return its output (no echo), exit_status and duration_ms; TAP/KTAP output adds tests (totals, failures). Past timeout it gets Ctrl-C. Calls on one console run one after another."), s.exec)
}
