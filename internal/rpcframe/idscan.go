package rpcframe

import "encoding/json"

// maxIDLen bounds an id the scanner keeps: an id is a string or a number
// the client chose, and a client that makes it longer than this cannot
// expect it echoed.
const maxIDLen = 256

// idScanner finds the top-level "id" of a JSON object fed to it piece by
// piece, holding nothing but the id itself: a line over the limit is
// answered with its id (a client such as the TypeScript SDK writes "id"
// after "params", so the id can come at the very end) without the line
// ever being in memory. It is a lexer, not a validator: on input that is
// not an object it finds no id, and a valid line's id is the one
// encoding/json would decode (the last one, if there are several).
type idScanner struct {
	depth    int  // nesting: 1 inside the top-level object
	inString bool // inside a string
	escape   bool // the previous byte was a backslash in a string
	broken   bool // the input is not an object: give up

	// Keys and values at depth 1.
	expectKey bool   // the next string at depth 1 is a key
	key       []byte // the current key, up to len("id")+1 bytes
	keyLong   bool
	keyIsID   bool // the last key read was exactly "id"
	inValue   bool // reading the scalar value of "id"
	value     []byte
	valueLong bool

	id []byte // the id found, if any
}

// feed scans the next piece of the line.
func (s *idScanner) feed(p []byte) {
	for _, c := range p {
		if s.broken {
			return
		}
		s.step(c)
	}
}

func (s *idScanner) step(c byte) {
	if s.inString {
		if s.depth == 1 && s.expectKey {
			s.keyByte(c)
		} else if s.inValue {
			s.valueByte(c)
		}
		switch {
		case s.escape:
			s.escape = false
		case c == '\\':
			s.escape = true
		case c == '"':
			s.inString = false
			if s.depth == 1 && s.expectKey {
				s.expectKey = false
				s.keyIsID = !s.keyLong && string(s.key) == `id"`
			} else if s.inValue {
				s.endValue()
			}
		}
		return
	}
	if s.inValue {
		if len(s.value) == 0 {
			switch c {
			case ' ', '\t', '\r', '\n':
				return
			case '{', '[':
				// Not a scalar: no usable id; the structure goes on.
				s.inValue, s.keyIsID, s.id = false, false, nil
			case '"':
				s.inString = true
				s.valueByte(c)
				return
			default:
				s.valueByte(c)
				return
			}
		} else {
			switch c {
			case ',', '}', ' ', '\t', '\r', '\n':
				s.endValue()
			default:
				s.valueByte(c)
				return
			}
		}
	}
	switch c {
	case ' ', '\t', '\r', '\n':
	case '{', '[':
		if s.depth == 0 && c != '{' {
			s.broken = true
			return
		}
		s.depth++
		if s.depth == 1 {
			s.expectKey = true
		}
		s.keyIsID = false
	case '}', ']':
		s.depth--
		if s.depth <= 0 {
			s.broken = s.depth < 0
		}
	case ',':
		if s.depth == 1 {
			s.expectKey = true
			s.keyIsID = false
		}
	case ':':
		if s.depth == 1 && s.keyIsID {
			s.inValue = true
			s.value, s.valueLong = s.value[:0], false
		}
	case '"':
		s.inString = true
		if s.depth == 1 && s.expectKey {
			s.key, s.keyLong = s.key[:0], false
		}
	default:
		if s.depth == 0 {
			s.broken = true
		}
	}
}

func (s *idScanner) keyByte(c byte) {
	if len(s.key) >= 3 {
		s.keyLong = true
		return
	}
	s.key = append(s.key, c)
}

func (s *idScanner) valueByte(c byte) {
	if len(s.value) >= maxIDLen {
		s.valueLong = true
		return
	}
	s.value = append(s.value, c)
}

func (s *idScanner) endValue() {
	s.inValue, s.keyIsID = false, false
	s.id = nil
	if !s.valueLong && len(s.value) > 0 {
		s.id = append([]byte(nil), s.value...)
	}
}

// ID returns the id found, when it is one a response can carry: a string
// or an integer (MCP's ids); nil otherwise.
func (s *idScanner) ID() json.RawMessage {
	if s.broken || s.inValue || len(s.id) == 0 {
		return nil
	}
	id := json.RawMessage(s.id)
	switch {
	case id[0] == '"':
		var str string
		if json.Unmarshal(id, &str) != nil {
			return nil
		}
	default:
		if _, bad := intID(id); bad {
			return nil
		}
	}
	return id
}
