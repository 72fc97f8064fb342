package pcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// DefaultSummaries is how many summaries ReadSummaries returns when max is
// not positive, and MaxSummaries the most it returns in one call.
const (
	DefaultSummaries = 100
	MaxSummaries     = 10000
)

// Summary is one captured packet, decoded into a line like tcpdump -nn
// prints, plus the fields a program wants without parsing that line.
type Summary struct {
	// Index is the packet's number in the file, from 1: the same as
	// Wireshark's "No." column (and tcpdump -# without a filter).
	Index  int       `json:"index"`
	Time   time.Time `json:"time"`   // when it was captured (UTC)
	Len    int       `json:"len"`    // length on the wire
	CapLen int       `json:"caplen"` // bytes kept in the file (less than Len past the snap length)
	// Text is the tcpdump-style line, starting with the capture time in
	// local time as tcpdump prints it: "12:00:01.123456 ARP, Request
	// who-has 192.0.2.1 tell 192.0.2.15, length 28".
	Text string `json:"text"`
	// Proto is the innermost protocol recognised: Ethernet, ARP, IP, IP6,
	// ICMP, ICMP6, TCP, UDP, DHCP, DNS, TFTP.
	Proto string `json:"proto"`
	// Src and Dst are the network-layer addresses (ARP: sender and target
	// protocol addresses), or the MAC addresses for other frames.
	Src     string `json:"src,omitempty"`
	Dst     string `json:"dst,omitempty"`
	SrcPort int    `json:"src_port,omitempty"` // TCP and UDP ports, 0 otherwise
	DstPort int    `json:"dst_port,omitempty"`
	SrcMAC  string `json:"src_mac,omitempty"`
	DstMAC  string `json:"dst_mac,omitempty"`
}

// ReadSummaries decodes the packets of a pcap file from the one numbered
// from (1 is the first; smaller values mean 1), at most max of them
// (DefaultSummaries if max <= 0, never more than MaxSummaries), and returns
// them with the number to pass as from to continue: the Index after the last
// one returned, or from itself when there was nothing (yet) at from.
//
// The file may be being written (a running Capture): what is complete is
// read, and a record cut short at the end of the file is not an error, it
// is simply not there yet. A file too short for its header (just created)
// holds no packets.
func ReadSummaries(path string, from, max int) ([]Summary, int, error) {
	f, err := os.Open(path)
	if err != nil {
		if from < 1 {
			from = 1
		}
		return nil, from, fmt.Errorf("pcap: %w", err)
	}
	defer f.Close()
	return ReadSummariesFrom(f, path, from, max)
}

// ReadSummariesFrom is ReadSummaries of a capture file the caller opened.
func ReadSummariesFrom(f io.Reader, path string, from, max int) ([]Summary, int, error) {
	if from < 1 {
		from = 1
	}
	if max <= 0 {
		max = DefaultSummaries
	}
	if max > MaxSummaries {
		max = MaxSummaries
	}
	r, err := newReader(f)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, from, nil
		}
		// Not the reader's error: it quotes the file's first bytes, and
		// the file may be anyone's.
		return nil, from, fmt.Errorf("pcap: %s is not a pcap file (no pcap header)", path)
	}
	var out []Summary
	next := from
	for index := 1; len(out) < max; index++ {
		// Skipped records are read over, not decoded.
		data, ci, err := r.next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break // the end, or a record still being written
			}
			return out, next, fmt.Errorf("pcap: %s: packet %d: %w", path, index, err)
		}
		if index < from {
			continue
		}
		s := summarizeLink(data, r.linkType, ci.length)
		s.Index = index
		s.Time = ci.time.UTC()
		s.Len = ci.length
		s.CapLen = len(data)
		s.Text = s.Time.Local().Format("15:04:05.000000") + " " + s.Text
		out = append(out, s)
		next = index + 1
	}
	return out, next, nil
}

