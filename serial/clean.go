package serial

import (
	"encoding/base64"
	"strings"
	"unicode/utf8"
)

// Clean turns raw console output into plain text for an agent to read:
// valid UTF-8 without terminal control sequences, rendered line by line the
// way a terminal would show it.
//
//   - Escape sequences are removed: CSI (ESC [ params intermediates
//     final; colours, cursor keys, erasing), OSC (ESC ] ... up to BEL or
//     ST, such as a window title) and the other string sequences (DCS ESC
//     P, SOS ESC X, PM ESC ^, APC ESC _; up to ST), and the short ones (ESC
//     followed by intermediates and a final byte: ESC 7, ESC c, ESC ( B,
//     ...). A string sequence also ends at CAN or SUB (removed) and at a
//     newline (kept), so a stray ESC ] cannot swallow the rest of the
//     output; a CSI sequence interrupted by a byte that cannot be part of
//     it ends there, and that byte counts on its own. An ESC followed by
//     anything else is removed alone. C1 controls (U+0080-U+009F), DEL and
//     C0 controls other than \n, \t, \r and \b are removed.
//   - Lines are rendered: \r\n (and \r\r\n, ...) is a newline; a lone \r
//     moves back to the start of the line and \b one column back, so
//     that what follows overwrites what was there, as on a screen. A
//     progress bar "10%\r20%\r30%\n" becomes "30%\n", and line editing's
//     echo "ab\b \bc" becomes "ac". The CSI sequences that edit a line
//     are applied too: erase in line (K), cursor forward, back and to a
//     column (C, D, G), delete and insert characters (P, @) and erase
//     characters (X). A line ends up as the screen would show it, except
//     that blanks at or after the cursor at its end (what erasing with
//     spaces leaves) are dropped. A column is a rune; tabs are kept as
//     they are.
//   - Each run of bytes that is not valid UTF-8 becomes one U+FFFD.
//
// Clean keeps no state between calls. A sequence cut at the end of b (an
// escape sequence, or a multi-byte UTF-8 character, whose rest is not in b
// yet) is dropped, as are \r at the very end (possibly the first half of
// \r\n); [CompletePrefix] says where such a tail starts, so a caller that
// reads output in windows can end its window (and its cursor) there and
// get the whole sequence in the next one. A window that starts inside a
// sequence shows its rest as text; a \r or \b can only move back within the
// window. Raw bytes are for [Raw].
func Clean(b []byte) string {
	if plain(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b))
	var ln screenLine
	invalid := false // the previous token was an invalid byte
	for i := 0; i < len(b); {
		t := nextToken(b[i:])
		if !t.complete {
			break
		}
		wasInvalid := invalid
		invalid = false
		switch t.kind {
		case tokRune:
			ln.put(t.r)
		case tokInvalid:
			if !wasInvalid {
				ln.put(utf8.RuneError)
			}
			invalid = true
		case tokControl:
			switch b[i] {
			case '\n':
				ln.flush(&sb, true)
			case '\t':
				ln.put('\t')
			case '\b':
				ln.col = max(ln.col-1, 0)
			case '\r':
				j := i
				for j < len(b) && b[j] == '\r' {
					j++
				}
				switch {
				case j == len(b) || !nextToken(b[j:]).complete:
					// At the end (after it only a cut sequence, which is
					// dropped): perhaps half of a \r\n.
					j = len(b)
				case b[j] == '\n':
					ln.flush(&sb, true)
					j++
				default:
					ln.col = 0
				}
				i = j
				continue
			}
		case tokEscape:
			ln.escape(b[i : i+t.n])
		}
		i += t.n
	}
	ln.flush(&sb, false)
	return sb.String()
}

