package pcap_test

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// Test frames use documentation addresses only.
var (
	guestMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x0f}
	hostMAC  = net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x53, 0x01}
	bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	mcast6   = net.HardwareAddr{0x33, 0x33, 0xff, 0x00, 0x00, 0x01}

	hostIP  = net.IPv4(192, 0, 2, 1).To4()
	guestIP = net.IPv4(192, 0, 2, 15).To4()
	otherIP = net.IPv4(198, 51, 100, 7).To4()
	host6   = net.ParseIP("2001:db8::1")
	guest6  = net.ParseIP("2001:db8::2")
)

type sample struct {
	name string
	data []byte
}

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	for _, l := range ls {
		switch l := l.(type) {
		case *layers.UDP:
			for _, n := range ls {
				if nl, ok := n.(gopacket.NetworkLayer); ok {
					l.SetNetworkLayerForChecksum(nl)
				}
			}
		case *layers.TCP:
			for _, n := range ls {
				if nl, ok := n.(gopacket.NetworkLayer); ok {
					l.SetNetworkLayerForChecksum(nl)
				}
			}
		case *layers.ICMPv6:
			for _, n := range ls {
				if nl, ok := n.(gopacket.NetworkLayer); ok {
					l.SetNetworkLayerForChecksum(nl)
				}
			}
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func eth(src, dst net.HardwareAddr, typ layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: typ}
}

func ip4(src, dst net.IP, proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: 1, Protocol: proto, SrcIP: src, DstIP: dst}
}

func ip6(src, dst net.IP, next layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 255, NextHeader: next, SrcIP: src, DstIP: dst}
}

func payload(n int) gopacket.Payload {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i)
	}
	return p
}

// samples is a little of everything the summaries and the filter know.
func samples(t testing.TB) []sample {
	arpReq := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: guestMAC, SourceProtAddress: guestIP, DstHwAddress: make([]byte, 6), DstProtAddress: hostIP}
	arpRep := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPReply, SourceHwAddress: hostMAC, SourceProtAddress: hostIP, DstHwAddress: guestMAC, DstProtAddress: guestIP}

	dhcp := &layers.DHCPv4{Operation: layers.DHCPOpRequest, HardwareType: layers.LinkTypeEthernet, HardwareLen: 6, Xid: 0x1234,
		ClientHWAddr: guestMAC, Options: layers.DHCPOptions{
			layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(layers.DHCPMsgTypeDiscover)}),
			layers.NewDHCPOption(layers.DHCPOptEnd, nil),
		}}
	dnsQ := &layers.DNS{ID: 4660, RD: true, Questions: []layers.DNSQuestion{{Name: []byte("example.com"), Type: layers.DNSTypeA, Class: layers.DNSClassIN}}}
	dnsA := &layers.DNS{ID: 4660, QR: true, RD: true, RA: true, Questions: dnsQ.Questions,
		Answers: []layers.DNSResourceRecord{{Name: []byte("example.com"), Type: layers.DNSTypeA, Class: layers.DNSClassIN, TTL: 60, IP: net.IPv4(192, 0, 2, 7).To4()}}}

	ns := []byte{0, 0, 0, 0}
	ns = append(ns, host6...)
	echo6 := []byte{0, 9, 0, 1}

	return []sample{
		{"arp request", serialize(t, eth(guestMAC, bcastMAC, layers.EthernetTypeARP), arpReq)},
		{"arp reply", serialize(t, eth(hostMAC, guestMAC, layers.EthernetTypeARP), arpRep)},
		{"icmp echo request", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv4), ip4(guestIP, hostIP, layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 0}, payload(56))},
		{"icmp echo reply", serialize(t, eth(hostMAC, guestMAC, layers.EthernetTypeIPv4), ip4(hostIP, guestIP, layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoReply, 0), Id: 1, Seq: 0}, payload(56))},
		{"dhcp discover", serialize(t, eth(guestMAC, bcastMAC, layers.EthernetTypeIPv4), ip4(net.IPv4zero.To4(), net.IPv4bcast.To4(), layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 68, DstPort: 67}, dhcp)},
		{"dns query", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv4), ip4(guestIP, hostIP, layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 40000, DstPort: 53}, dnsQ)},
		{"dns answer", serialize(t, eth(hostMAC, guestMAC, layers.EthernetTypeIPv4), ip4(hostIP, guestIP, layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 53, DstPort: 40000}, dnsA)},
		{"udp other", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv4), ip4(guestIP, otherIP, layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 12345, DstPort: 9}, payload(100))},
		{"tcp syn", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv4), ip4(guestIP, hostIP, layers.IPProtocolTCP),
			&layers.TCP{SrcPort: 40001, DstPort: 80, Seq: 1000, SYN: true, Window: 64240, DataOffset: 5})},
		{"tcp data", serialize(t, eth(hostMAC, guestMAC, layers.EthernetTypeIPv4), ip4(hostIP, guestIP, layers.IPProtocolTCP),
			&layers.TCP{SrcPort: 80, DstPort: 40001, Seq: 5000, Ack: 1001, ACK: true, PSH: true, Window: 502, DataOffset: 5}, payload(10))},
		{"tftp rrq", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv4), ip4(guestIP, hostIP, layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 1024, DstPort: 69}, gopacket.Payload("\x00\x01kernel.bin\x00octet\x00"))},
		{"icmp6 neighbor solicitation", serialize(t, eth(guestMAC, mcast6, layers.EthernetTypeIPv6), ip6(guest6, net.ParseIP("ff02::1:ff00:1"), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0)}, gopacket.Payload(ns))},
		{"icmp6 echo", serialize(t, eth(guestMAC, hostMAC, layers.EthernetTypeIPv6), ip6(guest6, host6, layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}, gopacket.Payload(append(echo6, payload(8)...)))},
		{"udp6", serialize(t, eth(hostMAC, guestMAC, layers.EthernetTypeIPv6), ip6(host6, guest6, layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 5000, DstPort: 9}, payload(20))},
		{"other ethertype", append(serialize(t, eth(guestMAC, bcastMAC, layers.EthernetType(0x88b5))), payload(46)...)},
	}
}

// writeSamples writes the frames to a new pcap file, one millisecond apart.
func writeSamples(t testing.TB, path string, ss []sample) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 21, 12, 0, 1, 123456000, time.UTC)
	for i, s := range ss {
		ci := gopacket.CaptureInfo{Timestamp: t0.Add(time.Duration(i) * time.Millisecond), CaptureLength: len(s.data), Length: len(s.data)}
		if err := w.WritePacket(ci, s.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
