package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
)

// The tests here run the server as one unprivileged user (the owner) and
// act as another user beside it, as on a shared machine: two users made
// for the test, deleted when it ends (see internal/testusers).

// account is a test user with a copy of the test binary it may run and a
// directory of its own that others may enter (as a home usually is).
type account struct {
	testusers.User
	bin  string
	home string
}

func accounts(t *testing.T, n int) []account {
	t.Helper()
	users := testusers.New(t, n)
	shared := testusers.Shared(t)
	bin := testusers.Binary(t, shared)
	var as []account
	for _, u := range users {
		home := u.Dir(t, shared)
		os.Chmod(home, 0o755)
		as = append(as, account{User: u, bin: bin, home: home})
	}
	return as
}

// dir makes a directory of a's, mode 0700 (a runtime directory), or 0755.
func (a account) dir(t *testing.T, name string, perm os.FileMode) string {
	t.Helper()
	d := filepath.Join(a.home, name)
	if err := os.Mkdir(d, perm); err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, perm)
	if err := os.Chown(d, a.UID, a.GID); err != nil {
		t.Fatal(err)
	}
	return d
}

// serverCmd is the server run as a, in cwd, with runtime directory dir (its
// lock and state beside it, as serverCmd puts them).
func (a account) serverCmd(dir, cwd string, args ...string) *exec.Cmd {
	cmd := serverCmd(dir, args...)
	cmd.Path, cmd.Args[0] = a.bin, a.bin
	cmd.Dir = cwd
	cmd.SysProcAttr = a.Attr()
	// A -race binary otherwise sleeps a second at exit.
	cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0", "HOME="+a.home)
	return cmd
}

// helper runs the test binary as a in one of userHelper's modes.
func (a account) helper(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(a.bin, "-test.run=^$")
	cmd.SysProcAttr = a.Attr()
	cmd.Dir = a.home
	cmd.Env = append(os.Environ(), append([]string{"QEMU_MCP_TEST_MAIN=" + mode, "GORACE=atexit_sleep_ms=0"}, env...)...)
	return cmd
}

// userHelper is what a user does from outside the server:
//
//	post: POST an MCP initialize to $QEMU_MCP_TEST_URL (with the bearer
//	      $QEMU_MCP_TEST_TOKEN if set) and print the status code
//	holdro: open the files $QEMU_MCP_TEST_PATHS (colon-separated)
//	      read-only, hold a flock on each, print "locked" and wait for EOF
//	dial: connect to the unix socket $QEMU_MCP_TEST_PATHS and print "ok"
//	      and the first line the server sends, or "error" and why
//	gdbtcp: connect to the gdbstub at $QEMU_MCP_TEST_URL, ask why the
//	      guest stopped ("?") and print "reply" and the answer, or "closed"
func userHelper(mode string) int {
	switch mode {
	case "gdbtcp":
		c, err := net.DialTimeout("tcp", os.Getenv("QEMU_MCP_TEST_URL"), 5*time.Second)
		if err != nil {
			fmt.Println("error", err)
			return 0
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("$?#3f"))
		buf := make([]byte, 256)
		n, err := io.ReadAtLeast(c, buf, 2)
		if err != nil {
			fmt.Println("closed", err)
			return 0
		}
		c.Write([]byte("+$D#44")) // detach: the guest runs on
		fmt.Printf("reply %q\n", buf[:n])
		return 0
	case "post":
		req, _ := http.NewRequest("POST", os.Getenv("QEMU_MCP_TEST_URL"), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok := os.Getenv("QEMU_MCP_TEST_TOKEN"); tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1000))
		res.Body.Close()
		fmt.Println(res.StatusCode, strings.ReplaceAll(string(body), "\n", " "))
		return 0
	case "holdro":
		for _, p := range filepath.SplitList(os.Getenv("QEMU_MCP_TEST_PATHS")) {
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
			}
			if err != nil {
				fmt.Println("error", p, err)
				return 1
			}
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "dial":
		c, err := net.DialTimeout("unix", os.Getenv("QEMU_MCP_TEST_PATHS"), 5*time.Second)
		if err != nil {
			fmt.Println("error", err)
			return 0
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Printf("ok %q\n", line)
		return 0
	}
	return 2
}

// post has user a POST an MCP initialize to url: the status and body.
func (a account) post(t *testing.T, url, token string) (int, string) {
	t.Helper()
	out, err := a.helper("post", "QEMU_MCP_TEST_URL="+url, "QEMU_MCP_TEST_TOKEN="+token).Output()
	if err != nil {
		t.Fatalf("post as %s: %v: %s", a.Name, err, out)
	}
	code, body, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	n, err := strconv.Atoi(code)
	if err != nil {
		t.Fatalf("post as %s: %q", a.Name, out)
	}
	return n, body
}