// plain reports whether Clean has nothing to do: printable ASCII, \n and
// \t only.
func plain(b []byte) bool {
	for _, c := range b {
		if (c < 0x20 && c != '\n' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// maxHeldBack is the longest incomplete tail CompletePrefix holds back.
const maxHeldBack = 512

// CompletePrefix returns the length of the longest prefix of b that does
// not end inside an escape sequence or a UTF-8 character: the bytes after
// it are the start of one that needs more bytes than b has (Clean drops
// them), together with any bytes before that which only b's tail made
// complete (a lead byte that the cut sequence proved invalid). A caller
// that cleans output in windows can end its window there, so that the
// sequence is cleaned whole in the next one. It holds back at most 512
// bytes: a longer unfinished tail (a string sequence that never ends) is
// not held back, so windows larger than that always make progress.
func CompletePrefix(b []byte) int {
	lo := len(b) - maxHeldBack // a token starting before lo is never held back
	var starts []int           // token boundaries from a little before lo on
	i := incompleteTail(b, 0, func(p int) {
		if p >= lo-utf8.UTFMax {
			starts = append(starts, p)
		}
	})
	n := len(b)
	for i < n {
		if i < lo {
			return len(b)
		}
		n = i
		// Cutting b[i:] can leave the token before it unfinished too (a
		// lead byte that only the cut bytes showed to be invalid, an
		// escape sequence interrupted by the first cut byte). How b
		// splits into tokens up to p depends on bytes up to p+3 at most,
		// so b's token boundaries at or before n-4 are still boundaries:
		// tokenize again from there.
		p := 0
		for _, s := range starts {
			if s > n-utf8.UTFMax {
				break
			}
			p = s
		}
		i = incompleteTail(b[:n], p, nil)
	}
	return n
}

// incompleteTail splits b into tokens from the token boundary p on,
// calling record (if not nil) with each token's start, and returns the
// start of the unfinished token at the end of b, or len(b) if there is
// none.
func incompleteTail(b []byte, p int, record func(int)) int {
	for p < len(b) {
		if record != nil {
			record(p)
		}
		t := nextToken(b[p:])
		if !t.complete {
			return p
		}
		p += t.n
	}
	return len(b)
}

// Raw returns b as it came for a JSON text field: b itself with encoding
// "utf-8" if it is valid UTF-8, else its standard base64 encoding with
// encoding "base64".
func Raw(b []byte) (text, encoding string) {
	if utf8.Valid(b) {
		return string(b), "utf-8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

type tokKind uint8

const (
	tokRune    tokKind = iota // a printable character
	tokInvalid                // a byte that is not valid UTF-8
	tokControl                // a C0 or C1 control character, or DEL
	tokEscape                 // an escape sequence (or a lone ESC)
)

type token struct {
	kind     tokKind
	n        int  // length in bytes
	r        rune // the character, for tokRune
	complete bool // false: b ends before the token does
}

// nextToken returns the token at the start of b, which is not empty.
func nextToken(b []byte) token {
	c := b[0]
	switch {
	case c == 0x1b:
		n, ok := escapeLen(b)
		return token{kind: tokEscape, n: n, complete: ok}
	case c < 0x20 || c == 0x7f:
		return token{kind: tokControl, n: 1, complete: true}
	case c < 0x80:
		return token{kind: tokRune, n: 1, r: rune(c), complete: true}
	}
	if !utf8.FullRune(b) {
		return token{kind: tokInvalid, n: len(b), complete: false}
	}
	r, n := utf8.DecodeRune(b)
	switch {
	case r == utf8.RuneError && n == 1:
		return token{kind: tokInvalid, n: 1, complete: true}
	case r < 0xa0:
		return token{kind: tokControl, n: n, complete: true} // C1
	}
	return token{kind: tokRune, n: n, r: r, complete: true}
}

// escapeLen returns the length of the escape sequence at the start of b
// (b[0] is ESC) and whether it is complete; see Clean.
func escapeLen(b []byte) (int, bool) {
	if len(b) < 2 {
		return len(b), false
	}
	switch c := b[1]; {
	case c == '[': // CSI: parameters, intermediates, then a final byte
		return finalByte(b, skipBytes(b, skipBytes(b, 2, 0x30, 0x3f), 0x20, 0x2f), 0x40, 0x7e)
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_': // OSC, DCS, SOS, PM, APC
		for j := 2; j < len(b); j++ {
			switch b[j] {
			case 0x07, 0x18, 0x1a: // BEL ends an OSC; CAN and SUB cancel
				return j + 1, true
			case '\n':
				return j, true
			case 0x1b:
				switch {
				case j+1 == len(b):
					return len(b), false
				case b[j+1] == '\\': // ST
					return j + 2, true
				}
				return j, true // a new sequence starts
			}
		}
		return len(b), false
	case c >= 0x20 && c <= 0x2f: // intermediates, then a final byte
		return finalByte(b, skipBytes(b, 2, 0x20, 0x2f), 0x30, 0x7e)
	case c >= 0x30 && c <= 0x7e:
		return 2, true
	}
	return 1, true // a lone ESC
}

// skipBytes returns the index of the first byte of b from j on that is not
// in lo..hi.
func skipBytes(b []byte, j int, lo, hi byte) int {
	for j < len(b) && b[j] >= lo && b[j] <= hi {
		j++
	}
	return j
}

// finalByte ends an escape sequence whose final byte, in lo..hi, is due at
// b[j]: the sequence is incomplete if b ends first, and interrupted (ends
// before b[j]) if another byte stands there.
func finalByte(b []byte, j int, lo, hi byte) (int, bool) {
	switch {
	case j == len(b):
		return j, false
	case b[j] >= lo && b[j] <= hi:
		return j + 1, true
	}
	return j, true
}

// maxMove bounds how far past the end of a line escape sequences can move
// the cursor (and how many blanks one can insert), so that a few bytes
// cannot make Clean's output huge.
const maxMove = 256

// screenLine is the line being rendered: its characters and the cursor.
type screenLine struct {
	cells []rune
	col   int
}

// put writes r at the cursor and moves it right, padding with blanks if
// the cursor is past the end.
func (l *screenLine) put(r rune) {
	if l.col < len(l.cells) {
		l.cells[l.col] = r
	} else {
		for len(l.cells) < l.col {
			l.cells = append(l.cells, ' ')
		}
		l.cells = append(l.cells, r)
	}
	l.col++
}

// flush appends the line (and a newline if nl) to sb and starts a new one.
func (l *screenLine) flush(sb *strings.Builder, nl bool) {
	cells := l.cells
	if l.col < len(cells) {
		k := len(cells)
		for k > l.col && cells[k-1] == ' ' {
			k--
		}
		cells = cells[:k]
	}
	for _, r := range cells {
		sb.WriteRune(r)
	}
	if nl {
		sb.WriteByte('\n')
	}
	l.cells, l.col = l.cells[:0], 0
}

// escape applies the escape sequence seq if it edits the line; all
// others are just dropped.
func (l *screenLine) escape(seq []byte) {
	if len(seq) < 3 || seq[1] != '[' {
		return
	}
	final := seq[len(seq)-1]
	params := seq[2 : len(seq)-1]
	if final < 0x40 || final > 0x7e || (len(params) > 0 && params[0] >= '<') {
		return // interrupted, or private (ESC [ ? 25 l and the like)
	}
	n := 0
	for _, c := range params {
		if c < '0' || c > '9' {
			if c >= 0x20 && c <= 0x2f {
				return // intermediates: something else
			}
			break // only the first parameter matters here
		}
		n = min(n*10+int(c-'0'), 1<<20)
	}
	n1 := max(n, 1) // for counts and positions, 0 means 1
	limit := max(len(l.cells), l.col) + maxMove
	switch final {
	case 'K': // erase in line
		switch n {
		case 0:
			l.cells = l.cells[:min(l.col, len(l.cells))]
		case 1:
			for i := 0; i <= l.col && i < len(l.cells); i++ {
				l.cells[i] = ' '
			}
		case 2:
			l.cells = l.cells[:0]
		}
	case 'C': // cursor forward
		l.col = min(l.col+n1, limit)
	case 'D': // cursor back
		l.col = max(l.col-n1, 0)
	case 'G': // cursor to column
		l.col = min(n1-1, limit)
	case 'P': // delete characters
		if l.col < len(l.cells) {
			k := min(n1, len(l.cells)-l.col)
			l.cells = append(l.cells[:l.col], l.cells[l.col+k:]...)
		}
	case '@': // insert blanks
		if l.col < len(l.cells) {
			k := min(n1, maxMove)
			l.cells = append(l.cells[:l.col], append(make([]rune, k), l.cells[l.col:]...)...)
			for i := range k {
				l.cells[l.col+i] = ' '
			}
		}
	case 'X': // erase characters
		for i := l.col; i < l.col+n1 && i < len(l.cells); i++ {
			l.cells[i] = ' '
		}
	}
}
