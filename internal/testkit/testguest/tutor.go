package testguest

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TutorDir is the tutor kernel's source: a small xv6-style teaching
// kernel with a shell, which tests build from source (see its README.md).
func TutorDir() string {
	return filepath.Join(Repo(), "testdata", "kernels", "tutor")
}

// tutorOutput reports whether rel (a path in the tutor kernel's
// directory) is something its make builds; a build left in the source
// directory is not copied.
func tutorOutput(rel string) bool {
	switch rel {
	case "kernel/kernel", "mkfs/mkfs", "fs.img":
		return true
	}
	return strings.HasSuffix(rel, ".o")
}

// TutorToolPrefix is the cross toolchain the tutor kernel is built with:
// riscv64-unknown-elf- (Debian's bare-metal gcc), else
// riscv64-linux-gnu-; "" if there is neither.
func TutorToolPrefix() string {
	for _, p := range []string{"riscv64-unknown-elf-", "riscv64-linux-gnu-"} {
		if _, err := exec.LookPath(p + "gcc"); err == nil {
			return p
		}
	}
	return ""
}

// Tutor copies the tutor kernel's source into a new directory of the
// test's, lets patch change it there (patch may be nil), and builds the
// kernel (kernel/kernel) and its disk (fs.img). It returns the directory;
// TutorQEMULine gives the command line that boots it. It skips the test
// when a tool is missing.
func Tutor(t testing.TB, patch func(dir string) error) (dir string) {
	t.Helper()
	prefix := TutorToolPrefix()
	if prefix == "" {
		t.Skip("no riscv64 cross compiler (riscv64-unknown-elf-gcc or riscv64-linux-gnu-gcc): run scripts/deps (installs gcc-riscv64-unknown-elf)")
	}
	for _, tool := range []string{"make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found, which builds the tutor kernel: install make and gcc (apt-get install make gcc)", tool)
		}
	}
	dir = filepath.Join(t.TempDir(), "tutor")
	src := TutorDir()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dir, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case !d.Type().IsRegular() || tutorOutput(filepath.ToSlash(rel)):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy the tutor kernel: %v", err)
	}
	if patch != nil {
		if err := patch(dir); err != nil {
			t.Fatalf("patch the tutor kernel: %v", err)
		}
	}
	out, err := tutorMake(dir, "-j2", "TOOLPREFIX="+prefix, "kernel/kernel", "fs.img").CombinedOutput()
	if err != nil {
		t.Fatalf("build the tutor kernel (make TOOLPREFIX=%s kernel/kernel fs.img in %s): %v\n%s", prefix, dir, err, out)
	}
	return dir
}

// TutorQEMULine is the one command line that make -n qemu prints in dir
// (a built tutor kernel, see Tutor): the QEMU command that boots it.
func TutorQEMULine(t testing.TB, dir string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := tutorMake(dir, "-n", "qemu")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n qemu in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 1 || lines[0] == "" {
		t.Fatalf("make -n qemu in %s printed %d lines, want the one QEMU command (is the build up to date?):\n%s", dir, len(lines), out)
	}
	return lines[0]
}

// tutorMake runs make in dir, away from the make (if any) that runs the
// tests: its flags would change what is printed.
func tutorMake(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{}
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "TOOLPREFIX", "QEMU", "CPUS":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	return cmd
}
