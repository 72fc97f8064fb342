package pcap

// The summaries as they were made with gopacket, kept as the reference the
// summaries of summary.go are compared with (TestSummariesMatchGopacket,
// FuzzSummariesMatchGopacket): gopacket is a test-only dependency.

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// summarize is Summarize for a frame that was wire bytes long before the
// snap length cut it to data: tcpdump's lengths are the wire's.
func refSummarize(data []byte, wire int) Summary {
	link := layers.LinkTypeEthernet
	pkt := gopacket.NewPacket(data, link, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	var s Summary
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth != nil {
		s.SrcMAC, s.DstMAC = eth.SrcMAC.String(), eth.DstMAC.String()
		s.Src, s.Dst = s.SrcMAC, s.DstMAC
		s.Proto = "Ethernet"
	}
	switch {
	case pkt.Layer(layers.LayerTypeARP) != nil:
		s.Text = refSummarizeARP(&s, pkt.Layer(layers.LayerTypeARP).(*layers.ARP), wire-14)
	case pkt.Layer(layers.LayerTypeIPv4) != nil:
		s.Text = refSummarizeIPv4(&s, pkt)
	case pkt.Layer(layers.LayerTypeIPv6) != nil:
		s.Text = refSummarizeIPv6(&s, pkt)
	case eth != nil:
		name := eth.EthernetType.String()
		if strings.HasPrefix(name, "Unknown") {
			name = "Unknown"
		}
		s.Text = fmt.Sprintf("%s > %s, ethertype %s (0x%04x), length %d", eth.SrcMAC, eth.DstMAC, name, uint16(eth.EthernetType), wire)
	default:
		s.Proto = "unknown"
		s.Text = fmt.Sprintf("undecodable frame, length %d", wire)
	}
	return s
}

// summarizeARP prints as tcpdump does; length is the ARP payload's (the
// frame without its Ethernet header, padding included).
func refSummarizeARP(s *Summary, a *layers.ARP, length int) string {
	s.Proto = "ARP"
	if a.AddrType != layers.LinkTypeEthernet || a.Protocol != layers.EthernetTypeIPv4 || a.HwAddressSize != 6 || a.ProtAddressSize != 4 {
		return fmt.Sprintf("ARP, hardware %s (len %d), protocol %s (len %d), operation %d, length %d", a.AddrType, a.HwAddressSize, a.Protocol, a.ProtAddressSize, a.Operation, length)
	}
	spa, tpa := net.IP(a.SourceProtAddress).String(), net.IP(a.DstProtAddress).String()
	s.Src, s.Dst = spa, tpa
	sha, tha := net.HardwareAddr(a.SourceHwAddress), net.HardwareAddr(a.DstHwAddress)
	switch a.Operation {
	case layers.ARPRequest:
		if isZero(tha) {
			return fmt.Sprintf("ARP, Request who-has %s tell %s, length %d", tpa, spa, length)
		}
		return fmt.Sprintf("ARP, Request who-has %s (%s) tell %s, length %d", tpa, tha, spa, length)
	case layers.ARPReply:
		return fmt.Sprintf("ARP, Reply %s is-at %s, length %d", spa, sha, length)
	}
	return fmt.Sprintf("ARP, op %d, sender %s (%s) target %s (%s), length %d", a.Operation, spa, sha, tpa, tha, length)
}

func refSummarizeIPv4(s *Summary, pkt gopacket.Packet) string {
	ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	s.Proto = "IP"
	s.Src, s.Dst = ip.SrcIP.String(), ip.DstIP.String()
	payloadLen := int(ip.Length) - int(ip.IHL)*4
	if ip.FragOffset != 0 {
		return fmt.Sprintf("IP %s > %s: ip-proto-%d (fragment offset %d), length %d", s.Src, s.Dst, ip.Protocol, int(ip.FragOffset)*8, payloadLen)
	}
	switch ip.Protocol {
	case layers.IPProtocolICMPv4:
		if icmp, ok := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
			s.Proto = "ICMP"
			return fmt.Sprintf("IP %s > %s: ICMP %s, length %d", s.Src, s.Dst, refIcmpText(icmp), payloadLen)
		}
	case layers.IPProtocolUDP:
		if udp, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
			return "IP " + refUdpText(s, udp)
		}
	case layers.IPProtocolTCP:
		if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
			return "IP " + refTcpText(s, tcp, payloadLen-int(tcp.DataOffset)*4)
		}
	}
	return fmt.Sprintf("IP %s > %s: ip-proto-%d %d", s.Src, s.Dst, ip.Protocol, payloadLen)
}