// summarizeLink summarizes a record of a file of the given link type: only
// Ethernet is decoded (what captures here write).
func summarizeLink(data []byte, link uint32, wire int) Summary {
	if link != linkTypeEthernet {
		return Summary{Proto: "unknown", Text: fmt.Sprintf("undecodable frame, length %d", wire)}
	}
	return summarize(data, wire)
}

// Tag EtherTypes (the others: see filter.go).
const (
	etherTypeVLAN = 0x8100 // 802.1Q
	etherTypeQinQ = 0x88a8 // 802.1ad
)

// etherTypeNames name the EtherTypes that summaries print by name.
var etherTypeNames = map[uint16]string{
	0x0000: "LLC", 0x0800: "IPv4", 0xffff: "Raw", 0x86dd: "IPv6", 0x0806: "ARP", 0x8100: "Dot1Q", 0x880b: "PPP",
	0x8863: "PPPoEDiscovery", 0x8864: "PPPoESession", 0x9000: "EthernetCTP", 0x2000: "CiscoDiscovery",
	0x01a2: "NortelDiscovery", 0x88cc: "LinkLayerDiscovery", 0x8847: "MPLSUnicast", 0x8848: "MPLSMulticast",
	0x888e: "EAPOL", 0x88a8: "Dot1Q", 0x6558: "TransparentEthernetBridging", 0x88be: "ERSPAN Type II", 0x0712: "MDP",
}

// summarize is Summarize for a frame that was wire bytes long before the
// snap length cut it to data: tcpdump's lengths are the wire's.
func summarize(data []byte, wire int) Summary {
	var s Summary
	if len(data) < 14 {
		s.Proto = "unknown"
		s.Text = fmt.Sprintf("undecodable frame, length %d", wire)
		return s
	}
	dst, src := net.HardwareAddr(data[0:6]), net.HardwareAddr(data[6:12])
	s.SrcMAC, s.DstMAC = src.String(), dst.String()
	s.Src, s.Dst = s.SrcMAC, s.DstMAC
	s.Proto = "Ethernet"
	outer := binary.BigEndian.Uint16(data[12:14])
	typ, p := outer, data[14:]
	if typ < 0x0600 { // an 802.3 length: LLC follows
		typ, outer = 0, 0
	}
	// 802.1Q and 802.1ad tags: the frame inside is summarized.
	for (typ == etherTypeVLAN || typ == etherTypeQinQ) && len(p) >= 4 {
		typ, p = binary.BigEndian.Uint16(p[2:4]), p[4:]
	}
	switch typ {
	case etherTypeARP:
		if t, ok := summarizeARP(&s, p, wire-14); ok {
			s.Text = t
			return s
		}
	case etherTypeIPv4, 0xffff: // 0xffff: raw IPv4, as gopacket reads it
		if t, ok := summarizeIPv4(&s, p); ok {
			s.Text = t
			return s
		}
	case etherTypeIPv6:
		if t, ok := summarizeIPv6(&s, p); ok {
			s.Text = t
			return s
		}
	}
	name, ok := etherTypeNames[outer]
	if !ok {
		name = "Unknown"
	}
	s.Text = fmt.Sprintf("%s > %s, ethertype %s (0x%04x), length %d", src, dst, name, outer, wire)
	return s
}

// summarizeARP prints as tcpdump does; length is the ARP payload's (the
// frame without its Ethernet header, padding included).
func summarizeARP(s *Summary, p []byte, length int) (string, bool) {
	if len(p) < 8 {
		return "", false
	}
	htype, ptype := binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4])
	hlen, plen, op := int(p[4]), int(p[5]), binary.BigEndian.Uint16(p[6:8])
	if len(p) < 8+2*hlen+2*plen {
		return "", false
	}
	s.Proto = "ARP"
	if htype != 1 || ptype != etherTypeIPv4 || hlen != 6 || plen != 4 {
		return fmt.Sprintf("ARP, hardware %s (len %d), protocol %s (len %d), operation %d, length %d",
			linkTypeName(htype), hlen, etherTypeName(ptype), plen, op, length), true
	}
	sha, spa := net.HardwareAddr(p[8:14]), net.IP(p[14:18]).String()
	tha, tpa := net.HardwareAddr(p[18:24]), net.IP(p[24:28]).String()
	s.Src, s.Dst = spa, tpa
	switch op {
	case 1:
		if isZero(tha) {
			return fmt.Sprintf("ARP, Request who-has %s tell %s, length %d", tpa, spa, length), true
		}
		return fmt.Sprintf("ARP, Request who-has %s (%s) tell %s, length %d", tpa, tha, spa, length), true
	case 2:
		return fmt.Sprintf("ARP, Reply %s is-at %s, length %d", spa, sha, length), true
	}
	return fmt.Sprintf("ARP, op %d, sender %s (%s) target %s (%s), length %d", op, spa, sha, tpa, tha, length), true
}

