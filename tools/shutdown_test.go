package tools_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// Seed 003: tool calls racing Close must each get a result or a clean
// error; Close must wait for them and then leave nothing behind.
func TestConcurrentCallsRaceShutdown(t *testing.T) {
	s := newSession(t)
	b := s.bootTiny()
	q := qemuProcess(t, b.PID)
	calls := []struct {
		name string
		args map[string]any
	}{
		{"serial_read", map[string]any{"wait_for": "never-printed", "timeout": 30}},
		{"serial_send", map[string]any{"data": "echo race", "wait_for": "race\r\n"}},
		{"qmp_command", map[string]any{"command": "query-status"}},
		{"qemu_status", nil},
		{"server_info", nil},
		{"serial_read", map[string]any{"since": 0}},
		{"qemu_boot", nil}, // refused: a guest is running, or shutdown began
	}
	// Two waves of 100: the first is in flight (long waits among them)
	// when Close starts; the second starts at the same moment as Close.
	const n = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	wave1, wave2 := make(chan struct{}), make(chan struct{})
	for i := 0; i < n; i++ {
		c := calls[i%len(calls)]
		start := wave1
		if i >= n/2 {
			start = wave2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: c.name, Arguments: c.args})
			var kind string
			switch {
			case err != nil:
				t.Errorf("%s: protocol error %v (want a result or a tool error)", c.name, err)
				kind = "protocol error"
			case res.IsError:
				msg := text(res)
				if msg == "" {
					t.Errorf("%s: tool error without a message", c.name)
				}
				kind = "tool error"
				if strings.Contains(msg, "shutting down") {
					kind = "refused: shutting down"
				}
			default:
				kind = "result"
			}
			mu.Lock()
			outcomes[c.name+": "+kind]++
			mu.Unlock()
		}()
	}
	close(wave1)
	time.Sleep(500 * time.Millisecond)
	close(wave2)
	closeStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	closeTook := time.Since(closeStart)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("tool calls still hanging 30 s after Close")
	}
	t.Logf("Close took %v; outcomes: %v", closeTook, outcomes)
	results := 0
	for k, v := range outcomes {
		if strings.HasSuffix(k, ": result") {
			results += v
		}
	}
	if results == 0 {
		t.Errorf("no call completed before Close: the test did not race anything")
	}
	if closeTook > 10*time.Second {
		t.Errorf("Close took %v: in-flight waits were not cancelled", closeTook)
	}
	if live, _, _ := proc.Check(q); live == proc.Alive {
		t.Errorf("qemu %d still running after Close", q.PID)
	}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if e.Name() != "images" && e.Name() != "captures" {
			t.Errorf("left behind after Close: %s", e.Name())
		}
	}
	// After Close every call is refused cleanly.
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "qemu_status"})
	if err != nil || !res.IsError || !strings.Contains(text(res), "shutting down") {
		t.Errorf("call after Close: %v %v", err, res)
	}
}

// Files a dead server left are reaped by the next boot and reported.
func TestBootReapsDeadServers(t *testing.T) {
	s := newSession(t)
	dead := deadPID(t)
	var names []string
	for _, n := range []string{"serial-%d.in", "serial-%d.out"} {
		p := fmt.Sprintf(s.dir+"/"+n, dead)
		if err := mkfifo(p); err != nil {
			t.Fatal(err)
		}
		names = append(names, p)
	}
	var b struct {
		Matched bool `json:"matched"`
		Reaped  struct {
			DeadServers []int    `json:"dead_servers"`
			Removed     []string `json:"removed"`
		} `json:"reaped"`
	}
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt}, &b)
	if len(b.Reaped.DeadServers) != 1 || b.Reaped.DeadServers[0] != dead || len(b.Reaped.Removed) != 2 {
		t.Errorf("reaped %+v, want the 2 FIFOs of pid %d", b.Reaped, dead)
	}
	for _, p := range names {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s not reaped", p)
		}
	}
}
