package pcap_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gopacket/gopacket/layers"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/taptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/tap"
	"golang.org/x/sys/unix"
)

// Tests that capture run in the private network namespace taptest.Main
// makes (the whole test binary is re-run in it), so QEMU started from here
// finds the TAP, and nothing reaches the host's links.
func TestMain(m *testing.M) { taptest.Main(m) }

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		ifname string
		opts   pcap.Options
		is     error
		want   string
	}{
		{"lo", pcap.Options{Dir: dir, Filter: "vlan 1"}, pcap.ErrBadFilter, "supported"},
		{"lo", pcap.Options{Dir: dir, Snaplen: -1}, nil, "snap length"},
		{"lo", pcap.Options{Dir: dir, Snaplen: pcap.MaxSnaplen + 1}, nil, "snap length"},
		{"lo", pcap.Options{}, nil, "neither"},
		{"qmcpnosuch0", pcap.Options{Dir: dir}, pcap.ErrNoInterface, "qmcpnosuch0"},
	} {
		c, err := pcap.Start(tc.ifname, tc.opts)
		if err == nil {
			c.Stop()
			t.Errorf("Start(%s, %+v) succeeded", tc.ifname, tc.opts)
			continue
		}
		if (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%s, %+v) = %v; want %v, %q", tc.ifname, tc.opts, err, tc.is, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed Starts left files: %v", entries)
	}
}

var otherHost = net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x53, 0x99} // nobody's MAC: the host's stack ignores these frames

// injected are frames "from the guest" that the host's stack drops
// (addressed to another MAC), so the host sends nothing back and the
// counts are exact: three 1042-byte UDP frames to port 9 and two ARP
// requests.
func injected(t *testing.T) [][]byte {
	arp := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: guestMAC, SourceProtAddress: guestIP, DstHwAddress: make([]byte, 6),
		DstProtAddress: net.IPv4(192, 0, 2, 99).To4()}
	udp := serialize(t, eth(guestMAC, otherHost, layers.EthernetTypeIPv4), ip4(guestIP, net.IPv4(192, 0, 2, 99).To4(), layers.IPProtocolUDP),
		&layers.UDP{SrcPort: 40000, DstPort: 9}, payload(1000))
	a := serialize(t, eth(guestMAC, otherHost, layers.EthernetTypeARP), arp)
	return [][]byte{udp, a[:42], udp, a[:42], udp} // ARP without the Ethernet padding gopacket adds
}

// attach opens the TAP's guest side, as QEMU does.
func attach(t *testing.T, name string) *os.File {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
		unix.Close(fd)
		t.Fatalf("attach to %s: %v", name, errno)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	t.Cleanup(func() { f.Close() })
	return f
}

