package tools_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/settings"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

// bootUBoot boots Debian's U-Boot as the default guest of a new session
// (skipping the test where it is not installed), with args over the usual
// arguments, and waits for its autoboot prompt or for args' wait_for.
func bootUBoot(t testing.TB, args map[string]any) (*session, bootOut) {
	t.Helper()
	if _, err := os.Stat(testguest.UBoot); err != nil {
		t.Skipf("%s missing: run scripts/deps (installs u-boot-qemu)", testguest.UBoot)
	}
	s := newSession(t)
	a := map[string]any{"kernel": testguest.UBoot, "memory": "256M", "wait_for": "Hit any key to stop autoboot", "timeout": 60}
	maps.Copy(a, args)
	var b bootOut
	s.mustCall("qemu_boot", a, &b)
	if !b.Matched {
		t.Fatalf("U-Boot: %q not seen: %q", a["wait_for"], b.Output)
	}
	return s, b
}

func needQEMU(t testing.TB) { t.Helper(); testguest.NeedQEMU(t) }

type session struct {
	t   testing.TB
	cs  *mcp.ClientSession
	srv *tools.Server
	dir string
}

// newSession starts a tool server and connects a real MCP client to it over
// in-memory transports: the same path stdio takes, minus the pipe.
func newSession(t testing.TB) *session { return newSessionWith(t, nil, nil) }

// testConfig is a test server's settings and its tools' options.
type testConfig struct {
	settings.Settings
	WholeText bool
}

// newSessionWith is newSession with the server's config adjusted by adjust
// and the client's options given.
func newSessionWith(t testing.TB, adjust func(*testConfig), copts *mcp.ClientOptions) *session {
	t.Helper()
	return newSessionAs(t, "test", adjust, copts)
}

// newSessionAs is newSessionWith for a client that declares its name.
func newSessionAs(t testing.TB, client string, adjust func(*testConfig), copts *mcp.ClientOptions) *session {
	t.Helper()
	needQEMU(t)
	kernel, symbols := testImage(t, "tiny.bin"), testImage(t, "tiny.elf")
	dir := testguest.SocketDir(t, "qmcp")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	// Each session has its own lock: tests of other packages boot guests
	// from this repository at the same time.
	cfg := testConfig{Settings: settings.Settings{RuntimeDir: dir, BuiltinKernel: kernel, BuiltinSymbols: symbols, Version: "test", Logger: log,
		LockFile: filepath.Join(t.TempDir(), "qemu.lock"), QEMUBinary: testguest.QEMU(t)}}
	if adjust != nil {
		adjust(&cfg)
	}
	srv, err := newServer(cfg.Settings, tools.Config{Version: "test", WholeText: cfg.WholeText, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return &session{t: t, cs: connect(t, srv, client, copts, nil), srv: srv, dir: dir}
}

// testImage is the guest image name of testdata/images (tiny.bin, the
// built-in kernel; tiny.elf, its symbols).
func testImage(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../testdata/images", name))
	if err != nil {
		t.Fatalf("read test image: %v", err)
	}
	return b
}

// connect connects a real MCP client named client to srv over in-memory
// transports, the same path stdio takes minus the pipe; the test's end
// closes both and the server.
func connect(t testing.TB, srv *tools.Server, client string, copts *mcp.ClientOptions, opts *mcp.ClientSessionOptions) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.NewMCPServer().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: client}, copts).Connect(ctx, ct, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.Close(cctx); err != nil {
			t.Errorf("close server: %v", err)
		}
	})
	return cs
}

// bareSession starts a tool server and connects a real MCP client to it
// over in-memory transports, with no QEMU and no guest's settings: enough
// for what a client learns without booting (the handshake, the lists of
// tools and resources). opts are the client session's (its protocol
// version, say).
func bareSession(t testing.TB, opts *mcp.ClientSessionOptions) *mcp.ClientSession {
	t.Helper()
	dir := testguest.SocketDir(t, "qmcp")
	srv, err := newServer(settings.Settings{RuntimeDir: dir, Version: "test", Logger: slog.New(slog.DiscardHandler),
		LockFile: filepath.Join(dir, "qemu.lock"), Captures: filepath.Join(dir, "captures"),
		Snapshots: filepath.Join(dir, "snapshots"), CacheDir: filepath.Join(dir, "cache")}, tools.Config{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return connect(t, srv, "test", nil, opts)
}

// call invokes a tool and decodes its structured result into out. It
// returns the result so tests can look at IsError and the text.
func (s *session) call(name string, args map[string]any, out any) *mcp.CallToolResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s: protocol error: %v", name, err)
	}
	if out != nil && !res.IsError {
		// Fields a result leaves out (false flags) must read as zero, not
		// as what an earlier call left in out.
		v := reflect.ValueOf(out).Elem()
		v.Set(reflect.Zero(v.Type()))
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("%s: decode %s: %v", name, b, err)
		}
	}
	return res
}

