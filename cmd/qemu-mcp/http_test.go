package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"

	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
)

// httpServer starts qemu-mcp -http and returns its base URL, read from the
// log line that names the address it listens on.
func httpServer(t *testing.T, dir string, args ...string) (*server, string) {
	t.Helper()
	return httpServerCmd(t, serverCmd(dir, args...))
}

// httpServerCmd starts cmd, a server with -http, and returns its URL.
func httpServerCmd(t *testing.T, cmd *exec.Cmd) (*server, string) {
	t.Helper()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, done: make(chan struct{})}
	urlc := make(chan string, 1)
	re := regexp.MustCompile(`addr=(http://\S+)`)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
	})
	select {
	case u := <-urlc:
		return s, u
	case <-s.done:
		t.Fatalf("server exited: %v", s.err)
	case <-time.After(20 * time.Second):
		t.Fatal("server never said where it listens")
	}
	return nil, ""
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func connectHTTP(t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: url}
	if token != "" {
		tr.HTTPClient = &http.Client{Transport: bearer{token}}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return cs
}

// Boot, echo and shutdown over streamable HTTP; SIGTERM then cleans up.
func TestHTTPSession(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	s, url := httpServer(t, dir, "-http", "127.0.0.1:0")
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("url %s", url)
	}
	cs := connectHTTP(t, url, "")
	s.cs = cs
	q := bootAndEcho(t, cs)
	// A second client shares the same QEMU.
	other := connectHTTP(t, url, "")
	var st struct {
		Running bool `json:"running"`
		PID     int  `json:"pid"`
	}
	(&server{cs: other}).call(t, "qemu_status", nil, &st)
	if !st.Running || st.PID != q.PID {
		t.Errorf("second session sees %+v, want qemu %d running", st, q.PID)
	}
	var info struct {
		Transport string `json:"transport"`
	}
	s.call(t, "server_info", nil, &info)
	if info.Transport != "http" {
		t.Errorf("transport %q", info.Transport)
	}
	s.call(t, "qemu_shutdown", nil, nil)
	cs.Close()
	other.Close()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.err != nil {
			t.Errorf("exit: %v", s.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("http server did not exit on SIGTERM")
	}
	assertClean(t, dir, q)
}

