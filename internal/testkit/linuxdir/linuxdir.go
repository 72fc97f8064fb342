// Package linuxdir finds the Linux test guests that scripts/build-linux
// builds and caches. It imports none of the module's packages, so that
// the tests of every package, the architectures' own included, find the
// guest the same way.
package linuxdir

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Env names the directory of the default architecture's guest; Env_ARCH
// (QEMU_MCP_LINUX_DIR_AARCH64, ...) another architecture's.
const Env = "QEMU_MCP_LINUX_DIR"

// Dir is the directory of the Linux guest of architecture arch ("" for
// the default architecture's): $QEMU_MCP_LINUX_DIR (or _ARCH), else the
// cached build that scripts/build-linux [--arch ARCH] --print-dir names.
// It skips t if neither is there.
func Dir(t testing.TB, arch string) string {
	t.Helper()
	env, args, what := Env, []string{"--print-dir"}, "the Linux guest"
	if arch != "" {
		env += "_" + strings.ToUpper(arch)
		args = append([]string{"--arch", arch}, args...)
		what = "the " + arch + " Linux guest"
	}
	if dir := os.Getenv(env); dir != "" {
		return dir
	}
	out, err := exec.Command(filepath.Join(repo(), "scripts", "build-linux"), args...).Output()
	if err != nil {
		t.Skipf("%s is not built: run %s (scripts/test does), or set %s", what, build(arch), env)
	}
	return strings.TrimSpace(string(out))
}

// Vmlinux is the path of the vmlinux (the kernel with its symbols and
// debug information) of arch's guest (see Dir). It skips t if there is
// none.
func Vmlinux(t testing.TB, arch string) string {
	t.Helper()
	dir := Dir(t, arch)
	p := filepath.Join(dir, "vmlinux")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no vmlinux in %s: run %s", dir, build(arch))
	}
	return p
}

// build is the command that builds arch's guest.
func build(arch string) string {
	if arch == "" {
		return "scripts/build-linux"
	}
	return "scripts/build-linux --arch " + arch
}

// repo is the module's root directory.
func repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}