// mustCall is call that fails the test on a tool error.
func (s *session) mustCall(name string, args map[string]any, out any) {
	s.t.Helper()
	if res := s.call(name, args, out); res.IsError {
		s.t.Fatalf("%s(%v): tool error: %s", name, args, text(res))
	}
}

// wantError calls a tool that must fail and checks its message.
func (s *session) wantError(name string, args map[string]any, want ...string) {
	s.t.Helper()
	res := s.call(name, args, nil)
	if !res.IsError {
		s.t.Fatalf("%s(%v) succeeded, want an error containing %q", name, args, want)
	}
	msg := text(res)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			s.t.Errorf("%s error %q does not contain %q", name, msg, w)
		}
	}
}

// text is the text content of a result.
var text = mcptest.Text

type bootOut struct {
	PID      int      `json:"pid"`
	Argv     []string `json:"argv"`
	Output   string   `json:"output"`
	Matched  bool     `json:"matched"`
	Match    string   `json:"match"`
	Cursor   int64    `json:"cursor"`
	TimedOut bool     `json:"timed_out"`
	Running  bool     `json:"running"`
	Elapsed  int64    `json:"elapsed_ms"`
	Paths    struct {
		SerialIn  string `json:"serial_in"`
		SerialOut string `json:"serial_out"`
		QMPSocket string `json:"qmp_socket"`
	} `json:"paths"`
}

type waitOut struct {
	Written     int    `json:"written"`
	Output      string `json:"output"`
	OutputStart int64  `json:"output_start"`
	Truncated   bool   `json:"truncated"`
	Matched     bool   `json:"matched"`
	Cursor      int64  `json:"cursor"`
	TimedOut    bool   `json:"timed_out"`
	Exited      bool   `json:"exited"`
	ExitStatus  *int   `json:"exit_status"`
	Running     bool   `json:"running"`
}

const prompt = `tiny> $`

func (s *session) bootTiny() bootOut {
	s.t.Helper()
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched {
		s.t.Fatalf("boot: prompt not seen: %+v", b)
	}
	return b
}

// qemuProcess is the process pid as proc identifies it (pid and start
// time), so that a test signals or checks that very process, not a later
// one given the same pid.
func qemuProcess(t testing.TB, pid int) proc.Identity {
	t.Helper()
	info, err := proc.Stat(pid)
	if err != nil {
		t.Fatalf("qemu pid %d: %v", pid, err)
	}
	return proc.Identity{PID: info.PID, StartTime: info.StartTime}
}

func TestBootWaitForEchoAndShutdownLeavesNothing(t *testing.T) {
	s := newSession(t)
	b := s.bootTiny()
	if !strings.Contains(b.Output, "qemu-mcp tiny kernel 1.0") || !strings.HasSuffix(b.Output, "tiny> ") {
		t.Errorf("boot output %q lacks the banner or does not end at the prompt", b.Output)
	}
	if b.Cursor <= int64(len(b.Output)) || !b.Running || b.Match != "tiny> " {
		t.Errorf("boot result: cursor %d, output %d bytes, running %v, match %q", b.Cursor, len(b.Output), b.Running, b.Match)
	}
	if b.Argv[0] == "" || !contains(b.Argv, "-S") || !contains(b.Argv, "-kernel") {
		t.Errorf("argv %q", b.Argv)
	}
	for _, p := range []string{b.Paths.SerialIn, b.Paths.SerialOut, b.Paths.QMPSocket} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("path in use is missing: %v", err)
		}
	}
	q := qemuProcess(t, b.PID)

	var send waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo hello world", "wait_for": `hello world\r\n` + prompt}, &send)
	if !send.Matched || send.Written != len("echo hello world\r") {
		t.Fatalf("send: %+v", send)
	}
	if send.Output != "echo hello world\nhello world\ntiny> " {
		t.Errorf("send output %q", send.Output)
	}

	var st struct {
		Running     bool  `json:"running"`
		PID         int   `json:"pid"`
		SerialBytes int64 `json:"serial_bytes"`
	}
	s.mustCall("qemu_status", nil, &st)
	if !st.Running || st.PID != b.PID || st.SerialBytes != send.Cursor {
		t.Errorf("status %+v, want running pid %d with %d serial bytes", st, b.PID, send.Cursor)
	}

	var sd struct {
		How        string `json:"how"`
		Exited     bool   `json:"exited"`
		ExitStatus int    `json:"exit_status"`
	}
	s.mustCall("qemu_shutdown", nil, &sd)
	if sd.How != "quit" || !sd.Exited || sd.ExitStatus != 0 {
		t.Errorf("shutdown %+v", sd)
	}
	if live, _, _ := proc.Check(q); live == proc.Alive || live == proc.Zombie {
		t.Errorf("qemu %d is %v after shutdown", b.PID, live)
	}
	assertEmptyRuntimeDir(t, s.dir)
	// The output stays readable after shutdown.
	var r waitOut
	s.mustCall("serial_read", map[string]any{"since": 0}, &r)
	if !strings.Contains(r.Output, "hello world") || !r.Exited {
		t.Errorf("read after shutdown: %+v", r)
	}
}

