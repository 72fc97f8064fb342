package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// These tests use a scripted peer for situations real QEMU will not produce
// on demand: silence, oversized lines, stray responses.

func TestFakeRunDeadline(t *testing.T) {
	t.Parallel()
	path := startFake(t, serveCommands(func(*fakeConn, fakeCmd) {}))
	m, _ := newMonitor(t, path, WithDefaultTimeout(100*time.Millisecond))
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}

	// The clock starts before the deadline is set: taken after, it ran
	// 43 us short of 100 ms once.
	start := time.Now()
	ctx, cancel := context.WithTimeout(testContext(t), 100*time.Millisecond)
	defer cancel()
	_, err := m.RunContext(ctx, []byte(`{"execute":"query-status"}`))
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if elapsed < 100*time.Millisecond || elapsed > time.Second {
		t.Errorf("RunContext returned after %v, want about 100ms", elapsed)
	}

	start = time.Now()
	if _, err := m.Run([]byte(`{"execute":"query-status"}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run with default timeout: err = %v, want DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("Run returned after %v, want about 100ms", elapsed)
	}

	if m.Err() != nil {
		t.Errorf("a timed-out command closed the monitor: %v", m.Err())
	}
	m.mu.Lock()
	pending := len(m.pending)
	m.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d abandoned commands still registered", pending)
	}
}

func TestFakeLateResponseDiscarded(t *testing.T) {
	t.Parallel()
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		if cmd.Execute == "slow" {
			go func() {
				time.Sleep(200 * time.Millisecond)
				fc.reply(cmd, "slow")
			}()
			return
		}
		fc.reply(cmd, cmd.Execute)
	}))
	m, rec := newMonitor(t, path)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(testContext(t), 50*time.Millisecond)
	defer cancel()
	if _, err := m.Execute(ctx, "slow", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow: err = %v, want DeadlineExceeded", err)
	}
	// Straddle the late reply: commands before and after it get their own.
	for _, name := range []string{"fast1", "fast2"} {
		ret, err := m.Execute(testContext(t), name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := `"` + name + `"`; string(ret) != want {
			t.Errorf("%s returned %s, want %s", name, ret, want)
		}
	}
	waitFor(t, func() bool { return rec.count("abandoned") > 0 })
	ret, err := m.Execute(testContext(t), "fast3", nil)
	if err != nil || string(ret) != `"fast3"` {
		t.Errorf("fast3 = %s, %v", ret, err)
	}
	if n := rec.count("unknown id"); n != 0 {
		t.Errorf("late reply logged as unknown id")
	}
}

func TestFakeConnectNoGreeting(t *testing.T) {
	t.Parallel()
	path := startFake(t, func(fc *fakeConn) { io.Copy(io.Discard, fc.c) })
	m, _ := newMonitor(t, path)

	ctx, cancel := context.WithTimeout(testContext(t), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.ConnectContext(ctx)
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "connect qmp "+path) {
		t.Errorf("error %q does not name the socket", err)
	}
	if elapsed > time.Second {
		t.Errorf("ConnectContext returned after %v, want about 100ms", elapsed)
	}
	t.Logf("error: %v", err)
}

func TestFakeHugeLine(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 1<<20)
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		if cmd.Execute == "big" {
			fc.reply(cmd, big)
			return
		}
		fc.reply(cmd, struct{}{})
	}))
	m, _ := newMonitor(t, path)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}

	var s string
	if err := executeInto(testContext(t), m, "big", &s); err != nil {
		t.Fatal(err)
	}
	if s != big {
		t.Errorf("got %d bytes, want %d", len(s), len(big))
	}
	execute(t, m, "after")
}

func TestFakeConnectRetry(t *testing.T) {
	t.Parallel()
	serve := serveCommands(func(fc *fakeConn, cmd fakeCmd) { fc.reply(cmd, struct{}{}) })

	// The monitor retries until QEMU listens, after a missing socket and
	// after a stale one (a socket file nobody listens on, as left behind
	// by a killed QEMU), and logs why.
	for _, c := range []struct {
		name, logged, retried string
		stale                 bool
	}{
		{"missing socket", "no such file", "a missing socket", false},
		{"stale socket", "connection refused", "a refused connection", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := socketPath(t)
			if c.stale {
				ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				ln.SetUnlinkOnClose(false)
				ln.Close()
			}
			m, rec := newMonitor(t, path)
			time.AfterFunc(50*time.Millisecond, func() {
				os.Remove(path)
				if err := listenFake(t, path, serve); err != nil {
					t.Error(err)
				}
			})
			if err := m.ConnectContext(testContext(t)); err != nil {
				t.Fatal(err)
			}
			if rec.count(c.logged) == 0 {
				t.Errorf("no retry on %s was logged", c.retried)
			}
		})
	}

	t.Run("gives up", func(t *testing.T) {
		t.Parallel()
		path := socketPath(t)
		m, _ := newMonitor(t, path)
		ctx, cancel := context.WithTimeout(testContext(t), 100*time.Millisecond)
		defer cancel()
		err := m.ConnectContext(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("err = %v, want DeadlineExceeded mentioning the last dial error", err)
		}
		// A failed connect can be retried.
		if err := listenFake(t, path, serve); err != nil {
			t.Fatal(err)
		}
		if err := m.ConnectContext(testContext(t)); err != nil {
			t.Errorf("retry after failed connect: %v", err)
		}
	})
}

func TestFakeDisconnectDuringConnect(t *testing.T) {
	t.Parallel()
	m, _ := newMonitor(t, socketPath(t))
	errc := make(chan error, 1)
	go func() { errc <- m.ConnectContext(testContext(t)) }()
	time.Sleep(20 * time.Millisecond)
	if err := m.Disconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("err = %v, want ErrClosed", err)
		}
	case <-time.After(time.Second):
		t.Fatal("ConnectContext did not return after Disconnect")
	}
}

func TestFakeLifecycleWithoutConnect(t *testing.T) {
	t.Parallel()
	m := New(socketPath(t))
	ctx := testContext(t)
	if _, err := m.RunContext(ctx, []byte(`{"execute":"query-status"}`)); !errors.Is(err, ErrNotConnected) {
		t.Errorf("Run before Connect: err = %v, want ErrNotConnected", err)
	}
	// Subscribing before connecting is allowed and closes with the monitor.
	ch, err := m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := m.Disconnect(); err != nil {
			t.Fatal(err)
		}
	}
	expectClosed(t, ch)
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed after Disconnect")
	}
	if m.Err() != ErrClosed {
		t.Errorf("Err = %v, want ErrClosed", m.Err())
	}
	if err := m.ConnectContext(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Connect after Disconnect: err = %v, want ErrClosed", err)
	}
	if _, err := m.Run([]byte(`{"execute":"query-status"}`)); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Disconnect: err = %v, want ErrClosed", err)
	}
	if _, err := m.Events(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Events after Disconnect: err = %v, want ErrClosed", err)
	}
}

func TestFakeCapabilitiesRejected(t *testing.T) {
	t.Parallel()
	path := startFake(t, func(fc *fakeConn) {
		fc.greet()
		cmd, err := fc.read()
		if err != nil {
			return
		}
		fc.send(map[string]any{"id": cmd.ID, "error": map[string]string{"class": "GenericError", "desc": "nope"}})
	})
	m, _ := newMonitor(t, path)
	err := m.ConnectContext(testContext(t))
	var qerr *Error
	if !errors.As(err, &qerr) || qerr.Class != "GenericError" || qerr.Command != "qmp_capabilities" {
		t.Errorf("err = %v, want *Error for qmp_capabilities", err)
	}
}

func TestFakeCommandRewriting(t *testing.T) {
	t.Parallel()
	wire := make(chan fakeCmd, 1)
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		wire <- cmd
		fc.reply(cmd, struct{}{})
	}))
	m, _ := newMonitor(t, path)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}

	resp, err := m.RunContext(testContext(t), []byte(`{"execute":"echo","id":42,"arguments":{"s":"<a&b>","n":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	sent := <-wire
	var answered struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(resp, &answered); err != nil {
		t.Fatalf("%s: %v", resp, err)
	}
	var sentID string
	if err := json.Unmarshal(sent.ID, &sentID); err != nil || sentID == "" || sentID != answered.ID {
		t.Errorf("sent id %s, answered id %q: want the caller's id replaced by a string id", sent.ID, answered.ID)
	}
	if sent.Execute != "echo" || string(sent.Arguments) != `{"s":"<a&b>","n":1}` {
		t.Errorf("sent %s", sent.raw)
	}

	for _, bad := range []string{`nope`, `null`, `[]`, `{"arguments":{}}`, `{"execute":1}`} {
		if _, err := m.RunContext(testContext(t), []byte(bad)); err == nil {
			t.Errorf("RunContext(%s) succeeded", bad)
		}
	}
	select {
	case cmd := <-wire:
		t.Errorf("invalid command reached the wire: %s", cmd.raw)
	default:
	}
}

func TestFakeStrayResponses(t *testing.T) {
	t.Parallel()
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		fc.sendLine([]byte(`{"return": {}, "id": "999999999"}`))
		fc.sendLine([]byte(`{"return": {}, "id": {"x": 1}}`))
		fc.sendLine([]byte(`{"error": {"class": "GenericError", "desc": "QMP input must be a JSON object"}}`))
		fc.sendLine([]byte(`not json`))
		fc.sendLine([]byte(`{"greeting": "?"}`))
		fc.reply(cmd, "ok")
	}))
	m, rec := newMonitor(t, path)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	ret, err := m.Execute(testContext(t), "x", nil)
	if err != nil || string(ret) != `"ok"` {
		t.Fatalf("Execute = %s, %v", ret, err)
	}
	if n := rec.count("unknown id"); n != 3 {
		t.Errorf("logged %d unknown ids, want 3", n)
	}
	if rec.count("malformed") != 1 || rec.count("neither event nor response") != 1 {
		t.Errorf("malformed lines not logged:\n%s", rec.String())
	}
}

