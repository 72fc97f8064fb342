package runtimedir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPathPrecedence(t *testing.T) {
	t.Setenv(Env, "/x/y/")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/7")
	if got := Path(); got != "/x/y" {
		t.Errorf("with %s: %q", Env, got)
	}
	t.Setenv(Env, "")
	if got := Path(); got != "/run/user/7/qemu-mcp" {
		t.Errorf("with XDG_RUNTIME_DIR: %q", got)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got := Path(); !strings.HasPrefix(got, os.TempDir()+"/qemu-mcp-") {
		t.Errorf("fallback: %q", got)
	}
}

func TestEnsureCreatesPrivate(t *testing.T) {
	d := filepath.Join(t.TempDir(), "rt")
	if err := Ensure(d); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(d)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	// Loose permissions on our own directory are fixed.
	os.Chmod(d, 0o777)
	if err := Ensure(d); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(d); fi.Mode().Perm() != 0o700 {
		t.Fatalf("not tightened: %v", fi.Mode())
	}
}

func TestEnsureRefusesSymlink(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "elsewhere")
	os.Mkdir(target, 0o755)
	link := filepath.Join(base, "rt")
	os.Symlink(target, link)
	err := Ensure(link)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("Ensure(symlink) = %v", err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o755 {
		t.Errorf("symlink target was modified: %v", fi.Mode())
	}
}

func TestEnsureRefusesForeignOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to create a directory owned by another user")
	}
	d := filepath.Join(t.TempDir(), "rt")
	os.Mkdir(d, 0o700)
	if err := os.Chown(d, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	err := Ensure(d)
	if err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("Ensure(foreign) = %v", err)
	}
}
