package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
)

// server is a qemu-mcp process under test with an MCP client on its pipes.
type server struct {
	cmd  *exec.Cmd
	cs   *mcp.ClientSession
	done chan struct{} // closed when the process has exited
	err  error
}

// startServer runs the real command in cwd with env added, connected over
// pipes (not CommandTransport, so the test decides how the server dies).
// owner is the identity the server's names carry; call it while it runs.
func (s *server) owner(t *testing.T) names.Owner {
	t.Helper()
	info, err := proc.Stat(s.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return names.Owner{PID: info.PID, StartTime: info.StartTime}
}

// files are the names of a server's record and of its instance's FIFOs and
// socket.
func files(o names.Owner, instance string) []string {
	return []string{registry.FileName(o), names.Name(names.SerialIn, o, instance),
		names.Name(names.SerialOut, o, instance), names.Name(names.QMPSocket, o, instance)}
}

func startServer(t *testing.T, dir, cwd string, env ...string) *server {
	t.Helper()
	cmd := serverCmd(dir)
	cmd.Dir = cwd
	return startServerCmd(t, cmd, append(cmd.Env, env...))
}

// startServerCmd starts cmd (a server, possibly wrapped) with env and
// connects a client to its pipes.
func startServerCmd(t *testing.T, cmd *exec.Cmd, env []string) *server {
	t.Helper()
	cmd.Env = env
	if cmd.Stderr == nil {
		cmd.Stderr = &logWriter{t: t}
	}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
	})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: stdout, Writer: stdin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.cs = cs
	return s
}

func (s *server) call(t *testing.T, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if out != nil && !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, out)
	}
	return res
}

func gitRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found: run scripts/deps")
	}
	repo := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q"},
		{"-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "init"},
	} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return repo
}

type bootWithReap struct {
	PID     int    `json:"pid"`
	Matched bool   `json:"matched"`
	Lock    string `json:"lock"`
	Reaped  *struct {
		DeadServers []int    `json:"dead_servers"`
		Removed     []string `json:"removed"`
	} `json:"reaped"`
}

