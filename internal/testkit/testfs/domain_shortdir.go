package testfs

import (
	"os"
	"testing"
)

// ShortDir makes a private temporary directory whose path is short enough
// for unix sockets in it (a socket's path is at most 107 bytes, which
// t.TempDir's long paths can pass), and removes it when the test ends.
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qmcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