// hostTAP creates a TAP with the host's end at 192.0.2.1/24, closed when
// the test ends.
func hostTAP(t *testing.T) *tap.Device {
	t.Helper()
	dev, err := tap.Create(tap.Options{CIDR: "192.0.2.1/24"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// startCapture starts a capture on ifname, stopped when the test ends if
// the test has not stopped it.
func startCapture(t *testing.T, ifname string, opts pcap.Options) *pcap.Capture {
	t.Helper()
	c, err := pcap.Start(ifname, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

func TestCaptureInjected(t *testing.T) {
	taptest.Require(t)
	dev := hostTAP(t)
	guest := attach(t, dev.Name)

	dir := filepath.Join(t.TempDir(), "captures")
	all := startCapture(t, dev.Name, pcap.Options{Dir: dir, Boot: 3, Snaplen: 128})
	udpPath := filepath.Join(t.TempDir(), "udp.pcap")
	udp := startCapture(t, dev.Name, pcap.Options{Path: udpPath, Filter: "udp and port 9"})
	arp := startCapture(t, dev.Name, pcap.Options{Dir: dir, Prefix: "arp", Filter: "arp"})

	if !regexp.MustCompile(`^`+dev.Name+`-3-\d{8}T\d{6}\.\d{6}Z\.pcap$`).MatchString(filepath.Base(all.Path())) || filepath.Dir(all.Path()) != dir {
		t.Errorf("capture file %s", all.Path())
	}
	if !strings.HasPrefix(filepath.Base(arp.Path()), "arp-") || udp.Path() != udpPath {
		t.Errorf("capture files %s, %s", arp.Path(), udp.Path())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("capture directory: %v, %v; want mode 0700", fi.Mode(), err)
	}

	frames := injected(t)
	for _, f := range frames {
		if _, err := guest.Write(f); err != nil {
			t.Fatal(err)
		}
	}

	// Live: the counters and the file show the packets while the capture
	// runs (one write per packet).
	deadline := time.Now().Add(5 * time.Second)
	for all.Stats().Packets < 5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	sums, _, err := pcap.ReadSummaries(all.Path(), 1, 0)
	if err != nil || len(sums) != 5 {
		t.Fatalf("while running: %d summaries (%v), want 5", len(sums), err)
	}
	for i, s := range sums {
		wantLen, wantCap := 1042, 128
		if i%2 == 1 {
			wantLen, wantCap = 42, 42
		}
		if s.Len != wantLen || s.CapLen != wantCap {
			t.Errorf("packet %d: len %d caplen %d, want %d %d (%s)", s.Index, s.Len, s.CapLen, wantLen, wantCap, s.Text)
		}
	}
	if !strings.Contains(sums[0].Text, "IP 192.0.2.15.40000 > 192.0.2.99.9: UDP, length 1000") ||
		!strings.Contains(sums[1].Text, "ARP, Request who-has 192.0.2.99 tell 192.0.2.15, length 28") {
		t.Errorf("summaries:\n%s\n%s", sums[0].Text, sums[1].Text)
	}

	for _, c := range []struct {
		c                         *pcap.Capture
		packets, filtered, nbytes int64
	}{
		{all, 5, 0, 3*128 + 2*42},
		{udp, 3, 2, 3 * 1042},
		{arp, 2, 3, 2 * 42},
	} {
		st, err := c.c.Stop()
		if err != nil {
			t.Errorf("Stop %s: %v", c.c.Path(), err)
		}
		if st.Packets != c.packets || st.Filtered != c.filtered || st.Bytes != c.nbytes || st.Drops != 0 || st.Path != c.c.Path() || st.Interface != dev.Name {
			t.Errorf("%s: stats %+v; want %d packets, %d filtered, %d bytes", c.c.Path(), st, c.packets, c.filtered, c.nbytes)
		}
		if st.Stopped.IsZero() || st.Stopped.Before(st.Started) {
			t.Errorf("times %v .. %v", st.Started, st.Stopped)
		}
		again, err2 := c.c.Stop()
		if again != st || err2 != err {
			t.Errorf("second Stop: %+v, %v", again, err2)
		}
		select {
		case <-c.c.Done():
		default:
			t.Errorf("Done not closed after Stop")
		}
		if fi, err := os.Stat(c.c.Path()); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("capture file after Stop: %v %v", fi, err)
		}
	}
	if st := udp.Stats(); st.Filter != "udp and port 9" || st.Snaplen != pcap.DefaultSnaplen {
		t.Errorf("stats %+v", st)
	}

	// The outside reader agrees.
	if tcpdump, err := exec.LookPath("tcpdump"); err == nil {
		out, err := exec.Command(tcpdump, "-nn", "-r", udp.Path()).Output()
		if err != nil {
			t.Fatal(err)
		}
		if lines := tcpdumpLines(string(out)); len(lines) != 3 {
			t.Errorf("tcpdump reads %d packets from %s, want 3:\n%s", len(lines), udp.Path(), out)
		}
	}

	// A capture never overwrites a file.
	if _, err := pcap.Start(dev.Name, pcap.Options{Path: udpPath}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("Start over an existing file: %v", err)
	}

	// Stop right after the traffic: what the kernel had queued is still
	// written.
	quick, err := pcap.Start(dev.Name, pcap.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if _, err := guest.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	st, err := quick.Stop()
	if err != nil || st.Packets != 5 {
		t.Errorf("immediate Stop: %+v, %v; want 5 packets", st, err)
	}
	if sums, _, err := pcap.ReadSummaries(quick.Path(), 1, 0); err != nil || len(sums) != 5 {
		t.Errorf("after immediate Stop: %d packets in the file (%v), want 5", len(sums), err)
	}
}

const helperEnv = "QMCP_PCAP_UNPRIVILEGED_HELPER"

// TestNoPrivilege runs TestUnprivilegedHelper as nobody (uid 65534).
func TestNoPrivilege(t *testing.T) {
	taptest.Require(t)
	// go test's build directory is private to root: the binary is
	// copied where nobody can run it, and nobody writes its captures.
	dir := testusers.Shared(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	bin := testusers.Binary(t, dir)
	cmd := exec.Command(bin, "-test.run=^TestUnprivilegedHelper$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = []string{helperEnv + "=" + dir, "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	timer.Stop()
	t.Logf("helper output:\n%s", buf.String())
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if !strings.Contains(buf.String(), "--- PASS: TestUnprivilegedHelper") {
		t.Fatal("helper did not run")
	}
}

func TestUnprivilegedHelper(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("only run as nobody by TestNoPrivilege")
	}
	c, err := pcap.Start("lo", pcap.Options{Dir: filepath.Join(dir, "captures")})
	if err == nil {
		c.Stop()
		t.Fatal("Start succeeded without privileges")
	}
	t.Logf("Start: %v", err)
	if !errors.Is(err, pcap.ErrNoPrivilege) || !strings.Contains(err.Error(), "CAP_NET_RAW") {
		t.Errorf("error %v does not wrap ErrNoPrivilege or name CAP_NET_RAW", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "captures")); err == nil {
		t.Errorf("a failed Start created the capture directory")
	}
}
