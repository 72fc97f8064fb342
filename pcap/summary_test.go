package pcap_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/pcap"
)

// wantText is the summary of each sample, without the timestamp.
var wantText = map[string]string{
	"arp request":                 "ARP, Request who-has 192.0.2.1 tell 192.0.2.15, length 46",
	"arp reply":                   "ARP, Reply 192.0.2.1 is-at 02:00:5e:00:53:01, length 46",
	"icmp echo request":           "IP 192.0.2.15 > 192.0.2.1: ICMP echo request, id 1, seq 0, length 64",
	"icmp echo reply":             "IP 192.0.2.1 > 192.0.2.15: ICMP echo reply, id 1, seq 0, length 64",
	"dhcp discover":               "IP 0.0.0.0.68 > 255.255.255.255.67: BOOTP/DHCP, Request from 52:54:00:00:00:0f, length 246, xid 0x1234, DHCP Discover",
	"dns query":                   "IP 192.0.2.15.40000 > 192.0.2.1.53: 4660+ A? example.com. (29)",
	"dns answer":                  "IP 192.0.2.1.53 > 192.0.2.15.40000: 4660 1/0/0 A 192.0.2.7 (56)",
	"udp other":                   "IP 192.0.2.15.12345 > 198.51.100.7.9: UDP, length 100",
	"tcp syn":                     "IP 192.0.2.15.40001 > 192.0.2.1.80: Flags [S], seq 1000, win 64240, length 0",
	"tcp data":                    "IP 192.0.2.1.80 > 192.0.2.15.40001: Flags [P.], seq 5000:5010, ack 1001, win 502, length 10",
	"tftp rrq":                    `IP 192.0.2.15.1024 > 192.0.2.1.69: TFTP, length 19, RRQ "kernel.bin" octet`,
	"icmp6 neighbor solicitation": "IP6 2001:db8::2 > ff02::1:ff00:1: ICMP6, neighbor solicitation, who has 2001:db8::1, length 24",
	"icmp6 echo":                  "IP6 2001:db8::2 > 2001:db8::1: ICMP6, echo request, id 9, seq 1, length 16",
	"udp6":                        "IP6 2001:db8::1.5000 > 2001:db8::2.9: UDP, length 20",
	"other ethertype":             "52:54:00:00:00:0f > ff:ff:ff:ff:ff:ff, ethertype Unknown (0x88b5), length 106",
}

func TestReadSummaries(t *testing.T) {
	ss := samples(t)
	path := filepath.Join(t.TempDir(), "samples.pcap")
	writeSamples(t, path, ss)

	sums, next, err := pcap.ReadSummaries(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != len(ss) || next != len(ss)+1 {
		t.Fatalf("got %d summaries, next %d; want %d, %d", len(sums), next, len(ss), len(ss)+1)
	}
	for i, s := range sums {
		name := ss[i].name
		if s.Index != i+1 || s.Len != len(ss[i].data) || s.CapLen != s.Len {
			t.Errorf("%s: index %d, len %d, caplen %d", name, s.Index, s.Len, s.CapLen)
		}
		stamp := s.Time.Local().Format("15:04:05.000000")
		text, ok := strings.CutPrefix(s.Text, stamp+" ")
		if !ok {
			t.Errorf("%s: %q does not start with the time %s", name, s.Text, stamp)
		}
		if text != wantText[name] {
			t.Errorf("%s:\n got %s\nwant %s", name, text, wantText[name])
		}
	}
	check := func(i int, proto, src, dst string, sport, dport int) {
		t.Helper()
		s := sums[i]
		if s.Proto != proto || s.Src != src || s.Dst != dst || s.SrcPort != sport || s.DstPort != dport {
			t.Errorf("%s: proto %s src %s:%d dst %s:%d; want %s %s:%d %s:%d", ss[i].name, s.Proto, s.Src, s.SrcPort, s.Dst, s.DstPort, proto, src, sport, dst, dport)
		}
	}
	check(0, "ARP", "192.0.2.15", "192.0.2.1", 0, 0)
	check(2, "ICMP", "192.0.2.15", "192.0.2.1", 0, 0)
	check(4, "DHCP", "0.0.0.0", "255.255.255.255", 68, 67)
	check(5, "DNS", "192.0.2.15", "192.0.2.1", 40000, 53)
	check(7, "UDP", "192.0.2.15", "198.51.100.7", 12345, 9)
	check(8, "TCP", "192.0.2.15", "192.0.2.1", 40001, 80)
	check(10, "TFTP", "192.0.2.15", "192.0.2.1", 1024, 69)
	check(12, "ICMP6", "2001:db8::2", "2001:db8::1", 0, 0)
	check(14, "Ethernet", "52:54:00:00:00:0f", "ff:ff:ff:ff:ff:ff", 0, 0)
	if sums[0].SrcMAC != "52:54:00:00:00:0f" || sums[0].DstMAC != "ff:ff:ff:ff:ff:ff" {
		t.Errorf("MACs %s > %s", sums[0].SrcMAC, sums[0].DstMAC)
	}

	// The outside reader prints the same lines.
	tcpdump := lookTcpdump(t)
	out, err := exec.Command(tcpdump, "-nn", "-S", "-r", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := tcpdumpLines(string(out))
	if len(lines) != len(ss) {
		t.Fatalf("tcpdump printed %d packets, want %d:\n%s", len(lines), len(ss), out)
	}
	// Where one says more (tcpdump: ": HTTP" after a TCP segment, a hex
	// dump; ours: the DHCP message type), the other is a prefix of it.
	for i, s := range sums {
		if !strings.HasPrefix(s.Text, lines[i]) && !strings.HasPrefix(lines[i], s.Text) {
			t.Errorf("%s:\n    ours %s\ntcpdump %s", ss[i].name, s.Text, lines[i])
		}
	}
}

// tcpdumpLines drops the hex dumps tcpdump adds for frames it cannot decode.
func tcpdumpLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && l[0] != '\t' && l[0] != ' ' {
			lines = append(lines, l)
		}
	}
	return lines
}

