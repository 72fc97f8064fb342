package gdb

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
)

// maxPacket bounds one incoming packet after run-length expansion. QEMU's
// largest replies are about 4 KiB; the bound only keeps a broken or hostile
// peer from making the client allocate without limit.
const maxPacket = 1 << 20

// Frame kinds readFrame reports besides '$' (a packet) and '%' (a
// notification).
const (
	frameAck  = '+'
	frameNack = '-'
)

// errMalformed marks input that is not the Remote Serial Protocol; the
// connection cannot be trusted after it.
var errMalformed = errors.New("malformed packet")

// appendPacket frames payload as $payload#xx. The four characters the
// protocol reserves are escaped wherever they occur, which is what binary
// data needs and is harmless for text: stubs unescape every packet.
func appendPacket(dst, payload []byte) []byte {
	dst = append(dst, '$')
	var sum byte
	for _, b := range payload {
		switch b {
		case '$', '#', '}', '*':
			dst = append(dst, '}', b^0x20)
			sum += '}' + (b ^ 0x20)
		default:
			dst = append(dst, b)
			sum += b
		}
	}
	return append(dst, '#', hexDigits[sum>>4], hexDigits[sum&0xf])
}

const hexDigits = "0123456789abcdef"

// readFrame reads the next unit the stub sends: an ack ('+'), a nack ('-'),
// or a whole packet ('$') or notification ('%') with its checksum checked
// and run-length encoding expanded. Bytes outside a frame are skipped, as
// gdb does. A checksum mismatch is reported as a '$' or '%' frame with
// badSum set, so that the caller can ask for a retransmission in ack mode.
func readFrame(r *bufio.Reader) (kind byte, payload []byte, badSum bool, err error) {
	for {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, false, err
		}
		switch b {
		case frameAck, frameNack:
			return b, nil, false, nil
		case '$', '%':
			kind = b
		default:
			continue
		}
		break
	}
	var raw []byte
	var sum byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, false, err
		}
		if b == '#' {
			break
		}
		if b == '$' {
			// A new packet inside a packet: the first was cut short
			// (gdb restarts on it too). Only its checksum would tell.
			raw, sum = raw[:0], 0
			continue
		}
		if len(raw) >= maxPacket {
			return 0, nil, false, fmt.Errorf("%w: longer than %d bytes", errMalformed, maxPacket)
		}
		raw = append(raw, b)
		sum += b
	}
	var cs [2]byte
	for i := range cs {
		if cs[i], err = r.ReadByte(); err != nil {
			return 0, nil, false, err
		}
	}
	want, ok := parseHexByte(cs[0], cs[1])
	if !ok || want != sum {
		return kind, nil, true, nil
	}
	payload, err = expandRLE(raw)
	if err != nil {
		return 0, nil, false, err
	}
	return kind, payload, false, nil
}

// expandRLE undoes the protocol's run-length encoding: "c*n" stands for c
// followed by n-29 more copies of it. As in gdb, it applies to the bytes as
// sent, before binary unescaping.
func expandRLE(raw []byte) ([]byte, error) {
	star := false
	for _, b := range raw {
		if b == '*' {
			star = true
			break
		}
	}
	if !star {
		return raw, nil
	}
	out := make([]byte, 0, len(raw)+32)
	for i := 0; i < len(raw); i++ {
		b := raw[i]
		if b != '*' {
			out = append(out, b)
			continue
		}
		if len(out) == 0 || i+1 >= len(raw) {
			return nil, fmt.Errorf("%w: run-length marker without a character or count", errMalformed)
		}
		i++
		n := int(raw[i]) - 29
		if n < 3 || raw[i] > '~' {
			return nil, fmt.Errorf("%w: run-length count %q", errMalformed, raw[i])
		}
		if len(out)+n > maxPacket {
			return nil, fmt.Errorf("%w: longer than %d bytes", errMalformed, maxPacket)
		}
		prev := out[len(out)-1]
		for range n {
			out = append(out, prev)
		}
	}
	return out, nil
}

// unescape decodes binary data, where '}' means "the next byte XOR 0x20".
// Only binary replies (qXfer) are escaped: text and hex replies are not, so
// unescaping them would corrupt a literal '}'.
func unescape(b []byte) ([]byte, error) {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '}' {
			out = append(out, b[i])
			continue
		}
		i++
		if i >= len(b) {
			return nil, fmt.Errorf("%w: escape character at the end", errMalformed)
		}
		out = append(out, b[i]^0x20)
	}
	return out, nil
}

func parseHexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexVal(hi)
	l, ok2 := hexVal(lo)
	return h<<4 | l, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func isHex(s []byte) bool {
	for _, c := range s {
		if _, ok := hexVal(c); !ok {
			return false
		}
	}
	return true
}

// decodeHex decodes a hex reply such as the answer to 'm' or 'g'.
func decodeHex(s []byte) ([]byte, error) {
	out := make([]byte, len(s)/2)
	if _, err := hex.Decode(out, s); err != nil {
		return nil, fmt.Errorf("%w: bad hex %.40q: %v", errMalformed, s, err)
	}
	return out, nil
}

// littleEndian reads a register value as the stub sends it: target byte
// order, which for RISC-V is little-endian. Bytes past the eighth are
// dropped by the callers, which refuse registers wider than 64 bits.
func littleEndian(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func appendLittleEndian(dst []byte, v uint64, size int) []byte {
	for range size {
		dst = append(dst, hexDigits[v>>4&0xf], hexDigits[v&0xf])
		v >>= 8
	}
	return dst
}

// isStopReply reports whether a packet is a stop reply (T, S, W or X
// followed by two hex digits). No reply to a command this package sends,
// other than '?', 's' and 'c', can look like that: those are hex, "OK",
// "Exx", empty, or start with a lowercase letter or "PacketSize", "QC".
func isStopReply(p []byte) bool {
	if len(p) < 3 || !isHex(p[1:3]) {
		return false
	}
	switch p[0] {
	case 'T', 'W', 'X':
		return len(p) == 3 || p[3] == ';' || p[0] == 'T'
	case 'S':
		return len(p) == 3
	}
	return false
}
