package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qemu"
	goqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"
)

// These tests run against a real qemu-system-riscv64 started paused (-S), so
// the guest never executes and the only events are the ones the tests cause.

func TestQEMUConnectRightAfterStart(t *testing.T) {
	t.Parallel()
	q := startQEMU(t)
	_, statErr := os.Stat(q.sock)
	m, rec := newMonitor(t, q.sock)

	if err := m.ConnectContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	retries := rec.count("retrying")
	t.Logf("connected %v after exec; socket existed at first dial: %v; dial retries: %d",
		time.Since(q.started).Round(time.Millisecond), statErr == nil, retries)
	if statErr != nil && retries == 0 {
		t.Error("socket did not exist before connecting, yet no dial retry was logged")
	}

	g := m.Greeting()
	if g.Version.QEMU.Major == 0 {
		t.Errorf("greeting has no version: %+v", g)
	}
	t.Logf("greeting: version %s (%s), capabilities %q", g.Version, g.Version.Package, g.Capabilities)

	if err := m.ConnectContext(testContext(t)); err == nil || !strings.Contains(err.Error(), "already connected") {
		t.Errorf("second ConnectContext = %v, want already connected", err)
	}
}

func TestQEMUQueryStatus(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)

	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := json.Unmarshal(execute(t, m, "query-status"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "prelaunch" || st.Running {
		t.Errorf("query-status = %+v, want prelaunch, not running", st)
	}

	// Run returns the whole response object, as go-qemu's raw package expects.
	resp, err := m.Run([]byte(`{"execute":"query-status","id":"caller-id"}`))
	if err != nil {
		t.Fatal(err)
	}
	var full struct {
		Return json.RawMessage `json:"return"`
		ID     string          `json:"id"`
	}
	if err := json.Unmarshal(resp, &full); err != nil {
		t.Fatalf("response %s: %v", resp, err)
	}
	if len(full.Return) == 0 || full.ID == "" || full.ID == "caller-id" {
		t.Errorf("response %s: want a return value and the monitor's own id", resp)
	}
}

func TestQEMUEvents(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)

	// Emitted before anyone subscribes: must still be delivered.
	execute(t, m, "cont")
	execute(t, m, "stop")

	ch, err := m.Events(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ch, "RESUME", "STOP")
	execute(t, m, "cont")
	expectEvents(t, ch, "RESUME")

	// A later subscriber gets the same history, independently.
	ctx, cancel := context.WithCancel(testContext(t))
	ch2, err := m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ch2, "RESUME", "STOP", "RESUME")
	cancel()
	expectClosed(t, ch2)

	// Cancelling one subscriber leaves the other alone.
	execute(t, m, "stop")
	expectEvents(t, ch, "STOP")

	if err := m.Disconnect(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, ch)
}

func TestQEMUCommandNotFound(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)

	_, err := m.RunContext(testContext(t), []byte(`{"execute":"no-such-command"}`))
	var qerr *Error
	if !errors.As(err, &qerr) {
		t.Fatalf("err = %v (%T), want *Error", err, err)
	}
	if qerr.Class != "CommandNotFound" || qerr.Command != "no-such-command" {
		t.Errorf("error = %+v, want class CommandNotFound for no-such-command", qerr)
	}
	const want = "qmp no-such-command: CommandNotFound: The command no-such-command has not been found"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err, want)
	}

	// Argument errors carry a different class.
	_, err = m.Execute(testContext(t), "stop", map[string]int{"bogus": 1})
	if !errors.As(err, &qerr) || qerr.Class != "GenericError" {
		t.Errorf("stop with bogus argument: err = %v, want GenericError", err)
	}

	execute(t, m, "query-status")
}

