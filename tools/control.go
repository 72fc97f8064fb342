package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// QMPInput is qmp_command's arguments.
type QMPInput struct {
	Command   string         `json:"command" max:"128" jsonschema:"QMP command name, such as query-status"`
	Arguments map[string]any `json:"arguments,omitempty" jsonschema:"the command's arguments object"`
	Timeout   float64        `json:"timeout,omitempty" default:"30" jsonschema:"seconds to wait for QEMU's answer"`
	Offset    int            `json:"offset,omitempty" jsonschema:"first element to return of a long list answer (next_offset of the last call)"`
	Target
}

// QMPOutput is qmp_command's result.
type QMPOutput struct {
	Return     any    `json:"return" jsonschema:"QMP's return value, or a page of it"`
	Total      int    `json:"total,omitempty" jsonschema:"elements in the whole list answer, when return is a page of it"`
	NextOffset int    `json:"next_offset,omitempty" jsonschema:"offset of the next page, when more follows"`
	Size       int    `json:"size,omitempty" jsonschema:"bytes of the whole answer, when it was too large to return"`
	SavedTo    string `json:"saved_to,omitempty" jsonschema:"file holding the whole answer, when it was too large to return"`
}

// maxQMPArgs bounds a command's arguments.
const maxQMPArgs = 64 << 10

func (s *Server) qmpCommand(ctx context.Context, req *mcp.CallToolRequest, in QMPInput) (*mcp.CallToolResult, QMPOutput, error) {
	if strings.TrimSpace(in.Command) == "" {
		return nil, QMPOutput{}, fmt.Errorf("command is empty: give a QMP command such as query-status")
	}
	if in.Offset < 0 {
		return nil, QMPOutput{}, fmt.Errorf("offset %d: want 0 or more", in.Offset)
	}
	timeout, err := seconds("timeout", in.Timeout, 30*time.Second)
	if err != nil {
		return nil, QMPOutput{}, err
	}
	// A command QEMU would need long to read (a huge HMP line) would hold
	// the monitor: its arguments are bounded like every other input.
	if b, _ := json.Marshal(in.Arguments); len(b) > maxQMPArgs {
		return nil, QMPOutput{}, fmt.Errorf("qmp %s: arguments of %d bytes, more than the limit of %d", in.Command, len(b), maxQMPArgs)
	}
	inst, err := s.instance(in.Target)
	if err != nil {
		return nil, QMPOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	raw, err := inst.QMP(ctx, in.Command, in.Arguments)
	if err != nil {
		return nil, QMPOutput{}, err
	}
	out, err := s.qmpAnswer(inst, in.Command, raw, in.Offset, s.budget(req).Answer)
	if err != nil {
		return nil, QMPOutput{}, err
	}
	text := fmt.Sprintf("qmp %s: %d bytes of answer", in.Command, len(raw))
	switch {
	case out.Total > 0:
		text += fmt.Sprintf("; elements %d to %d of %d", in.Offset, in.Offset+len(out.Return.([]any)), out.Total)
		if out.NextOffset > 0 {
			text += fmt.Sprintf(" (next: offset %d)", out.NextOffset)
		}
	case out.SavedTo != "":
		text += "; too large to return, saved to " + out.SavedTo
	}
	return textResult(text), out, nil
}

// qmpAnswer fits an answer into budget characters of JSON (see
// kit.AnswerBudget): whole, a page of a list, or saved to a file in the
// captures directory.
func (s *Server) qmpAnswer(inst *instance.Instance, command string, raw json.RawMessage, offset, budget int) (QMPOutput, error) {
	decode := func(b []byte) (any, error) {
		// UseNumber keeps 64-bit integers (addresses, sizes) exact.
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("qmp %s: decode answer: %w", command, err)
		}
		return v, nil
	}
	if len(raw) <= budget && offset == 0 {
		v, err := decode(raw)
		return QMPOutput{Return: v}, err
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		if offset > len(list) {
			return QMPOutput{}, fmt.Errorf("offset %d: the answer has %d elements", offset, len(list))
		}
		page := []any{}
		size := 0
		for _, e := range list[offset:] {
			if len(page) > 0 && size+len(e) > budget {
				break
			}
			v, err := decode(e)
			if err != nil {
				return QMPOutput{}, err
			}
			page = append(page, v)
			size += len(e) + 1
		}
		out := QMPOutput{Return: page, Total: len(list)}
		if end := offset + len(page); end < len(list) {
			out.NextOffset = end
		}
		return out, nil
	}
	// One large object: the whole of it in a file, nothing lost.
	path, err := inst.Display().KeepAnswer(raw)
	if err != nil {
		return QMPOutput{}, fmt.Errorf("qmp %s: the answer (%d bytes) is too large to return, and saving it failed: %w", command, len(raw), err)
	}
	return QMPOutput{Size: len(raw), SavedTo: path}, nil
}