func refSummarizeIPv6(s *Summary, pkt gopacket.Packet) string {
	ip := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	s.Proto = "IP6"
	s.Src, s.Dst = ip.SrcIP.String(), ip.DstIP.String()
	if icmp, ok := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
		s.Proto = "ICMP6"
		length := len(icmp.Contents) + len(icmp.Payload)
		if ip.NextHeader == layers.IPProtocolICMPv6 {
			length = int(ip.Length) // from the header: right for truncated packets too
		}
		return fmt.Sprintf("IP6 %s > %s: ICMP6, %s, length %d", s.Src, s.Dst, refIcmp6Text(icmp), length)
	}
	if udp, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		return "IP6 " + refUdpText(s, udp)
	}
	if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
		return "IP6 " + refTcpText(s, tcp, len(tcp.Payload))
	}
	return fmt.Sprintf("IP6 %s > %s: ip-proto-%d %d", s.Src, s.Dst, ip.NextHeader, ip.Length)
}

func refIcmpText(icmp *layers.ICMPv4) string {
	t, c := icmp.TypeCode.Type(), icmp.TypeCode.Code()
	switch t {
	case layers.ICMPv4TypeEchoRequest:
		return fmt.Sprintf("echo request, id %d, seq %d", icmp.Id, icmp.Seq)
	case layers.ICMPv4TypeEchoReply:
		return fmt.Sprintf("echo reply, id %d, seq %d", icmp.Id, icmp.Seq)
	case layers.ICMPv4TypeDestinationUnreachable:
		// The payload starts with the offending datagram's IP header.
		p := icmp.Payload
		if len(p) >= 20 && p[0]>>4 == 4 {
			dst := net.IP(p[16:20])
			hl := int(p[0]&0x0f) * 4
			switch c {
			case layers.ICMPv4CodePort:
				if len(p) >= hl+4 && (p[9] == refProtoUDP || p[9] == refProtoTCP) {
					proto := "udp"
					if p[9] == refProtoTCP {
						proto = "tcp"
					}
					return fmt.Sprintf("%s %s port %d unreachable", dst, proto, binary.BigEndian.Uint16(p[hl+2:hl+4]))
				}
			case layers.ICMPv4CodeHost:
				return fmt.Sprintf("host %s unreachable", dst)
			case layers.ICMPv4CodeNet:
				return fmt.Sprintf("net %s unreachable", dst)
			case layers.ICMPv4CodeProtocol:
				return fmt.Sprintf("%s protocol %d unreachable", dst, p[9])
			}
		}
		return fmt.Sprintf("destination unreachable (code %d)", c)
	case layers.ICMPv4TypeTimeExceeded:
		if c == 0 {
			return "time exceeded in-transit"
		}
		return "ip reassembly time exceeded"
	case layers.ICMPv4TypeRedirect:
		return fmt.Sprintf("redirect (code %d)", c)
	}
	return fmt.Sprintf("type-#%d", t)
}

