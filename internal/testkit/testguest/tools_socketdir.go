package testguest

import (
	"os"
	"testing"
)

// SocketDir is a new directory for a test's unix sockets and FIFOs (a
// server's runtime directory, a QEMU's monitor), removed at the test's
// end. A unix socket's path is at most 108 bytes: the directory is
// directly under the system's temporary directory and named by the short
// prefix, not one of t.TempDir's long names.
func SocketDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