func linkTypeName(t uint16) string {
	switch t {
	case 0:
		return "Null"
	case 1:
		return "Ethernet"
	case 9:
		return "PPP"
	case 10:
		return "FDDI"
	case 101:
		return "Raw"
	case 105:
		return "802.11"
	case 108:
		return "Loop"
	case 117:
		return "PFLog"
	case 127:
		return "RadioTap"
	}
	return "UnknownLinkType"
}

func etherTypeName(t uint16) string {
	if n, ok := etherTypeNames[t]; ok {
		return n
	}
	return "UnknownEthernetType"
}

// summarizeIPv4 summarizes an IPv4 packet; false if its header is broken.
func summarizeIPv4(s *Summary, p []byte) (string, bool) {
	if len(p) < 20 {
		return "", false
	}
	ihl := int(p[0]&0x0f) * 4
	length := int(binary.BigEndian.Uint16(p[2:4]))
	if length == 0 { // segmentation offload
		length = len(p)
	}
	if length < 20 || ihl < 20 || ihl > length || ihl > len(p) || !ipv4Options(p[20:ihl]) {
		return "", false
	}
	if len(p) > length {
		p = p[:length] // Ethernet padding
	}
	proto := p[9]
	flagsFrag := binary.BigEndian.Uint16(p[6:8])
	fragOff, more := flagsFrag&0x1fff, flagsFrag&0x2000 != 0
	s.Proto = "IP"
	s.Src, s.Dst = net.IP(p[12:16]).String(), net.IP(p[16:20]).String()
	payloadLen := int(uint16(length)) - ihl
	if fragOff != 0 {
		return fmt.Sprintf("IP %s > %s: ip-proto-%d (fragment offset %d), length %d", s.Src, s.Dst, proto, int(fragOff)*8, payloadLen), true
	}
	if !more {
		body := p[ihl:]
		switch proto {
		case protoICMP:
			if len(body) >= 8 {
				s.Proto = "ICMP"
				return fmt.Sprintf("IP %s > %s: ICMP %s, length %d", s.Src, s.Dst, icmpText(body), payloadLen), true
			}
		case protoUDP:
			if t, ok := udpText(s, body); ok {
				return "IP " + t, true
			}
		case protoTCP:
			if len(body) >= 20 {
				if t, ok := tcpText(s, body, payloadLen-int(body[12]>>4)*4); ok {
					return "IP " + t, true
				}
			}
		}
	}
	return fmt.Sprintf("IP %s > %s: ip-proto-%d %d", s.Src, s.Dst, proto, payloadLen), true
}

// ipv4Options tells whether the options of an IPv4 header are well formed.
func ipv4Options(o []byte) bool {
	for len(o) > 0 {
		switch o[0] {
		case 0:
			return true
		case 1:
			o = o[1:]
		default:
			if len(o) < 2 || int(o[1]) > len(o) || o[1] < 2 {
				return false
			}
			o = o[o[1]:]
		}
	}
	return true
}