func TestQEMULargeResponse(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)

	resp, err := m.RunContext(testContext(t), []byte(`{"execute":"query-qmp-schema"}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp) <= 64<<10 {
		t.Fatalf("query-qmp-schema response is %d bytes, want > 65536 for this test to mean anything", len(resp))
	}
	var schema struct {
		Return []struct {
			Name     string `json:"name"`
			MetaType string `json:"meta-type"`
		} `json:"return"`
	}
	if err := json.Unmarshal(resp, &schema); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(schema.Return, func(e struct {
		Name     string `json:"name"`
		MetaType string `json:"meta-type"`
	}) bool {
		return e.Name == "query-status" && e.MetaType == "command"
	}) {
		t.Error("schema does not list query-status")
	}
	t.Logf("query-qmp-schema: %d bytes, %d entities", len(resp), len(schema.Return))

	execute(t, m, "query-status")
}

func TestQEMUConcurrentRuns(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)
	want := m.Greeting().Version

	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			ctx := testContext(t)
			for j := range 10 {
				if (i+j)%2 == 0 {
					var v goqmp.Version
					if err := executeInto(ctx, m, "query-version", &v); err != nil {
						t.Errorf("query-version: %v", err)
						return
					}
					if v != want {
						t.Errorf("query-version = %+v, want greeting version %+v", v, want)
					}
				} else {
					var st struct{ Status string }
					if err := executeInto(ctx, m, "query-status", &st); err != nil {
						t.Errorf("query-status: %v", err)
						return
					}
					if st.Status != "prelaunch" {
						t.Errorf("query-status = %q, want prelaunch", st.Status)
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestQEMUStalledSubscriber(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t, WithEventBuffer(8))

	stalled, err := m.Events(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	running := false
	for i := range 1000 {
		cmd := "query-status"
		if i%5 == 0 {
			cmd = "cont"
			if running {
				cmd = "stop"
			}
			running = !running
		}
		if _, err := m.Execute(testContext(t), cmd, nil); err != nil {
			t.Fatalf("run %d (%s): %v", i, cmd, err)
		}
	}
	t.Logf("1000 runs with a stalled subscriber took %v; %d events dropped",
		time.Since(start).Round(time.Millisecond), m.DroppedEvents())
	if m.DroppedEvents() == 0 {
		t.Error("expected the stalled subscriber to drop events")
	}

	start = time.Now()
	if err := m.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Disconnect took %v", d)
	}
	// The queue holds the most recent events, then the channel closes.
	n := 0
	for range stalled {
		n++
	}
	if n != 8 {
		t.Errorf("stalled subscriber had %d queued events, want 8", n)
	}
}

func TestQEMUGoQemuDomain(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)

	d, err := qemu.NewDomain(m, "test")
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Status()
	if err != nil {
		t.Fatal(err)
	}
	if st != qemu.StatusPreLaunch {
		t.Errorf("Status = %v, want %v", st, qemu.StatusPreLaunch)
	}
	v, err := d.Version()
	if err != nil {
		t.Fatal(err)
	}
	if want := m.Greeting().Version.String(); v != want {
		t.Errorf("Version = %q, want %q", v, want)
	}

	rs, err := raw.NewMonitor(m).QueryStatus()
	if err != nil {
		t.Fatal(err)
	}
	if rs.Status != raw.RunStatePrelaunch {
		t.Errorf("raw QueryStatus = %v, want prelaunch", rs.Status)
	}

	// Domain subscribes via Events once and fans out to its own listeners.
	events, done, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Run(goqmp.Command{Execute: "cont"}); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, events, "RESUME")
	close(done)

	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Domain.Close hung")
	}
}

func TestQEMUKilled(t *testing.T) {
	t.Parallel()
	q, m := connectQEMU(t)
	execute(t, m, "query-status")

	// A stopped process keeps its socket open but answers nothing, which
	// makes the next command reliably pending when QEMU dies.
	if err := q.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.RunContext(testContext(t), []byte(`{"execute":"query-status"}`))
		errc <- err
	}()
	waitFor(t, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.pending) == 1
	})
	select {
	case err := <-errc:
		t.Fatalf("Run returned before QEMU died: %v", err)
	case <-time.After(20 * time.Millisecond):
	}

	killed := time.Now()
	if err := q.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("pending Run: err = %v, want ErrClosed", err)
		}
		t.Logf("pending Run failed %v after kill: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(testTimeout):
		t.Fatal("pending Run did not fail after QEMU was killed")
	}
	select {
	case <-m.Done():
	case <-time.After(testTimeout):
		t.Fatal("Done not closed")
	}
	if err := m.Err(); !errors.Is(err, ErrClosed) || err == ErrClosed {
		t.Errorf("Err = %v, want ErrClosed wrapping the read error", err)
	}

	if _, err := m.Run([]byte(`{"execute":"query-status"}`)); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after death: err = %v, want ErrClosed", err)
	}
	if _, err := m.Events(testContext(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Events after death: err = %v, want ErrClosed", err)
	}
	if err := m.Disconnect(); err != nil {
		t.Errorf("Disconnect after death: %v", err)
	}
}

func TestQEMUQuit(t *testing.T) {
	t.Parallel()
	_, m := connectQEMU(t)
	ch, err := m.Events(testContext(t))
	if err != nil {
		t.Fatal(err)
	}

	// QEMU answers quit before closing the socket, so it succeeds.
	execute(t, m, "quit")
	expectEvents(t, ch, "SHUTDOWN")
	expectClosed(t, ch)
	select {
	case <-m.Done():
	case <-time.After(testTimeout):
		t.Fatal("Done not closed after quit")
	}
	if !errors.Is(m.Err(), ErrClosed) {
		t.Errorf("Err = %v, want ErrClosed", m.Err())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(time.Millisecond)
	}
}
