package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The test binary doubles as qemu-mcp: with QEMU_MCP_TEST_MAIN set it runs
// main's code, so the tests drive the real command over real pipes.
func TestMain(m *testing.M) {
	switch os.Getenv("QEMU_MCP_TEST_MAIN") {
	case "server":
		args := os.Args[1:]
		// The QEMU under test; the server itself finds QEMU by name.
		if q := os.Getenv(testguest.QEMUEnv); q != "" && (len(args) == 0 || args[0] != "doctor" && args[0] != "probe") {
			args = append([]string{"-qemu", q}, args...)
		}
		os.Exit(run(args, os.Stderr))
	case "spawner":
		// Plays an MCP client that starts the server, handing it our own
		// stdin and stdout, then waits to be killed.
		cmd := serverCmd(os.Getenv("QEMU_MCP_RUNTIME_DIR"))
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "spawner:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "spawner: server pid", cmd.Process.Pid)
		cmd.Wait()
		os.Exit(0)
	case "post", "holdro", "dial", "gdbtcp":
		// What another user (or the owner) does from outside: see
		// users_test.go.
		os.Exit(userHelper(os.Getenv("QEMU_MCP_TEST_MAIN")))
	}
	os.Exit(m.Run())
}

// serverCmd runs the server with its own runtime dir. Unless the caller
// sets QEMU_MCP_LOCK_FILE itself (to "" for the repository's lock), the
// lock is private to the runtime dir's test, so tests never contend for
// the lock of the repository they run in.
func serverCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), "QEMU_MCP_TEST_MAIN=server", "QEMU_MCP_RUNTIME_DIR="+dir,
		"QEMU_MCP_LOCK_FILE="+dir+".lock", "QEMU_MCP_STATE_DIR="+dir+".state",
		// Under -race the runtime sleeps a second before every exit
		// (atexit_sleep_ms): not the server's time.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

func needQEMU(t *testing.T) { t.Helper(); testguest.NeedQEMU(t) }

func runtimeDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "qmcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(d)
		os.RemoveAll(d + ".state")
		os.Remove(d + ".lock")
		os.Remove(d + ".lock.guard")
	})
	return d
}

type bootResult struct {
	PID     int  `json:"pid"`
	Matched bool `json:"matched"`
}

// bootAndEcho boots the built-in kernel through cs and does one round trip.
func bootAndEcho(t *testing.T, cs *mcp.ClientSession) proc.Identity {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var b bootResult
	callInto(ctx, t, cs, "qemu_boot", map[string]any{"wait_for": `tiny> $`, "timeout": 30}, &b)
	if !b.Matched {
		t.Fatalf("boot: prompt not seen")
	}
	var e struct {
		Matched bool `json:"matched"`
	}
	callInto(ctx, t, cs, "serial_send", map[string]any{"data": "echo over-stdio", "wait_for": `over-stdio\r\n`}, &e)
	if !e.Matched {
		t.Fatalf("echo not seen")
	}
	info, err := proc.Stat(b.PID)
	if err != nil {
		t.Fatalf("qemu %d: %v", b.PID, err)
	}
	return proc.Identity{PID: info.PID, StartTime: info.StartTime}
}

func callInto(ctx context.Context, t *testing.T, cs *mcp.ClientSession, name string, args, out any) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %v", name, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// assertClean checks that the server and its QEMU are gone and nothing of
// theirs is left in the runtime directory.
func assertClean(t *testing.T, dir string, qemu proc.Identity) {
	t.Helper()
	testguest.AwaitGone(t, qemu, 2*time.Second, false, "the server ended")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "images" && e.Name() != "captures" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return 0
}

// startPiped starts the server on pipes the test holds, and kills it at the
// end of the test if it still runs.
func startPiped(t *testing.T, dir string) (*exec.Cmd, io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd := serverCmd(dir)
	cmd.Stderr = &logWriter{t: t}
	stdin, stdout := testguest.StartPiped(t, cmd, "server")
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, stdin, stdout
}

// The client closing stdin is the normal end of a stdio session.
func TestStdinEOF(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd := serverCmd(dir)
	cmd.Stderr = &logWriter{t: t}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := bootAndEcho(t, cs)
	start := time.Now()
	// CommandTransport closes stdin, waits for exit, and only then signals.
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v (the server did not exit on stdin EOF by itself)", err)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Errorf("exit after stdin EOF took %v", el)
	}
	assertClean(t, dir, q)
}

func TestSignals(t *testing.T) {
	needQEMU(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			dir := runtimeDir(t)
			cmd, stdin, stdout := startPiped(t, dir)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: stdout, Writer: stdin}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			q := bootAndEcho(t, cs)
			cmd.Process.Signal(sig)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if code := exitCode(t, err); code != 0 {
					t.Errorf("exit code %d after %v", code, sig)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("server did not exit after %v", sig)
			}
			assertClean(t, dir, q)
		})
	}
}

