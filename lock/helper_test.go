package lock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"golang.org/x/sys/unix"
)

// The tests run real processes: the test binary re-executed in a helper mode
// chosen by this variable.
const (
	helperEnv     = "QEMU_MCP_LOCK_HELPER"
	helperPathEnv = "QEMU_MCP_LOCK_HELPER_PATH"
	helperRootEnv = "QEMU_MCP_LOCK_HELPER_ROOT" // acquire: compute the path with Path(root, "")
	helperRecEnv  = "QEMU_MCP_LOCK_HELPER_RECORD"
	helperGateEnv = "QEMU_MCP_LOCK_HELPER_GATE" // acquire: print "ready", wait for EOF on fd 3
)

// waitFor bounds every wait on a child, so that a broken test fails instead
// of hanging.
const waitFor = 15 * time.Second

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

// runHelper is a child's whole life. Every mode that blocks does so reading
// stdin, so it ends when the parent closes the pipe or dies.
func runHelper(mode string) int {
	switch mode {
	case "block":
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "exit":
		return 0
	case "hold":
		return helperHold()
	case "acquire":
		return helperAcquire()
	case "holdro":
		return helperHoldReadOnly()
	case "describe":
		return helperDescribe()
	}
	fmt.Println("error unknown helper mode", mode)
	return 2
}

// helperHold flocks the lock file directly, the way an unrelated process
// that inherited the descriptor (or a script) holds it, and writes the record
// from the environment, with @PID@, @START@ and @WRONGSTART@ replaced by its
// own PID, its start time and a start time that is not its own.
func helperHold() int {
	path := os.Getenv(helperPathEnv)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		fmt.Println("error flock:", err)
		return 1
	}
	self, err := proc.Self()
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	rec := strings.NewReplacer(
		"@PID@", strconv.Itoa(self.PID),
		"@START@", strconv.FormatUint(self.StartTime, 10),
		"@WRONGSTART@", strconv.FormatUint(self.StartTime+12345, 10),
	).Replace(os.Getenv(helperRecEnv))
	unix.Ftruncate(fd, 0)
	if _, err := unix.Pwrite(fd, []byte(rec), 0); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("locked", self.PID)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// helperHoldReadOnly does what any user who can read a lock file can do:
// open each of the paths (colon-separated) read-only and hold its flock.
func helperHoldReadOnly() int {
	for _, p := range filepath.SplitList(os.Getenv(helperPathEnv)) {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			fmt.Println("error flock:", p, err)
			return 1
		}
	}
	fmt.Println("locked", os.Getpid())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// helperDescribe runs Acquire and reports "held <uid> <hidden>" and then
// "msg <message>", or "locked <pid>" (holding it until stdin closes), or
// "error <message>".
func helperDescribe() int {
	return acquireAndHold(os.Getenv(helperPathEnv), func(held *HeldError, err error) {
		fmt.Println("held", held.UID, held.Hidden)
		fmt.Println("msg", oneLine(err.Error()))
	})
}

// helperAcquire runs Acquire and reports "locked <pid>", "held <holder pid>"
// or "error <message>"; a winner holds the lock until stdin closes.
func helperAcquire() int {
	path := os.Getenv(helperPathEnv)
	if root := os.Getenv(helperRootEnv); root != "" {
		p, err := Path(root, "")
		if err != nil {
			fmt.Println("error", oneLine(err.Error()))
			return 1
		}
		path = p
	}
	if os.Getenv(helperGateEnv) != "" {
		fmt.Println("ready")
		gate := os.NewFile(3, "gate")
		io.Copy(io.Discard, gate)
		gate.Close()
	}
	return acquireAndHold(path, func(held *HeldError, _ error) {
		fmt.Println("held", held.Holder.PID)
	})
}

// acquireAndHold runs Acquire on path: if the lock is held, it has report
// say so; on another error it reports "error <message>"; a winner reports
// "locked <pid>" and holds the lock until stdin closes.
func acquireAndHold(path string, report func(held *HeldError, err error)) int {
	l, err := Acquire(path, Record{Target: "helper"})
	var held *HeldError
	switch {
	case errors.As(err, &held):
		report(held, err)
		return 0
	case err != nil:
		fmt.Println("error", oneLine(err.Error()))
		return 1
	}
	fmt.Println("locked", os.Getpid())
	io.Copy(io.Discard, os.Stdin)
	if err := l.Release(); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		return 1
	}
	return 0
}

