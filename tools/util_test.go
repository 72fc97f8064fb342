package tools_test

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func mkfifo(p string) error { return unix.Mkfifo(p, 0o600) }
