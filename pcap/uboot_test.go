package pcap_test

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/taptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/pcap"
)

const ubootImage = "/usr/lib/u-boot/qemu-riscv64_smode/u-boot.bin"

// console is a guest's serial console on QEMU's stdio.
type console struct {
	t  *testing.T
	in io.Writer

	mu   sync.Mutex
	out  bytes.Buffer
	seen int // output before this offset has been matched already
}

func (c *console) collect(r io.Reader) {
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		c.mu.Lock()
		c.out.Write(buf[:n])
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// waitFor waits for s in the output after what earlier waits matched.
func (c *console) waitFor(s string, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		out := c.out.String()
		c.mu.Unlock()
		if i := strings.Index(out[c.seen:], s); i >= 0 {
			c.seen += i + len(s)
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no %q on the console within %v; output:\n%s", s, timeout, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *console) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, s); err != nil {
		c.t.Fatalf("console: %v", err)
	}
}

// TestCaptureUBootPing boots Debian's U-Boot on a TAP in the test's
// namespace, has it ping the host, and checks what three captures (all,
// "icmp", "arp") and tcpdump make of the traffic.
func TestCaptureUBootPing(t *testing.T) {
	taptest.Require(t)
	qemu := testguest.QEMU(t)
	if _, err := os.Stat(ubootImage); err != nil {
		t.Skipf("no U-Boot image (apt-get install u-boot-qemu): %v", err)
	}

	dev := hostTAP(t)

	dir := filepath.Join(t.TempDir(), "captures")
	all := startCapture(t, dev.Name, pcap.Options{Dir: dir, Boot: 1})
	icmp := startCapture(t, dev.Name, pcap.Options{Dir: dir, Prefix: "icmp", Filter: "icmp"})
	arp := startCapture(t, dev.Name, pcap.Options{Dir: dir, Prefix: "arp", Filter: "arp"})

	// The whole test process is in the namespace, so QEMU is too.
	cmd := exec.Command(qemu, "-M", "virt", "-m", "256M", "-display", "none", "-nodefaults",
		"-bios", "default", "-kernel", ubootImage,
		"-netdev", "tap,id=n0,ifname="+dev.Name+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0,mac="+dev.GuestMAC.String(),
		"-serial", "stdio")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, stdout := testguest.StartPiped(t, cmd, "QEMU")
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill() // this QEMU only
		<-exited
	})
	con := &console{t: t, in: stdin}
	go con.collect(stdout)

	start := time.Now()
	// Stop autoboot at once, before U-Boot tries BOOTP.
	con.waitFor("Hit any key to stop autoboot", 30*time.Second)
	con.send(" ")
	con.waitFor("=> ", 10*time.Second)
	con.send("setenv ipaddr 192.0.2.15; ping 192.0.2.1\r")
	con.waitFor("host 192.0.2.1 is alive", 20*time.Second)
	t.Logf("U-Boot pinged the host %v after QEMU started", time.Since(start).Round(time.Millisecond))

	stop := func(name string, c *pcap.Capture) pcap.Stats {
		t.Helper()
		st, err := c.Stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %+v", name, st)
		return st
	}
	stAll, stICMP, stARP := stop("all", all), stop("icmp", icmp), stop("arp", arp)

	sums, next, err := pcap.ReadSummaries(all.Path(), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(sums)) != stAll.Packets || next != len(sums)+1 {
		t.Errorf("read %d packets (next %d), the capture wrote %d", len(sums), next, stAll.Packets)
	}
	for _, s := range sums {
		t.Logf("#%d %s", s.Index, s.Text)
	}
	guest := dev.GuestMAC.String()
	for _, want := range []struct {
		text, proto, src, dst, srcMAC string
	}{
		{"ARP, Request who-has 192.0.2.1 tell 192.0.2.15, length ", "ARP", "192.0.2.15", "192.0.2.1", guest},
		{"ARP, Reply 192.0.2.1 is-at " + dev.MAC.String() + ", length ", "ARP", "192.0.2.1", "192.0.2.15", dev.MAC.String()},
		{"IP 192.0.2.15 > 192.0.2.1: ICMP echo request, id ", "ICMP", "192.0.2.15", "192.0.2.1", guest},
		{"IP 192.0.2.1 > 192.0.2.15: ICMP echo reply, id ", "ICMP", "192.0.2.1", "192.0.2.15", dev.MAC.String()},
	} {
		found := false
		for _, s := range sums {
			if strings.Contains(s.Text, want.text) {
				found = true
				if s.Proto != want.proto || s.Src != want.src || s.Dst != want.dst || s.SrcMAC != want.srcMAC {
					t.Errorf("%s: proto %s, %s > %s, from %s", s.Text, s.Proto, s.Src, s.Dst, s.SrcMAC)
				}
				break
			}
		}
		if !found {
			t.Errorf("no %q in the capture", want.text)
		}
	}
	for _, s := range sums {
		if strings.HasPrefix(s.Proto, "IP6") || s.Proto == "ICMP6" {
			t.Errorf("IPv6 frame in the capture (the TAP should have IPv6 off): %s", s.Text)
		}
	}

	// The filtered captures hold exactly the matching packets of the full
	// one (same lines; the capture time is the same skb's timestamp, but
	// compare without it to be independent of that).
	for _, fc := range []struct {
		c     *pcap.Capture
		st    pcap.Stats
		proto string
	}{{icmp, stICMP, "ICMP"}, {arp, stARP, "ARP"}} {
		got, _, err := pcap.ReadSummaries(fc.c.Path(), 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var want, have []string
		for _, s := range sums {
			if s.Proto == fc.proto {
				want = append(want, untimed(s.Text))
			}
		}
		for _, s := range got {
			if s.Proto != fc.proto {
				t.Errorf("%s capture holds %s", fc.proto, s.Text)
			}
			have = append(have, untimed(s.Text))
		}
		sort.Strings(want)
		sort.Strings(have)
		if strings.Join(want, "\n") != strings.Join(have, "\n") {
			t.Errorf("%s capture:\n%s\nfull capture's %s packets:\n%s", fc.proto, strings.Join(have, "\n"), fc.proto, strings.Join(want, "\n"))
		}
		if len(have) < 2 {
			t.Errorf("%s capture has %d packets, want at least 2", fc.proto, len(have))
		}
		if fc.st.Packets+fc.st.Filtered != stAll.Packets {
			t.Errorf("%s capture: %d kept + %d filtered != %d in the full capture", fc.proto, fc.st.Packets, fc.st.Filtered, stAll.Packets)
		}
	}

	// The outside reader reads the same file and agrees, line for line on
	// ARP and ICMP.
	if tcpdump, err := exec.LookPath("tcpdump"); err == nil {
		out, err := exec.Command(tcpdump, "-nn", "-r", all.Path()).Output()
		if err != nil {
			t.Fatalf("tcpdump -r %s: %v", all.Path(), err)
		}
		tl := tcpdumpLines(string(out))
		if len(tl) != len(sums) {
			t.Errorf("tcpdump reads %d packets, we read %d:\n%s", len(tl), len(sums), out)
		} else {
			for i, s := range sums {
				if (s.Proto == "ARP" || s.Proto == "ICMP") && tl[i] != s.Text {
					t.Errorf("packet %d:\n    ours %s\ntcpdump %s", i+1, s.Text, tl[i])
				}
			}
		}
	} else {
		t.Log("tcpdump not installed: no outside check")
	}

	// Nothing removed the capture files.
	for _, p := range []string{all.Path(), icmp.Path(), arp.Path()} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("capture file: %v", err)
		}
	}
}

// untimed drops the leading timestamp of a summary line.
func untimed(s string) string {
	_, rest, _ := strings.Cut(s, " ")
	return rest
}
