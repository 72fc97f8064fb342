// Package runtimedir finds and secures the directory where a server keeps its
// FIFOs, QMP socket and records: private to this user, never a symlink.
package runtimedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Env names the variable that overrides the runtime directory.
const Env = "QEMU_MCP_RUNTIME_DIR"

// Path returns the runtime directory: $QEMU_MCP_RUNTIME_DIR if set, else
// $XDG_RUNTIME_DIR/qemu-mcp, else /tmp/qemu-mcp-<uid>. It does not create it.
func Path() string {
	if d := os.Getenv(Env); d != "" {
		return filepath.Clean(d)
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "qemu-mcp")
	}
	return filepath.Join(os.TempDir(), "qemu-mcp-"+strconv.Itoa(os.Getuid()))
}

// Ensure creates dir with mode 0700 if it does not exist and checks that it
// is safe to use: a real directory (not a symlink someone planted, which in a
// shared /tmp would hand them our FIFOs), owned by this user, and not
// writable by group or others. A directory of ours with loose permissions is
// tightened; one owned by someone else is refused.
func Ensure(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create parent of runtime dir %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create runtime dir %s: %w (set %s to a directory you own)", dir, err, Env)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("check runtime dir %s: %w", dir, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("runtime dir %s is a symlink: refusing to use it (remove it, or set %s to a directory you own)", dir, Env)
	}
	if !fi.IsDir() {
		return fmt.Errorf("runtime dir %s is not a directory (remove it, or set %s)", dir, Env)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("check runtime dir %s: no owner information", dir)
	}
	if int(st.Uid) != os.Getuid() {
		return fmt.Errorf("runtime dir %s is owned by uid %d, not by you (uid %d): refusing to use it (set %s to a directory you own)",
			dir, st.Uid, os.Getuid(), Env)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("runtime dir %s has mode %v and cannot be made private: %w (set %s to a directory you own)",
				dir, fi.Mode().Perm(), err, Env)
		}
	}
	return nil
}

// CapturesDir is where files meant to outlive the server (serial transcripts,
// packet captures) are kept. Reapers never touch it.
func CapturesDir(dir string) string { return filepath.Join(dir, "captures") }
