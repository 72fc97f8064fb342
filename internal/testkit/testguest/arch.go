package testguest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/linuxdir"
)

// ArchQEMUEnv names the QEMU of a's guests the tests run:
// QEMU_MCP_QEMU for the default architecture, QEMU_MCP_QEMU_<NAME>
// (QEMU_MCP_QEMU_AARCH64) for the others. scripts/test sets each to the
// QEMU of the version it runs.
func ArchQEMUEnv(a arch.Arch) string {
	if a.Name() == archs.Default().Name() {
		return QEMUEnv
	}
	return QEMUEnv + "_" + strings.ToUpper(a.Name())
}

// ArchQEMU is QEMU for a's guests: $ArchQEMUEnv(a), else a's QEMU on
// PATH. It marks the test QEMU-facing and skips it if there is none.
func ArchQEMU(t testing.TB, a arch.Arch) string {
	t.Helper()
	if a.Name() == archs.Default().Name() {
		return QEMU(t)
	}
	p := os.Getenv(ArchQEMUEnv(a))
	if p == "" {
		p, _ = exec.LookPath(a.QEMU().Binary)
	}
	if _, loaded := marked.LoadOrStore(t.Name(), struct{}{}); !loaded {
		t.Logf("%s %s", Facing, p)
	}
	if p == "" {
		t.Skipf("%s not found: run scripts/deps (installs %s)", a.QEMU().Binary, a.QEMU().Package)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v (scripts/qemu11 --arch %s makes QEMU 11's wrapper)", ArchQEMUEnv(a), p, err, a.Name())
	}
	return p
}

// ArchTiny is a's built-in tiny kernel and its ELF, and a's QEMU (see
// ArchQEMU).
func ArchTiny(t testing.TB, a arch.Arch) (kernel, elf, qemu string) {
	t.Helper()
	qemu = ArchQEMU(t, a)
	name := "tiny"
	if a.Name() != archs.Default().Name() {
		name += "-" + a.Name()
	}
	dir := filepath.Join(Repo(), "testdata", "images")
	kernel = filepath.Join(dir, name+".bin")
	if _, err := os.Stat(kernel); err != nil {
		kernel = filepath.Join(dir, name+".elf") // booted as its ELF (x86_64's, through its PVH note)
	}
	return kernel, filepath.Join(dir, name+".elf"), qemu
}

// StartArchQEMU is StartQEMU for a's QEMU (see ArchQEMU).
func StartArchQEMU(t testing.TB, a arch.Arch, dir string, args ...string) *Process {
	t.Helper()
	return startBinary(t, ArchQEMU(t, a), dir, args...)
}

// ArchLinux is the Linux guest of architecture a (see LinuxGuest): from
// $QEMU_MCP_LINUX_DIR_<NAME>, else the cached build of
// scripts/build-linux --arch NAME. It skips the test if neither is there,
// or if a's QEMU is missing.
func ArchLinux(t testing.TB, a arch.Arch) Linux {
	t.Helper()
	if a.Name() == archs.Default().Name() {
		return LinuxGuest(t)
	}
	ArchQEMU(t, a)
	dir := linuxdir.Dir(t, a.Name())
	l := Linux{Dir: dir, Kernel: filepath.Join(dir, "Image"), Initrd: filepath.Join(dir, "initramfs.cpio.gz"),
		Vmlinux: filepath.Join(dir, "vmlinux"), Append: "console=" + a.QEMU().Console + " " + a.QEMU().Earlycon}
	for _, p := range []string{l.Kernel, l.Initrd} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s Linux guest in %s is incomplete: %v (rebuild it with scripts/build-linux --arch %s)", a.Name(), dir, err, a.Name())
		}
	}
	return l
}