func TestReadSummariesCursor(t *testing.T) {
	ss := samples(t)
	path := filepath.Join(t.TempDir(), "samples.pcap")
	writeSamples(t, path, ss)

	var all []pcap.Summary
	from := 1
	for calls := 0; ; calls++ {
		if calls > len(ss) {
			t.Fatal("the cursor does not advance")
		}
		sums, next, err := pcap.ReadSummaries(path, from, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(sums) > 4 {
			t.Fatalf("max 4, got %d", len(sums))
		}
		if len(sums) == 0 {
			if next != from {
				t.Errorf("at the end: next %d, want from %d", next, from)
			}
			break
		}
		if sums[0].Index != from || next != sums[len(sums)-1].Index+1 {
			t.Errorf("from %d: first index %d, next %d", from, sums[0].Index, next)
		}
		all = append(all, sums...)
		from = next
	}
	if len(all) != len(ss) {
		t.Errorf("paged through %d packets, want %d", len(all), len(ss))
	}
	sums, next, err := pcap.ReadSummaries(path, 3, 1)
	if err != nil || len(sums) != 1 || sums[0].Index != 3 || next != 4 || !strings.Contains(sums[0].Text, "echo request") {
		t.Errorf("ReadSummaries(3, 1) = %+v, %d, %v", sums, next, err)
	}
	if _, _, err := pcap.ReadSummaries(filepath.Join(t.TempDir(), "missing.pcap"), 1, 1); err == nil {
		t.Errorf("no error for a missing file")
	}
	notPcap := filepath.Join(t.TempDir(), "not.pcap")
	os.WriteFile(notPcap, []byte(strings.Repeat("not a pcap file ", 4)), 0o600)
	if _, _, err := pcap.ReadSummaries(notPcap, 1, 1); err == nil {
		t.Errorf("no error for a file that is not pcap")
	}
}

// A file being written ends anywhere: in its header, or inside a record.
// Every prefix of a file must read as the packets complete in it, without
// error.
func TestReadSummariesTruncated(t *testing.T) {
	ss := samples(t)[:3]
	dir := t.TempDir()
	full := filepath.Join(dir, "full.pcap")
	writeSamples(t, full, ss)
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	// Record boundaries: 24-byte file header, then 16-byte record headers.
	ends := []int{}
	off := 24
	for _, s := range ss {
		off += 16 + len(s.data)
		ends = append(ends, off)
	}
	cut := filepath.Join(dir, "cut.pcap")
	for n := 0; n <= len(data); n++ {
		if err := os.WriteFile(cut, data[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		sums, next, err := pcap.ReadSummaries(cut, 1, 0)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		want := 0
		for _, e := range ends {
			if n >= e {
				want++
			}
		}
		if len(sums) != want || next != want+1 {
			t.Fatalf("%d bytes: %d packets, next %d; want %d", n, len(sums), next, want)
		}
	}
}
