package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
)

// A restart that would fail leaves the running guest as it was: its QEMU,
// its console and the read cursor. The refusals: a TAP the user may not
// make, a TAP that does not exist, a capture filter that does not compile,
// and a repository lock another server holds.
func TestRefusedRestartKeepsGuest(t *testing.T) {
	needQEMU(t)
	owner := accounts(t, 1)[0]
	dir := owner.dir(t, "run", 0o700)
	work := owner.dir(t, "work", 0o755)
	other := filepath.Join(work, "other")
	os.MkdirAll(filepath.Join(other, ".git"), 0o755)
	owner.Chown(t, work)
	// Another server of the same user holds the lock of work/other.
	cmd2 := owner.serverCmd(owner.dir(t, "run2", 0o700), other)
	s2 := startServerCmd(t, cmd2, append(cmd2.Env, "QEMU_MCP_LOCK_FILE="))
	if res := s2.call(t, "qemu_boot", nil, nil); res.IsError {
		t.Fatalf("boot of the other server: %s", mcptest.Text(res))
	}

	cmd := owner.serverCmd(dir, work)
	s := startServerCmd(t, cmd, append(cmd.Env, "QEMU_MCP_LOCK_FILE="))
	var b struct {
		PID int `json:"pid"`
	}
	if res := s.call(t, "qemu_boot", map[string]any{"wait_for": `tiny> $`}, &b); res.IsError {
		t.Fatalf("boot: %s", mcptest.Text(res))
	}
	var r struct {
		Cursor int64  `json:"cursor"`
		Output string `json:"output"`
	}
	s.call(t, "serial_send", map[string]any{"data": "echo before", "wait_for": `before\r\ntiny> $`}, &r)
	cursor := r.Cursor
	for what, args := range map[string]map[string]any{
		"unprivileged tap":  {"network": "tap"},
		"missing tap":       {"network": "tap", "tap": "qmnosuch0"},
		"bad pcap filter":   {"network": "tap", "pcap": true, "pcap_filter": "port banana"},
		"busy lock":         {"project_root": "other"},
		"tap with tap_cidr": {"network": "tap", "tap": "qmtap0", "tap_cidr": "192.0.2.1/24"},
	} {
		args["restart"] = true
		res := s.call(t, "qemu_boot", args, nil)
		msg := mcptest.Text(res)
		if !res.IsError {
			t.Fatalf("%s: the restart succeeded: %s", what, msg)
		}
		t.Logf("%s: %s", what, msg)
		if what == "unprivileged tap" && (!strings.Contains(msg, "ip tuntap add dev qmtap0 mode tap user "+owner.Name) || !strings.Contains(msg, "ip link set qmtap0 up")) {
			t.Errorf("the unprivileged TAP error does not give root's commands: %s", msg)
		}
		var st struct {
			Running bool `json:"running"`
			PID     int  `json:"pid"`
		}
		s.call(t, "qemu_status", nil, &st)
		if !st.Running || st.PID != b.PID {
			t.Fatalf("%s: the guest is %+v after the refused restart, want qemu %d running", what, st, b.PID)
		}
	}
	// The console and this session's cursor are where they were.
	s.call(t, "serial_read", nil, &r)
	if r.Cursor != cursor {
		t.Errorf("cursor %d after the refusals, was %d (output %q)", r.Cursor, cursor, r.Output)
	}
	s.call(t, "serial_send", map[string]any{"data": "echo after", "wait_for": `after\r\ntiny> $`}, &r)
	if !strings.Contains(r.Output, "after") {
		t.Errorf("the guest's console after the refusals: %q", r.Output)
	}
}

// userTAPServer runs a's server inside namespace ns with a /dev/net/tun of
// its own that only a may open (a device node in a private mount
// namespace, gone with it): this machine's /dev/net/tun is 0600, where
// Debian's udev makes it 0666.
func userTAPServer(t *testing.T, a account, ns, dir, cwd string, args ...string) *server {
	t.Helper()
	for _, tool := range []string{"unshare", "setpriv", "mknod"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (util-linux, coreutils)", tool)
		}
	}
	devDir := t.TempDir()
	inner := serverCmd(dir, args...)
	ids := strconv.Itoa(a.UID) + ":" + strconv.Itoa(a.GID)
	script := `dev=$1 ns=$2 bin=$3; shift 3
mount -t tmpfs -o mode=0755 tmpfs "$dev" && mknod -m 0600 "$dev/tun" c 10 200 && chown ` + ids + ` "$dev/tun" &&
mount --bind "$dev/tun" /dev/net/tun &&
exec ip netns exec "$ns" setpriv --reuid=` + strconv.Itoa(a.UID) + ` --regid=` + strconv.Itoa(a.GID) + ` --clear-groups -- "$bin" "$@"`
	argv := append([]string{"unshare", "-m", "sh", "-c", script, "sh", devDir, ns, a.bin}, inner.Args[1:]...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = cwd
	env := append(inner.Env, "GORACE=atexit_sleep_ms=0", "HOME="+a.home)
	return startServerCmd(t, cmd, env)
}