// ShutdownInput is qemu_shutdown's arguments.
type ShutdownInput struct {
	Method  string  `json:"method,omitempty" default:"quit" jsonschema:"quit (QMP quit, disks flushed), powerdown (ask the guest via system_powerdown first) or kill"`
	Timeout float64 `json:"timeout,omitempty" default:"10" jsonschema:"seconds to give the polite step before SIGTERM, then SIGKILL"`
	Force   bool    `json:"force,omitempty" jsonschema:"SIGKILL at once"`
	Target
}

// ShutdownOutput is qemu_shutdown's result.
type ShutdownOutput struct {
	Instance   string `json:"instance"`
	How        string `json:"how" jsonschema:"what stopped QEMU: already-exited, exited (by itself), stopped-while-booting, powerdown, quit, sigterm or sigkill"`
	PID        int    `json:"pid"`
	Exited     bool   `json:"exited"`
	ExitStatus int    `json:"exit_status"`
	Signal     string `json:"signal,omitempty" jsonschema:"the signal that killed QEMU, if any"`
	Running    bool   `json:"running"`
}

func (s *Server) shutdown(ctx context.Context, _ *mcp.CallToolRequest, in ShutdownInput) (*mcp.CallToolResult, ShutdownOutput, error) {
	method := qemu.Method(in.Method)
	if in.Force {
		method = qemu.Kill
	}
	switch method {
	case "", qemu.Quit, qemu.Powerdown, qemu.Kill:
	default:
		return nil, ShutdownOutput{}, fmt.Errorf("method %q: want quit, powerdown or kill", in.Method)
	}
	wait, err := seconds("timeout", in.Timeout, 10*time.Second)
	if err != nil {
		return nil, ShutdownOutput{}, err
	}
	inst, err := s.instance(in.Target)
	if err != nil {
		return nil, ShutdownOutput{}, err
	}
	wasStopped := inst.State() == instance.Stopped
	end, err := inst.Stop(ctx, method, wait)
	if err != nil {
		return nil, ShutdownOutput{}, fmt.Errorf("shutdown of %q: %w", inst.Name(), err)
	}
	if wasStopped && end.How != "already-exited" {
		end.How = "already-exited"
	}
	out := ShutdownOutput{Instance: inst.Name(), How: end.How, Exited: true, ExitStatus: end.Exit.Code, Signal: end.Exit.Signal}
	if m := inst.Process(); m != nil {
		out.PID = m.PID()
	}
	return textResult(fmt.Sprintf("%q: qemu pid %d stopped (%s): %s; FIFOs, QMP socket, TAP and lock released", out.Instance, out.PID, out.How, end.Exit)), out, nil
}

// StatusOutput is qemu_status's result.
type StatusOutput struct {
	Instance    string        `json:"instance"`
	State       string        `json:"state" jsonschema:"none (never booted), booting, running, stopping or stopped"`
	Running     bool          `json:"running"`
	Booted      bool          `json:"booted" jsonschema:"QEMU was started for this instance (it may have exited since)"`
	PID         int           `json:"pid,omitempty"`
	UptimeMS    int64         `json:"uptime_ms,omitempty" jsonschema:"milliseconds since QEMU started (until it exited)"`
	Exited      bool          `json:"exited"`
	ExitStatus  *int          `json:"exit_status,omitempty"`
	Argv        []string      `json:"argv,omitempty"`
	Files       []qemu.File   `json:"files,omitempty" jsonschema:"checked host files QEMU got as descriptors (/proc/self/fd/N in argv)"`
	Paths       qemu.Paths    `json:"paths"`
	SerialBytes int64         `json:"serial_bytes" jsonschema:"bytes of serial output so far (the cursor of its end)"`
	ReadCursor  int64         `json:"read_cursor" jsonschema:"where this session's next serial_read without since starts"`
	Boots       int           `json:"boots" jsonschema:"boots of this instance name in this server"`
	TAP         string        `json:"tap,omitempty" jsonschema:"the guest's TAP device, with network tap"`
	PCAP        *CaptureState `json:"pcap,omitempty" jsonschema:"the running or last capture"`
	Transcript  string        `json:"transcript,omitempty" jsonschema:"file holding the complete serial output of this boot"`
	// Events are the guest's recent QMP events (RESET, SHUTDOWN, STOP,
	// RESUME, BLOCK_IO_ERROR, GUEST_PANICKED, WATCHDOG ...), oldest first.
	Events      []instance.Event `json:"events,omitempty"`
	EventsTotal int              `json:"events_total,omitempty"`
}

