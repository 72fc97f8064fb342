package pcap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// ErrBadFilter is wrapped by every error for a filter expression this
// package cannot compile.
var ErrBadFilter = errors.New("unsupported capture filter")

// FilterSyntax lists the filter language, for error messages and tool
// descriptions.
const FilterSyntax = `a subset of tcpdump's filter language: ` +
	`arp, ip, ip6, icmp, icmp6, tcp, udp; ` +
	`[tcp|udp] [src|dst] port N; ` +
	`[ip|ip6|arp] [src|dst] host ADDR (or [src|dst] ADDR); ` +
	`[ip|ip6|arp] [src|dst] net ADDR/LEN; ` +
	`ether [src|dst] host MAC (or ether src|dst MAC); ` +
	`[ether] broadcast, [ether] multicast; ` +
	`combined with not/!, and/&&, or/|| and parentheses ` +
	`(and/or have equal precedence and group left to right, as in tcpdump; ` +
	`a bare value after and/or repeats the previous qualifiers: "port 67 or 68"). ` +
	`Addresses are numeric (no host or port names)`

// Filter decides which frames a capture keeps. It is compiled from a
// tcpdump-style expression and evaluated in Go on each frame (Ethernet, no
// VLAN tag), over the whole frame even when the capture keeps only Snaplen
// bytes of it, as a kernel filter would.
//
// The language is a subset of tcpdump's, with the same meaning (see
// FilterSyntax): an expression accepted here selects the same frames when
// given to tcpdump. Ports match TCP and UDP over IPv4 (first fragments only)
// and IPv6 (no extension headers); host and net match IPv4 and IPv6 source
// and destination addresses and, for IPv4, ARP's sender and target
// protocol addresses; icmp is ICMP over IPv4, icmp6 is ICMPv6 directly
// after the IPv6 header.
type Filter struct {
	expr string
	root node
}

// Compile parses a filter expression. An empty (or all-blank) expression
// gives a nil *Filter, which matches every frame.
func Compile(expr string) (*Filter, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, nil
	}
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	p := &parser{text: expr, toks: toks}
	root, err := p.expr()
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tEOF {
		return nil, p.errorf(t, "unexpected %q", t.text)
	}
	return &Filter{expr: expr, root: root}, nil
}

// String is the expression the filter was compiled from.
func (f *Filter) String() string {
	if f == nil {
		return ""
	}
	return f.expr
}

// Match reports whether the Ethernet frame passes the filter. A nil filter
// passes everything.
func (f *Filter) Match(frame []byte) bool {
	if f == nil {
		return true
	}
	fr := parseFrame(frame)
	return f.root.match(&fr)
}

// --- frames ---

const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd

	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// frame is what the filter looks at, read straight from the bytes at the
// offsets tcpdump's compiled filters read. Fields of headers the frame is too
// short for stay unset, so primitives about them do not match.
type frame struct {
	ok        bool // has an Ethernet header
	src, dst  net.HardwareAddr
	etherType uint16

	hasIP    bool // IPv4 or IPv6 header present (etherType says which)
	ipSrc    net.IP
	ipDst    net.IP
	ipProto  uint8
	hasPorts bool
	srcPort  uint16
	dstPort  uint16

	hasARP bool // IPv4-over-Ethernet ARP
	arpSPA net.IP
	arpTPA net.IP
}

func parseFrame(b []byte) frame {
	var f frame
	if len(b) < 14 {
		return f
	}
	f.ok = true
	f.dst, f.src = b[0:6], b[6:12]
	f.etherType = binary.BigEndian.Uint16(b[12:14])
	p := b[14:]
	switch f.etherType {
	case etherTypeIPv4:
		if len(p) < 20 || p[0]>>4 != 4 {
			return f
		}
		hl := int(p[0]&0x0f) * 4
		f.hasIP = true
		f.ipProto = p[9]
		f.ipSrc, f.ipDst = net.IP(p[12:16]), net.IP(p[16:20])
		firstFragment := binary.BigEndian.Uint16(p[6:8])&0x1fff == 0
		if firstFragment && hl >= 20 && (f.ipProto == protoTCP || f.ipProto == protoUDP) && len(p) >= hl+4 {
			f.hasPorts = true
			f.srcPort = binary.BigEndian.Uint16(p[hl : hl+2])
			f.dstPort = binary.BigEndian.Uint16(p[hl+2 : hl+4])
		}
	case etherTypeIPv6:
		if len(p) < 40 || p[0]>>4 != 6 {
			return f
		}
		f.hasIP = true
		f.ipProto = p[6]
		f.ipSrc, f.ipDst = net.IP(p[8:24]), net.IP(p[24:40])
		if (f.ipProto == protoTCP || f.ipProto == protoUDP) && len(p) >= 44 {
			f.hasPorts = true
			f.srcPort = binary.BigEndian.Uint16(p[40:42])
			f.dstPort = binary.BigEndian.Uint16(p[42:44])
		}
	case etherTypeARP:
		// htype Ethernet, ptype IPv4, hlen 6, plen 4.
		if len(p) < 28 || binary.BigEndian.Uint16(p[0:2]) != 1 || binary.BigEndian.Uint16(p[2:4]) != etherTypeIPv4 || p[4] != 6 || p[5] != 4 {
			return f
		}
		f.hasARP = true
		f.arpSPA, f.arpTPA = net.IP(p[14:18]), net.IP(p[24:28])
	}
	return f
}

