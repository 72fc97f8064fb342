package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// testTimeout bounds every wait in the tests so that a bug shows up as a
// failure rather than a hung test binary.
const testTimeout = 10 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// socketPath returns a fresh unix socket path, avoiding t.TempDir when its
// long name would not fit sun_path (108 bytes including the NUL).
func socketPath(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir)+len("/q.sock") >= 100 {
		var err error
		dir, err = os.MkdirTemp("", "qmp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return filepath.Join(dir, "q.sock")
}

// logRecorder captures a Monitor's log so tests can assert on it and show
// it when they fail. Writing to t.Log directly would panic if the monitor
// logged after the test returned.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func newLogRecorder(t *testing.T) *logRecorder {
	r := &logRecorder{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("monitor log:\n%s", r.String())
		}
	})
	return r
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

func (r *logRecorder) count(substr string) int {
	return strings.Count(r.String(), substr)
}

func (r *logRecorder) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newMonitor returns a Monitor that logs to a recorder and is disconnected
// when the test ends.
func newMonitor(t *testing.T, path string, opts ...Option) (*Monitor, *logRecorder) {
	t.Helper()
	rec := newLogRecorder(t)
	m := New(path, append([]Option{WithLogger(rec.logger())}, opts...)...)
	t.Cleanup(func() { m.Disconnect() })
	return m, rec
}

type qemuProc struct {
	cmd     *exec.Cmd
	sock    string
	started time.Time
}

// startQEMU launches a paused riscv64 QEMU with a QMP socket and does not
// wait for the socket to appear.
func startQEMU(t *testing.T) *qemuProc {
	t.Helper()
	sock := socketPath(t)
	started := time.Now()
	p := testguest.StartQEMU(t, "",
		"-M", "virt", "-bios", "none", "-S", "-display", "none", "-nodefaults",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	return &qemuProc{cmd: p.Cmd, sock: sock, started: started}
}

// connectQEMU starts QEMU and returns a connected Monitor for it.
func connectQEMU(t *testing.T, opts ...Option) (*qemuProc, *Monitor) {
	t.Helper()
	q := startQEMU(t)
	m, _ := newMonitor(t, q.sock, opts...)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	return q, m
}

func execute(t *testing.T, m *Monitor, command string) json.RawMessage {
	t.Helper()
	ret, err := m.Execute(testContext(t), command, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// expectEvents receives the named events in order.
func expectEvents(t *testing.T, ch <-chan goqmp.Event, names ...string) {
	t.Helper()
	for _, want := range names {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event channel closed, want %s", want)
			}
			if ev.Event != want {
				t.Fatalf("got event %s, want %s", ev.Event, want)
			}
		case <-time.After(testTimeout):
			t.Fatalf("timed out waiting for event %s", want)
		}
	}
}

// expectClosed drains ch and fails unless it is closed in time.
func expectClosed(t *testing.T, ch <-chan goqmp.Event) {
	t.Helper()
	timeout := time.After(testTimeout)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("event channel not closed")
		}
	}
}

// fakeConn is the server side of a connection to a scripted QMP peer.
type fakeConn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex // serializes writes from handler goroutines
}

type fakeCmd struct {
	Execute   string          `json:"execute"`
	ID        json.RawMessage `json:"id"`
	Arguments json.RawMessage `json:"arguments"`
	raw       json.RawMessage
}

func (fc *fakeConn) sendLine(b []byte) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	_, err := fc.c.Write(append(b, '\r', '\n'))
	return err
}

func (fc *fakeConn) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fc.sendLine(b)
}

func (fc *fakeConn) read() (fakeCmd, error) {
	line, err := fc.r.ReadBytes('\n')
	if err != nil {
		return fakeCmd{}, err
	}
	var cmd fakeCmd
	if err := json.Unmarshal(line, &cmd); err != nil {
		return fakeCmd{}, err
	}
	cmd.raw = bytes.TrimSpace(line)
	return cmd, nil
}

func (fc *fakeConn) reply(cmd fakeCmd, ret any) error {
	return fc.send(map[string]any{"return": ret, "id": cmd.ID})
}

func (fc *fakeConn) greet() error {
	return fc.sendLine([]byte(`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "fake"}, "capabilities": ["oob"]}}`))
}

// handshake plays QEMU's side of connection setup.
func (fc *fakeConn) handshake() error {
	if err := fc.greet(); err != nil {
		return err
	}
	cmd, err := fc.read()
	if err != nil {
		return err
	}
	if cmd.Execute != "qmp_capabilities" {
		return errors.New("expected qmp_capabilities, got " + cmd.Execute)
	}
	return fc.reply(cmd, struct{}{})
}

// serveCommands handshakes and then passes each command to handle until the
// connection ends.
func serveCommands(handle func(*fakeConn, fakeCmd)) func(*fakeConn) {
	return func(fc *fakeConn) {
		if fc.handshake() != nil {
			return
		}
		for {
			cmd, err := fc.read()
			if err != nil {
				return
			}
			handle(fc, cmd)
		}
	}
}

// startFake serves a scripted QMP peer on a fresh socket path.
func startFake(t *testing.T, serve func(*fakeConn)) string {
	t.Helper()
	path := socketPath(t)
	if err := listenFake(t, path, serve); err != nil {
		t.Fatal(err)
	}
	return path
}

// listenFake serves a scripted QMP peer on path until the test ends. It may
// be called from any goroutine.
func listenFake(t *testing.T, path string, serve func(*fakeConn)) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(&fakeConn{c: c, r: bufio.NewReader(c)})
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return nil
}

// executeInto runs command without arguments and decodes what it returns
// into v.
func executeInto(ctx context.Context, m *Monitor, command string, v any) error {
	ret, err := m.Execute(ctx, command, nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(ret, v)
}
