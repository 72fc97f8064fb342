package testfs

import (
	"os"
	"testing"
)

// Perm returns the permission bits of path itself (a symlink is not
// followed), failing the test if it cannot be read.
func Perm(t testing.TB, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}