// --- expression tree ---

type node interface{ match(*frame) bool }

type andNode struct{ l, r node }
type orNode struct{ l, r node }
type notNode struct{ n node }

func (n andNode) match(f *frame) bool { return n.l.match(f) && n.r.match(f) }
func (n orNode) match(f *frame) bool  { return n.l.match(f) || n.r.match(f) }
func (n notNode) match(f *frame) bool { return !n.n.match(f) }

// protoNode is a bare protocol keyword.
type protoNode string

func (n protoNode) match(f *frame) bool {
	switch n {
	case "ip":
		return f.ok && f.etherType == etherTypeIPv4
	case "ip6":
		return f.ok && f.etherType == etherTypeIPv6
	case "arp":
		return f.ok && f.etherType == etherTypeARP
	case "icmp":
		return f.hasIP && f.etherType == etherTypeIPv4 && f.ipProto == protoICMP
	case "icmp6":
		return f.hasIP && f.etherType == etherTypeIPv6 && f.ipProto == protoICMPv6
	case "tcp":
		return f.hasIP && f.ipProto == protoTCP
	case "udp":
		return f.hasIP && f.ipProto == protoUDP
	}
	return false
}

// dir says which address or port a primitive looks at.
type dir int

const (
	srcOrDst dir = iota
	srcOnly
	dstOnly
)

func (d dir) pick(src, dst bool) bool {
	switch d {
	case srcOnly:
		return src
	case dstOnly:
		return dst
	}
	return src || dst
}

type portNode struct {
	proto string // "", "tcp" or "udp"
	dir   dir
	port  uint16
}

func (n portNode) match(f *frame) bool {
	if !f.hasPorts {
		return false
	}
	if (n.proto == "tcp" && f.ipProto != protoTCP) || (n.proto == "udp" && f.ipProto != protoUDP) {
		return false
	}
	return n.dir.pick(f.srcPort == n.port, f.dstPort == n.port)
}

// netNode is host (a full-length prefix) and net.
type netNode struct {
	proto string // "", "ip", "ip6" or "arp"
	dir   dir
	net   *net.IPNet
}

func (n netNode) match(f *frame) bool {
	v4 := n.net.IP.To4() != nil
	if f.hasIP && (n.proto == "" || n.proto == "ip" || n.proto == "ip6") {
		if (f.etherType == etherTypeIPv4) == v4 && (n.proto == "" || (n.proto == "ip") == v4) {
			if n.dir.pick(n.net.Contains(f.ipSrc), n.net.Contains(f.ipDst)) {
				return true
			}
		}
	}
	if f.hasARP && v4 && (n.proto == "" || n.proto == "arp") {
		return n.dir.pick(n.net.Contains(f.arpSPA), n.net.Contains(f.arpTPA))
	}
	return false
}

type etherNode struct {
	dir dir
	mac net.HardwareAddr
}

func (n etherNode) match(f *frame) bool {
	return f.ok && n.dir.pick(bytes.Equal(f.src, n.mac), bytes.Equal(f.dst, n.mac))
}

type castNode bool // true: broadcast, false: multicast

func (n castNode) match(f *frame) bool {
	if !f.ok {
		return false
	}
	if n {
		return bytes.Equal(f.dst, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	}
	return f.dst[0]&1 != 0
}

// --- lexer ---

type tokKind int

const (
	tEOF tokKind = iota
	tWord
	tLParen
	tRParen
	tNot
	tAnd
	tOr
)

type token struct {
	kind tokKind
	text string
	pos  int // byte offset in the expression, for errors
}

func lex(expr string) ([]token, error) {
	var toks []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(':
			toks = append(toks, token{tLParen, "(", i})
			i++
		case c == ')':
			toks = append(toks, token{tRParen, ")", i})
			i++
		case c == '!':
			toks = append(toks, token{tNot, "!", i})
			i++
		case strings.HasPrefix(expr[i:], "&&"):
			toks = append(toks, token{tAnd, "&&", i})
			i += 2
		case strings.HasPrefix(expr[i:], "||"):
			toks = append(toks, token{tOr, "||", i})
			i += 2
		case c == '&' || c == '|':
			return nil, fmt.Errorf("pcap: %w %q: %q at offset %d (use && or ||); supported: %s", ErrBadFilter, expr, string(c), i, FilterSyntax)
		default:
			j := i
			for j < len(expr) && !strings.ContainsRune(" \t\n\r()!&|", rune(expr[j])) {
				j++
			}
			w := expr[i:j]
			kind := tWord
			switch strings.ToLower(w) {
			case "and":
				kind = tAnd
			case "or":
				kind = tOr
			case "not":
				kind = tNot
			}
			toks = append(toks, token{kind, w, i})
			i = j
		}
	}
	return append(toks, token{tEOF, "", len(expr)}), nil
}