// Seed 000, looped: boot, SIGKILL the server, start a new one in the same
// repository, boot again. Every boot must succeed, every killed server's
// QEMU must be gone within 2 s, and nothing of a dead PID may remain.
func TestSeed000KilledServerLeavesNothingThatBlocks(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	repo := gitRepo(t)
	var dead []int
	for i := 0; i < 5; i++ {
		s := startServer(t, dir, repo, "QEMU_MCP_LOCK_FILE=")
		var b bootWithReap
		res := s.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`, "timeout": 30}, &b)
		if res.IsError || !b.Matched {
			t.Fatalf("round %d: boot failed: %s", i, mcptest.Text(res))
		}
		if want := filepath.Join(repo, ".git", ".qemu.lock"); b.Lock != want {
			t.Errorf("round %d: lock %q, want %q", i, b.Lock, want)
		}
		if i > 0 {
			if b.Reaped == nil || len(b.Reaped.DeadServers) != 1 || b.Reaped.DeadServers[0] != dead[i-1] {
				t.Errorf("round %d: reaped %+v, want the server killed in round %d (pid %d)", i, b.Reaped, i-1, dead[i-1])
			}
		}
		info, err := proc.Stat(b.PID)
		if err != nil {
			t.Fatal(err)
		}
		q := proc.Identity{PID: info.PID, StartTime: info.StartTime}
		s.cmd.Process.Kill()
		<-s.done
		dead = append(dead, s.cmd.Process.Pid)
		waitGone(t, q, 2*time.Second)
	}
	// A last server boots, shuts down and exits cleanly; then nothing of
	// any dead PID remains.
	s := startServer(t, dir, repo, "QEMU_MCP_LOCK_FILE=")
	if res := s.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("final boot: %s", mcptest.Text(res))
	}
	s.call(t, "qemu_shutdown", nil, nil)
	s.cs.Close()
	<-s.done
	assertNoEntriesOf(t, dir, append(dead, s.cmd.Process.Pid)...)
	if _, err := os.Lstat(filepath.Join(repo, ".git", ".qemu.lock")); err == nil {
		t.Errorf("lock file still there after the last server exited")
	}
}

// assertNoEntriesOf fails if dir holds a runtime entry of any of pids.
func assertNoEntriesOf(t *testing.T, dir string, pids ...int) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n, ok := names.Classify(e.Name()); ok && slices.Contains(pids, n.Owner.PID) {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// A server with two guests is killed: both QEMUs go within 2 s, and the
// next server reaps everything of both (FIFOs, sockets, record).
func TestKilledServerWithTwoInstances(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	s := startServer(t, dir, t.TempDir())
	var qemus []proc.Identity
	for _, name := range []string{"a", "b"} {
		var b bootWithReap
		if res := s.call(t, "qemu_boot", map[string]any{"instance": name, "wait_for": `tiny> $`, "timeout": 30}, &b); res.IsError || !b.Matched {
			t.Fatalf("boot %s: %s", name, mcptest.Text(res))
		}
		info, err := proc.Stat(b.PID)
		if err != nil {
			t.Fatal(err)
		}
		qemus = append(qemus, proc.Identity{PID: info.PID, StartTime: info.StartTime})
	}
	owner := s.owner(t)
	s.cmd.Process.Kill()
	<-s.done
	for _, q := range qemus {
		waitGone(t, q, 2*time.Second)
	}
	left := append(files(owner, "a"), files(owner, "b")[1:]...)
	for _, f := range left {
		if _, err := os.Lstat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the killed server's %s is not there to reap: %v", f, err)
		}
	}
	next := startServer(t, dir, t.TempDir())
	var b bootWithReap
	if res := next.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &b); res.IsError || !b.Matched {
		t.Fatalf("boot after the kill: %s", mcptest.Text(res))
	}
	// The server may have been probing its QEMU (qemu/caps) when it was
	// killed: that probe's directory goes too.
	var removed []string
	if b.Reaped != nil {
		for _, r := range b.Reaped.Removed {
			if !strings.HasPrefix(filepath.Base(r), names.ProbePrefix) {
				removed = append(removed, r)
			}
		}
	}
	if b.Reaped == nil || !slices.Equal(b.Reaped.DeadServers, []int{owner.PID}) || len(removed) != len(left) {
		t.Errorf("reaped %+v, want the %d entries of pid %d", b.Reaped, len(left), owner.PID)
	}
	assertNoEntriesOf(t, dir, owner.PID)
}

// waitGone waits until the process id names is no longer running. A
// zombie has exited: only its parent (init, after reparenting) can reap it.
func waitGone(t *testing.T, id proc.Identity, d time.Duration) {
	t.Helper()
	live, took := testguest.AwaitGone(t, id, d, true, "its server was killed")
	t.Logf("qemu %d %v %v after its server was killed", id.PID, live, took.Round(time.Millisecond))
}

// A second server in the same repository, or in another worktree of it,
// is refused with a message that names the lock, the holder and the way out.
func TestSecondServerSameRepoAndWorktree(t *testing.T) {
	needQEMU(t)
	repo := gitRepo(t)
	wt := filepath.Join(t.TempDir(), "wt")
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "-q", wt).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add: %v\n%s", err, out)
	}
	a := startServer(t, runtimeDir(t), repo, "QEMU_MCP_LOCK_FILE=")
	for _, name := range []string{"default", "router"} {
		if res := a.call(t, "qemu_boot", map[string]any{"instance": name, "wait_for": `tiny> $`}, nil); res.IsError {
			t.Fatalf("boot of %s: %s", name, mcptest.Text(res))
		}
	}
	lockPath := filepath.Join(repo, ".git", ".qemu.lock")
	for _, cwd := range []string{repo, wt} {
		b := startServer(t, runtimeDir(t), cwd, "QEMU_MCP_LOCK_FILE=")
		res := b.call(t, "qemu_boot", nil, nil)
		msg := mcptest.Text(res)
		if !res.IsError {
			t.Fatalf("second server in %s booted while the lock is held", cwd)
		}
		for _, want := range []string{lockPath, "process " + strconv.Itoa(a.cmd.Process.Pid), "kill -TERM " + strconv.Itoa(a.cmd.Process.Pid), "qemu_shutdown",
			"instance(s) default, router"} {
			if !strings.Contains(msg, want) {
				t.Errorf("from %s: error %q lacks %q", cwd, msg, want)
			}
		}
		// Still serving after the refusal.
		var info struct {
			LockState  string `json:"lock_state"`
			LockHolder int    `json:"lock_holder"`
		}
		b.call(t, "server_info", nil, &info)
		if info.LockState != "held" || info.LockHolder != a.cmd.Process.Pid {
			t.Errorf("server_info from %s: %+v", cwd, info)
		}
	}
	// Once the first server shuts its guests down, the lock is free again;
	// not before.
	a.call(t, "qemu_shutdown", nil, nil)
	b := startServer(t, runtimeDir(t), wt, "QEMU_MCP_LOCK_FILE=")
	if res := b.call(t, "qemu_boot", nil, nil); !res.IsError || !strings.Contains(mcptest.Text(res), "instance(s) router since") {
		t.Fatalf("boot while router still runs: %s", mcptest.Text(res))
	}
	a.call(t, "qemu_shutdown", map[string]any{"instance": "router"}, nil)
	if res := b.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("boot from the worktree after release: %s", mcptest.Text(res))
	}
}

func TestDoctor(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	live := startServer(t, dir, t.TempDir())
	if res := live.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	dead := startServer(t, dir, t.TempDir(), "QEMU_MCP_LOCK_FILE="+dir+"-2.lock")
	var b bootWithReap
	if res := dead.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &b); res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	defer os.Remove(dir + "-2.lock")
	defer os.Remove(dir + "-2.lock.guard")
	deadOwner, liveOwner := dead.owner(t), live.owner(t)
	dead.cmd.Process.Kill()
	<-dead.done

	doctor := func(args ...string) string {
		cmd := exec.Command(os.Args[0], append([]string{"doctor"}, args...)...)
		cmd.Env = append(os.Environ(), "QEMU_MCP_TEST_MAIN=server", "QEMU_MCP_RUNTIME_DIR="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("doctor %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := doctor()
	t.Log(out)
	livePID := strconv.Itoa(live.cmd.Process.Pid)
	deadFiles, liveFiles := files(deadOwner, "default"), files(liveOwner, "default")
	for _, want := range []string{"pid " + livePID, "stdio", deadFiles[1], "--cleanup"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q", want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, deadFiles[0])); err != nil {
		t.Errorf("plain doctor changed something: %v", err)
	}
	out = doctor("--cleanup")
	t.Log(out)
	for i := range deadFiles {
		if _, err := os.Lstat(filepath.Join(dir, deadFiles[i])); err == nil {
			t.Errorf("doctor --cleanup left %s", deadFiles[i])
		}
		if _, err := os.Lstat(filepath.Join(dir, liveFiles[i])); err != nil {
			t.Errorf("doctor --cleanup removed the live server's %s", liveFiles[i])
		}
	}
	var st struct {
		Running bool `json:"running"`
	}
	live.call(t, "qemu_status", nil, &st)
	if !st.Running {
		t.Errorf("the live server's guest stopped during doctor --cleanup")
	}
}

// A server whose executable is replaced on disk serves stale code: its
// server_info says so.
func TestServerInfoStaleExecutable(t *testing.T) {
	dir := runtimeDir(t)
	exe := filepath.Join(t.TempDir(), "qemu-mcp")
	copyFile(t, os.Args[0], exe)
	cmd := exec.Command(exe, "-log-level", "warn")
	cmd.Env = append(os.Environ(), "QEMU_MCP_TEST_MAIN=server", "QEMU_MCP_RUNTIME_DIR="+dir, "QEMU_MCP_LOCK_FILE="+dir+".lock")
	cmd.Stderr = &logWriter{t: t}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	s := &server{cs: cs}
	var info struct {
		Health   string   `json:"health"`
		Problems []string `json:"problems"`
		PID      int      `json:"pid"`
		Revision string   `json:"revision"`
	}
	s.call(t, "server_info", nil, &info)
	if info.Health != "ok" || info.PID != cmd.Process.Pid {
		t.Fatalf("fresh server: %+v", info)
	}
	// Replace the binary the way an install does: a new file renamed over it.
	copyFile(t, os.Args[0], exe+".new")
	os.Rename(exe+".new", exe)
	s.call(t, "server_info", nil, &info)
	if info.Health != "degraded" || len(info.Problems) == 0 || !strings.Contains(info.Problems[0], "stale code") {
		t.Errorf("after replacing the executable: %+v", info)
	}
}

func copyFile(t *testing.T, from, to string) { testusers.CopyExecutable(t, from, to) }