// holdFiles has user a hold flocks on paths through read-only descriptors
// until the test ends.
func (a account) holdFiles(t *testing.T, paths ...string) {
	t.Helper()
	cmd := a.helper("holdro", "QEMU_MCP_TEST_PATHS="+strings.Join(paths, ":"))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "locked\n" {
		t.Fatalf("%s holding %v: %q", a.Name, paths, line)
	}
}

// The owner's HTTP server on loopback serves the owner's connections and
// refuses everyone else's, root's included, on 127.0.0.1 and ::1; with a
// token, whoever has it gets in.
func TestHTTPOnlyOwner(t *testing.T) {
	users := accounts(t, 2)
	owner, other := users[0], users[1]
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			if ln, err := net.Listen("tcp", addr); err != nil {
				t.Skipf("no %s here: %v", addr, err)
			} else {
				ln.Close()
			}
			dir := owner.dir(t, "run-"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), 0o700)
			_, url := httpServerCmd(t, owner.serverCmd(dir, owner.home, "-http", addr))
			url += "/mcp"
			if code, body := owner.post(t, url, ""); code != http.StatusOK {
				t.Errorf("the owner's own request: %d %s", code, body)
			}
			code, body := other.post(t, url, "")
			if code != http.StatusForbidden || !strings.Contains(body, "only its owner") || !strings.Contains(body, strconv.Itoa(other.UID)) {
				t.Errorf("another user's request: %d %s", code, body)
			}
			t.Logf("another user is told: %s", body)
			// Root is another user too (as far as this server goes).
			ru := account{User: testusers.User{Name: "root"}, bin: owner.bin, home: owner.home}
			if code, body := ru.post(t, url, ""); code != http.StatusForbidden {
				t.Errorf("root's request: %d %s", code, body)
			}
		})
	}
	t.Run("token", func(t *testing.T) {
		dir := owner.dir(t, "run-token", 0o700)
		token := "0123456789abcdef0123456789abcdef"
		tokenFile := filepath.Join(dir, "token")
		os.WriteFile(tokenFile, []byte(token), 0o600)
		os.Chown(tokenFile, owner.UID, owner.GID)
		_, url := httpServerCmd(t, owner.serverCmd(dir, owner.home, "-http", "127.0.0.1:0", "-token-file", tokenFile))
		if code, _ := other.post(t, url, token); code != http.StatusOK {
			t.Errorf("another user with the token: %d", code)
		}
		if code, _ := other.post(t, url, ""); code != http.StatusUnauthorized {
			t.Errorf("another user without the token: %d", code)
		}
	})
}

