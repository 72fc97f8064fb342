package tap_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/taptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
	"github.com/qemu-mcp/qemu-mcp/tap"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Every test that creates links runs in the namespace taptest.Main makes:
// names need not be unique beyond this process, and nothing reaches the
// host's links.
func TestMain(m *testing.M) { taptest.Main(m) }

func TestName(t *testing.T) {
	for _, pid := range []int{1, 1234, 4194304} {
		name := tap.Name(pid)
		if name != "qmcp"+strconv.Itoa(pid) || len(name) > 15 {
			t.Errorf("Name(%d) = %q", pid, name)
		}
		got, ok := tap.PIDFromName(name)
		if !ok || got != pid {
			t.Errorf("PIDFromName(%q) = %d, %v", name, got, ok)
		}
	}
	for _, bad := range []string{"qmcp", "qmcp0", "qmcp012", "qmcpx1", "eth0", "qmcp12345678", "qmcp-1", "qmcp+1"} {
		if pid, ok := tap.PIDFromName(bad); ok {
			t.Errorf("PIDFromName(%q) = %d, true; want false", bad, pid)
		}
	}
}

func TestGuestMAC(t *testing.T) {
	for pid, want := range map[int]string{
		1:         "52:54:00:00:00:01",
		0x123456:  "52:54:00:12:34:56",
		4194304:   "52:54:00:40:00:00",
		0x1abcdef: "52:54:00:ab:cd:ef", // only the low 24 bits
	} {
		mac := tap.GuestMAC(pid)
		if mac.String() != want {
			t.Errorf("GuestMAC(%d) = %s, want %s", pid, mac, want)
		}
		if mac[0]&2 == 0 || mac[0]&1 != 0 {
			t.Errorf("GuestMAC(%d) = %s is not a locally administered unicast address", pid, mac)
		}
	}
}

// Bad options fail before any system call, so this needs no privileges.
func TestCreateRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts tap.Options
		want string
	}{
		{tap.Options{Name: "qmcp-much-too-long"}, "longer than 15"},
		{tap.Options{Name: "a/b"}, "refuses"},
		{tap.Options{Name: "qmcpx", CIDR: "192.0.2.1"}, "prefix length"},
		{tap.Options{Name: "qmcpx", CIDR: "192.0.2.1/24", Bridge: "br0"}, "not both"},
		{tap.Options{Name: "qmcpx", MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0x53, 1}}, "multicast"},
		{tap.Options{PID: -1}, "invalid PID"},
		{tap.Options{Name: "qmcpx", CIDR: "2001:db8::1/64"}, "only IPv4"},
	} {
		_, err := tap.Create(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create(%+v) = %v, want an error with %q", tc.opts, err, tc.want)
		}
	}
}

