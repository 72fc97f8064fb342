package tools_test

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// A stopped QEMU (SIGSTOP) takes no QMP command and reads no console
// input: calls end at their time-out with a clear error, the monitor stays
// connected (server_info says it is stuck), and once QEMU continues
// everything works again.
func TestStoppedQEMU(t *testing.T) {
	s := newSession(t)
	b := s.bootTiny()
	q := qemuProcess(t, b.PID)
	if err := proc.Signal(q, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { proc.Signal(q, unix.SIGCONT) }
	defer cont()

	// QMP: commands of 60 KB fill the socket until a write blocks; each
	// call ends at its timeout, abandoned.
	var abandoned int
	start := time.Now()
	for range 12 {
		res := s.call("qmp_command", map[string]any{"command": "qom-list", "arguments": map[string]any{"path": "/" + strings.Repeat("a", 60000)}, "timeout": 0.5}, nil)
		if res.IsError && strings.Contains(text(res), "abandoned") {
			abandoned++
		}
	}
	if abandoned == 0 || time.Since(start) > 15*time.Second {
		t.Fatalf("%d of 12 commands abandoned in %v", abandoned, time.Since(start))
	}
	var si struct {
		Health   string   `json:"health"`
		Problems []string `json:"problems"`
	}
	s.mustCall("server_info", nil, &si)
	if si.Health != "degraded" || !strings.Contains(strings.Join(si.Problems, "\n"), "has not taken a QMP command") {
		t.Errorf("server_info while QEMU is stopped: %+v", si)
	}

	// The console: a write that QEMU does not drain ends at the timeout.
	chunk := strings.Repeat("x", 65000)
	s.mustCall("serial_send", map[string]any{"data": chunk, "newline": "none"}, nil)
	start = time.Now()
	res := s.call("serial_send", map[string]any{"data": chunk, "newline": "none", "timeout": 2}, nil)
	if took := time.Since(start); !res.IsError || !strings.Contains(text(res), "not reading its console") || took > 5*time.Second {
		t.Errorf("a blocked console write: %v after %v: %s", res.IsError, took, text(res))
	}

	// QEMU continues: the abandoned commands run, their answers are
	// dropped, and the monitor answers.
	cont()
	var st struct {
		Return struct {
			Status string `json:"status"`
		} `json:"return"`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res := s.call("qmp_command", map[string]any{"command": "query-status", "timeout": 5}, &st)
		if !res.IsError && st.Return.Status == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("query-status after SIGCONT: %s", text(res))
		}
	}
	s.mustCall("server_info", nil, &si)
	if si.Health != "ok" {
		t.Errorf("server_info after SIGCONT: %+v", si)
	}
}

// Oversized inputs are refused at once with short errors naming the limit.
func TestInputLimits(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"serial_send", map[string]any{"data": strings.Repeat("y", 1<<20), "timeout": 60}, "limit of 1048576"},
		{"serial_send", map[string]any{"data": strings.Repeat("y", 100<<10), "timeout": 60}, "limit of 65536"},
		{"qmp_command", map[string]any{"command": strings.Repeat("x", 2<<20)}, "limit of 1048576"},
		{"qmp_command", map[string]any{"command": strings.Repeat("x", 1000)}, "limit of 128"},
		{"qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": strings.Repeat("i", 2<<20)}}, "limit of 1048576"},
		{"qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": strings.Repeat("i", 100<<10)}}, "limit of 65536"},
		{"qemu_type_text", map[string]any{"text": strings.Repeat("a", 20000)}, "limit of 1000"},
		{"qemu_type_text", map[string]any{"text": strings.Repeat("a", 1000), "delay_ms": 100}, "type it in parts"},
		{"qemu_type_text", map[string]any{"text": "a", "delay_ms": 10001}, "delay_ms 10001: want 0 to 10000"},
		{"qemu_send_key", map[string]any{"keys": "ret", "hold_time": 10001}, "hold_time 10001: want 0 to 10000 ms"},
		{"serial_read", map[string]any{"wait_for": []any{strings.Repeat("(", 5000)}}, "limit of 4096"},
		{"qemu_boot", map[string]any{"extra_args": make([]any, 300), "restart": true}, "limit of 256"},
		{"qemu_boot", map[string]any{"command_line": strings.Repeat("-no-reboot ", 2000), "restart": true}, "limit of 16384"},
		{"qemu_boot", map[string]any{"command_line": make([]any, 600), "restart": true}, "limit of 512"},
		{"serial_read", map[string]any{"wait_for": strings.Repeat("(", 5000)}, "limit of 4096"},
		{"serial_read", map[string]any{"since": 0, "max_bytes": 1 << 30}, "at most 32768"},
	} {
		start := time.Now()
		res := s.call(c.tool, c.args, nil)
		msg := text(res)
		// Refused before anything waits (a wait would take its 60 s):
		// ten seconds leave room for the client and the SDK, which marshal
		// and parse the oversized request themselves, slowly under the
		// race detector on a busy machine (3.3 s seen).
		if !res.IsError || !strings.Contains(msg, c.want) || len(msg) > 2200 || time.Since(start) > 10*time.Second {
			t.Errorf("%s: error %v after %v, %d bytes: %.300s", c.tool, res.IsError, time.Since(start), len(msg), msg)
		}
	}
	// (Ten megabytes and more never reach a tool over stdio: the framing
	// refuses such a line unread, see cmd/qemu-mcp TestHostileStdio.)
	// The session and the guest are fine.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo fine", "wait_for": `fine\r\n`}, &w)
	if !w.Matched {
		t.Errorf("after the oversized inputs: %+v", w)
	}
}

// A stopped QEMU is still shut down: the polite step times out, SIGKILL
// ends it.
func TestShutdownStoppedQEMU(t *testing.T) {
	s := newSession(t)
	b := s.bootTiny()
	if err := proc.Signal(qemuProcess(t, b.PID), unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var sd struct {
		How string `json:"how"`
	}
	s.mustCall("qemu_shutdown", map[string]any{"timeout": 1}, &sd)
	if took := time.Since(start); took > 8*time.Second || (sd.How != "sigkill" && sd.How != "sigterm") {
		t.Errorf("shutdown of a stopped QEMU: %+v after %v", sd, took)
	}
	assertEmptyRuntimeDir(t, s.dir)
}
