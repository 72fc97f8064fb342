package rpcframe

import (
	"bytes"
	"unicode/utf8"
)

// fastDepth bounds the nesting the fast path follows; deeper messages (the
// SDK refuses past 1000) take the full check.
const fastDepth = 100

// fastAccept reports whether msg is, beyond doubt, one JSON-RPC message
// that the full check (checkFull) and the SDK's decoder both accept, in a
// single pass over the bytes and without allocating: the ordinary request,
// notification or response of a client. It never rejects: false means only
// "not sure", and the full check decides, with its exact answer. So
// anything unusual (a key in another case or with escapes, a duplicate key,
// an "error" member, an id that is not a plain string or int64, a number
// with an exponent, a string that is not valid UTF-8 or escapes a
// surrogate, deep nesting) is left to it: what the fast path accepts is a
// subset of what the full check accepts, which a fuzz test holds it to.
func fastAccept(msg []byte) bool {
	s := scanner{b: msg}
	if !s.object() || s.i != len(s.b) {
		return false
	}
	if s.seen&(1<<keyError) != 0 || !bytes.Equal(s.val[keyJSONRPC], []byte(`"2.0"`)) {
		return false
	}
	hasID := false
	if id := s.val[keyID]; id != nil {
		switch {
		case id[0] == '"':
			hasID = true
		case id[0] == 'n': // null
		case plainInt64(id):
			hasID = true
		default:
			return false
		}
	}
	if m := s.val[keyMethod]; m != nil {
		return m[0] == '"'
	}
	return s.val[keyResult] != nil && hasID
}

// plainInt64 reports whether n (a valid JSON number) is an integer without
// fraction or exponent that fits an int64 with room to spare: it decodes
// the same as a float64 (the SDK) and an int64.
func plainInt64(n []byte) bool {
	d := n
	if d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 15 {
		return false
	}
	for _, c := range d {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// The top-level members the check looks at.
const (
	keyJSONRPC = iota
	keyID
	keyMethod
	keyParams
	keyResult
	keyError
	numKeys
)

var keyNames = [numKeys]string{"jsonrpc", "id", "method", "params", "result", "error"}

// scanner is a strict JSON validator (RFC 8259, as encoding/json's) that
// records the raw values of the top-level members; ok false means invalid
// or unusual.
type scanner struct {
	b     []byte
	i     int
	depth int
	seen  uint8
	val   [numKeys][]byte
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) object() bool {
	// s.b[s.i] is '{'.
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	if closed, ok := s.enter('}'); closed || !ok {
		return ok
	}
	top := s.depth == 1
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		start := s.i
		if !s.str() {
			return false
		}
		k := -1
		if top && !s.topKey(s.b[start+1:s.i-1], &k) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		vstart := s.i
		if !s.value() {
			return false
		}
		if k >= 0 {
			s.val[k] = s.b[vstart:s.i]
		}
		if more, ok := s.next('}'); !more {
			return ok
		}
		s.ws()
	}
}

// topKey classifies a top-level key (its raw bytes between the quotes):
// k is the member the check reads, or -1 for one it ignores. False for a
// key the decoders might read differently: escaped, not ASCII, another
// case of a member's name (encoding/json folds case, the SDK does not), or
// a member given twice.
func (s *scanner) topKey(raw []byte, k *int) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	for j, name := range keyNames {
		if len(raw) != len(name) {
			continue
		}
		if string(raw) == name {
			if s.seen&(1<<j) != 0 {
				return false
			}
			s.seen |= 1 << j
			*k = j
			return true
		}
		if bytes.EqualFold(raw, []byte(name)) {
			return false
		}
	}
	return true
}

func (s *scanner) array() bool {
	// s.b[s.i] is '['.
	if closed, ok := s.enter(']'); closed || !ok {
		return ok
	}
	for {
		if !s.value() {
			return false
		}
		if more, ok := s.next(']'); !more {
			return ok
		}
		s.ws()
	}
}

// enter steps into the object or array opening at s.i, one level deeper:
// not ok past the depth the check follows; closed if it is empty (and
// then left again).
func (s *scanner) enter(close byte) (closed, ok bool) {
	s.depth++
	if s.depth > fastDepth {
		return false, false
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == close {
		s.i++
		s.depth--
		return true, true
	}
	return false, true
}

// next reads what follows a member or element: a ',' (more follows) or
// close, which leaves the object or array; anything else is not ok. It is
// small enough for the compiler to inline.
func (s *scanner) next(close byte) (more, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		return true, true
	case close:
		s.i++
		s.depth--
		return false, true
	}
	return false, false
}

func (s *scanner) value() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		return s.str()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	}
	return false
}

func (s *scanner) lit(l string) bool {
	if len(s.b)-s.i < len(l) || string(s.b[s.i:s.i+len(l)]) != l {
		return false
	}
	s.i += len(l)
	return true
}

// number accepts -?(0|[1-9][0-9]*)(\.[0-9]+)?, and leaves a number with an
// exponent to the full check.
func (s *scanner) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return false
	}
	return true
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// str accepts a string of valid UTF-8 whose escapes are JSON's, and leaves
// one that escapes a surrogate (decoders differ on lone ones) to the full
// check.
func (s *scanner) str() bool {
	s.i++ // '"'
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false
				}
				var r rune
				for _, h := range s.b[s.i+2 : s.i+6] {
					switch {
					case h >= '0' && h <= '9':
						r = r<<4 | rune(h-'0')
					case h >= 'a' && h <= 'f':
						r = r<<4 | rune(h-'a'+10)
					case h >= 'A' && h <= 'F':
						r = r<<4 | rune(h-'A'+10)
					default:
						return false
					}
				}
				if r >= 0xd800 && r <= 0xdfff {
					return false
				}
				s.i += 6
			default:
				return false
			}
		case c < 0x20:
			return false
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n <= 1 {
				return false
			}
			s.i += n
		}
	}
	return false
}