// --- parser ---

// quals are a primitive's qualifiers, kept to complete a bare value that
// follows and/or ("port 67 or 68").
type quals struct {
	proto string // ether, ip, ip6, arp, tcp, udp or ""
	dir   dir
	typ   string // host, net or port
}

type parser struct {
	text string
	toks []token
	i    int
	last *quals
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) errorf(t token, format string, args ...any) error {
	where := "at the end"
	if t.kind != tEOF {
		where = fmt.Sprintf("at offset %d", t.pos)
	}
	return fmt.Errorf("pcap: %w %q: %s %s; supported: %s", ErrBadFilter, p.text, fmt.Sprintf(format, args...), where, FilterSyntax)
}

// expr := term { (and|or) term }, left to right with equal precedence, as
// tcpdump does ("a or b and c" is "(a or b) and c").
func (p *parser) expr() (node, error) {
	left, err := p.term()
	if err != nil {
		return nil, err
	}
	for {
		op := p.peek()
		if op.kind != tAnd && op.kind != tOr {
			return left, nil
		}
		p.next()
		right, err := p.term()
		if err != nil {
			return nil, err
		}
		if op.kind == tAnd {
			left = andNode{left, right}
		} else {
			left = orNode{left, right}
		}
	}
}

func (p *parser) term() (node, error) {
	t := p.peek()
	switch t.kind {
	case tNot:
		p.next()
		n, err := p.term()
		if err != nil {
			return nil, err
		}
		return notNode{n}, nil
	case tLParen:
		p.next()
		n, err := p.expr()
		if err != nil {
			return nil, err
		}
		if c := p.next(); c.kind != tRParen {
			return nil, p.errorf(c, "missing )")
		}
		return n, nil
	case tWord:
		return p.primitive()
	case tEOF:
		return nil, p.errorf(t, "expression ends early")
	}
	return nil, p.errorf(t, "unexpected %q", t.text)
}

var protoWords = map[string]bool{"ether": true, "ip": true, "ip6": true, "arp": true, "tcp": true, "udp": true, "icmp": true, "icmp6": true}

// unsupported are tcpdump words this subset leaves out, for a clearer
// message than "unknown word".
var unsupported = map[string]bool{
	"vlan": true, "mpls": true, "pppoed": true, "pppoes": true, "geneve": true, "rarp": true, "sctp": true,
	"portrange": true, "less": true, "greater": true, "len": true, "proto": true, "gateway": true,
	"igmp": true, "igrp": true, "pim": true, "vrrp": true, "carp": true, "ah": true, "esp": true,
	"decnet": true, "fddi": true, "tr": true, "wlan": true, "atalk": true, "aarp": true, "iso": true,
	"stp": true, "ipx": true, "netbeui": true, "inbound": true, "outbound": true, "ifname": true,
	"on": true, "rnr": true, "reason": true, "rset": true, "ruleset": true, "srnr": true, "subrulenum": true,
	"action": true, "type": true, "subtype": true, "dir": true, "llc": true, "mask": true,
	"protochain": true, "lat": true, "moprc": true, "mopdl": true, "clnp": true, "esis": true, "isis": true,
}