func TestHTTPTokenAndHost(t *testing.T) {
	dir := runtimeDir(t)
	// A non-loopback bind without a token is refused outright.
	cmd := serverCmd(dir, "-http", "0.0.0.0:0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "token-file") {
		t.Fatalf("non-loopback without token: %v\n%s", err, out)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	token := "0123456789abcdef0123456789abcdef"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	_, url := httpServer(t, dir, "-http", "0.0.0.0:0", "-token-file", tokenFile)
	url = strings.Replace(url, "0.0.0.0", "127.0.0.1", 1)
	url = strings.Replace(url, "[::]", "127.0.0.1", 1)

	post := func(host, auth string) int {
		return postInitialize(t, url, func(req *http.Request) {
			if host != "" {
				req.Host = host
			}
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
		})
	}
	if code := post("", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code := post("", "Bearer wrong-token-wrong-token-xx"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d, want 401", code)
	}
	if code := post("", "Bearer "+token); code != http.StatusOK {
		t.Errorf("right token: %d, want 200", code)
	}
	// DNS rebinding: a foreign Host header on a local connection.
	if code := post("evil.example:80", "Bearer "+token); code != http.StatusForbidden {
		t.Errorf("foreign Host: %d, want 403", code)
	}
	cs := connectHTTP(t, url, token)
	var info struct {
		PID int `json:"pid"`
	}
	(&server{cs: cs}).call(t, "server_info", nil, &info)
	if info.PID == 0 {
		t.Error("server_info over HTTP with token failed")
	}
	cs.Close()

	// A token file others can read is refused.
	os.Chmod(tokenFile, 0o644)
	out, err = serverCmd(dir, "-http", "0.0.0.0:0", "-token-file", tokenFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "chmod 600") {
		t.Errorf("world-readable token file: %v\n%s", err, out)
	}
}

// Origin is validated, /mcp is served, each session reads from its own
// cursor, and idle sessions are closed.
func TestHTTPHygiene(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	_, base := httpServer(t, dir, "-http", "127.0.0.1:0", "-http-session-timeout", "2s")
	url := base + "/mcp"
	post := func(origin string) int {
		return postInitialize(t, url, func(req *http.Request) {
			if origin != "" {
				req.Header.Set("Origin", origin)
			}
		})
	}
	for origin, want := range map[string]int{"": http.StatusOK, base: http.StatusOK, "https://evil.example": http.StatusForbidden,
		"http://127.0.0.1:1": http.StatusForbidden, "null": http.StatusForbidden} {
		if code := post(origin); code != want {
			t.Errorf("Origin %q: %d, want %d", origin, code, want)
		}
	}

	a := &server{cs: connectHTTP(t, url, "")}
	defer a.cs.Close()
	if res := a.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	// b connects now: idle through a boot on a busy machine, it could
	// outlive the session time-out.
	b := &server{cs: connectHTTP(t, url, "")}
	defer b.cs.Close()
	var r struct {
		OutputStart int64 `json:"output_start"`
		Cursor      int64 `json:"cursor"`
	}
	a.call(t, "serial_read", nil, &r)
	var st struct {
		ReadCursor int64 `json:"read_cursor"`
	}
	b.call(t, "qemu_status", nil, &st)
	if st.ReadCursor != 0 || r.Cursor == 0 {
		t.Errorf("b's cursor %d after a read to %d by a: cursors are shared", st.ReadCursor, r.Cursor)
	}
	b.call(t, "serial_read", nil, &r)
	if r.OutputStart != 0 {
		t.Errorf("b's first read started at %d, want 0", r.OutputStart)
	}

	a.call(t, "qemu_shutdown", nil, nil)

	// An idle session is closed after the time-out.
	idle := connectHTTP(t, url, "")
	time.Sleep(4500 * time.Millisecond)
	if _, err := idle.CallTool(context.Background(), &mcp.CallToolParams{Name: "qemu_list"}); err == nil {
		t.Error("a session idle for 4.5 s with a 2 s time-out still answers")
	}
	idle.Close()
}

// 5,000 sessions opened and abandoned: the server keeps at most its cap
// of sessions, and its memory stays flat.
func TestHTTPAbandonedSessions(t *testing.T) {
	dir := runtimeDir(t)
	s, base := httpServer(t, dir, "-http", "127.0.0.1:0")
	url := base + "/mcp"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	open := func(n int) {
		for range n {
			req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("initialize: %d", res.StatusCode)
			}
		}
	}
	rss := func() int64 {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				return kb << 10
			}
		}
		return 0
	}
	open(500) // past the cap, so what stays is what the cap keeps
	before := rss()
	start := time.Now()
	open(5000)
	after := rss()
	t.Logf("5,000 abandoned sessions in %v: RSS %.1f -> %.1f MiB", time.Since(start).Round(time.Millisecond), float64(before)/(1<<20), float64(after)/(1<<20))
	if after-before > 16<<20 {
		t.Errorf("RSS grew by %.1f MiB over 5,000 abandoned sessions", float64(after-before)/(1<<20))
	}
	// Still serving.
	cs := connectHTTP(t, url, "")
	defer cs.Close()
	if res := (&server{cs: cs}).call(t, "qemu_list", nil, nil); res.IsError {
		t.Errorf("qemu_list after the flood of sessions: %s", mcptest.Text(res))
	}
}

// postInitialize posts an MCP initialize request to url, shaped by set,
// and returns the HTTP status it is answered with.
func postInitialize(t *testing.T, url string, set func(*http.Request)) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	set(req)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}
