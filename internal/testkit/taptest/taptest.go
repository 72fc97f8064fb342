// Package taptest runs a package's tests inside a network namespace of their
// own, so that tests can create TAPs, bridges and addresses, and start QEMU
// on them, without touching the host's links.
//
// Main (called from TestMain) creates a namespace "qmcptest<pid>", re-runs
// the test binary in it with `ip netns exec` and deletes the namespace when
// the binary exits, whatever the outcome. Re-running the whole process in
// the namespace is what makes this reliable: a netlink handle for another
// namespace still creates TUN devices in the calling thread's namespace, a
// packet socket and the Go runtime's interface lookups follow the thread,
// and QEMU must run in the same namespace to find its TAP. With the whole
// process inside, every thread and every child is.
//
// Tests that need the namespace call Require, which skips them (with the
// reason) where it could not be made: not root, no /dev/net/tun, no `ip`.
package taptest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// envNS is set in the re-run binary to the namespace it runs in, and
// envOuterNS to the namespace it was started from (/proc/self/ns/net).
const (
	envNS      = "QMCP_TEST_NETNS"
	envOuterNS = "QMCP_TEST_OUTER_NETNS"
)

// skipReason is why the namespace could not be made ("" inside it).
var skipReason = "taptest.Main was not called from TestMain"

// Main runs the tests of m in a fresh network namespace and exits. Where
// that cannot be done, it runs them in place, and Require skips the tests
// that need the namespace.
func Main(m *testing.M) {
	if ns := os.Getenv(envNS); ns != "" {
		// The re-run: refuse to pretend if `ip netns exec` did not move us.
		if err := checkPrivateNetns(); err != nil {
			skipReason = ""
			fmt.Fprintf(os.Stderr, "taptest: %v\n", err)
			os.Exit(2)
		}
		skipReason = ""
		os.Exit(m.Run())
	}
	if reason := unavailable(); reason != "" {
		skipReason = reason
		os.Exit(m.Run())
	}
	os.Exit(runInNamespace())
}

// Require skips the test unless it runs inside the private namespace made
// by Main.
func Require(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skipf("needs a private network namespace: %s", skipReason)
	}
}

// unavailable says what is missing to make a namespace with TAPs in it.
func unavailable() string {
	if os.Geteuid() != 0 {
		return "not root (TAP tests need CAP_NET_ADMIN; run as root)"
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Sprintf("no /dev/net/tun (%v)", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no `ip` command (install iproute2)"
	}
	return ""
}

// checkPrivateNetns makes sure this process is not in the network
// namespace of the process that made the namespace (the host's, usually).
// PID 1's would be the better reference, but a container may deny reading
// /proc/1/ns even to root.
func checkPrivateNetns() error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("cannot tell which network namespace this is: %w", err)
	}
	if outer := os.Getenv(envOuterNS); outer == "" || self == outer {
		return fmt.Errorf("still in the outer network namespace (%s) after `ip netns exec`; refusing to run", self)
	}
	return nil
}

// runInNamespace makes the namespace, re-runs this binary in it with the
// same arguments (so -test.run, -test.v, -test.timeout... apply), deletes
// the namespace and returns the exit code.
func runInNamespace() int {
	ns := "qmcptest" + strconv.Itoa(os.Getpid())
	outer, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		fmt.Fprintf(os.Stderr, "taptest: %v\n", err)
		return 2
	}
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		// A namespace of that name can only be a leftover of a dead run
		// with our PID: remove it and try once more.
		_ = exec.Command("ip", "netns", "del", ns).Run()
		if out2, err2 := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err2 != nil {
			fmt.Fprintf(os.Stderr, "taptest: ip netns add %s: %v: %s%s\n", ns, err, out, out2)
			return 2
		}
	}
	defer func() {
		// Links in the namespace go with it; a TAP kept alive by a leaked
		// QEMU would keep the namespace alive too, but not its name.
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "taptest: ip netns del %s: %v: %s\n", ns, err, bytes.TrimSpace(out))
		}
	}()

	args := append([]string{"netns", "exec", ns, os.Args[0]}, os.Args[1:]...)
	cmd := exec.Command("ip", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envNS+"="+ns, envOuterNS+"="+outer)
	// The child dies with us (the parent-death signal is tied to the
	// thread that starts it: keep this one); and our interrupts go to it (same process
	// group) while we wait to clean up after it.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "taptest: ip netns exec: %v\n", err)
		return 2
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case s := <-sigs:
		_ = cmd.Process.Signal(s)
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
	}
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		return ee.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "taptest: test binary in namespace %s: %v\n", ns, err)
	return 1
}