// statusEvents is how many recent events qemu_status lists.
const statusEvents = 16

// CaptureState describes a capture for status results.
type CaptureState struct {
	Path    string `json:"path"`
	Active  bool   `json:"active"`
	Packets int64  `json:"packets"`
	Bytes   int64  `json:"bytes"`
	Drops   int64  `json:"drops"`
}

// captureState reports the guest's running capture, or else its last one.
func captureState(in *instance.Instance) *CaptureState {
	st, active, ok := in.Network().CaptureStats()
	if !ok {
		return nil
	}
	return &CaptureState{Path: st.Path, Active: active, Packets: st.Packets, Bytes: st.Bytes, Drops: st.Drops}
}

type empty struct{}

func (s *Server) status(_ context.Context, req *mcp.CallToolRequest, t Target) (*mcp.CallToolResult, StatusOutput, error) {
	if err := instance.CheckName(t.name()); err != nil {
		return nil, StatusOutput{}, err
	}
	inst, err := s.instance(t)
	if err != nil {
		// Asking about a guest that was never booted is a question with
		// an answer, not a failure.
		return textResult(advise(err).Error()), StatusOutput{Instance: t.name(), State: "none"}, nil
	}
	info := inst.Info()
	out := StatusOutput{Instance: inst.Name(), State: string(info.State), Boots: inst.Boot(), ReadCursor: s.cursor(req, inst),
		TAP: info.TAP, PCAP: captureState(inst), Transcript: inst.Transcript()}
	out.Events, out.EventsTotal = inst.Events(statusEvents)
	if out.EventsTotal == len(out.Events) {
		out.EventsTotal = 0
	}
	m := inst.Process()
	if m == nil {
		return textResult(fmt.Sprintf("%q: %s, QEMU not started", out.Instance, out.State)), out, nil
	}
	out.Booted = true
	out.PID = m.PID()
	out.Argv = m.Argv()
	out.Files = m.Files()
	out.Paths = m.Paths()
	out.SerialBytes = info.SerialBytes
	out.UptimeMS = info.Uptime.Milliseconds()
	var text string
	if exit := info.Exit; exit != nil {
		out.Exited = true
		code := exit.Code
		out.ExitStatus = &code
		text = fmt.Sprintf("%q: qemu pid %d %s after %s; %d bytes of serial output", out.Instance, out.PID, exit, info.Uptime.Round(time.Millisecond), out.SerialBytes)
	} else {
		out.Running = info.State == instance.Running
		text = fmt.Sprintf("%q: qemu pid %d %s for %s; %d bytes of serial output, next read from cursor %d",
			out.Instance, out.PID, out.State, info.Uptime.Round(time.Millisecond), out.SerialBytes, out.ReadCursor)
	}
	if len(out.Events) > 0 {
		var evs []string
		for _, e := range out.Events {
			s := e.Time.Format("15:04:05.000") + " " + e.Event
			if r := e.Reason(); r != "" {
				s += " (" + r + ")"
			}
			evs = append(evs, s)
		}
		text += "; events: " + strings.Join(evs, ", ")
	}
	return textResult(text), out, nil
}

func (s *Server) registerControl(ms *mcp.Server) {
	add(s, ms, tool("qmp_command", "QMP command", mutating,
		"Run a QMP command (e.g. query-status, system_reset) and return its 'return' value, a long list a page at a time (offset, next_offset); QMP errors are tool errors with their class."), s.qmpCommand)
	add(s, ms, tool("qemu_shutdown", "Shut down QEMU", mcp.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
		"Stop QEMU (QMP quit, or system_powerdown first; then SIGTERM, then SIGKILL of the exact process) and remove its FIFOs and socket. Reports how it ended and the exit status."), s.shutdown)
	add(s, ms, tool("qemu_status", "QEMU status", querying,
		"A guest's state (booting, running, stopping, stopped), pid, uptime, exit status, command line, paths, bytes of serial output, and its recent QMP events (RESET, SHUTDOWN, STOP, RESUME, errors) with times and cursors."), s.status)
}
