// Package testguest finds the guests the tests boot (the built-in tiny
// kernel, Debian's U-Boot, the Linux guest of testdata/linux) and QEMU
// itself, and skips a test with a message that says how to get what is
// missing. scripts/test provides all of them, so in CI nothing skips.
package testguest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// UBoot is Debian's U-Boot for the virt board in S-mode (package
// u-boot-qemu).
const UBoot = "/usr/lib/u-boot/qemu-riscv64_smode/u-boot.bin"

// LinuxEnv names the directory of a built Linux guest; scripts/test sets it.
const LinuxEnv = "QEMU_MCP_LINUX_DIR"

// Repo is the repository's root directory.
func Repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// NeedQEMU skips the test when qemu-system-riscv64 is not installed.
func NeedQEMU(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-riscv64"); err != nil {
		t.Skip("qemu-system-riscv64 not found: run scripts/deps (installs qemu-system-misc, opensbi, u-boot-qemu)")
	}
}

// Tiny returns the built-in tiny kernel's image.
func Tiny(t testing.TB) string {
	t.Helper()
	NeedQEMU(t)
	return filepath.Join(Repo(), "testdata", "images", "tiny.bin")
}

// Linux is a built Linux guest.
type Linux struct {
	Dir     string
	Kernel  string // Image
	Initrd  string // initramfs.cpio.gz
	Vmlinux string // with DWARF
}

// LinuxPrompt and LinuxReady are what the guest's console shows once its
// shell runs (see testdata/linux/init).
const (
	LinuxPrompt = `qemu-mcp-linux# $`
	LinuxReady  = "qemu-mcp linux guest ready"
	// LinuxAppend is the kernel command line for its console.
	LinuxAppend = "console=ttyS0 earlycon=sbi"
)

// LinuxGuest returns the Linux guest: from $QEMU_MCP_LINUX_DIR, else the
// cached build for the current inputs (scripts/build-linux --print-dir).
// It skips the test if neither is there.
func LinuxGuest(t testing.TB) Linux {
	t.Helper()
	NeedQEMU(t)
	dir := os.Getenv(LinuxEnv)
	if dir == "" {
		out, err := exec.Command(filepath.Join(Repo(), "scripts", "build-linux"), "--print-dir").Output()
		if err != nil {
			t.Skip("the Linux guest is not built: run scripts/build-linux (scripts/test does), or set " + LinuxEnv)
		}
		dir = strings.TrimSpace(string(out))
	}
	l := Linux{Dir: dir, Kernel: filepath.Join(dir, "Image"), Initrd: filepath.Join(dir, "initramfs.cpio.gz"),
		Vmlinux: filepath.Join(dir, "vmlinux")}
	for _, p := range []string{l.Kernel, l.Initrd} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Linux guest in %s is incomplete: %v (rebuild it with scripts/build-linux)", dir, err)
		}
	}
	return l
}

// QEMUImg skips the test when qemu-img is not installed.
func QEMUImg(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not found: run scripts/deps (installs qemu-utils)")
	}
}

// SnapshotTags lists the server's snapshots (tags "qemu-mcp-...") in a
// qcow2 image as qemu-img sees them, while a guest may hold it (-U).
func SnapshotTags(t testing.TB, image string) []string {
	t.Helper()
	out, err := exec.Command("qemu-img", "snapshot", "-U", "-l", image).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img snapshot -l %s: %v %s", image, err, out)
	}
	var tags []string
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "qemu-mcp-") {
			tags = append(tags, f)
		}
	}
	return tags
}