// summarizeIPv6 summarizes an IPv6 packet, past its extension headers.
func summarizeIPv6(s *Summary, p []byte) (string, bool) {
	if len(p) < 40 {
		return "", false
	}
	plen := int(binary.BigEndian.Uint16(p[4:6]))
	next := p[6]
	src, dst := net.IP(p[8:24]).String(), net.IP(p[24:40]).String()
	body := p[40:]
	if plen == 0 {
		return "", false // a jumbogram: not on a TAP
	}
	if plen < len(body) {
		body = body[:plen]
	}
	s.Proto = "IP6"
	s.Src, s.Dst = src, dst
	proto := next
	decoded := true
	for decoded {
		var hl int
		switch proto {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(body) < 2 {
				decoded = false
				continue
			}
			hl = (int(body[1]) + 1) * 8
		case 44: // fragment: only an unfragmented "fragment" goes on
			if len(body) < 8 || binary.BigEndian.Uint16(body[2:4])&0xfff9 != 0 {
				decoded = false
				continue
			}
			hl = 8
		default:
			goto upper
		}
		if hl > len(body) {
			decoded = false
			continue
		}
		proto, body = body[0], body[hl:]
	}
upper:
	if decoded {
		switch proto {
		case protoICMPv6:
			if len(body) >= 4 {
				s.Proto = "ICMP6"
				length := len(body)
				if next == protoICMPv6 {
					length = plen // from the header: right for truncated packets too
				}
				return fmt.Sprintf("IP6 %s > %s: ICMP6, %s, length %d", src, dst, icmp6Text(body), length), true
			}
		case protoUDP:
			if t, ok := udpText(s, body); ok {
				return "IP6 " + t, true
			}
		case protoTCP:
			if len(body) >= 20 {
				if t, ok := tcpText(s, body, -1); ok {
					return "IP6 " + t, true
				}
			}
		}
	}
	return fmt.Sprintf("IP6 %s > %s: ip-proto-%d %d", src, dst, next, plen), true
}

// icmpText describes an ICMP message (p holds at least its 8-byte header).
func icmpText(icmp []byte) string {
	t, c := icmp[0], icmp[1]
	id, seq := binary.BigEndian.Uint16(icmp[4:6]), binary.BigEndian.Uint16(icmp[6:8])
	switch t {
	case 8:
		return fmt.Sprintf("echo request, id %d, seq %d", id, seq)
	case 0:
		return fmt.Sprintf("echo reply, id %d, seq %d", id, seq)
	case 3:
		// The payload starts with the offending datagram's IP header.
		p := icmp[8:]
		if len(p) >= 20 && p[0]>>4 == 4 {
			dst := net.IP(p[16:20])
			hl := int(p[0]&0x0f) * 4
			switch c {
			case 3:
				if len(p) >= hl+4 && (p[9] == protoUDP || p[9] == protoTCP) {
					proto := "udp"
					if p[9] == protoTCP {
						proto = "tcp"
					}
					return fmt.Sprintf("%s %s port %d unreachable", dst, proto, binary.BigEndian.Uint16(p[hl+2:hl+4]))
				}
			case 1:
				return fmt.Sprintf("host %s unreachable", dst)
			case 0:
				return fmt.Sprintf("net %s unreachable", dst)
			case 2:
				return fmt.Sprintf("%s protocol %d unreachable", dst, p[9])
			}
		}
		return fmt.Sprintf("destination unreachable (code %d)", c)
	case 11:
		if c == 0 {
			return "time exceeded in-transit"
		}
		return "ip reassembly time exceeded"
	case 5:
		return fmt.Sprintf("redirect (code %d)", c)
	}
	return fmt.Sprintf("type-#%d", t)
}

