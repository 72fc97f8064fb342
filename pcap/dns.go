package pcap

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
)

// dnsMessage is what a summary shows of a DNS message.
type dnsMessage struct {
	id                      uint16
	qr, aa, rd, ra          bool
	opcode, rcode           byte
	questions               []dnsQuestion
	answers                 []dnsRR
	nAuthority, nAdditional int
}

type dnsQuestion struct {
	name string
	typ  uint16
}

type dnsRR struct {
	typ  uint16
	data string
}

// decodeDNS decodes a DNS message; false if any of it is malformed (the
// datagram is then summarized as plain UDP).
func decodeDNS(p []byte) (*dnsMessage, bool) {
	if len(p) < 12 {
		return nil, false
	}
	m := &dnsMessage{
		id: binary.BigEndian.Uint16(p[0:2]),
		qr: p[2]&0x80 != 0, opcode: p[2] >> 3 & 0x0f, aa: p[2]&0x04 != 0, rd: p[2]&0x01 != 0,
		ra: p[3]&0x80 != 0, rcode: p[3] & 0x0f,
	}
	counts := [4]int{}
	for i := range counts {
		counts[i] = int(binary.BigEndian.Uint16(p[4+2*i:]))
	}
	off := 12
	for range counts[0] {
		name, end, ok := dnsName(p, off)
		if !ok || len(p) < end+4 {
			return nil, false
		}
		m.questions = append(m.questions, dnsQuestion{name, binary.BigEndian.Uint16(p[end:])})
		off = end + 4
	}
	for section := 1; section < 4; section++ {
		for range counts[section] {
			_, end, ok := dnsName(p, off)
			if !ok || len(p) < end+10 {
				return nil, false
			}
			typ := binary.BigEndian.Uint16(p[end:])
			ttl := binary.BigEndian.Uint32(p[end+4:])
			rdlen := int(binary.BigEndian.Uint16(p[end+8:]))
			start := end + 10
			if start+rdlen > len(p) {
				return nil, false
			}
			data, ok := dnsRData(p[:start+rdlen], start, typ)
			if !ok {
				return nil, false
			}
			switch section {
			case 1:
				m.answers = append(m.answers, dnsRR{typ, data})
			case 2:
				m.nAuthority++
			case 3:
				m.nAdditional++
				if typ == 41 { // OPT: the extended response code
					m.rcode |= byte(ttl >> 20 & 0xf0)
				}
			}
			off = start + rdlen
		}
	}
	return m, true
}

// dnsName reads the (possibly compressed) name at off: the name without
// its final dot, and where the record goes on.
func dnsName(p []byte, off int) (string, int, bool) {
	var b []byte
	end := -1
	for jumps := 0; ; {
		if off >= len(p) {
			return "", 0, false
		}
		c := int(p[off])
		switch c & 0xc0 {
		case 0x00:
			if c == 0 {
				if end < 0 {
					end = off + 1
				}
				return string(b), end, true
			}
			if off+1+c > len(p) {
				return "", 0, false
			}
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, p[off+1:off+1+c]...)
			if len(b) > 255 {
				return "", 0, false
			}
			off += 1 + c
		case 0xc0:
			if off+2 > len(p) {
				return "", 0, false
			}
			if end < 0 {
				end = off + 2
			}
			jumps++
			if jumps > 255 {
				return "", 0, false
			}
			off = int(binary.BigEndian.Uint16(p[off:]) & 0x3fff)
		default:
			return "", 0, false
		}
	}
}