// The client dies but the server's stdin stays open (another process holds
// the pipe): the server must notice its parent is gone and clean up.
func TestParentDeath(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	// Become the subreaper so the orphaned server is reparented to us and
	// its exit status can be collected.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	spawner := exec.Command(os.Args[0])
	spawner.Env = append(os.Environ(), "QEMU_MCP_TEST_MAIN=spawner", "QEMU_MCP_RUNTIME_DIR="+dir)
	// The spawner's serverCmd adds the private lock file.
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	spawner.Stdin, spawner.Stdout, spawner.Stderr = inR, outW, errW
	if err := spawner.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	errW.Close()
	defer inW.Close()
	serverPID := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			var pid int
			if _, err := fmt.Sscanf(sc.Text(), "spawner: server pid %d", &pid); err == nil {
				serverPID <- pid
			}
		}
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := bootAndEcho(t, cs)
	pid := <-serverPID
	spawner.Process.Kill()
	spawner.Wait()
	// stdin (inW) is still open here: only the parent's death can end it.
	var ws unix.WaitStatus
	done := make(chan error, 1)
	go func() {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait for server %d: %v", pid, err)
		}
		if !ws.Exited() || ws.ExitStatus() != 0 {
			t.Errorf("server ended with %v", ws)
		}
	case <-time.After(10 * time.Second):
		unix.Kill(pid, unix.SIGKILL)
		t.Fatalf("server %d did not exit after its parent died", pid)
	}
	assertClean(t, dir, q)
}

func TestSelftestFlag(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd := serverCmd(dir, "--selftest")
	var out strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &logWriter{t: t}
	if err := cmd.Run(); err != nil {
		t.Fatalf("selftest: %v\n%s", err, out.String())
	}
	for _, want := range []string{"ok   boot tiny kernel", "ok   echo round trip", "ok   qmp query-status", "ok   shutdown", "ok   nothing left behind", "selftest passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("selftest output lacks %q:\n%s", want, out.String())
		}
	}
}

// logWriter sends a child's stderr to the test log.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

// A client that closes the server's stdout while stdin stays open: the next
// answer fails with EPIPE (SIGPIPE is ignored, so it does not kill the
// server), and the server ends as on stdin EOF: exit 0, nothing left.
func TestStdoutClosed(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd, stdin, stdout, q := startBootedKeepingStdin(t, dir)
	stdout.Close()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	// Its answer is what the server fails to write, if it has not seen
	// the closed stdout already (then this write fails: it is gone).
	if _, err := io.WriteString(stdin, `{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"qemu_status","arguments":{}}}`+"\n"); err != nil && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write request: %v", err)
	}
	t.Logf("server exited %v after stdout was closed", waitExit(t, cmd, start).Round(time.Millisecond))
	assertClean(t, dir, q)
}

// startBootedKeepingStdin starts the server on pipes, connects a client
// that leaves the server's stdin open when it goes (so that the server must
// notice its stdout, not its stdin), and boots and echoes on a guest.
func startBootedKeepingStdin(t *testing.T, dir string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, proc.Identity) {
	t.Helper()
	cmd, stdin, stdout := startPiped(t, dir)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: stdout, Writer: keepOpen{stdin}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, stdin, stdout, bootAndEcho(t, cs)
}

// waitExit waits up to 10 s for a server whose stdout was closed at start
// to exit 0, and says how long it took.
func waitExit(t *testing.T, cmd *exec.Cmd, start time.Time) time.Duration {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := exitCode(t, err); code != 0 {
			t.Errorf("exit code %d after stdout was closed", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server still running 10 s after its stdout was closed")
	}
	return time.Since(start)
}

// A client that closes only the server's stdout while a 30 s wait is in
// flight: nothing is due to be written, yet the server ends within a
// second, and its QEMU with it.
func TestStdoutClosedMidWait(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd, stdin, stdout, q := startBootedKeepingStdin(t, dir)
	// A wait that would last 30 s, its request written raw.
	if _, err := io.WriteString(stdin, `{"jsonrpc":"2.0","id":98,"method":"tools/call","params":{"name":"serial_read","arguments":{"wait_for":"never-printed","timeout":30}}}`+"\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	stdout.Close()
	start := time.Now()
	el := waitExit(t, cmd, start)
	t.Logf("server exited %v after stdout was closed mid-wait", el.Round(time.Millisecond))
	if el > time.Second {
		t.Errorf("server took %v to end after its stdout was closed, want under a second", el)
	}
	assertClean(t, dir, q)
}

// keepOpen is a writer whose Close leaves the underlying pipe open.
type keepOpen struct{ io.Writer }

func (keepOpen) Close() error { return nil }

// At the default log level a whole session (start, tools/list, a boot, a
// shutdown, the end) writes nothing to stderr: clients such as Claude Code
// show every stderr line as an error.
func TestQuietByDefault(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd := serverCmd(dir)
	cmd.Args = []string{cmd.Args[0]} // no -log-level
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	q := bootAndEcho(t, cs)
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr at the default log level:\n%s", stderr.String())
	}
	assertClean(t, dir, q)
}
