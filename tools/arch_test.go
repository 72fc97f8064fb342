package tools_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// aarch64Session is a session whose server boots aarch64 guests with the
// tests' aarch64 QEMU and the built-in aarch64 tiny kernel, beside
// riscv64's.
func aarch64Session(t *testing.T, adjust func(*testConfig)) (*session, string) {
	t.Helper()
	return archSession(t, arm64.Arch, adjust)
}

// archSession is a session whose server boots a's guests with the tests'
// QEMU for a and a's built-in tiny kernel, beside riscv64's.
func archSession(t *testing.T, a arch.Arch, adjust func(*testConfig)) (*session, string) {
	t.Helper()
	kernel, elf, q := testguest.ArchTiny(t, a)
	k, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	e, err := os.ReadFile(elf)
	if err != nil {
		t.Fatal(err)
	}
	s := newSessionWith(t, func(c *testConfig) {
		c.Platforms = map[string]instance.Platform{a.Name(): {QEMU: q, Kernel: k, Symbols: e}}
		if adjust != nil {
			adjust(c)
		}
	}, nil)
	return s, q
}

// qemu_boot {arch: "aarch64"} with no kernel boots the built-in aarch64
// tiny kernel on the aarch64 QEMU: the console, QMP (with the GIC's own
// query, which riscv64 guests are refused), a snapshot restored three
// times with its state, and poweroff all work as on riscv64; server_info
// lists the architecture.
func TestAarch64TinyKernel(t *testing.T) {
	snaps := t.TempDir()
	s, q := aarch64Session(t, func(c *testConfig) { c.Snapshots = snaps })
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"arch": "aarch64", "wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched || !strings.Contains(b.Output, "qemu-mcp tiny kernel") {
		t.Fatalf("boot: %+v", b)
	}
	var st struct {
		Arch string   `json:"arch"`
		Argv []string `json:"argv"`
	}
	s.mustCall("qemu_status", nil, &st)
	if len(st.Argv) == 0 || st.Argv[0] != q || !slices.Contains(st.Argv, "virt,gic-version=3") || slices.Contains(st.Argv, "-bios") {
		t.Errorf("command line %q: want %s, the GICv3 virt board and no -bios", st.Argv, q)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo on", "newline": "none", "match_echo": true, "wait_for": "echo on"}, &w)
	var gic struct {
		Return []struct {
			Version  int  `json:"version"`
			Emulated bool `json:"emulated"`
		} `json:"return"`
	}
	s.mustCall("qmp_command", map[string]any{"command": "query-gic-capabilities"}, &gic)
	if !slices.ContainsFunc(gic.Return, func(g struct {
		Version  int  `json:"version"`
		Emulated bool `json:"emulated"`
	}) bool {
		return g.Version == 3 && g.Emulated
	}) {
		t.Errorf("query-gic-capabilities: %+v, want an emulated GICv3", gic)
	}
	var si snapInfo
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "base"}, &si)
	s.mustCall("serial_send", map[string]any{"data": "x", "wait_for": "onx\r\ntiny> $"}, &w)
	for k := range 3 {
		var lo loadFull
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "base"}, &lo)
		s.mustCall("serial_send", map[string]any{"data": "e", "wait_for": `\r\n(on\w+)\r\ntiny> $`}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") {
			t.Fatalf("restore %d: %+v", k, w)
		}
	}
	var info struct {
		Arches []instance.ArchHealth `json:"architectures"`
	}
	s.mustCall("server_info", nil, &info)
	if i := slices.IndexFunc(info.Arches, func(a instance.ArchHealth) bool { return a.Name == "aarch64" }); i < 0 ||
		!info.Arches[i].Found || !info.Arches[i].Builtin || info.Arches[i].Binary != q || !strings.Contains(info.Arches[i].Version, "QEMU emulator version") {
		t.Errorf("server_info architectures: %+v", info.Arches)
	}
	s.poweroffExits()
}

// poweroffExits types the tiny kernel's poweroff and checks that QEMU
// exits with status 0.
func (s *session) poweroffExits() {
	s.t.Helper()
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "poweroff", "wait_for": prompt, "timeout": 20}, &w)
	if !w.Exited {
		s.t.Errorf("poweroff: %+v, want QEMU to exit", w)
	}
	var after struct {
		State      string `json:"state"`
		ExitStatus *int   `json:"exit_status"`
	}
	s.mustCall("qemu_status", nil, &after)
	if after.State != "stopped" || after.ExitStatus == nil || *after.ExitStatus != 0 {
		s.t.Errorf("after poweroff: %+v", after)
	}
}

