package tools_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/registrytest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

type listOut struct {
	Instances []struct {
		Instance    string `json:"instance"`
		State       string `json:"state"`
		PID         int    `json:"pid"`
		UptimeMS    int64  `json:"uptime_ms"`
		ExitStatus  *int   `json:"exit_status"`
		Kernel      string `json:"kernel"`
		SerialBytes int64  `json:"serial_bytes"`
	} `json:"instances"`
	MaxInstances int `json:"max_instances"`
}

func (s *session) bootInstance(name string) bootOut {
	s.t.Helper()
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"instance": name, "wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched {
		s.t.Fatalf("boot %s: prompt not seen: %+v", name, b)
	}
	return b
}

// Two guests of one server: each has its own console, and their output
// never mixes; stopping one leaves the other running.
func TestTwoInstancesEchoIndependently(t *testing.T) {
	s := newSession(t)
	a, b := s.bootInstance("a"), s.bootInstance("b")
	if a.PID == b.PID || a.Paths.SerialIn == b.Paths.SerialIn || a.Paths.QMPSocket == b.Paths.QMPSocket {
		t.Fatalf("instances share a process or files: %+v %+v", a, b)
	}
	// Both consoles at once, many lines each.
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Go(func() {
			for i := range 20 {
				var w waitOut
				line := fmt.Sprintf("from-%s-%d", name, i)
				if res := s.call("serial_send", map[string]any{"instance": name, "data": "echo " + line, "wait_for": line + `\r\n` + prompt}, &w); res.IsError || !w.Matched {
					t.Errorf("%s: %s %+v", line, text(res), w)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, c := range []struct{ name, own, other string }{{"a", "from-a-", "from-b-"}, {"b", "from-b-", "from-a-"}} {
		var r waitOut
		s.mustCall("serial_read", map[string]any{"instance": c.name, "since": 0}, &r)
		if strings.Count(r.Output, c.own) != 40 || strings.Contains(r.Output, c.other) {
			t.Errorf("console of %s has %d of its own lines (want 40: echo and answer) and %v of the other's:\n%s",
				c.name, strings.Count(r.Output, c.own), strings.Contains(r.Output, c.other), r.Output)
		}
	}
	var l listOut
	s.mustCall("qemu_list", nil, &l)
	if len(l.Instances) != 2 || l.Instances[0].Instance != "a" || l.Instances[1].State != "running" || l.Instances[0].PID != a.PID ||
		l.Instances[0].SerialBytes == 0 || l.MaxInstances != 4 {
		t.Errorf("qemu_list %+v", l)
	}

	var sd struct {
		Instance string `json:"instance"`
		How      string `json:"how"`
	}
	s.mustCall("qemu_shutdown", map[string]any{"instance": "b"}, &sd)
	if sd.Instance != "b" || sd.How != "quit" {
		t.Errorf("shutdown %+v", sd)
	}
	if live, _, _ := proc.Check(proc.Identity{PID: a.PID}); live != proc.Alive {
		t.Fatalf("a's qemu is %v after b's shutdown", live)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"instance": "a", "data": "echo still-here", "wait_for": `still-here\r\n` + prompt}, &w)
	if !w.Matched {
		t.Errorf("a after b's shutdown: %+v", w)
	}
	s.wantError("serial_send", map[string]any{"instance": "b", "data": "x"}, `"b"`, "qemu_boot")
	s.mustCall("qemu_list", nil, &l)
	if len(l.Instances) != 2 || l.Instances[0].State != "running" || l.Instances[1].State != "stopped" || l.Instances[1].ExitStatus == nil {
		t.Errorf("qemu_list after b's shutdown %+v", l)
	}
	s.wantError("serial_read", map[string]any{"instance": "nope"}, `no guest named "nope"`, "a, b")
	s.wantError("qemu_status", map[string]any{"instance": "Bad Name"}, "instance name")
	var st struct {
		State  string `json:"state"`
		Booted bool   `json:"booted"`
	}
	if res := s.call("qemu_status", map[string]any{"instance": "c"}, &st); res.IsError || st.State != "none" || st.Booted {
		t.Errorf("status of a guest never booted: %s %+v", text(res), st)
	}
	s.mustCall("qemu_shutdown", map[string]any{"instance": "a"}, nil)
	assertEmptyRuntimeDir(t, s.dir)
}

// A stop does not wait for a boot that waits on its console: the shutdown
// answers at once and the boot call returns.
func TestShutdownDuringBootWait(t *testing.T) {
	s := newSession(t)
	type result struct {
		res *mcp.CallToolResult
		err error
		at  time.Time
	}
	booted := make(chan result, 1)
	go func() {
		res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "qemu_boot",
			Arguments: map[string]any{"wait_for": "never printed", "timeout": 15}})
		booted <- result{res, err, time.Now()}
	}()
	// Wait until the guest runs, so the boot is in its console wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st struct {
			State string `json:"state"`
		}
		if res := s.call("qemu_status", nil, &st); !res.IsError && st.State == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest did not come up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	var sd struct {
		How string `json:"how"`
	}
	s.mustCall("qemu_shutdown", nil, &sd)
	took := time.Since(start)
	if took > time.Second {
		t.Errorf("qemu_shutdown took %v while the boot waited (want < 1 s)", took)
	}
	select {
	case r := <-booted:
		if r.err != nil || !r.res.IsError || !strings.Contains(text(r.res), "stopped") {
			t.Errorf("boot call: %v %s", r.err, text(r.res))
		}
		if d := r.at.Sub(start); d > time.Second {
			t.Errorf("the boot call returned %v after the shutdown began", d)
		}
		t.Logf("shutdown (%s) answered in %v; the boot returned: %s", sd.How, took.Round(time.Millisecond), text(r.res))
	case <-time.After(5 * time.Second):
		t.Fatal("the boot call did not return after the shutdown")
	}
	assertEmptyRuntimeDir(t, s.dir)
}

