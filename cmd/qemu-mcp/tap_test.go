package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// netns makes a network namespace for one test and deletes it afterwards.
// TAP tests run only in such namespaces, on documentation addresses.
func netns(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("TAP tests need root (CAP_NET_ADMIN): run them as root, as CI does")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("/dev/net/tun missing: the kernel has no TUN/TAP support")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip not found: run scripts/deps (installs iproute2)")
	}
	name := "qmcpcmd" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// startServerIn runs the server inside namespace ns.
func startServerIn(t *testing.T, ns, dir string, args ...string) *server {
	t.Helper()
	wrapped := serverCmd(dir, args...)
	s := startServerCmd(t, exec.Command("ip", append([]string{"netns", "exec", ns}, wrapped.Args...)...), wrapped.Env)
	return s
}

// needUBootAndTcpdump skips a test that boots U-Boot to ping and reads
// its capture with tcpdump unless QEMU, U-Boot and tcpdump are all here.
func needUBootAndTcpdump(t *testing.T) {
	t.Helper()
	needQEMU(t)
	if _, err := os.Stat(testguest.UBoot); err != nil {
		t.Skip("U-Boot missing: run scripts/deps (installs u-boot-qemu)")
	}
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("tcpdump missing: run scripts/deps")
	}
}

func linkExists(ns, name string) bool {
	return exec.Command("ip", "-n", ns, "link", "show", name).Run() == nil
}

func TestTAPAndCapture(t *testing.T) {
	needUBootAndTcpdump(t)
	ns := netns(t)
	dir := runtimeDir(t)
	a := startServerIn(t, ns, dir)
	b := ubootPing(t, a, map[string]any{"network": "tap", "tap_cidr": "192.0.2.1/24", "pcap": true})
	if b.TAP != names.TAP(a.owner(t), "default") || !linkExists(ns, b.TAP) || !strings.Contains(b.PCAP, "/captures/") {
		t.Fatalf("boot result tap %q pcap %q", b.TAP, b.PCAP)
	}
	var w struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	// A restore keeps the guest's TAP and capture: the restored U-Boot
	// pings again, through the same device, into the same capture.
	var lo struct {
		PID int `json:"pid"`
	}
	if res := a.call(t, "qemu_snapshot_save", map[string]any{"name": "net"}, nil); res.IsError {
		t.Fatalf("save: %s", mcptest.Text(res))
	}
	if res := a.call(t, "qemu_snapshot_load", map[string]any{"name": "net"}, &lo); res.IsError || lo.PID == 0 {
		t.Fatalf("load: %s", mcptest.Text(res))
	}
	a.call(t, "serial_send", map[string]any{"data": "ping 192.0.2.1", "wait_for": `host 192\.0\.2\.1 is alive`, "timeout": 20}, &w)
	if !w.Matched || !linkExists(ns, b.TAP) {
		t.Fatalf("ping after the restore: %q", w.Output)
	}
	out := stopCapture(t, a, b.PCAP, 6)
	for _, w := range []string{"Request who-has 192.0.2.1 tell 192.0.2.15", "Reply 192.0.2.1 is-at", "192.0.2.15 > 192.0.2.1: ICMP echo request", "192.0.2.1 > 192.0.2.15: ICMP echo reply"} {
		if !strings.Contains(out, w) {
			t.Errorf("tcpdump output lacks %q", w)
		}
	}
	// After shutdown the TAP is gone; the capture file is kept.
	a.call(t, "qemu_shutdown", nil, nil)
	if linkExists(ns, b.TAP) {
		t.Errorf("TAP %s still exists after shutdown", b.TAP)
	}
	if _, err := os.Stat(b.PCAP); err != nil {
		t.Errorf("capture file gone: %v", err)
	}

	// After SIGKILL of the server, the next server's reaper deletes its TAP.
	res := a.call(t, "qemu_boot", map[string]any{"network": "tap", "tap_cidr": "198.51.100.1/24", "wait_for": `tiny> $`}, &b)
	if res.IsError || !linkExists(ns, b.TAP) {
		t.Fatalf("second boot: %s", mcptest.Text(res))
	}
	a.cmd.Process.Kill()
	<-a.done
	if !linkExists(ns, b.TAP) {
		t.Fatalf("TAP %s vanished with the server: the reaper test would prove nothing", b.TAP)
	}
	if deleted := reapedTAPs(t, ns, dir); len(deleted) != 1 || deleted[0] != b.TAP || linkExists(ns, b.TAP) {
		t.Errorf("reaper: deleted %v, link exists %v; want %s deleted", deleted, linkExists(ns, b.TAP), b.TAP)
	}
}

