package serial

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// uBootSMode is Debian's u-boot-qemu build for QEMU's riscv64 virt board in
// S-mode, run after OpenSBI (QEMU's "-bios default").
const uBootSMode = "/usr/lib/u-boot/qemu-riscv64_smode/u-boot.bin"

// TestRealQEMU boots U-Boot in a real QEMU attached to a Console, stops
// autoboot, runs "version" and finally checks Finish after QEMU is killed.
func TestRealQEMU(t *testing.T) {
	if _, err := os.Stat(uBootSMode); err != nil {
		t.Skipf("%s missing (Debian package u-boot-qemu); skipping the real-QEMU test", uBootSMode)
	}
	ctx := testCtx(t)
	dir, err := os.MkdirTemp("", "ser")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := Create(testBase(dir, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	p := testguest.StartQEMU(t, "",
		"-M", "virt", "-m", "256M", "-bios", "default",
		"-display", "none", "-nodefaults",
		"-chardev", "pipe,id=s0,path="+c.Base(), "-serial", "chardev:s0",
		"-kernel", uBootSMode)
	cmd, exited := p.Cmd, p.Done

	buf := c.Buffer()
	wait := func(since int64, re string, timeout time.Duration) Match {
		t.Helper()
		m, err := buf.Wait(ctx, since, regexp.MustCompile(re), timeout)
		if err != nil || !m.Matched {
			out, _ := buf.Read(0, 0)
			t.Fatalf("waiting for %q: %v; timed out %v, finished %v\nconsole:\n%s\nqemu stderr:\n%s",
				re, err, m.TimedOut, m.Finished, out, p.Stderr())
		}
		return m
	}
	m := wait(0, `Hit any key to stop autoboot:`, 10*time.Second)
	if _, err := c.Write(ctx, []byte(" ")); err != nil {
		t.Fatal(err)
	}
	m = wait(m.Cursor, `=> `, 5*time.Second)
	if _, err := c.Write(ctx, []byte("version\r")); err != nil {
		t.Fatal(err)
	}
	m = wait(m.Cursor, `U-Boot (20\d\d\.\d+)`, 5*time.Second)
	t.Logf("U-Boot %s answered after %d console bytes", m.Groups[0], m.Cursor)
	wait(m.Cursor, `=> `, 5*time.Second)

	// QEMU's exit is noticed elsewhere; here the test kills it and calls
	// Finish, which must wake a pending Wait.
	ch := waitAsync(ctx, buf, buf.End(), `never`, time.Minute)
	cmd.Process.Kill()
	<-exited
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, ch); r.err != nil || !r.m.Finished {
		t.Fatalf("Wait pending at QEMU exit: %+v, %v", r.m, r.err)
	}
}
