package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
)

// termThenKill sends the server SIGTERM and, delay later, SIGKILL, as
// Copilot CLI stops its servers (about 2 ms apart), through the identity
// the test recorded when it started the process.
func termThenKill(t *testing.T, s *server, delay time.Duration) names.Owner {
	t.Helper()
	o := s.owner(t)
	id := proc.Identity{PID: o.PID, StartTime: o.StartTime}
	if err := proc.Signal(id, unix.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	time.Sleep(delay)
	// The server may be gone already: then there is nothing to kill.
	proc.Signal(id, unix.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not exit after SIGTERM and SIGKILL %v later", delay)
	}
	return o
}

var killDelays = []time.Duration{0, 200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond,
	2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond}

// SIGTERM then SIGKILL a few milliseconds later, at every delay of the
// sweep: a server without a guest leaves nothing behind, however far its
// shutdown got.
func TestTermThenKillIdle(t *testing.T) {
	dir := runtimeDir(t)
	for _, d := range killDelays {
		for _, ready := range []string{"initialize", "tools/list", "server_info"} {
			s := startServer(t, dir, t.TempDir())
			// The record and directories are made once initialize is
			// answered; after a call they exist for sure.
			switch ready {
			case "tools/list":
				if _, err := s.cs.ListTools(t.Context(), nil); err != nil {
					t.Fatal(err)
				}
			case "server_info":
				s.call(t, "server_info", nil, nil)
			}
			o := termThenKill(t, s, d)
			if left := entriesOf(t, dir, o.PID); len(left) > 0 {
				t.Errorf("SIGKILL %v after SIGTERM, after %s: left %v", d, ready, left)
			}
		}
	}
}

// With a guest, whatever is left at any delay of the sweep, QEMU dies with
// the server and the next server reaps all of it.
func TestTermThenKillWithGuest(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	// Fewer steps than the idle sweep: each costs two boots.
	for _, d := range []time.Duration{0, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		s := startServer(t, dir, t.TempDir())
		var b bootWithReap
		if res := s.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`, "timeout": 30}, &b); res.IsError || !b.Matched {
			t.Fatalf("boot: %s", mcptest.Text(res))
		}
		info, err := proc.Stat(b.PID)
		if err != nil {
			t.Fatal(err)
		}
		o := termThenKill(t, s, d)
		waitGone(t, proc.Identity{PID: info.PID, StartTime: info.StartTime}, 5*time.Second)
		left := entriesOf(t, dir, o.PID)
		next := startServer(t, dir, t.TempDir())
		var nb bootWithReap
		if res := next.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &nb); res.IsError || !nb.Matched {
			t.Fatalf("boot after the kill %v: %s", d, mcptest.Text(res))
		}
		if len(left) > 0 && (nb.Reaped == nil || !slices.Contains(nb.Reaped.DeadServers, o.PID)) {
			t.Errorf("SIGKILL %v after SIGTERM left %v, and the next boot reaped %+v", d, left, nb.Reaped)
		}
		if rest := entriesOf(t, dir, o.PID); len(rest) > 0 {
			t.Errorf("SIGKILL %v after SIGTERM: after the next boot, still %v", d, rest)
		}
		t.Logf("SIGKILL %v after SIGTERM: left %d entries, reaped by the next boot", d, len(left))
		next.call(t, "qemu_shutdown", nil, nil)
		next.cs.Close()
		<-next.done
	}
}

// entriesOf lists the runtime entries of the server pid in dir.
func entriesOf(t *testing.T, dir string, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if n, ok := names.Classify(e.Name()); ok && n.Owner.PID == pid {
			out = append(out, e.Name())
		} else if o, ok := registry.ParseFileName(e.Name()); ok && o.PID == pid {
			out = append(out, e.Name())
		} else if !e.IsDir() && !slices.Contains(out, e.Name()) && filepath.Ext(e.Name()) == ".tmp" {
			out = append(out, fmt.Sprintf("%s (temporary)", e.Name()))
		}
	}
	return out
}