// stopCapture stops s's capture, which must be the file wantPath holding at
// least min packets, and returns what an outside reader (tcpdump) reads of
// it: as many packets as the capture says.
func stopCapture(t *testing.T, s *server, wantPath string, min int64) string {
	t.Helper()
	var stop struct {
		Path    string `json:"path"`
		Packets int64  `json:"packets"`
	}
	s.call(t, "qemu_pcap_stop", nil, &stop)
	if stop.Path != wantPath || stop.Packets < min {
		t.Errorf("pcap stop %+v", stop)
	}
	out, err := exec.Command("tcpdump", "-nn", "-r", stop.Path).Output()
	if err != nil {
		t.Fatalf("tcpdump -r: %v", err)
	}
	if n := len(strings.Split(strings.TrimSpace(string(out)), "\n")); int64(n) != stop.Packets {
		t.Errorf("tcpdump reads %d packets, the capture says %d:\n%s", n, stop.Packets, out)
	}
	return string(out)
}

// reapedTAPs starts a server in ns on dir (after a server there was
// killed), boots a guest, and returns the TAPs its reaper says it deleted.
func reapedTAPs(t *testing.T, ns, dir string) []string {
	t.Helper()
	next := startServerIn(t, ns, dir)
	var nb struct {
		Reaped struct {
			DeletedTAPs []string `json:"deleted_taps"`
		} `json:"reaped"`
	}
	if res := next.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &nb); res.IsError {
		t.Fatalf("boot after the kill: %s", mcptest.Text(res))
	}
	return nb.Reaped.DeletedTAPs
}

