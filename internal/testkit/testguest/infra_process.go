package testguest

import (
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// SocketDir returns a new private directory with a short path, removed
// when the test ends: unix socket paths are limited to 108 bytes, which a
// t.TempDir path can exceed.
func SocketDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// AwaitGone waits up to within for the QEMU id names to be gone (or, with
// zombieOK, a zombie: it has exited, and only its parent can reap it), and
// returns what it is then and how long that took. A QEMU still there after
// within is killed and fails the test, which says after what it should
// have gone.
func AwaitGone(t testing.TB, id proc.Identity, within time.Duration, zombieOK bool, after string) (proc.Liveness, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		live, _, _ := proc.Check(id)
		if live == proc.Gone || zombieOK && live == proc.Zombie {
			return live, time.Since(start)
		}
		if time.Since(start) > within {
			proc.Signal(id, unix.SIGKILL)
			t.Fatalf("qemu %d still %v %v after %s", id.PID, live, within, after)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// StartPiped starts cmd with a pipe to its stdin and one from its stdout,
// failing the test if it cannot; what names the process in the failure.
func StartPiped(t testing.TB, cmd *exec.Cmd, what string) (io.WriteCloser, io.ReadCloser) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	return stdin, stdout
}
