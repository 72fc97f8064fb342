package qemu

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Linux delivers the parent-death signal when the *thread* that forked the
// child exits, not the process (Go issue 27505). Go may retire an idle OS
// thread at any time, which would kill a healthy QEMU. So every QEMU is
// started from one goroutine locked to its thread for the life of the
// server: that thread only dies with the process, which is exactly when QEMU
// should die too.
type launchRequest struct {
	cmd  *exec.Cmd
	done chan error
}

var launcher = sync.OnceValue(func() chan<- launchRequest {
	reqs := make(chan launchRequest)
	go func() {
		runtime.LockOSThread()
		// Never unlocked and never returns: returning while locked would
		// terminate the thread and SIGKILL every QEMU it started.
		for r := range reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return reqs
})

// StartProcess starts cmd, a QEMU of the server's, so that it dies with the
// server even on SIGKILL (the parent-death signal, sent from the launcher
// thread) and in a process group of its own, so that a terminal's Ctrl-C
// reaches the server, which then stops QEMU in order. Every QEMU the
// server runs, long-lived or asked one question, starts here.
func StartProcess(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return startOnLauncher(cmd)
}

// startOnLauncher runs cmd.Start on the long-lived launcher thread.
func startOnLauncher(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	launcher() <- launchRequest{cmd: cmd, done: done}
	return <-done
}

var lookPath = exec.LookPath

// Tail keeps the last max bytes written to it: enough of QEMU's stderr to
// explain a failure, bounded however chatty it gets.
type Tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// NewTail returns a Tail of max bytes.
func NewTail(max int) *Tail { return &Tail{max: max} }

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