func (p *parser) primitive() (node, error) {
	start := p.peek()
	w := strings.ToLower(start.text)
	var q quals
	explicit := false // some qualifier was written (else: a bare value)

	if protoWords[w] {
		p.next()
		explicit = true
		nx := strings.ToLower(p.peek().text)
		if p.peek().kind != tWord || !(nx == "src" || nx == "dst" || nx == "host" || nx == "net" || nx == "port" || nx == "broadcast" || nx == "multicast") {
			if w == "ether" {
				return nil, p.errorf(p.peek(), "ether needs host, src, dst, broadcast or multicast")
			}
			return protoNode(w), nil
		}
		q.proto = w
		w = nx
	}
	switch w {
	case "broadcast", "multicast":
		t := p.next()
		if q.proto != "" && q.proto != "ether" {
			return nil, p.errorf(t, "%s %s is not supported (only [ether] %s)", q.proto, w, w)
		}
		return castNode(w == "broadcast"), nil
	case "src", "dst":
		p.next()
		explicit = true
		q.dir = srcOnly
		if w == "dst" {
			q.dir = dstOnly
		}
		if t := p.peek(); t.kind == tAnd || t.kind == tOr {
			return nil, p.errorf(t, `"src or dst" and "src and dst" are not supported; write "host X" or "src X and dst Y"`)
		}
		w = strings.ToLower(p.peek().text)
	}
	switch w {
	case "host", "net", "port":
		p.next()
		explicit = true
		q.typ = w
	}
	if !explicit {
		// A bare value: complete it with the previous primitive's
		// qualifiers, as tcpdump does.
		if unsupported[w] {
			return nil, p.errorf(start, "%q is not supported", start.text)
		}
		if p.last == nil {
			if net.ParseIP(start.text) != nil {
				return nil, p.errorf(start, "write host %s", start.text) // tcpdump refuses it too
			}
			return nil, p.errorf(start, "unknown word %q", start.text)
		}
		q = *p.last
	}
	if q.typ == "" {
		q.typ = "host" // "src 192.0.2.1", "ether dst MAC"
	}
	val := p.next()
	if val.kind != tWord {
		return nil, p.errorf(val, "%s needs a value", q.typ)
	}
	if protoWords[strings.ToLower(val.text)] || unsupported[strings.ToLower(val.text)] {
		return nil, p.errorf(val, "%s needs a value, not %q", q.typ, val.text)
	}
	n, err := p.build(q, val)
	if err != nil {
		return nil, err
	}
	p.last = &q
	return n, nil
}

func (p *parser) build(q quals, val token) (node, error) {
	switch q.typ {
	case "port":
		if q.proto != "" && q.proto != "tcp" && q.proto != "udp" {
			return nil, p.errorf(val, "%s port is not supported (only [tcp|udp] port)", q.proto)
		}
		n, err := strconv.ParseUint(val.text, 10, 16)
		if err != nil {
			return nil, p.errorf(val, "port %q is not a number from 0 to 65535 (port names are not supported)", val.text)
		}
		return portNode{proto: q.proto, dir: q.dir, port: uint16(n)}, nil
	case "host":
		if q.proto == "ether" {
			mac, err := net.ParseMAC(val.text)
			if err != nil || len(mac) != 6 {
				return nil, p.errorf(val, "%q is not a MAC address like 52:54:00:12:34:56", val.text)
			}
			return etherNode{dir: q.dir, mac: mac}, nil
		}
		if q.proto != "" && q.proto != "ip" && q.proto != "ip6" && q.proto != "arp" {
			return nil, p.errorf(val, "%s host is not supported (write host X and %s)", q.proto, q.proto)
		}
		ip := net.ParseIP(val.text)
		if ip == nil {
			return nil, p.errorf(val, "%q is not an IP address (host names are not supported)", val.text)
		}
		bits := 128
		if v4 := ip.To4(); v4 != nil {
			ip, bits = v4, 32
		}
		if err := p.checkFamily(q, ip, val); err != nil {
			return nil, err
		}
		return netNode{proto: q.proto, dir: q.dir, net: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}}, nil
	case "net":
		if q.proto != "" && q.proto != "ip" && q.proto != "ip6" && q.proto != "arp" {
			return nil, p.errorf(val, "%s net is not supported", q.proto)
		}
		ip, ipnet, err := net.ParseCIDR(val.text)
		if err != nil {
			return nil, p.errorf(val, "%q is not a network like 192.0.2.0/24", val.text)
		}
		if !ip.Equal(ipnet.IP) {
			// tcpdump refuses host bits in a net too.
			return nil, p.errorf(val, "%s has bits set outside its prefix (%s)", val.text, ipnet)
		}
		if v4 := ipnet.IP.To4(); v4 != nil {
			ipnet.IP = v4
		}
		if err := p.checkFamily(q, ipnet.IP, val); err != nil {
			return nil, err
		}
		return netNode{proto: q.proto, dir: q.dir, net: ipnet}, nil
	}
	return nil, p.errorf(val, "unknown qualifier %q", q.typ)
}

func (p *parser) checkFamily(q quals, ip net.IP, val token) error {
	v4 := ip.To4() != nil
	if (q.proto == "ip" || q.proto == "arp") && !v4 {
		return p.errorf(val, "%s %s needs an IPv4 address, not %s", q.proto, q.typ, val.text)
	}
	if q.proto == "ip6" && v4 {
		return p.errorf(val, "ip6 %s needs an IPv6 address, not %s", q.typ, val.text)
	}
	return nil
}