// assertEmptyRuntimeDir fails if any FIFO or socket is left; the shared
// images directory and the live server's own record are expected.
func assertEmptyRuntimeDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if guestFile(t, e.Name()) {
			t.Errorf("left behind in runtime dir: %s (%v)", e.Name(), e.Type())
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Output printed before anyone reads must all be there for the first read,
// and a read after a send sees everything since the last cursor.
func TestNothingLostBetweenCalls(t *testing.T) {
	s := newSession(t)
	var b bootOut
	s.mustCall("qemu_boot", nil, &b)
	if !b.Running || b.Output != "" || b.Cursor != 0 {
		t.Fatalf("boot without wait_for: %+v", b)
	}
	// Let the guest print its banner and prompt with nobody reading.
	var st struct {
		SerialBytes int64 `json:"serial_bytes"`
	}
	// Wait (without reading) until the output has been quiet for a while.
	deadline := time.Now().Add(20 * time.Second)
	for last := int64(-1); st.SerialBytes == 0 || st.SerialBytes != last; {
		if time.Now().After(deadline) {
			t.Fatal("guest output never settled")
		}
		last = st.SerialBytes
		time.Sleep(300 * time.Millisecond)
		s.mustCall("qemu_status", nil, &st)
	}
	var r waitOut
	s.mustCall("serial_read", nil, &r)
	if !strings.HasPrefix(strings.TrimLeft(r.Output, "\r\n"), "OpenSBI") || !strings.Contains(r.Output, "tiny> ") || r.OutputStart != 0 {
		t.Fatalf("first read lost output: start %d, %q", r.OutputStart, head(r.Output))
	}
	first := r.Cursor

	// Two sends without waiting, then one read sees both echoes.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo one"}, &w)
	if w.Cursor != first {
		t.Errorf("send without wait_for moved the cursor to %d, want %d", w.Cursor, first)
	}
	s.mustCall("serial_send", map[string]any{"data": "echo two"}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": `two\r\n` + prompt, "timeout": 10}, &r)
	if !r.Matched || r.OutputStart != first || !regexp.MustCompile(`(?s)^echo one\none\ntiny> echo two\ntwo\ntiny> $`).MatchString(r.Output) {
		t.Fatalf("read after sends: %+v", r)
	}
	// Reading again from an old cursor returns the same bytes: nothing is consumed.
	var again waitOut
	s.mustCall("serial_read", map[string]any{"since": first}, &again)
	if again.Output != r.Output {
		t.Errorf("re-read from %d: %q, want %q", first, again.Output, r.Output)
	}
	// max_bytes pages through the output.
	var page waitOut
	s.mustCall("serial_read", map[string]any{"since": 0, "max_bytes": 10, "raw": true}, &page)
	if len(page.Output) != 10 || page.Cursor != 10 || !page.Truncated {
		t.Errorf("page: %+v", page)
	}
}

func head(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func TestTimeouts(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	start := time.Now()
	var r waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": "never-printed", "timeout": 0.3}, &r)
	el := time.Since(start)
	if !r.TimedOut || r.Matched || !r.Running {
		t.Errorf("read timeout result %+v", r)
	}
	if el < 300*time.Millisecond || el > 3*time.Second {
		t.Errorf("0.3 s timeout took %v", el)
	}
	// A send whose answer never comes times out as a result, and the output
	// that did come is in it.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo abc", "wait_for": "xyz", "timeout": 0.5}, &w)
	if !w.TimedOut || !strings.Contains(w.Output, "abc\ntiny> ") {
		t.Errorf("send timeout result %+v", w)
	}
	// A boot whose pattern never appears reports it, with the guest running.
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"restart": true, "wait_for": "never-printed", "timeout": 1}, &b)
	if !b.TimedOut || b.Matched || !b.Running || !strings.Contains(b.Output, "tiny> ") {
		t.Errorf("boot timeout result %+v", b)
	}
	s.wantError("serial_read", map[string]any{"timeout": -1}, "timeout")
}

func TestQMP(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	var st struct {
		Return struct {
			Running bool   `json:"running"`
			Status  string `json:"status"`
		} `json:"return"`
	}
	s.mustCall("qmp_command", map[string]any{"command": "query-status"}, &st)
	if !st.Return.Running || st.Return.Status != "running" {
		t.Errorf("query-status %+v", st)
	}
	// QMP's own errors keep their class.
	s.wantError("qmp_command", map[string]any{"command": "device_del", "arguments": map[string]any{"id": "no-such-device"}}, "DeviceNotFound", "no-such-device")
	// Unknown commands never reach QEMU: the boundary refuses them.
	s.wantError("qmp_command", map[string]any{"command": "no-such-command"}, `refused by rule "unlisted"`, "--allow-host-access")
	s.wantError("qmp_command", map[string]any{"command": "query-cpus-fast", "arguments": map[string]any{"bogus": 1}}, "GenericError")

	// query-qmp-schema (about 200 KB, over 1,000 entries) comes a page at a
	// time within the result budget, and the pages hold every entry.
	var got, total, pages int
	for offset := 0; ; pages++ {
		res := s.call("qmp_command", map[string]any{"command": "query-qmp-schema", "offset": offset}, nil)
		if res.IsError {
			t.Fatalf("query-qmp-schema: %s", text(res))
		}
		raw, _ := json.Marshal(res.StructuredContent)
		if len(raw) > 30000 {
			t.Errorf("page at offset %d is %d bytes", offset, len(raw))
		}
		var page struct {
			Return     []map[string]any `json:"return"`
			Total      int              `json:"total"`
			NextOffset int              `json:"next_offset"`
		}
		json.Unmarshal(raw, &page)
		got += len(page.Return)
		total = page.Total
		if page.NextOffset == 0 {
			break
		}
		if page.NextOffset != offset+len(page.Return) {
			t.Fatalf("next_offset %d after %d entries from %d", page.NextOffset, len(page.Return), offset)
		}
		offset = page.NextOffset
	}
	if total < 1000 || got != total || pages < 5 {
		t.Errorf("query-qmp-schema: %d of %d entries in %d pages", got, total, pages+1)
	}
	// QMP still works after the large answer.
	s.mustCall("qmp_command", map[string]any{"command": "query-status"}, &st)
	s.mustCall("qmp_command", map[string]any{"command": "stop"}, nil)
	s.mustCall("qmp_command", map[string]any{"command": "query-status"}, &st)
	if st.Return.Running || st.Return.Status != "paused" {
		t.Errorf("after stop: %+v", st)
	}
}

func TestGuestExitIsReported(t *testing.T) {
	s := newSession(t)
	for _, tc := range []struct {
		cmd  string
		want int
	}{{"poweroff", 0}, {"exit 7", 7}} {
		b := s.bootTiny()
		var w waitOut
		s.mustCall("serial_send", map[string]any{"data": tc.cmd, "wait_for": "this never comes", "timeout": 20}, &w)
		if !w.Exited || w.ExitStatus == nil || *w.ExitStatus != tc.want || w.TimedOut || w.Running {
			t.Errorf("%s: %+v", tc.cmd, w)
		}
		// What the guest printed before it powered off is in the
		// call's output, though QEMU announced the power-off first.
		if tc.cmd == "poweroff" && !strings.Contains(w.Output, "Powering off") {
			t.Errorf("poweroff: output %q", w.Output)
		}
		// The call that reported the end returned once the guest was
		// torn down: nothing of it is left.
		assertEmptyRuntimeDir(t, s.dir)
		var st struct {
			Running    bool `json:"running"`
			Exited     bool `json:"exited"`
			ExitStatus *int `json:"exit_status"`
		}
		s.mustCall("qemu_status", nil, &st)
		if st.Running || !st.Exited || st.ExitStatus == nil || *st.ExitStatus != tc.want {
			t.Errorf("%s: status %+v", tc.cmd, st)
		}
		s.wantError("serial_send", map[string]any{"data": "help"}, "exited", "qemu_boot")
		if _, err := os.Lstat(b.Paths.QMPSocket); err == nil {
			t.Errorf("%s: socket %s left after the guest exited", tc.cmd, b.Paths.QMPSocket)
		}
	}
}

// guestFile tells a guest's file in the runtime directory from what stays
// for the server's life (its images, captures and record).
func guestFile(t *testing.T, name string) bool {
	return name != "images" && name != "captures" && name != ownRecord(t)
}

func TestBadInputKeepsServing(t *testing.T) {
	s := newSession(t)
	s.wantError("serial_send", map[string]any{"data": "x"}, "has been booted: call qemu_boot first", "qemu_boot")
	s.wantError("qmp_command", map[string]any{"command": "query-status"}, "has been booted: call qemu_boot first")
	s.wantError("qemu_boot", map[string]any{"kernel": "does/not/exist.bin"}, "no such file", "project_root")
	s.wantError("qemu_boot", map[string]any{"wait_for": "(unclosed"}, "not a valid regular expression")
	for _, a := range []string{"-serial", "-chardev", "-qmp", "-monitor", "--daemonize", "-pidfile"} {
		s.wantError("qemu_boot", map[string]any{"extra_args": []string{a, "x"}}, "extra_args", strings.TrimLeft(a, "-"), "refused by rule")
	}
	s.wantError("qemu_boot", map[string]any{"memory": "lots"}, "memory")
	s.wantError("qemu_boot", map[string]any{"extra_args": []string{"-no-such-option"}}, "no-such-option", "refused")
	s.wantError("qemu_boot", map[string]any{"smp": 2, "extra_args": []string{"-machine", "no-such-board"}}, "no-such-board", "refused")
	// What passes the checks but QEMU rejects comes back in QEMU's words.
	s.wantError("qemu_boot", map[string]any{"extra_args": []string{"-cpu", "no-such-cpu"}}, "qemu exited with status 1", "no-such-cpu")
	assertEmptyRuntimeDir(t, s.dir)
	// Still serving: a good boot works, and a second boot is refused clearly.
	b := s.bootTiny()
	s.wantError("qemu_boot", nil, "already running", "qemu_shutdown", "restart")
	s.wantError("serial_send", map[string]any{"data": "x", "newline": "weird"}, "newline")
	var b2 bootOut
	s.mustCall("qemu_boot", map[string]any{"restart": true, "wait_for": prompt, "timeout": 30}, &b2)
	if b2.PID == b.PID || !b2.Matched {
		t.Errorf("restart: %+v", b2)
	}
	if live, _, _ := proc.Check(proc.Identity{PID: b.PID}); live == proc.Alive {
		t.Errorf("old qemu %d still alive after restart", b.PID)
	}
}

// Debian's U-Boot is a guest nobody here wrote: stop its autoboot and run
// a command at its prompt.
func TestUBoot(t *testing.T) {
	s, _ := bootUBoot(t, nil)
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": " ", "newline": "none", "wait_for": "=> $", "timeout": 10}, &w)
	if !w.Matched {
		t.Fatalf("no U-Boot prompt: %+v", w)
	}
	s.mustCall("serial_send", map[string]any{"data": "version", "wait_for": `U-Boot 20\d\d[^\n]*\n(?s:.*)=> $`, "timeout": 10}, &w)
	if !w.Matched {
		t.Fatalf("version: %+v", w)
	}
	s.mustCall("qemu_shutdown", nil, nil)
	assertEmptyRuntimeDir(t, s.dir)
}

// ownRecord is the file name of this process's registry record.
func ownRecord(t *testing.T) string {
	t.Helper()
	self, err := proc.Self()
	if err != nil {
		t.Fatal(err)
	}
	return registry.FileName(names.Owner{PID: self.PID, StartTime: self.StartTime})
}

// Every turn of the model pays for tools/list: it stays within the budget
// of 32,000 characters, whatever tools are added.
func TestToolListBudget(t *testing.T) {
	s := newSession(t)
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res.Tools)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tools, %d characters", len(res.Tools), len(b))
	if len(b) > 32000 {
		t.Errorf("tools/list is %d characters, over the 32,000 budget", len(b))
	}
}

// newServer is a tool server of the guests set configures, wired as the
// program wires it.
func newServer(set settings.Settings, cfg tools.Config) (*tools.Server, error) {
	guests, err := set.Manager()
	if err != nil {
		return nil, err
	}
	cfg.Guests = guests
	return tools.New(cfg)
}
