package pcap_test

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/pcap"
)

// filterCases: expression and the sample names it must select.
var filterCases = []struct {
	expr string
	want []string
}{
	{"arp", []string{"arp request", "arp reply"}},
	{"icmp", []string{"icmp echo request", "icmp echo reply"}},
	{"icmp6", []string{"icmp6 neighbor solicitation", "icmp6 echo"}},
	{"ip6", []string{"icmp6 neighbor solicitation", "icmp6 echo", "udp6"}},
	{"tcp", []string{"tcp syn", "tcp data"}},
	{"udp", []string{"dhcp discover", "dns query", "dns answer", "udp other", "tftp rrq", "udp6"}},
	{"ip", []string{"icmp echo request", "icmp echo reply", "dhcp discover", "dns query", "dns answer", "udp other", "tcp syn", "tcp data", "tftp rrq"}},
	{"port 53", []string{"dns query", "dns answer"}},
	{"udp port 67", []string{"dhcp discover"}},
	{"tcp port 53", nil},
	{"port 67 or 68", []string{"dhcp discover"}},
	{"src port 53", []string{"dns answer"}},
	{"dst port 53", []string{"dns query"}},
	{"tcp dst port 80", []string{"tcp syn"}},
	{"port 5000 or 9", []string{"udp other", "udp6"}},
	{"host 192.0.2.1", []string{"arp request", "arp reply", "icmp echo request", "icmp echo reply", "dns query", "dns answer", "tcp syn", "tcp data", "tftp rrq"}},
	{"src host 192.0.2.15", []string{"arp request", "icmp echo request", "dns query", "udp other", "tcp syn", "tftp rrq"}},
	{"dst 192.0.2.15", []string{"arp reply", "icmp echo reply", "dns answer", "tcp data"}},
	{"arp host 192.0.2.1", []string{"arp request", "arp reply"}},
	{"ip host 192.0.2.1 and not tcp", []string{"icmp echo request", "icmp echo reply", "dns query", "dns answer", "tftp rrq"}},
	{"net 198.51.100.0/24", []string{"udp other"}},
	{"dst net 192.0.2.0/24 and udp", []string{"dns query", "dns answer", "tftp rrq"}},
	{"host 2001:db8::1", []string{"icmp6 echo", "udp6"}},
	{"ip6 src host 2001:db8::2", []string{"icmp6 neighbor solicitation", "icmp6 echo"}},
	{"ether host 02:00:5e:00:53:01", []string{"arp reply", "icmp echo request", "icmp echo reply", "dns query", "dns answer", "udp other", "tcp syn", "tcp data", "tftp rrq", "icmp6 echo", "udp6"}},
	{"ether src 02:00:5e:00:53:01", []string{"arp reply", "icmp echo reply", "dns answer", "tcp data", "udp6"}},
	{"ether dst ff:ff:ff:ff:ff:ff", []string{"arp request", "dhcp discover", "other ethertype"}},
	{"broadcast", []string{"arp request", "dhcp discover", "other ethertype"}},
	{"ether multicast", []string{"arp request", "dhcp discover", "icmp6 neighbor solicitation", "other ethertype"}},
	{"not ip and not ip6", []string{"arp request", "arp reply", "other ethertype"}},
	{"!arp && !ip && !ip6", []string{"other ethertype"}},
	{"icmp or arp", []string{"arp request", "arp reply", "icmp echo request", "icmp echo reply"}},
	// and/or: equal precedence, left to right, as tcpdump: (arp or icmp) and dst 192.0.2.1
	{"arp or icmp and dst 192.0.2.1", []string{"arp request", "icmp echo request"}},
	{"arp or (icmp and dst 192.0.2.1)", []string{"arp request", "arp reply", "icmp echo request"}},
	{"not (arp or ip or ip6)", []string{"other ethertype"}},
	{"udp || tcp && port 80", []string{"tcp syn", "tcp data"}},
	{"host 192.0.2.1 and not 192.0.2.15", nil},
	{"port 53 and not 40000", nil},
	{"PORT 53 AND SRC 192.0.2.1", []string{"dns answer"}},
}