func TestCreate(t *testing.T) {
	taptest.Require(t)
	name := tap.Name(os.Getpid())
	hostMAC := net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x53, 0x01}
	dev, err := tap.Create(tap.Options{CIDR: "192.0.2.1/24", UID: 65534, GID: 65534, MAC: hostMAC})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })

	if dev.Name != name || dev.CIDR != "192.0.2.1/24" || dev.Bridge != "" || dev.UID != 65534 || dev.GID != 65534 {
		t.Errorf("device = %+v", dev)
	}
	if dev.MAC.String() != hostMAC.String() {
		t.Errorf("MAC = %s, want %s", dev.MAC, hostMAC)
	}
	if want := tap.GuestMAC(os.Getpid()); dev.GuestMAC.String() != want.String() {
		t.Errorf("GuestMAC = %s, want %s", dev.GuestMAC, want)
	}

	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	tt, ok := link.(*netlink.Tuntap)
	if !ok {
		t.Fatalf("%s is a %T, want *netlink.Tuntap", name, link)
	}
	if tt.Mode != netlink.TUNTAP_MODE_TAP {
		t.Errorf("mode = %v, want tap", tt.Mode)
	}
	if tt.Flags&netlink.TUNTAP_NO_PI == 0 {
		t.Errorf("flags = %#x: NO_PI not set", tt.Flags)
	}
	if tt.NonPersist {
		t.Errorf("device is not persistent")
	}
	if tt.Owner != 65534 || tt.Group != 65534 {
		t.Errorf("owner/group = %d/%d, want 65534/65534", tt.Owner, tt.Group)
	}
	if link.Attrs().Index != dev.Index {
		t.Errorf("index = %d, device says %d", link.Attrs().Index, dev.Index)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is not up (flags %v)", name, link.Attrs().Flags)
	}
	// The kernel's own view, as a second opinion on what netlink decodes.
	flags := readSys(t, "/sys/class/net/"+name+"/tun_flags")
	f, err := strconv.ParseUint(strings.TrimPrefix(flags, "0x"), 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	if f&unix.IFF_TAP == 0 || f&unix.IFF_NO_PI == 0 || f&unix.IFF_ONE_QUEUE == 0 || f&unix.IFF_TUN != 0 {
		t.Errorf("tun_flags = %s: want IFF_TAP|IFF_NO_PI|IFF_ONE_QUEUE", flags)
	}

	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "192.0.2.1/24" {
		t.Errorf("IPv4 addresses = %v, want [192.0.2.1/24]", addrs)
	}
	if got := readSys(t, "/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6"); got != "1" {
		t.Errorf("disable_ipv6 = %s, want 1", got)
	}
	if got := readSys(t, "/proc/sys/net/ipv6/conf/"+name+"/accept_ra"); got != "0" {
		t.Errorf("accept_ra = %s, want 0", got)
	}
	if v6, err := netlink.AddrList(link, netlink.FAMILY_V6); err != nil || len(v6) != 0 {
		t.Errorf("IPv6 addresses = %v (%v), want none", v6, err)
	}

	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		t.Errorf("%s still exists after Close", name)
	}
	if err := dev.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCreateDefaults(t *testing.T) {
	taptest.Require(t)
	dev, err := tap.Create(tap.Options{Name: "qmcp1", PID: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	if dev.CIDR != tap.DefaultCIDR {
		t.Errorf("CIDR = %q, want %q", dev.CIDR, tap.DefaultCIDR)
	}
	if dev.GuestMAC.String() != "52:54:00:00:00:07" {
		t.Errorf("GuestMAC = %s", dev.GuestMAC)
	}
	link := mustLink(t, "qmcp1")
	if tt := link.(*netlink.Tuntap); tt.Owner != 0 || tt.Group != 0 {
		t.Errorf("owner/group = %d/%d, want 0/0", tt.Owner, tt.Group)
	}
	if len(dev.MAC) != 6 {
		t.Errorf("MAC = %v", dev.MAC)
	}
}

func TestCreateNoOwner(t *testing.T) {
	taptest.Require(t)
	dev, err := tap.Create(tap.Options{Name: "qmcp2", CIDR: "198.51.100.1/24", UID: -1, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	// The kernel leaves IFLA_TUN_OWNER out when there is no owner (netlink
	// then says 0); sysfs prints -1.
	if owner, group := readSys(t, "/sys/class/net/qmcp2/owner"), readSys(t, "/sys/class/net/qmcp2/group"); owner != "-1" || group != "-1" {
		t.Errorf("owner/group = %s/%s, want -1/-1", owner, group)
	}
}

func TestCreateExisting(t *testing.T) {
	taptest.Require(t)
	first, err := tap.Create(tap.Options{Name: "qmcp3", CIDR: "192.0.2.1/24"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Delete("qmcp3") })

	if _, err := tap.Create(tap.Options{Name: "qmcp3", CIDR: "192.0.2.1/24"}); !errors.Is(err, tap.ErrExists) {
		t.Errorf("second Create: %v, want ErrExists", err)
	}
	if mustLink(t, "qmcp3").Attrs().Index != first.Index {
		t.Errorf("the failed Create changed the existing TAP")
	}
	// Replace: a stale TAP under our name goes, a new one comes.
	second, err := tap.Create(tap.Options{Name: "qmcp3", CIDR: "198.51.100.1/24", Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	if second.Index == first.Index {
		t.Errorf("Replace kept the old device (index %d)", first.Index)
	}

	// A link that is not a TAP is never replaced.
	addDummy(t, "qmcp4")
	if _, err := tap.Create(tap.Options{Name: "qmcp4", CIDR: "192.0.2.1/24"}); !errors.Is(err, tap.ErrExists) {
		t.Errorf("Create over a dummy: %v, want ErrExists", err)
	}
	if _, err := tap.Create(tap.Options{Name: "qmcp4", CIDR: "192.0.2.1/24", Replace: true}); !errors.Is(err, tap.ErrNotTAP) {
		t.Errorf("Create over a dummy with Replace: %v, want ErrNotTAP", err)
	}
	if !isDummy(mustLink(t, "qmcp4")) {
		t.Errorf("the dummy link was replaced")
	}
}

func TestDelete(t *testing.T) {
	taptest.Require(t)
	if err := tap.Delete("qmcp404"); err != nil {
		t.Errorf("Delete of a missing link: %v, want nil", err)
	}
	dev, err := tap.Create(tap.Options{Name: "qmcp5", CIDR: "192.0.2.1/24"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tap.Delete(dev.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(dev.Name); err == nil {
		t.Errorf("%s still exists after Delete", dev.Name)
	}
}

func TestDeleteIfTAP(t *testing.T) {
	taptest.Require(t)
	if deleted, err := tap.DeleteIfTAP("qmcp404"); deleted || err != nil {
		t.Errorf("DeleteIfTAP of a missing link = %v, %v; want false, nil", deleted, err)
	}

	// Someone else's link under a name that looks like ours stays.
	addDummy(t, "qmcp6")
	deleted, err := tap.DeleteIfTAP("qmcp6")
	if deleted || !errors.Is(err, tap.ErrNotTAP) {
		t.Errorf("DeleteIfTAP of a dummy = %v, %v; want false, ErrNotTAP", deleted, err)
	}
	if !isDummy(mustLink(t, "qmcp6")) {
		t.Errorf("the dummy link is gone")
	}

	dev, err := tap.Create(tap.Options{Name: "qmcp7", CIDR: "192.0.2.1/24"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Delete(dev.Name) })
	deleted, err = tap.DeleteIfTAP(dev.Name)
	if !deleted || err != nil {
		t.Errorf("DeleteIfTAP of a TAP = %v, %v; want true, nil", deleted, err)
	}
	if _, err := netlink.LinkByName(dev.Name); err == nil {
		t.Errorf("%s still exists after DeleteIfTAP", dev.Name)
	}
}

func TestBridge(t *testing.T) {
	taptest.Require(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "qmcpbr0"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(br) })
	brLink := mustLink(t, "qmcpbr0")

	dev, err := tap.Create(tap.Options{Name: "qmcp8", Bridge: "qmcpbr0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	if dev.Bridge != "qmcpbr0" || dev.CIDR != "" {
		t.Errorf("device = %+v", dev)
	}
	link := mustLink(t, "qmcp8")
	if link.Attrs().MasterIndex != brLink.Attrs().Index {
		t.Errorf("master index = %d, want the bridge's %d", link.Attrs().MasterIndex, brLink.Attrs().Index)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("not up")
	}
	if addrs, _ := netlink.AddrList(link, netlink.FAMILY_ALL); len(addrs) != 0 {
		t.Errorf("a bridge port got addresses: %v", addrs)
	}

	// A missing bridge, or a link that is not one, fails before a TAP is
	// made, and leaves none behind.
	addDummy(t, "qmcpdum")
	for _, bridge := range []string{"qmcpnobr", "qmcpdum"} {
		if _, err := tap.Create(tap.Options{Name: "qmcp9", Bridge: bridge}); err == nil {
			t.Errorf("Create with bridge %s succeeded", bridge)
		} else {
			t.Logf("bridge %s: %v", bridge, err)
		}
		if _, err := netlink.LinkByName("qmcp9"); err == nil {
			t.Errorf("a failed Create (bridge %s) left qmcp9 behind", bridge)
			tap.Delete("qmcp9")
		}
	}
}

// A failure after the device exists removes the device again.
func TestCreateCleansUp(t *testing.T) {
	taptest.Require(t)
	injected := errors.New("injected failure")
	tap.SetAfterConfigure(t, func(name string) error {
		if _, err := netlink.LinkByName(name); err != nil {
			t.Errorf("hook: %s does not exist: %v", name, err)
		}
		return injected
	})
	_, err := tap.Create(tap.Options{Name: "qmcp10", CIDR: "192.0.2.1/24"})
	if !errors.Is(err, injected) {
		t.Fatalf("Create = %v, want the injected error", err)
	}
	if _, err := netlink.LinkByName("qmcp10"); err == nil {
		tap.Delete("qmcp10")
		t.Errorf("failed Create left qmcp10 behind")
	}
}

const helperEnv = "QMCP_TAP_UNPRIVILEGED_HELPER"

// TestNoPrivilege runs TestUnprivilegedHelper as nobody (uid 65534), in
// this namespace, from a copy of the test binary nobody may execute.
func TestNoPrivilege(t *testing.T) {
	taptest.Require(t)
	addDummy(t, "qmcpnopriv")

	// go test's build directory is private to root: copy the binary to a
	// directory nobody can read.
	dir := testusers.Shared(t)
	bin := testusers.Binary(t, dir)

	cmd := exec.Command(bin, "-test.run=^TestUnprivilegedHelper$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	// Without the namespace marker: the helper must not try to be a
	// namespace test (it could not read /proc/1/ns/net as nobody).
	cmd.Env = []string{helperEnv + "=1", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	out, err := runTimeout(cmd, 60*time.Second)
	t.Logf("helper output:\n%s", out)
	if err != nil {
		t.Fatalf("helper failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestUnprivilegedHelper") {
		t.Fatalf("helper did not run (skipped?)")
	}
	if !isDummy(mustLink(t, "qmcpnopriv")) {
		t.Errorf("the unprivileged helper changed qmcpnopriv")
	}
}

// TestUnprivilegedHelper is TestNoPrivilege's other half; it does nothing
// unless started by it.
func TestUnprivilegedHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("only run as nobody by TestNoPrivilege")
	}
	if os.Geteuid() == 0 {
		t.Fatal("helper runs as root")
	}
	check := func(what string, err error) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if !errors.Is(err, tap.ErrNoPrivilege) {
			t.Errorf("%s: error %v does not wrap ErrNoPrivilege", what, err)
			return
		}
		msg := err.Error()
		for _, want := range []string{"CAP_NET_ADMIN", "root", `network: "user"`} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not mention %s", what, msg, want)
			}
		}
	}
	_, err := tap.Create(tap.Options{Name: "qmcpnobody", CIDR: "192.0.2.1/24"})
	check("Create", err)
	if err != nil && !strings.Contains(err.Error(), "/dev/net/tun") {
		t.Errorf("Create: error does not mention /dev/net/tun: %v", err)
	}
	// Netlink's EPERM, on a link that exists (made by TestNoPrivilege).
	check("Delete", tap.Delete("qmcpnopriv"))
	_, err = tap.Create(tap.Options{Name: "qmcpnopriv", Replace: true})
	if !errors.Is(err, tap.ErrNotTAP) {
		t.Errorf("Create over the dummy: %v, want ErrNotTAP", err)
	}
	// Looking up a missing link needs no privilege: still nil.
	if err := tap.Delete("qmcp404"); err != nil {
		t.Errorf("Delete of a missing link: %v", err)
	}
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l
}

// addDummy adds a link called name that is not a TAP: a dummy where the
// kernel has the dummy driver, a veth pair otherwise (some VM kernels have
// no dummy).
func addDummy(t *testing.T, name string) {
	t.Helper()
	var l netlink.Link = &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}
	err := netlink.LinkAdd(l)
	if errors.Is(err, unix.EOPNOTSUPP) {
		l = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
		err = netlink.LinkAdd(l)
	}
	if err != nil {
		t.Fatalf("add a non-TAP link %s: %v", name, err)
	}
	t.Cleanup(func() { netlink.LinkDel(l) })
}

// isDummy reports whether l is what addDummy makes.
func isDummy(l netlink.Link) bool {
	switch l.(type) {
	case *netlink.Dummy, *netlink.Veth:
		return true
	}
	return false
}

func readSys(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// runTimeout runs cmd and kills it (that process only) after d.
func runTimeout(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	timer.Stop()
	return []byte(buf.String()), err
}
