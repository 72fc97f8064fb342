// Package testfs gives tests a small file system of their own to fill: a
// tmpfs mounted on a temporary directory and unmounted when the test ends,
// also when it fails. Mounting needs root (or CAP_SYS_ADMIN); without it
// the test is skipped, saying so.
package testfs

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of size bytes on a new temporary directory and
// returns it.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qmcp-tmpfs")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(size, 10)+",mode=0700"); err != nil {
		os.Remove(dir)
		if os.Geteuid() != 0 {
			t.Skipf("mounting a tmpfs needs root: %v", err)
		}
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		// A process of the test may still hold a file: detach lazily.
		if err := unix.Unmount(dir, 0); err != nil {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		}
		os.Remove(dir)
	})
	return dir
}

// Fill writes a file into dir until the file system has at most leave
// bytes free, and returns a function that removes it (space returns).
func Fill(t testing.TB, dir string, leave int64) (free func()) {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		avail := int64(st.Bavail) * st.Bsize
		if avail <= leave {
			break
		}
		n := min(int64(len(buf)), avail-leave)
		if _, err := f.Write(buf[:n]); err != nil {
			break // full
		}
	}
	return func() {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			t.Errorf("free space: %v", err)
		}
	}
}