func refIcmp6Text(icmp *layers.ICMPv6) string {
	p := icmp.Payload
	switch icmp.TypeCode.Type() {
	case layers.ICMPv6TypeEchoRequest, layers.ICMPv6TypeEchoReply:
		kind := "echo request"
		if icmp.TypeCode.Type() == layers.ICMPv6TypeEchoReply {
			kind = "echo reply"
		}
		if len(p) >= 4 {
			return fmt.Sprintf("%s, id %d, seq %d", kind, binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4]))
		}
		return kind
	case layers.ICMPv6TypeNeighborSolicitation:
		if len(p) >= 20 {
			return "neighbor solicitation, who has " + net.IP(p[4:20]).String()
		}
		return "neighbor solicitation"
	case layers.ICMPv6TypeNeighborAdvertisement:
		if len(p) >= 20 {
			return "neighbor advertisement, tgt is " + net.IP(p[4:20]).String()
		}
		return "neighbor advertisement"
	case layers.ICMPv6TypeRouterSolicitation:
		return "router solicitation"
	case layers.ICMPv6TypeRouterAdvertisement:
		return "router advertisement"
	case layers.ICMPv6TypeRedirect:
		return "redirect"
	case layers.ICMPv6TypeDestinationUnreachable:
		return fmt.Sprintf("destination unreachable (code %d)", icmp.TypeCode.Code())
	case layers.ICMPv6TypePacketTooBig:
		return "packet too big"
	case layers.ICMPv6TypeTimeExceeded:
		return "time exceeded in-transit"
	case layers.ICMPv6TypeMLDv1MulticastListenerQueryMessage:
		return "multicast listener query"
	case layers.ICMPv6TypeMLDv1MulticastListenerReportMessage:
		return "multicast listener report"
	case layers.ICMPv6TypeMLDv1MulticastListenerDoneMessage:
		return "multicast listener done"
	case layers.ICMPv6TypeMLDv2MulticastListenerReportMessageV2:
		if len(p) >= 4 {
			return fmt.Sprintf("multicast listener report v2, %d group record(s)", binary.BigEndian.Uint16(p[2:4]))
		}
		return "multicast listener report v2"
	}
	return fmt.Sprintf("type-#%d", icmp.TypeCode.Type())
}

func refUdpText(s *Summary, udp *layers.UDP) string {
	s.Proto = "UDP"
	s.SrcPort, s.DstPort = int(udp.SrcPort), int(udp.DstPort)
	head := fmt.Sprintf("%s.%d > %s.%d: ", s.Src, udp.SrcPort, s.Dst, udp.DstPort)
	length := int(udp.Length) - 8
	if length < 0 {
		length = len(udp.Payload)
	}
	p := udp.Payload
	switch {
	case udp.SrcPort == 53 || udp.DstPort == 53 || udp.SrcPort == 5353 || udp.DstPort == 5353:
		var dns layers.DNS
		if dns.DecodeFromBytes(p, gopacket.NilDecodeFeedback) == nil {
			s.Proto = "DNS"
			return head + refDnsText(&dns, length)
		}
	case udp.SrcPort == 67 || udp.DstPort == 67 || udp.SrcPort == 68 || udp.DstPort == 68:
		var dhcp layers.DHCPv4
		if dhcp.DecodeFromBytes(p, gopacket.NilDecodeFeedback) == nil {
			s.Proto = "DHCP"
			return head + refDhcpText(&dhcp, length)
		}
	case udp.DstPort == 69 && len(p) >= 2:
		if t := tftpText(p); t != "" {
			s.Proto = "TFTP"
			return head + fmt.Sprintf("TFTP, length %d, %s", length, t)
		}
	}
	return head + fmt.Sprintf("UDP, length %d", length)
}

// tcpText prints like tcpdump -nn -S (absolute sequence numbers), without
// TCP options.
func refTcpText(s *Summary, tcp *layers.TCP, dataLen int) string {
	s.Proto = "TCP"
	s.SrcPort, s.DstPort = int(tcp.SrcPort), int(tcp.DstPort)
	if dataLen < 0 {
		dataLen = len(tcp.Payload)
	}
	var flags strings.Builder
	for _, f := range []struct {
		on bool
		c  byte
	}{{tcp.FIN, 'F'}, {tcp.SYN, 'S'}, {tcp.RST, 'R'}, {tcp.PSH, 'P'}, {tcp.URG, 'U'}, {tcp.ECE, 'E'}, {tcp.CWR, 'W'}} {
		if f.on {
			flags.WriteByte(f.c)
		}
	}
	if tcp.ACK {
		flags.WriteByte('.')
	}
	if flags.Len() == 0 {
		flags.WriteString("none")
	}
	b := fmt.Sprintf("%s.%d > %s.%d: Flags [%s]", s.Src, tcp.SrcPort, s.Dst, tcp.DstPort, flags.String())
	if dataLen > 0 || tcp.SYN || tcp.FIN || tcp.RST {
		if dataLen > 0 {
			b += fmt.Sprintf(", seq %d:%d", tcp.Seq, tcp.Seq+uint32(dataLen))
		} else {
			b += fmt.Sprintf(", seq %d", tcp.Seq)
		}
	}
	if tcp.ACK {
		b += fmt.Sprintf(", ack %d", tcp.Ack)
	}
	return b + fmt.Sprintf(", win %d, length %d", tcp.Window, dataLen)
}