// The aarch64 QEMU is probed with the aarch64 tiny kernel after its first
// boot, and server_info's architectures give its capabilities: it keeps
// the timer and loads in place (QEMU 7.2 and 11.1 alike: the generic
// timer is CPU state). A snapshot then restores in place, three times,
// into the same QEMU, with the state it saved; riscv64's
// qemu_capabilities stays about riscv64's QEMU.
func TestAarch64SnapshotInPlace(t *testing.T) { snapshotInPlace(t, arm64.Arch, false) }

// TestAarch64SnapshotInPlace on x86_64, whose probe reads the HPET, with
// QEMU given by its name and found on PATH, as a server started without
// -qemu finds it: the probe and the restore know it by its path.
func TestX86SnapshotInPlace(t *testing.T) { snapshotInPlace(t, x86_64.Arch, true) }

func snapshotInPlace(t *testing.T, ar arch.Arch, byName bool) {
	cache := t.TempDir() // probed by this server, not read from an earlier one
	q := testguest.ArchQEMU(t, ar)
	s, _ := archSession(t, ar, func(c *testConfig) {
		c.CacheDir = cache
		if byName {
			t.Setenv("PATH", filepath.Dir(q)+string(os.PathListSeparator)+os.Getenv("PATH"))
			p := c.Platforms[ar.Name()]
			p.QEMU = filepath.Base(q)
			c.Platforms[ar.Name()] = p
		}
	})
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"arch": ar.Name(), "wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched {
		t.Fatalf("boot: %+v", b)
	}
	a, info, res := probedArch(t, s, ar.Name())
	if a.Caps.Binary != q || a.Caps.Timer.Answer != "yes" || a.Caps.InPlace.Answer != "yes" {
		t.Fatalf("%s's QEMU %s: timer kept %+v, in-place load %+v", ar.Name(), a.Version, a.Caps.Timer, a.Caps.InPlace)
	}
	if !strings.Contains(text(res), "riscv64 (the QEMU above, built-in kernel)") || !strings.Contains(text(res), ar.Name()+" (QEMU emulator version") || !strings.Contains(text(res), "built-in kernel, timer kept yes, in-place load yes, replay checkpoint ") {
		t.Errorf("server_info's text: %s", text(res))
	}
	if info.QEMUCaps.Binary == q || !strings.Contains(info.QEMUCaps.Binary, "riscv64") {
		t.Errorf("qemu_capabilities is about %s, want riscv64's QEMU", info.QEMUCaps.Binary)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo on", "newline": "none", "match_echo": true, "wait_for": "echo on"}, &w)
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "base"}, nil)
	s.mustCall("serial_send", map[string]any{"data": "x", "wait_for": "onx\r\ntiny> $"}, &w)
	for k := range 3 {
		var lo loadFull
		res := s.call("qemu_snapshot_load", map[string]any{"name": "base"}, &lo)
		if res.IsError || !lo.InPlace || lo.PID != b.PID || lo.Note != "" {
			t.Fatalf("restore %d: %+v (booted pid %d): %s", k, lo, b.PID, text(res))
		}
		s.mustCall("serial_send", map[string]any{"data": "e", "wait_for": `\r\n(on\w+)\r\ntiny> $`}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") {
			t.Fatalf("restore %d: %+v", k, w)
		}
	}
}

type archInfo struct {
	capsInfo
	Arches []instance.ArchHealth `json:"architectures"`
}

// probedArch waits until server_info says what the QEMU of architecture
// name was probed to do (after the session's first boot of it).
func probedArch(t *testing.T, s *session, name string) (instance.ArchHealth, archInfo, *mcp.CallToolResult) {
	t.Helper()
	var info archInfo
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		res := s.call("server_info", nil, &info)
		i := slices.IndexFunc(info.Arches, func(a instance.ArchHealth) bool { return a.Name == name })
		if i < 0 || info.Arches[i].Caps == nil {
			t.Fatalf("server_info architectures: %+v", info.Arches)
		}
		if a := info.Arches[i]; a.Caps.State == "probed" {
			return a, info, res
		} else if a.Caps.State != "probing" && a.Caps.State != "not probed yet" || time.Now().After(deadline) {
			t.Fatalf("%s's QEMU after a boot: %+v", name, a.Caps)
		}
	}
}