// Lock files left 0644 by an earlier version, which another user opened and
// holds flocks on since before the owner's server started, delay the
// owner's boot by less than a second; afterwards they are private.
func TestLockFilesHeldByOtherUser(t *testing.T) {
	needQEMU(t)
	users := accounts(t, 2)
	owner, other := users[0], users[1]
	project := owner.dir(t, "project", 0o755)
	git := filepath.Join(project, ".git")
	if err := os.Mkdir(git, 0o755); err != nil {
		t.Fatal(err)
	}
	lockFile := filepath.Join(git, ".qemu.lock")
	// A record of the owner's that crashed, as this version leaves it.
	os.WriteFile(lockFile, []byte("pid=4194300\ntarget="+project+"\nstart_time=1\n"), 0o644)
	os.WriteFile(lockFile+".guard", nil, 0o644)
	owner.Chown(t, project)
	other.holdFiles(t, lockFile+".guard", lockFile)

	dir := owner.dir(t, "run", 0o700)
	cmd := owner.serverCmd(dir, project)
	s := startServerCmd(t, cmd, append(cmd.Env, "QEMU_MCP_LOCK_FILE="))
	boot := func() time.Duration {
		start := time.Now()
		var b struct {
			Lock string `json:"lock"`
		}
		if res := s.call(t, "qemu_boot", nil, &b); res.IsError {
			t.Fatalf("boot: %s", mcptest.Text(res))
		}
		el := time.Since(start)
		if b.Lock != lockFile {
			t.Errorf("lock %q, want %q", b.Lock, lockFile)
		}
		for _, p := range []string{lockFile, lockFile + ".guard"} {
			if m := mode(t, p); m != 0o600 {
				t.Errorf("%s: mode %v while the guest runs", filepath.Base(p), m)
			}
		}
		s.call(t, "qemu_shutdown", nil, nil)
		return el
	}
	held := boot()
	base := boot() // the other user's descriptors are on the old inodes now
	t.Logf("boot with the other user holding the old lock files: %v; without: %v", held, base)
	if held-base > time.Second {
		t.Errorf("the other user's flocks delayed the boot by %v", held-base)
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// Two projects of one user that are not git checkouts boot at once: each
// has its own lock in the user's runtime directory.
func TestTwoProjectsOutsideGit(t *testing.T) {
	needQEMU(t)
	owner := accounts(t, 1)[0]
	dir := owner.dir(t, "run", 0o700)
	var locks []string
	for _, name := range []string{"p1", "p2"} {
		project := owner.dir(t, name, 0o755)
		cmd := owner.serverCmd(dir, project)
		s := startServerCmd(t, cmd, append(cmd.Env, "QEMU_MCP_LOCK_FILE="))
		var b struct {
			Lock    string `json:"lock"`
			Matched bool   `json:"matched"`
		}
		if res := s.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &b); res.IsError || !b.Matched {
			t.Fatalf("boot in %s: %s", name, mcptest.Text(res))
		}
		if filepath.Dir(b.Lock) != dir {
			t.Errorf("lock of %s: %s, want one in the runtime directory %s", name, b.Lock, dir)
		}
		locks = append(locks, b.Lock)
	}
	if locks[0] == locks[1] {
		t.Errorf("both projects hold %s", locks[0])
	}
}

// With -gdb-tcp, the owner's gdb attaches over loopback TCP; another
// user's connection is closed before it reaches the stub, and the guest
// runs on.
func TestGDBTCPOnlyOwner(t *testing.T) {
	needQEMU(t)
	users := accounts(t, 2)
	owner, other := users[0], users[1]
	dir := owner.dir(t, "run", 0o700)
	cmd := owner.serverCmd(dir, owner.home, "-gdb-tcp", "127.0.0.1:0")
	s := startServerCmd(t, cmd, cmd.Env)
	var b struct {
		Paths struct {
			GDBAddress string `json:"gdb_address"`
		} `json:"paths"`
	}
	if res := s.call(t, "qemu_boot", map[string]any{"gdb": true, "wait_for": `tiny> $`}, &b); res.IsError || b.Paths.GDBAddress == "" {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	gdbAs := func(a account) string {
		out, err := a.helper("gdbtcp", "QEMU_MCP_TEST_URL="+b.Paths.GDBAddress).Output()
		if err != nil {
			t.Fatalf("gdb as %s: %v", a.Name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := gdbAs(other); !strings.HasPrefix(got, "closed") {
		t.Errorf("another user's gdb: %s, want the connection closed", got)
	}
	// A stop reply ($T or $S and the signal): the stub answered.
	if got := gdbAs(owner); !strings.HasPrefix(got, "reply") || !strings.Contains(got, "$T") && !strings.Contains(got, "$S") {
		t.Errorf("the owner's gdb: %s, want a stop reply", got)
	}
	var w struct {
		Matched bool `json:"matched"`
	}
	if res := s.call(t, "serial_send", map[string]any{"data": "echo still-running", "wait_for": `still-running\r\ntiny> $`, "timeout": 10}, &w); res.IsError || !w.Matched {
		t.Errorf("the guest after both attempts: %s", mcptest.Text(res))
	}
}

// The owner's VNC display is a unix socket in the owner's private runtime
// directory: the owner's viewer connects, another user's cannot, and
// nothing of the owner's listens on TCP.
func TestVNCOnlyOwner(t *testing.T) {
	needQEMU(t)
	users := accounts(t, 2)
	owner, other := users[0], users[1]
	dir := owner.dir(t, "run", 0o700)
	cmd := owner.serverCmd(dir, owner.home)
	s := startServerCmd(t, cmd, cmd.Env)
	var b struct {
		VNC string `json:"vnc"`
	}
	if res := s.call(t, "qemu_boot", map[string]any{"gpu": true, "vnc": true}, &b); res.IsError || b.VNC == "" {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	dial := func(a account) string {
		out, err := a.helper("dial", "QEMU_MCP_TEST_PATHS="+b.VNC).Output()
		if err != nil {
			t.Fatalf("dial as %s: %v", a.Name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := dial(owner); !strings.HasPrefix(got, `ok "RFB 003.`) {
		t.Errorf("the owner's viewer: %s", got)
	}
	if got := dial(other); !strings.HasPrefix(got, "error") || !strings.Contains(got, "permission denied") {
		t.Errorf("another user's viewer: %s, want permission denied", got)
	}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		tb, _ := os.ReadFile(table)
		for _, line := range strings.Split(string(tb), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 7 && f[3] == "0A" && f[7] == strconv.Itoa(owner.UID) {
				t.Errorf("a process of the owner listens on TCP: %s", line)
			}
		}
	}
	s.call(t, "qemu_shutdown", nil, nil)
	if _, err := os.Lstat(b.VNC); !os.IsNotExist(err) {
		t.Errorf("the VNC socket outlives the guest: %v", err)
	}
}
