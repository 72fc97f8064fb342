// Package testguest finds the guests the tests boot (the built-in tiny
// kernel, Debian's U-Boot, the Linux guest of testdata/linux) and the QEMU
// they run, starts QEMU for tests that drive it without the server, and
// skips a test with a message that says how to get what is missing.
// scripts/test provides all of them, so in CI nothing skips.
package testguest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/linuxdir"
)

// UBoot is Debian's U-Boot for the virt board in S-mode (package
// u-boot-qemu).
const UBoot = "/usr/lib/u-boot/qemu-riscv64_smode/u-boot.bin"

// LinuxEnv names the directory of a built Linux guest; scripts/test sets it.
const LinuxEnv = linuxdir.Env

// Repo is the repository's root directory.
func Repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// QEMUEnv names the qemu-system-riscv64 the tests run; empty means the
// one on PATH. scripts/test runs the QEMU-facing tests once per QEMU it
// knows (Debian's 7.2, and 11.x from scripts/qemu11), setting it.
const QEMUEnv = "QEMU_MCP_QEMU"

// Facing is the mark QEMU leaves in a test's log: scripts/test counts the
// tests that carry it per QEMU, and fails a run in which one of them
// skipped without being expected to.
const Facing = "[qemu-facing]"

// QEMUPath is the qemu-system-riscv64 the tests run: $QEMU_MCP_QEMU, else
// the one on PATH; "" if there is none. Tests that start a server pass it
// on (-qemu, tools.Config.QEMUBinary); use QEMU in a test, which also
// marks it.
func QEMUPath() string {
	if p := os.Getenv(QEMUEnv); p != "" {
		return p
	}
	p, _ := exec.LookPath("qemu-system-riscv64")
	return p
}

var marked sync.Map // test name -> struct{}

// QEMU returns the qemu-system-riscv64 the test is to run (see QEMUPath)
// and marks the test as QEMU-facing; it skips the test if there is none.
func QEMU(t testing.TB) string {
	t.Helper()
	p := QEMUPath()
	if _, loaded := marked.LoadOrStore(t.Name(), struct{}{}); !loaded {
		t.Logf("%s %s", Facing, p)
	}
	if p == "" {
		t.Skip("qemu-system-riscv64 not found: run scripts/deps (installs qemu-system-misc, opensbi, u-boot-qemu)")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v (scripts/qemu11 makes QEMU 11's wrapper)", QEMUEnv, p, err)
	}
	return p
}

// NeedQEMU skips the test when QEMU is missing (see QEMU).
func NeedQEMU(t testing.TB) { t.Helper(); QEMU(t) }

// Process is a QEMU a test started with StartQEMU.
type Process struct {
	Cmd *exec.Cmd
	// Done is closed once QEMU exited and was waited for.
	Done <-chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
}

// Stderr is what QEMU wrote to its standard error so far.
func (p *Process) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

// Kill ends this QEMU (the process the test started, by its PID) and
// waits for it.
func (p *Process) Kill() {
	p.Cmd.Process.Kill()
	<-p.Done
}

// StartQEMU starts the QEMU under test (see QEMU) with args, in dir if
// it is not empty. It is killed when the test ends, and what it wrote to
// stderr is logged if the test failed.
func StartQEMU(t testing.TB, dir string, args ...string) *Process {
	t.Helper()
	return startBinary(t, QEMU(t), dir, args...)
}

func startBinary(t testing.TB, bin, dir string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	p := &Process{Cmd: cmd}
	cmd.Stderr = p
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	done := make(chan struct{})
	p.Done = done
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			if s := p.Stderr(); s != "" {
				t.Logf("qemu stderr:\n%s", s)
			}
		}
	})
	return p
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
	// Append is the kernel command line for its console.
	Append string
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
	dir := linuxdir.Dir(t, "")
	l := Linux{Dir: dir, Kernel: filepath.Join(dir, "Image"), Initrd: filepath.Join(dir, "initramfs.cpio.gz"),
		Vmlinux: filepath.Join(dir, "vmlinux"), Append: LinuxAppend}
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

// FileSum is the sha256 of a file's bytes, to show it did not change.
func FileSum(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