// icmp6Text describes an ICMPv6 message (at least its 4-byte header).
func icmp6Text(icmp []byte) string {
	p := icmp[4:]
	switch t := icmp[0]; t {
	case 128, 129:
		kind := "echo request"
		if t == 129 {
			kind = "echo reply"
		}
		if len(p) >= 4 {
			return fmt.Sprintf("%s, id %d, seq %d", kind, binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4]))
		}
		return kind
	case 135:
		if len(p) >= 20 {
			return "neighbor solicitation, who has " + net.IP(p[4:20]).String()
		}
		return "neighbor solicitation"
	case 136:
		if len(p) >= 20 {
			return "neighbor advertisement, tgt is " + net.IP(p[4:20]).String()
		}
		return "neighbor advertisement"
	case 133:
		return "router solicitation"
	case 134:
		return "router advertisement"
	case 137:
		return "redirect"
	case 1:
		return fmt.Sprintf("destination unreachable (code %d)", icmp[1])
	case 2:
		return "packet too big"
	case 3:
		return "time exceeded in-transit"
	case 130:
		return "multicast listener query"
	case 131:
		return "multicast listener report"
	case 132:
		return "multicast listener done"
	case 143:
		if len(p) >= 4 {
			return fmt.Sprintf("multicast listener report v2, %d group record(s)", binary.BigEndian.Uint16(p[2:4]))
		}
		return "multicast listener report v2"
	default:
		return fmt.Sprintf("type-#%d", t)
	}
}

// udpText summarizes a UDP datagram; false if its header is broken.
func udpText(s *Summary, udp []byte) (string, bool) {
	if len(udp) < 8 {
		return "", false
	}
	sport, dport := int(binary.BigEndian.Uint16(udp[0:2])), int(binary.BigEndian.Uint16(udp[2:4]))
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	var p []byte
	switch {
	case ulen >= 8:
		p = udp[8:min(ulen, len(udp))]
	case ulen == 0: // a jumbogram: the rest
		p = udp[8:]
	default:
		return "", false
	}
	s.Proto = "UDP"
	s.SrcPort, s.DstPort = sport, dport
	head := fmt.Sprintf("%s.%d > %s.%d: ", s.Src, sport, s.Dst, dport)
	length := ulen - 8
	if length < 0 {
		length = len(p)
	}
	switch {
	case sport == 53 || dport == 53 || sport == 5353 || dport == 5353:
		if d, ok := decodeDNS(p); ok {
			s.Proto = "DNS"
			return head + d.text(length), true
		}
	case sport == 67 || dport == 67 || sport == 68 || dport == 68:
		if t, ok := dhcpText(p, length); ok {
			s.Proto = "DHCP"
			return head + t, true
		}
	case dport == 69 && len(p) >= 2:
		if t := tftpText(p); t != "" {
			s.Proto = "TFTP"
			return head + fmt.Sprintf("TFTP, length %d, %s", length, t), true
		}
	}
	return head + fmt.Sprintf("UDP, length %d", length), true
}

// tcpText prints like tcpdump -nn -S (absolute sequence numbers), without
// TCP options; dataLen < 0 means what the segment holds. False if the
// header is broken.
func tcpText(s *Summary, tcp []byte, dataLen int) (string, bool) {
	off := int(tcp[12]>>4) * 4
	if off < 20 || off > len(tcp) {
		return "", false
	}
	s.Proto = "TCP"
	sport, dport := binary.BigEndian.Uint16(tcp[0:2]), binary.BigEndian.Uint16(tcp[2:4])
	s.SrcPort, s.DstPort = int(sport), int(dport)
	seq, ack := binary.BigEndian.Uint32(tcp[4:8]), binary.BigEndian.Uint32(tcp[8:12])
	fl, win := tcp[13], binary.BigEndian.Uint16(tcp[14:16])
	if dataLen < 0 {
		dataLen = len(tcp) - off
	}
	const fin, syn, rst, psh, ackf, urg, ece, cwr = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80
	var flags []byte
	for _, f := range []struct {
		bit byte
		c   byte
	}{{fin, 'F'}, {syn, 'S'}, {rst, 'R'}, {psh, 'P'}, {urg, 'U'}, {ece, 'E'}, {cwr, 'W'}} {
		if fl&f.bit != 0 {
			flags = append(flags, f.c)
		}
	}
	if fl&ackf != 0 {
		flags = append(flags, '.')
	}
	if len(flags) == 0 {
		flags = []byte("none")
	}
	b := fmt.Sprintf("%s.%d > %s.%d: Flags [%s]", s.Src, sport, s.Dst, dport, flags)
	if dataLen > 0 {
		b += fmt.Sprintf(", seq %d:%d", seq, seq+uint32(dataLen))
	} else if fl&(syn|fin|rst) != 0 {
		b += fmt.Sprintf(", seq %d", seq)
	}
	if fl&ackf != 0 {
		b += fmt.Sprintf(", ack %d", ack)
	}
	return b + fmt.Sprintf(", win %d, length %d", win, dataLen), true
}