// PIDs repeat: files an earlier process with this very PID left (PID-only
// names of an older version, and names with another start time) are
// reaped at the boot, never a reason to refuse it.
func TestBootWithOwnPIDLeftovers(t *testing.T) {
	s := newSession(t)
	self, err := proc.Self()
	if err != nil {
		t.Fatal(err)
	}
	earlier := names.Owner{PID: self.PID, StartTime: self.StartTime - 1}
	legacy := names.Owner{PID: self.PID}
	var left []string
	for _, o := range []names.Owner{earlier, legacy} {
		for _, k := range []names.Kind{names.SerialIn, names.SerialOut} {
			p := filepath.Join(s.dir, names.Name(k, o, "default"))
			if err := unix.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			left = append(left, p)
		}
		p := filepath.Join(s.dir, names.Name(names.QMPSocket, o, "default"))
		if err := registrytest.MakeSocket(p); err != nil {
			t.Fatal(err)
		}
		left = append(left, p)
	}
	rec := registry.Record{PID: self.PID, StartTime: earlier.StartTime, Transport: "stdio"}
	if err := registry.Write(s.dir, rec); err != nil {
		t.Fatal(err)
	}
	left = append(left, registry.Path(s.dir, earlier))

	var b struct {
		bootOut
		Reaped struct {
			DeadServers []int    `json:"dead_servers"`
			Removed     []string `json:"removed"`
		} `json:"reaped"`
	}
	s.mustCall("qemu_boot", map[string]any{"wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched || len(b.Reaped.Removed) != len(left) {
		t.Errorf("boot: matched %v, reaped %+v, want %d files removed", b.Matched, b.Reaped, len(left))
	}
	for _, p := range left {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("left behind: %s", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.dir, ownRecord(t))); err != nil {
		t.Errorf("the server's own record: %v", err)
	}
}

// --max-instances bounds the guests, a writable image backs one guest at a
// time, and each error names what is in the way.
func TestInstanceLimits(t *testing.T) {
	project := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.MaxInstances = 2; c.WorkDir = project }, nil)
	disk := filepath.Join(project, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"instance": "a", "drives": []any{map[string]any{"path": disk}}, "wait_for": prompt}, &b)
	s.wantError("qemu_boot", map[string]any{"instance": "b", "drives": []any{map[string]any{"path": disk, "readonly": true}}},
		"disk.img", `instance "a"`, "writable")
	bb := s.bootInstance("b")
	// A restart that the drive would refuse leaves the running b alone.
	s.wantError("qemu_boot", map[string]any{"instance": "b", "restart": true, "drives": []any{map[string]any{"path": disk}}}, `instance "a"`)
	var st struct {
		State string `json:"state"`
		PID   int    `json:"pid"`
	}
	if s.mustCall("qemu_status", map[string]any{"instance": "b"}, &st); st.State != "running" || st.PID != bb.PID {
		t.Errorf("b after a refused restart: %+v, want running pid %d", st, bb.PID)
	}
	s.wantError("qemu_boot", map[string]any{"instance": "c"}, "2 guests already run (a, b)", "--max-instances 2")
	s.wantError("qemu_boot", map[string]any{"instance": "a"}, `guest "a" is already running`, "restart: true")
	// A restart of a name stays within the bound.
	var r bootOut
	s.mustCall("qemu_boot", map[string]any{"instance": "a", "restart": true, "wait_for": prompt}, &r)
	if !r.Matched || r.PID == b.PID {
		t.Errorf("restart of a: %+v", r)
	}
	s.mustCall("qemu_shutdown", map[string]any{"instance": "b"}, nil)
	s.bootInstance("c")
}

// The Linux profile docs/tools.md shows: the guest of testdata/linux inside
// the project boots to its shell, answers, and a kernel panic ends a wait.
func TestLinuxProfile(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "linux"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Image", "initramfs.cpio.gz"} {
		b, err := os.ReadFile(filepath.Join(lin.Dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "linux", f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	profile := documentedProfile(t, `"default": "linux"`)
	if err := os.WriteFile(filepath.Join(root, ".qemu-mcp.json"), []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = root }, nil)
	var b bootOut
	s.mustCall("qemu_boot", nil, &b)
	if !b.Matched || !strings.Contains(b.Output, testguest.LinuxReady) {
		t.Fatalf("boot: %+v", b)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "uname -sr"}, &w)
	if !w.Matched || !strings.Contains(w.Output, "Linux 6.1") {
		t.Errorf("uname: %+v", w)
	}
	var p struct {
		Panicked   bool   `json:"panicked"`
		PanicMatch string `json:"panic_match"`
	}
	s.mustCall("serial_send", map[string]any{"data": "echo c > /proc/sysrq-trigger", "timeout": 30}, &p)
	if !p.Panicked || !strings.Contains(p.PanicMatch, "Kernel panic - not syncing: sysrq triggered crash") {
		t.Errorf("panic: %+v", p)
	}
}