func TestFakeEventQueueDropsOldest(t *testing.T) {
	t.Parallel()
	const emitted = 10
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		for i := range emitted {
			fc.sendLine(fmt.Appendf(nil, `{"timestamp": {"seconds": 1, "microseconds": %d}, "event": "E%d", "data": {"i": %d}}`, i, i, i))
		}
		fc.reply(cmd, struct{}{})
	}))
	m, _ := newMonitor(t, path, WithEventBuffer(4))
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	ch, err := m.Events(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	// The reader dispatches in order, so the events are queued by the time
	// the response arrives.
	execute(t, m, "emit")
	for i := emitted - 4; i < emitted; i++ {
		select {
		case ev := <-ch:
			if want := fmt.Sprintf("E%d", i); ev.Event != want || ev.Data["i"] != float64(i) || ev.Timestamp.Microseconds != int64(i) {
				t.Errorf("got %+v, want %s", ev, want)
			}
		default:
			t.Fatalf("event E%d missing", i)
		}
	}
	if got := m.DroppedEvents(); got != emitted-4 {
		t.Errorf("DroppedEvents = %d, want %d", got, emitted-4)
	}

	// Replay for a new subscriber is bounded the same way.
	ch2, err := m.Events(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ch2, "E6", "E7", "E8", "E9")
}

func TestFakeConnectionLost(t *testing.T) {
	t.Parallel()
	path := startFake(t, serveCommands(func(fc *fakeConn, cmd fakeCmd) {
		fc.c.Close()
	}))
	m, _ := newMonitor(t, path)
	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	_, err := m.RunContext(testContext(t), []byte(`{"execute":"x"}`))
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "EOF") {
		t.Errorf("err = %v, want ErrClosed with EOF", err)
	}
	t.Logf("error: %v", err)
}