// child is a helper process started by a test; the test's cleanup ends it.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
	pid   int
}

// startHelper starts the test binary in helper mode with extra environment
// variables ("K=V") and extra descriptors from fd 3 on.
func startHelper(t *testing.T, mode string, env []string, extra ...*os.File) *child {
	t.Helper()
	return startHelperAs(t, runAs{}, mode, env, extra...)
}

// runAs says how a helper runs when not as the test itself.
type runAs struct {
	// bin is the test binary; another user needs a copy it may run
	// (testusers.Binary).
	bin  string
	attr *syscall.SysProcAttr
	// wrap is a command line the helper's own is appended to.
	wrap []string
}

func startHelperAs(t *testing.T, as runAs, mode string, env []string, extra ...*os.File) *child {
	t.Helper()
	bin := as.bin
	if bin == "" {
		bin = os.Args[0]
	}
	argv := append(append([]string(nil), as.wrap...), bin, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = as.attr
	// Under -race a process sleeps a second at exit unless told not to.
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, EnvLockFile+"=", "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = extra
	cmd.Stderr = os.Stderr
	stdin, stdout := testguest.StartPiped(t, cmd, "helper "+mode)
	c := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16), done: make(chan struct{}), pid: cmd.Process.Pid}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// line returns the child's next output line, failing the test after waitFor.
func (c *child) line() string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("helper %d exited without output", c.pid)
		}
		return l
	case <-time.After(waitFor):
		c.t.Fatalf("helper %d: no output after %v", c.pid, waitFor)
	}
	return ""
}

// expect reads the next line and requires it to start with word.
func (c *child) expect(word string) string {
	c.t.Helper()
	l := c.line()
	if l != word && !strings.HasPrefix(l, word+" ") {
		c.t.Fatalf("helper %d said %q, want %q", c.pid, l, word)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, word))
}

// stop closes the child's stdin, which ends every mode, and waits for it; a
// child that does not exit in time is killed (it is ours: we started it).
// Safe to call more than once.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(waitFor):
		c.cmd.Process.Kill()
		<-exited
		c.t.Errorf("helper %d did not exit when its stdin closed; killed it", c.pid)
	}
	close(c.done)
}

// deadIdentity returns the identity of a process that existed and has been
// reaped, so that no record naming it can be alive (its start time guards
// against the PID being reused meanwhile).
func deadIdentity(t *testing.T) proc.Identity {
	t.Helper()
	c := startHelper(t, "block", nil)
	c.expect("ready")
	info, err := proc.Stat(c.pid)
	if err != nil {
		t.Fatal(err)
	}
	c.stop()
	if live, _, _ := proc.Check(proc.Identity{PID: info.PID, StartTime: info.StartTime}); live == proc.Alive {
		t.Fatalf("process %d still alive after wait", info.PID)
	}
	return proc.Identity{PID: info.PID, StartTime: info.StartTime}
}

// inode returns the inode the path names.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// replacedPrivate notes the inodes of the lock and guard files at path and
// returns a check, for after an Acquire, that both were replaced by new
// files (not kept and chmod-ed) private to their user.
func replacedPrivate(t *testing.T, path string) func() {
	t.Helper()
	oldLock, oldGuard := inode(t, path), inode(t, path+guardSuffix)
	return func() {
		t.Helper()
		if inode(t, path) == oldLock || inode(t, path+guardSuffix) == oldGuard {
			t.Error("a loose lock or guard file was kept (chmod-ed?) instead of replaced")
		}
		for _, p := range []string{path, path + guardSuffix} {
			if got := mode(t, p); got != 0o600 {
				t.Errorf("%s: mode %v after the replacement", filepath.Base(p), got)
			}
		}
	}
}

func readRecordFile(t *testing.T, path string) Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ParseRecord(b)
	if err != nil {
		t.Fatalf("record in %s: %v (%q)", path, err, b)
	}
	return rec
}

func mustHeld(t *testing.T, err error, wantPID int) *HeldError {
	t.Helper()
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("got %v, want a *HeldError", err)
	}
	if held.Holder.PID != wantPID {
		t.Fatalf("HeldError names pid %d, want %d: %v", held.Holder.PID, wantPID, err)
	}
	return held
}