// A riscv64 guest is refused the aarch64 board's GIC query, and an arm64
// kernel named as riscv64 is refused before QEMU starts.
func TestArchRefusals(t *testing.T) {
	dir := t.TempDir()
	s, _ := aarch64Session(t, func(c *testConfig) { c.WorkDir = dir })
	s.bootTiny()
	s.wantError("qmp_command", map[string]any{"command": "query-gic-capabilities"}, "other-machines")
	img := make([]byte, 4096)
	copy(img[56:], "ARM\x64")
	if err := os.WriteFile(dir+"/Image", img, 0o644); err != nil {
		t.Fatal(err)
	}
	s.wantError("qemu_boot", map[string]any{"instance": "b", "kernel": "Image", "arch": "riscv64"},
		"is a aarch64 kernel, but arch riscv64 was asked")
}

// The aarch64 Linux guest, its architecture read from its Image header,
// on four vCPUs: to its shell; guest_exec's exit statuses; a share read;
// a snapshot restored three times with its state and a live timer (a
// sleep ends), in place where its QEMU was probed to load so (7.2 and
// 11.1 are); a boot from the snapshot.
func TestAarch64Linux(t *testing.T) { archLinux(t, arm64.Arch) }

// archLinux is TestAarch64Linux on a's Linux guest.
func archLinux(t *testing.T, a arch.Arch) {
	lin := testguest.ArchLinux(t, a)
	root := t.TempDir()
	snaps := t.TempDir()
	adjust := func(c *testConfig) { c.WorkDir, c.Snapshots, c.AllowPaths = root, snaps, []string{lin.Dir} }
	s, _ := archSession(t, a, adjust)
	if err := os.Mkdir(root+"/ro", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root+"/ro/hello.txt", []byte("hello from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var b struct {
		bootOut
		Arch   string `json:"arch"`
		Shares []struct {
			Mount string `json:"mount"`
		} `json:"shares"`
	}
	s.mustCall("qemu_boot", map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": lin.Append, "memory": "256M", "smp": 4,
		"shares": []map[string]any{{"path": "ro"}}, "wait_for": testguest.LinuxPrompt, "timeout": 90}, &b)
	if !b.Matched || b.Arch != a.Name() {
		t.Fatalf("boot: arch %q, %+v", b.Arch, b.bootOut)
	}
	if o := s.exec("grep -c ^processor /proc/cpuinfo", 0); strings.TrimSpace(o.Output) != "4" {
		t.Errorf("vCPUs: %+v", o)
	}
	for cmd, want := range map[string]int{"true": 0, "false": 1, "sh -c 'exit 7'": 7} {
		if o := s.exec(cmd, 0); status(o) != want {
			t.Errorf("%s: status %d, want %d: %+v", cmd, status(o), want, o)
		}
	}
	if o := s.exec(b.Shares[0].Mount+" && cat /mnt/ro/hello.txt && umount /mnt/ro", 0); o.Output != "hello from the host\n" {
		t.Errorf("share: %+v", o)
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo one > /tmp/f", "wait_for": testguest.LinuxPrompt}, &w)
	var si snapInfo
	s.mustCall("qemu_snapshot_save", map[string]any{"name": "prompt"}, &si)
	s.mustCall("serial_send", map[string]any{"data": "echo two > /tmp/f", "wait_for": testguest.LinuxPrompt}, &w)
	check := func(s *session, what string) {
		t.Helper()
		s.mustCall("serial_send", map[string]any{"data": "cat /tmp/f; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 15}, &w)
		if !w.Matched || !strings.Contains(w.Output, "\none\n") || strings.Contains(w.Output, "two") {
			t.Fatalf("%s: %+v", what, w)
		}
	}
	// A QEMU the server does not probe (no probe for its architecture)
	// restores into a new QEMU.
	inPlace := false
	if a.QEMU().Probe != nil {
		h, _, _ := probedArch(t, s, a.Name())
		inPlace = h.Caps.Timer.Answer == "yes" && h.Caps.InPlace.Answer == "yes"
	}
	for k := range 3 {
		var lo loadFull
		s.mustCall("qemu_snapshot_load", map[string]any{"name": "prompt"}, &lo)
		if lo.InPlace != inPlace || inPlace && lo.PID != b.PID {
			t.Errorf("restore %d: in place %v (pid %d, booted %d), want %v", k+1, lo.InPlace, lo.PID, b.PID, inPlace)
		}
		check(s, "restore "+string(rune('1'+k)))
	}
	s2, _ := archSession(t, a, adjust)
	s2.mustCall("qemu_boot", map[string]any{"snapshot": "prompt"}, &b)
	check(s2, "boot from the snapshot")
}