// tuntap makes a persistent TAP in namespace ns for user a, as root would
// for a user: up, with the host's address.
func tuntap(t *testing.T, ns, name string, a account) {
	t.Helper()
	for _, args := range [][]string{
		{"tuntap", "add", "dev", name, "mode", "tap", "user", strconv.Itoa(a.UID)},
		{"link", "set", name, "up"},
		{"addr", "add", "192.0.2.1/24", "dev", name},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
}

// An ordinary user's guest on a persistent TAP that root made for them,
// inside a namespace of the test's: used by name, captured (through QEMU,
// as the user may not open a packet socket), and left as it was after the
// guest stops.
func TestUserTAPByName(t *testing.T) {
	needUBootAndTcpdump(t)
	owner := accounts(t, 1)[0]
	ns := netns(t)
	tuntap(t, ns, "qmtapa", owner)
	dir := owner.dir(t, "run", 0o700)
	s := userTAPServer(t, owner, ns, dir, owner.home)

	// What goes with a TAP of the server's own does not go with this one.
	for _, extra := range []map[string]any{{"tap_cidr": "192.0.2.9/24"}, {"bridge": "br0"}} {
		args := map[string]any{"network": "tap", "tap": "qmtapa"}
		for k, v := range extra {
			args[k] = v
		}
		if res := s.call(t, "qemu_boot", args, nil); !res.IsError || !strings.Contains(mcptest.Text(res), "used as it is") {
			t.Errorf("tap with %v: %s", extra, mcptest.Text(res))
		}
	}

	b := ubootPing(t, s, map[string]any{"network": "tap", "tap": "qmtapa", "pcap": true})
	if b.TAP != "qmtapa" || b.PCAP == "" {
		t.Fatalf("boot result: tap %q pcap %q", b.TAP, b.PCAP)
	}
	want := pingLines
	var w struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	out := stopCapture(t, s, b.PCAP, 4)
	for _, w := range want {
		if !strings.Contains(out, strings.TrimPrefix(strings.TrimPrefix(w, "ARP, "), "IP ")) {
			t.Errorf("tcpdump output lacks %q:\n%s", w, out)
		}
	}
	// A second capture, started while the guest runs, works the same way.
	var st struct {
		Path string `json:"path"`
	}
	var stop struct {
		Packets int64 `json:"packets"`
	}
	if res := s.call(t, "qemu_pcap_start", map[string]any{"filter": "icmp"}, &st); res.IsError {
		t.Fatalf("pcap start: %s", mcptest.Text(res))
	}
	s.call(t, "serial_send", map[string]any{"data": "ping 192.0.2.1", "wait_for": `is alive`, "timeout": 20}, &w)
	s.call(t, "qemu_pcap_stop", nil, &stop)
	if stop.Packets != 2 {
		t.Errorf("the filtered capture has %d packets, want the echo request and reply", stop.Packets)
	}

	s.call(t, "qemu_shutdown", nil, nil)
	if !linkExists(ns, "qmtapa") {
		t.Error("the user's TAP is gone after the guest stopped: it is not the server's to delete")
	}
	if _, err := os.Stat(b.PCAP); err != nil {
		t.Errorf("the capture file is gone: %v", err)
	}
	// The server's record never named it, so no reaper deletes it.
	s.cmd.Process.Kill()
	<-s.done
	next := userTAPServer(t, owner, ns, dir, owner.home)
	if res := next.call(t, "qemu_boot", map[string]any{"network": "tap", "tap": "qmtapa", "wait_for": `tiny> $`}, nil); res.IsError {
		t.Fatalf("boot after the kill: %s", mcptest.Text(res))
	}
	if !linkExists(ns, "qmtapa") {
		t.Error("the user's TAP was reaped")
	}
}