func containsAll(lines, want []string) bool {
	for _, w := range want {
		found := false
		for _, l := range lines {
			if strings.Contains(l, w) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Without privileges network tap fails with a clear message that suggests
// network user, and the server keeps serving.
func TestTAPWithoutPrivilege(t *testing.T) {
	needQEMU(t)
	if os.Getuid() != 0 {
		t.Skip("needs root to drop to an unprivileged user")
	}
	dir := runtimeDir(t)
	os.Chown(dir, 65534, 65534)
	// The test binary's own directory is private to root: run a copy.
	binDir, err := os.MkdirTemp("", "qmcpbin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	os.Chmod(binDir, 0o755)
	copyFile(t, os.Args[0], binDir+"/qemu-mcp.test")
	cmd := serverCmd(dir)
	cmd.Path = binDir + "/qemu-mcp.test"
	cmd.Args[0] = cmd.Path
	cmd.Dir = binDir
	cmd.Env = append(cmd.Env, "QEMU_MCP_LOCK_FILE="+dir+"/lock")
	cmd.SysProcAttr = unprivileged()
	s := startServerCmd(t, cmd, cmd.Env)
	res := s.call(t, "qemu_boot", map[string]any{"network": "tap"}, nil)
	msg := mcptest.Text(res)
	if !res.IsError || !strings.Contains(msg, "CAP_NET_ADMIN") || !strings.Contains(msg, `network: "user"`) ||
		!strings.Contains(msg, "ip tuntap add dev qmtap0 mode tap user nobody") || !strings.Contains(msg, `tap: "qmtap0"`) {
		t.Fatalf("boot with tap as nobody: %s", msg)
	}
	var st struct {
		Booted bool `json:"booted"`
	}
	s.call(t, "qemu_status", nil, &st)
	if st.Booted {
		t.Error("a failed tap boot left a guest")
	}
}

// Two Linux guests of one server on one bridge ping each other; the
// capture on one guest's TAP sees the echo requests and replies. The
// bridge, the TAPs and all traffic stay inside the test's namespace.
func TestTwoGuestsOnABridge(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	ns := netns(t)
	for _, args := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	// The guest lives outside the project: the server may read it.
	s := startServerIn(t, ns, runtimeDir(t), "-allow-path", lin.Dir)
	taps := map[string]string{}
	for _, g := range []struct{ name, addr string }{{"a", "192.0.2.11"}, {"b", "192.0.2.12"}} {
		var b struct {
			TAP     string `json:"tap"`
			Matched bool   `json:"matched"`
		}
		res := s.call(t, "qemu_boot", map[string]any{
			"instance": g.name, "kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend, "memory": "256M",
			"network": "tap", "bridge": "br0", "pcap": g.name == "b", "wait_for": testguest.LinuxPrompt, "timeout": 60,
		}, &b)
		if res.IsError || !b.Matched || !linkExists(ns, b.TAP) {
			t.Fatalf("boot %s: %s", g.name, mcptest.Text(res))
		}
		taps[g.name] = b.TAP
		var w struct {
			Matched bool `json:"matched"`
		}
		if res := s.call(t, "serial_send", map[string]any{"instance": g.name, "data": "ip addr add " + g.addr + "/24 dev eth0 && ip link set eth0 up",
			"wait_for": testguest.LinuxPrompt, "timeout": 10}, &w); res.IsError || !w.Matched {
			t.Fatalf("configure %s: %s", g.name, mcptest.Text(res))
		}
	}
	if taps["a"] == taps["b"] {
		t.Fatalf("both guests have TAP %s", taps["a"])
	}
	var w struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	res := s.call(t, "serial_send", map[string]any{"instance": "a", "data": "ping -c 3 -W 2 192.0.2.12",
		"wait_for": `packets received`, "timeout": 30}, &w)
	if res.IsError || !strings.Contains(w.Output, "3 packets transmitted, 3 packets received") {
		t.Fatalf("ping from a to b: %s", mcptest.Text(res))
	}
	var p struct {
		Packets []struct {
			Text string `json:"text"`
		} `json:"packets"`
	}
	s.call(t, "qemu_pcap_read", map[string]any{"instance": "b"}, &p)
	var requests, replies int
	for _, pk := range p.Packets {
		switch {
		case strings.Contains(pk.Text, "192.0.2.11 > 192.0.2.12: ICMP echo request"):
			requests++
		case strings.Contains(pk.Text, "192.0.2.12 > 192.0.2.11: ICMP echo reply"):
			replies++
		}
	}
	if requests != 3 || replies != 3 {
		t.Errorf("capture on b's TAP: %d echo requests, %d replies, want 3 and 3: %+v", requests, replies, p.Packets)
	}
	for _, name := range []string{"a", "b"} {
		s.call(t, "qemu_shutdown", map[string]any{"instance": name}, nil)
		if linkExists(ns, taps[name]) {
			t.Errorf("TAP %s of %s still there after its shutdown", taps[name], name)
		}
	}
}

// The Linux guest pings the host side of its TAP (192.0.2.1 inside the
// test's namespace), which answers.
func TestLinuxPingsHost(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	ns := netns(t)
	s := startServerIn(t, ns, runtimeDir(t), "-allow-path", lin.Dir)
	res := s.call(t, "qemu_boot", map[string]any{
		"kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend, "memory": "256M",
		"network": "tap", "tap_cidr": "192.0.2.1/24", "wait_for": testguest.LinuxPrompt, "timeout": 60,
	}, nil)
	if res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	var w struct {
		Output string `json:"output"`
	}
	res = s.call(t, "serial_send", map[string]any{"data": "ip addr add 192.0.2.15/24 dev eth0 && ip link set eth0 up && ping -c 3 -W 2 192.0.2.1",
		"wait_for": `packets received`, "timeout": 30}, &w)
	if res.IsError || !strings.Contains(w.Output, "3 packets transmitted, 3 packets received") {
		t.Fatalf("ping the host: %s", mcptest.Text(res))
	}
}

// A server that could delete TAPs (root) leaves one it was given by name:
// not at shutdown, not when its next incarnation reaps after a SIGKILL; and
// it captures on it in-process.
func TestExistingTAPAsRoot(t *testing.T) {
	needQEMU(t)
	ns := netns(t)
	for _, args := range [][]string{{"tuntap", "add", "dev", "qmtapr", "mode", "tap"}, {"link", "set", "qmtapr", "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	dir := runtimeDir(t)
	a := startServerIn(t, ns, dir)
	var b struct {
		TAP  string `json:"tap"`
		PCAP string `json:"pcap"`
	}
	if res := a.call(t, "qemu_boot", map[string]any{"network": "tap", "tap": "qmtapr", "pcap": true, "wait_for": `tiny> $`}, &b); res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	if b.TAP != "qmtapr" || b.PCAP == "" {
		t.Errorf("boot result %+v", b)
	}
	// A second guest cannot have it while the first does.
	if res := a.call(t, "qemu_boot", map[string]any{"instance": "two", "network": "tap", "tap": "qmtapr"}, nil); !res.IsError || !strings.Contains(mcptest.Text(res), "in use") {
		t.Errorf("a second guest on the same TAP: %s", mcptest.Text(res))
	}
	a.call(t, "qemu_shutdown", nil, nil)
	if !linkExists(ns, "qmtapr") {
		t.Fatal("shutdown deleted the TAP it was given")
	}
	if res := a.call(t, "qemu_boot", map[string]any{"network": "tap", "tap": "qmtapr", "wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("second boot: %s", mcptest.Text(res))
	}
	a.cmd.Process.Kill()
	<-a.done
	if deleted := reapedTAPs(t, ns, dir); len(deleted) != 0 || !linkExists(ns, "qmtapr") {
		t.Errorf("the reaper deleted %v; TAP there: %v", deleted, linkExists(ns, "qmtapr"))
	}
}

// ubootBoot is what ubootPing's boot reports.
type ubootBoot struct {
	TAP     string `json:"tap"`
	PCAP    string `json:"pcap"`
	Matched bool   `json:"matched"`
}

// pingLines are what a capture of U-Boot's ping of 192.0.2.1 shows.
var pingLines = []string{
	"ARP, Request who-has 192.0.2.1 tell 192.0.2.15",
	"ARP, Reply 192.0.2.1 is-at",
	"IP 192.0.2.15 > 192.0.2.1: ICMP echo request",
	"IP 192.0.2.1 > 192.0.2.15: ICMP echo reply",
}

// ubootPing boots U-Boot with network args (a TAP whose host side is
// 192.0.2.1, captured at boot), has it ping the host, and waits until the
// agent's view of the capture (qemu_pcap_read, while it runs) shows the
// exchange.
func ubootPing(t *testing.T, s *server, network map[string]any) ubootBoot {
	t.Helper()
	args := map[string]any{"kernel": testguest.UBoot, "memory": "256M", "wait_for": "Hit any key to stop autoboot", "timeout": 60}
	for k, v := range network {
		args[k] = v
	}
	var b ubootBoot
	if res := s.call(t, "qemu_boot", args, &b); res.IsError || !b.Matched {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	var w struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	s.call(t, "serial_send", map[string]any{"data": " ", "newline": "none", "wait_for": "=> $", "timeout": 10}, &w)
	if !w.Matched {
		t.Fatalf("no U-Boot prompt: %q", w.Output)
	}
	s.call(t, "serial_send", map[string]any{"data": "setenv ipaddr 192.0.2.15; ping 192.0.2.1", "wait_for": `host 192\.0\.2\.1 is alive`, "timeout": 20}, &w)
	if !w.Matched {
		t.Fatalf("ping: %q", w.Output)
	}
	var r struct {
		Packets []struct {
			Text string `json:"text"`
		} `json:"packets"`
	}
	var lines []string
	for deadline := time.Now().Add(5 * time.Second); !containsAll(lines, pingLines) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s.call(t, "qemu_pcap_read", map[string]any{"from": 1}, &r)
		lines = lines[:0]
		for _, p := range r.Packets {
			lines = append(lines, p.Text)
		}
	}
	if !containsAll(lines, pingLines) {
		t.Fatalf("qemu_pcap_read shows %q, want lines containing %q", lines, pingLines)
	}
	return b
}
