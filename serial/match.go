package serial

import (
	"bytes"
	"regexp"
	"regexp/syntax"
	"sync"
	"unicode"
	"unicode/utf8"
)

// maxBoundedLen caps the match length analysis: patterns that can match more
// bytes than this are treated as unbounded.
const maxBoundedLen = 1 << 16

// matcher finds the leftmost match of a regexp in a growing window (the
// bytes from a Wait's since to the current end), rescanning as little as it
// can prove is enough.
//
// Why a suffix rescan is correct: suppose the window [0, e) was scanned and
// had no match, and the window grows to [0, e') with e' > e. Take any match
// [s, m) in the grown window. If m <= e, the same path through the regexp
// also matches in [0, e): it reads the same bytes, and if the pattern has no
// assertion that looks before the match position (^, \A, (?m)^, \b, \B), the
// only assertions it can use are $ and \z, which cannot be true before e'
// in the grown window except (?m)$ before a '\n', which holds in [0, e) too
// (at e itself because e is the end of the text there). That would
// contradict "no match in [0, e)", so every new match ends after e: it
// starts at or after e - maxLen if the pattern matches at most maxLen bytes,
// and after the last '\n' before e if the pattern can never match a '\n'.
// Independently of any scan, a match starts with the pattern's literal
// prefix (regexp.LiteralPrefix), so it starts at the first occurrence of the
// prefix at or after an earlier bound, or, if the window holds none, at
// most len(prefix)-1 bytes before its end. Scanning the suffix from such a point finds the same leftmost match as
// scanning from 0, because without look-behind assertions what matches at a
// position does not depend on bytes before it. The point is moved back to a
// rune boundary (as decoded from the window start), since Go's regexp only
// tries matches at those.
type matcher struct {
	re *regexp.Regexp
	// incremental reports that the suffix rescan applies; maxLen (-1 when
	// unbounded), lineLocal and prefix (nil if none) say which bounds hold.
	incremental bool
	maxLen      int
	lineLocal   bool
	prefix      []byte
	// scanned is the window length of the last scan, which found nothing
	// (-1 before the first scan); lo is a lower bound for the start of any
	// match in any longer window.
	scanned int
	lo      int
}

// newMatcher analyses re for the suffix rescan.
func newMatcher(re *regexp.Regexp) *matcher {
	m := &matcher{re: re, scanned: -1}
	a := analyses.get(re)
	m.incremental, m.maxLen, m.lineLocal, m.prefix = a.incremental, a.maxLen, a.lineLocal, a.prefix
	return m
}

// shape is what the suffix rescan may rely on for a pattern (see matcher).
type shape struct {
	incremental bool
	maxLen      int
	lineLocal   bool
	prefix      []byte // shared: never written
}

// analyse works out re's shape.
func analyse(re *regexp.Regexp) shape {
	sh := shape{maxLen: -1}
	// regexp.Compile parses with syntax.Perl. A POSIX pattern parses the same
	// way or (for [^...] classes) as possibly matching '\n', which only makes
	// the analysis more conservative; a parse failure disables it.
	tree, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return sh
	}
	var a analysis
	n, bounded := a.walk(tree)
	if a.lookBehind {
		return sh
	}
	if bounded {
		sh.maxLen = n
	}
	sh.lineLocal = !a.newline
	if prefix, _ := re.LiteralPrefix(); prefix != "" {
		sh.prefix = []byte(prefix)
	}
	sh.incremental = bounded || sh.lineLocal || sh.prefix != nil
	return sh
}

// shapes remembers patterns' shapes by their source: a wait's patterns
// are mostly those of the waits before it (the default panic patterns, a
// prompt), and parsing them again cost more than the rest of a short
// wait (30 µs of an echo's CPU for the seven patterns of a wait). It is
// bounded: past maxShapes it starts afresh.
type shapes struct {
	mu sync.Mutex
	m  map[string]shape
}

const maxShapes = 256

var analyses shapes

func (c *shapes) get(re *regexp.Regexp) shape {
	src := re.String()
	c.mu.Lock()
	sh, ok := c.m[src]
	c.mu.Unlock()
	if ok {
		return sh
	}
	sh = analyse(re)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxShapes {
		c.m = make(map[string]shape)
	}
	c.m[src] = sh
	c.mu.Unlock()
	return sh
}

// find returns the submatch indexes (relative to window) of the leftmost
// match in window, or nil. Each call's window must extend the previous one
// (same start, same bytes, at least as long).
func (m *matcher) find(window []byte) []int {
	if len(window) == m.scanned {
		return nil // nothing new since a scan that found nothing
	}
	p := 0
	if m.incremental && m.scanned >= 0 {
		p = m.safePoint(window)
	}
	loc := m.re.FindSubmatchIndex(window[p:])
	m.scanned = len(window)
	if loc == nil {
		return nil
	}
	if p > 0 {
		for i, v := range loc {
			if v >= 0 {
				loc[i] = v + p
			}
		}
	}
	return loc
}

// reset forgets all earlier scans: the next find scans its whole window.
func (m *matcher) reset() {
	m.scanned, m.lo = -1, 0
}