// tftpText decodes a TFTP request (to port 69): opcode, file name, mode.
func tftpText(p []byte) string {
	op := binary.BigEndian.Uint16(p[0:2])
	if op != 1 && op != 2 {
		return ""
	}
	fields := strings.Split(string(p[2:]), "\x00")
	if len(fields) < 2 {
		return ""
	}
	name := map[uint16]string{1: "RRQ", 2: "WRQ"}[op]
	b := fmt.Sprintf("%s %q %s", name, fields[0], fields[1])
	for i := 2; i+1 < len(fields); i += 2 {
		if fields[i] != "" {
			b += fmt.Sprintf(" %s %s", fields[i], fields[i+1])
		}
	}
	return b
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// dhcpText starts as tcpdump's short form ("BOOTP/DHCP, Request from MAC,
// length N") and adds what tcpdump shows only with -v: the transaction id
// and the DHCP message type, which is what one looks for when a guest's
// DHCP goes wrong. False if p is not a BOOTP message with DHCP's cookie.
func dhcpText(p []byte, length int) (string, bool) {
	if len(p) < 240 || p[2] > 16 || binary.BigEndian.Uint32(p[236:240]) != 0x63825363 {
		return "", false
	}
	opts, ok := dhcpOptions(p[240:])
	if !ok {
		return "", false
	}
	// Option overload (52): the file, then the sname field, go on with
	// options; a malformed one there ends that field.
	for _, o := range opts {
		if o.typ == 52 && len(o.data) > 0 {
			if o.data[0]&1 != 0 {
				more, _ := dhcpOptions(p[108:236])
				opts = append(opts, more...)
			}
			if o.data[0]&2 != 0 {
				more, _ := dhcpOptions(p[44:108])
				opts = append(opts, more...)
			}
			break
		}
	}
	b := "BOOTP/DHCP, Reply"
	if p[0] == 1 {
		b = "BOOTP/DHCP, Request from " + net.HardwareAddr(p[28:28+p[2]]).String()
	}
	b += fmt.Sprintf(", length %d, xid 0x%x", length, binary.BigEndian.Uint32(p[4:8]))
	for _, o := range opts {
		if o.typ == 53 && len(o.data) == 1 {
			b += ", DHCP " + dhcpMsgType(o.data[0])
		}
	}
	if yi := net.IP(p[16:20]); !yi.IsUnspecified() {
		b += ", your-ip " + yi.String()
	}
	for _, o := range opts {
		switch {
		case o.typ == 50 && len(o.data) == 4:
			b += ", requested-ip " + net.IP(o.data).String()
		case o.typ == 54 && len(o.data) == 4:
			b += ", server-id " + net.IP(o.data).String()
		}
	}
	return b, true
}

type dhcpOption struct {
	typ  byte
	data []byte
}

// dhcpOptions reads options up to End; false (with those before) if one
// runs past the end.
func dhcpOptions(p []byte) ([]dhcpOption, bool) {
	var opts []dhcpOption
	for len(p) > 0 {
		switch p[0] {
		case 255: // end
			return opts, true
		case 0: // pad
			p = p[1:]
			continue
		}
		if len(p) < 2 || int(p[1]) > len(p)-2 {
			return opts, false
		}
		opts = append(opts, dhcpOption{p[0], p[2 : 2+int(p[1])]})
		p = p[2+int(p[1]):]
	}
	return opts, true
}

func dhcpMsgType(t byte) string {
	names := [...]string{"Unspecified", "Discover", "Offer", "Request", "Decline", "Ack", "Nak", "Release", "Inform"}
	if int(t) < len(names) {
		return names[t]
	}
	return "Unknown"
}