// dnsText follows tcpdump's short form: "4660+ A? example.com. (29)" for a
// query, "4660 1/0/0 A 192.0.2.7 (45)" for a response.
func refDnsText(d *layers.DNS, length int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", d.ID)
	if !d.QR {
		if d.RD {
			b.WriteByte('+')
		}
		if d.OpCode != layers.DNSOpCodeQuery {
			fmt.Fprintf(&b, " %s", d.OpCode)
		}
		for _, q := range d.Questions {
			fmt.Fprintf(&b, " %s? %s.", q.Type, q.Name)
		}
		fmt.Fprintf(&b, " (%d)", length)
		return b.String()
	}
	if d.AA {
		b.WriteByte('*')
	}
	if !d.RA {
		b.WriteByte('-')
	}
	if d.ResponseCode != layers.DNSResponseCodeNoErr {
		fmt.Fprintf(&b, " %s", d.ResponseCode)
	}
	fmt.Fprintf(&b, " %d/%d/%d", len(d.Answers), len(d.Authorities), len(d.Additionals))
	for i, a := range d.Answers {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %s %s", sep, a.Type, refDnsData(a))
	}
	if len(d.Answers) == 0 {
		for _, q := range d.Questions {
			fmt.Fprintf(&b, " q: %s? %s.", q.Type, q.Name)
		}
	}
	fmt.Fprintf(&b, " (%d)", length)
	return b.String()
}

func refDnsData(a layers.DNSResourceRecord) string {
	switch a.Type {
	case layers.DNSTypeA, layers.DNSTypeAAAA:
		return a.IP.String()
	case layers.DNSTypeCNAME:
		return string(a.CNAME) + "."
	case layers.DNSTypeNS:
		return string(a.NS) + "."
	case layers.DNSTypePTR:
		return string(a.PTR) + "."
	case layers.DNSTypeMX:
		return fmt.Sprintf("%s. %d", a.MX.Name, a.MX.Preference)
	case layers.DNSTypeTXT:
		var parts []string
		// Fixed here as in summary.go: the old code ranged over the bytes
		// of TXT (the raw data), printing 'h' 'i' for "hi".
		for _, t := range a.TXTs {
			parts = append(parts, fmt.Sprintf("%q", t))
		}
		return strings.Join(parts, " ")
	}
	return fmt.Sprintf("(%d bytes)", len(a.Data))
}

// dhcpText starts as tcpdump's short form ("BOOTP/DHCP, Request from MAC,
// length N") and adds what tcpdump shows only with -v: the transaction id
// and the DHCP message type, which is what one looks for when a guest's
// DHCP goes wrong.
func refDhcpText(d *layers.DHCPv4, length int) string {
	b := "BOOTP/DHCP, Reply"
	if d.Operation == layers.DHCPOpRequest {
		b = "BOOTP/DHCP, Request from " + d.ClientHWAddr.String()
	}
	b += fmt.Sprintf(", length %d, xid 0x%x", length, d.Xid)
	for _, o := range d.Options {
		if o.Type == layers.DHCPOptMessageType && len(o.Data) == 1 {
			b += ", DHCP " + layers.DHCPMsgType(o.Data[0]).String()
		}
	}
	if ip := d.YourClientIP; ip != nil && !ip.IsUnspecified() {
		b += ", your-ip " + ip.String()
	}
	for _, o := range d.Options {
		switch {
		case o.Type == layers.DHCPOptRequestIP && len(o.Data) == 4:
			b += ", requested-ip " + net.IP(o.Data).String()
		case o.Type == layers.DHCPOptServerID && len(o.Data) == 4:
			b += ", server-id " + net.IP(o.Data).String()
		}
	}
	return b
}

const (
	refProtoUDP = 17
	refProtoTCP = 6
)