// dnsRData is how a summary shows a record's data.
func dnsRData(p []byte, off int, typ uint16) (string, bool) {
	rd := p[off:]
	switch typ {
	case 1, 28: // A, AAAA
		if len(rd) == 0 {
			return "<nil>", true
		}
		if (typ == 1 && len(rd) != 4) || (typ == 28 && len(rd) != 16) {
			return "", false
		}
		return net.IP(rd).String(), true
	case 2, 5, 12: // NS, CNAME, PTR
		if len(rd) == 0 {
			return ".", true
		}
		name, _, ok := dnsName(p, off)
		return name + ".", ok
	case 15: // MX
		if len(rd) == 0 {
			return ". 0", true
		}
		if len(rd) < 3 {
			return "", false
		}
		name, _, ok := dnsName(p, off+2)
		return fmt.Sprintf("%s. %d", name, binary.BigEndian.Uint16(rd)), ok
	case 16: // TXT
		var parts []string
		for len(rd) > 0 {
			n := 1 + int(rd[0])
			if n > len(rd) {
				return "", false
			}
			parts = append(parts, fmt.Sprintf("%q", rd[1:n]))
			rd = rd[n:]
		}
		return strings.Join(parts, " "), true
	}
	return fmt.Sprintf("(%d bytes)", len(rd)), true
}

var dnsTypeNames = map[uint16]string{
	1: "A", 2: "NS", 3: "MD", 4: "MF", 5: "CNAME", 6: "SOA", 7: "MB", 8: "MG", 9: "MR", 10: "NULL", 11: "WKS",
	12: "PTR", 13: "HINFO", 14: "MINFO", 15: "MX", 16: "TXT", 28: "AAAA", 33: "SRV", 35: "NAPTR", 41: "OPT",
	46: "RRSIG", 48: "DNSKEY", 64: "SVCB", 65: "HTTPS", 256: "URI",
}

func dnsTypeName(t uint16) string {
	if n, ok := dnsTypeNames[t]; ok {
		return n
	}
	return "Unknown"
}

var dnsOpcodeNames = map[byte]string{0: "Query", 1: "Inverse Query", 2: "Status", 4: "Notify", 5: "Update"}

var dnsRcodeNames = map[byte]string{
	0: "No Error", 1: "Format Error", 2: "Server Failure", 3: "Non-Existent Domain", 4: "Not Implemented",
	5: "Query Refused", 6: "Name Exists when it should not", 7: "RR Set Exists when it should not",
	8: "RR Set that should exist does not", 9: "Server Not Authoritative for zone", 10: "Name not contained in zone",
	16: "Bad OPT Version", 17: "Key not recognized", 18: "Signature out of time window", 19: "Bad TKEY Mode",
	20: "Duplicate key name", 21: "Algorithm not supported", 22: "Bad Truncation", 23: "Bad Cookie",
}

func nameOr(names map[byte]string, v byte) string {
	if n, ok := names[v]; ok {
		return n
	}
	return "Unknown"
}

// text follows tcpdump's short form: "4660+ A? example.com. (29)" for a
// query, "4660 1/0/0 A 192.0.2.7 (45)" for a response.
func (d *dnsMessage) text(length int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", d.id)
	if !d.qr {
		if d.rd {
			b.WriteByte('+')
		}
		if d.opcode != 0 {
			fmt.Fprintf(&b, " %s", nameOr(dnsOpcodeNames, d.opcode))
		}
		for _, q := range d.questions {
			fmt.Fprintf(&b, " %s? %s.", dnsTypeName(q.typ), q.name)
		}
		fmt.Fprintf(&b, " (%d)", length)
		return b.String()
	}
	if d.aa {
		b.WriteByte('*')
	}
	if !d.ra {
		b.WriteByte('-')
	}
	if d.rcode != 0 {
		fmt.Fprintf(&b, " %s", nameOr(dnsRcodeNames, d.rcode))
	}
	fmt.Fprintf(&b, " %d/%d/%d", len(d.answers), d.nAuthority, d.nAdditional)
	for i, a := range d.answers {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %s %s", sep, dnsTypeName(a.typ), a.data)
	}
	if len(d.answers) == 0 {
		for _, q := range d.questions {
			fmt.Fprintf(&b, " q: %s? %s.", dnsTypeName(q.typ), q.name)
		}
	}
	fmt.Fprintf(&b, " (%d)", length)
	return b.String()
}