// shift tells the matcher that the window now starts delta bytes later
// (bytes were evicted from the front), at a point where Go's regexp starts
// a rune whether it decodes from the old start or the new one (see
// ringStore.runeAligned). For an incremental matcher what it learnt still
// holds: a match in the shorter window [delta, scanned) would, without
// look-behind assertions, be a match at the same place in [0, scanned),
// which had none. A pattern with look-behind assertions (^ and \b depend
// on where the window starts) scans again from the new start.
func (m *matcher) shift(delta int) {
	if delta <= 0 {
		return
	}
	if !m.incremental || m.scanned < 0 || delta >= m.scanned {
		m.reset()
		return
	}
	m.scanned -= delta
	m.lo = max(m.lo-delta, 0)
}

// safePoint returns the offset in window from which a rescan finds the same
// leftmost match as a scan from 0, given that window[:m.scanned] had none.
func (m *matcher) safePoint(window []byte) int {
	e := m.scanned
	lo := m.lo
	if m.maxLen >= 0 && e-m.maxLen > lo {
		lo = e - m.maxLen
	}
	if m.lineLocal {
		if i := bytes.LastIndexByte(window[lo:e], '\n'); i >= 0 {
			lo += i + 1
		}
	}
	if m.prefix != nil {
		// Searches the whole window, new data included: this bound does
		// not depend on the earlier scan.
		if i := bytes.Index(window[lo:], m.prefix); i >= 0 {
			lo += i
		} else {
			lo = max(lo, len(window)-len(m.prefix)+1)
		}
	}
	lo = runeStart(window, lo)
	m.lo = lo
	return lo
}

// runeStart moves p back to a position where Go's regexp, decoding window
// from its start, begins a rune. A non-continuation byte always starts a
// rune (a valid multi-byte rune only spans continuation bytes; an invalid
// byte is a one-byte rune), and so does a position preceded by
// utf8.UTFMax-1 continuation bytes (no lead byte is near enough to cover
// it).
func runeStart(window []byte, p int) int {
	for q := p; q >= 0 && q > p-utf8.UTFMax; q-- {
		if q == 0 || q == len(window) || utf8.RuneStart(window[q]) {
			return q
		}
	}
	return p
}

// analysis collects properties of a regexp syntax tree.
type analysis struct {
	lookBehind bool // has ^, \A, (?m)^, \b or \B
	newline    bool // may match a '\n' byte
}

// walk returns the maximum number of bytes re can match and whether that is
// bounded, recording other properties in a.
func (a *analysis) walk(re *syntax.Regexp) (int, bool) {
	switch re.Op {
	case syntax.OpNoMatch, syntax.OpEmptyMatch, syntax.OpEndLine, syntax.OpEndText:
		return 0, true
	case syntax.OpBeginLine, syntax.OpBeginText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		a.lookBehind = true
		return 0, true
	case syntax.OpLiteral:
		n := 0
		for _, r := range re.Rune {
			if r == '\n' {
				a.newline = true
			}
			n += literalWidth(r, re.Flags&syntax.FoldCase != 0)
		}
		return n, n <= maxBoundedLen
	case syntax.OpCharClass:
		for i := 0; i+1 < len(re.Rune); i += 2 {
			if re.Rune[i] <= '\n' && '\n' <= re.Rune[i+1] {
				a.newline = true
			}
		}
		if len(re.Rune) == 0 {
			return 0, true
		}
		return runeWidth(re.Rune[len(re.Rune)-1]), true
	case syntax.OpAnyChar:
		a.newline = true
		return utf8.UTFMax, true
	case syntax.OpAnyCharNotNL:
		return utf8.UTFMax, true
	case syntax.OpCapture:
		return a.walk(re.Sub[0])
	case syntax.OpQuest:
		return a.walk(re.Sub[0])
	case syntax.OpStar, syntax.OpPlus:
		a.walk(re.Sub[0])
		return 0, false
	case syntax.OpRepeat:
		n, ok := a.walk(re.Sub[0])
		if !ok || re.Max < 0 {
			return 0, false
		}
		n *= re.Max
		return n, n <= maxBoundedLen
	case syntax.OpConcat, syntax.OpAlternate:
		total, bounded := 0, true
		for _, sub := range re.Sub {
			n, ok := a.walk(sub)
			bounded = bounded && ok
			if re.Op == syntax.OpConcat {
				total += n
			} else {
				total = max(total, n)
			}
		}
		return total, bounded && total <= maxBoundedLen
	default:
		// Unknown operator: assume the worst.
		a.lookBehind = true
		a.newline = true
		return 0, false
	}
}

// literalWidth returns the most bytes a literal rune can match, counting
// its case variants when folding.
func literalWidth(r rune, fold bool) int {
	n := runeWidth(r)
	if fold {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			n = max(n, runeWidth(f))
		}
	}
	return n
}

// runeWidth returns the most bytes a rune can match: its UTF-8 length (an
// invalid byte in the text is matched as U+FFFD of width 1).
func runeWidth(r rune) int {
	if n := utf8.RuneLen(r); n > 0 {
		return n
	}
	return utf8.UTFMax
}