func TestFilter(t *testing.T) {
	ss := samples(t)
	for _, tc := range filterCases {
		f, err := pcap.Compile(tc.expr)
		if err != nil {
			t.Errorf("Compile(%q): %v", tc.expr, err)
			continue
		}
		if f.String() != tc.expr {
			t.Errorf("String() = %q", f.String())
		}
		var got []string
		for _, s := range ss {
			if f.Match(s.data) {
				got = append(got, s.name)
			}
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q selects %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestFilterAgreesWithTcpdump gives the same expressions to tcpdump over the
// same frames: the subset must mean what it means there.
func TestFilterAgreesWithTcpdump(t *testing.T) {
	tcpdump := lookTcpdump(t)
	ss := samples(t)
	path := filepath.Join(t.TempDir(), "samples.pcap")
	writeSamples(t, path, ss)
	for _, tc := range filterCases {
		if strings.ToUpper(tc.expr) == tc.expr {
			continue // tcpdump wants lower case keywords
		}
		got, err := tcpdumpSelects(tcpdump, path, tc.expr, ss)
		if err != nil {
			t.Errorf("tcpdump %q: %v", tc.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("tcpdump: %q selects %q, we want %q", tc.expr, got, tc.want)
		}
	}
}

func TestFilterErrors(t *testing.T) {
	for _, expr := range []string{
		"foo", "port", "port x", "port 70000", "port domain", "host example.com", "host", "(arp", "arp)", "arp and",
		"and arp", "not", "vlan", "portrange 1-100", "greater 100", "tcp host 192.0.2.1", "ip port 53",
		"ether", "ether host 192.0.2.1", "ip6 host 192.0.2.1", "ip host 2001:db8::1", "net 192.0.2.1/24",
		"net 192.0.2.0", "src or dst host 192.0.2.1", "arp & ip", "arp | ip", "ip broadcast", "icmp src 192.0.2.1",
		"ip 192.0.2.1", "192.0.2.1", "192.0.2.1 and icmp", "host 192.0.2.1 192.0.2.2", "()", "udp port tcp",
	} {
		f, err := pcap.Compile(expr)
		if err == nil {
			t.Errorf("Compile(%q) = %v, want an error", expr, f)
			continue
		}
		if !errors.Is(err, pcap.ErrBadFilter) {
			t.Errorf("Compile(%q): %v does not wrap ErrBadFilter", expr, err)
		}
		if !strings.Contains(err.Error(), "supported: ") || !strings.Contains(err.Error(), "port N") {
			t.Errorf("Compile(%q): error does not list what is supported: %v", expr, err)
		}
	}
	_, err := pcap.Compile("vlan 10")
	t.Logf("example error: %v", err)

	// Empty: no filter, everything passes.
	f, err := pcap.Compile("  ")
	if f != nil || err != nil || !f.Match([]byte{1}) {
		t.Errorf("Compile(blank) = %v, %v", f, err)
	}
}

// tcpdumpSelects runs tcpdump with the filter over the samples file and
// names the samples it printed, found by their timestamps (writeSamples
// puts them 1 ms apart).
func tcpdumpSelects(tcpdump, path, expr string, ss []sample) ([]string, error) {
	out, err := exec.Command(tcpdump, "-nn", "-tt", "-r", path, expr).Output()
	if err != nil {
		return nil, err
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" || line[0] == '\t' || line[0] == ' ' {
			continue // empty, or a hex dump tcpdump adds to frames it cannot decode
		}
		stamp, _, _ := strings.Cut(line, " ")
		_, frac, ok := strings.Cut(stamp, ".")
		usec, err := strconv.Atoi(frac)
		if !ok || err != nil || (usec-123456)%1000 != 0 {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		i := (usec - 123456) / 1000
		if i < 0 || i >= len(ss) {
			return nil, fmt.Errorf("line %q: no such sample", line)
		}
		got = append(got, ss[i].name)
	}
	return got, nil
}

func lookTcpdump(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tcpdump")
	if err != nil {
		t.Skip("tcpdump is not installed (apt-get install tcpdump): no outside reader to compare with")
	}
	return p
}
