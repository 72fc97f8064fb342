package serial

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "hello\tworld\n", "hello\tworld\n"},
		{"empty", "", ""},
		{"colours", "\x1b[0;32m[  OK  ]\x1b[0m Started \x1b[1mJournal\x1b[m.\r\n", "[  OK  ] Started Journal.\n"},
		{"csi params", "\x1b[?25l\x1b[2J\x1b[1;1Hhome\x1b[38;2;255;0;0mred\x1b[?2004h", "homered"},
		{"osc title bel", "\x1b]0;user@host: ~\x07$ ", "$ "},
		{"osc title st", "\x1b]2;title\x1b\\text", "text"},
		{"osc hyperlink", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"unterminated osc stops at newline", "\x1b]0;oops\nnext line\n", "\nnext line\n"},
		{"dcs", "a\x1bPq#0;2;0;0;0\x1b\\b", "ab"},
		{"short escapes", "\x1b7\x1b(B\x1bcA\x1b8\x1b=\x1b>B", "AB"},
		{"lone esc", "a\x1b\x01b", "ab"},
		{"crlf", "line 1\r\nline 2\r\n", "line 1\nline 2\n"},
		{"cr cr lf", "U-Boot\r\r\nnext\r\r\r\n", "U-Boot\nnext\n"},
		{"prompt kept over crlf", "tiny> \r\ntiny> ", "tiny> \ntiny> "},
		{"lone cr progress", "10%\r20%\r100%\n", "100%\n"},
		{"lone cr overwrite", "abcdef\rXY\n", "XYcdef\n"},
		{"progress with erase", "Loading kernel...  12%\r\x1b[KLoading done\n", "Loading done\n"},
		{"erase whole line", "old text\x1b[2K\rnew\n", "new\n"},
		{"backspace erase echo", "tiny> abc\b \b\b \bd\r\n", "tiny> ad\n"},
		{"backspace countdown", "Hit any key to stop autoboot:  3 \b\b\b 2 \b\b\b 1 \b\b\b 0 \n", "Hit any key to stop autoboot:  0 \n"},
		{"backspace at start", "\b\bab\n", "ab\n"},
		{"cursor back and forward", "abc\x1b[2DX\x1b[CY\n", "aXcY\n"},
		{"cursor forward pads", "a\x1b[3Cb\n", "a   b\n"},
		{"column", "abcdef\x1b[3GZ\n", "abZdef\n"},
		{"delete chars", "abcdef\x1b[4G\x1b[2P\n", "abcf\n"},
		{"insert blanks", "abcd\x1b[2G\x1b[2@X\n", "aX bcd\n"},
		{"bell and nul", "ding\x07\x00!\n", "ding!\n"},
		{"c0 controls", "a\x01\x02\x0e\x0f\x7fb\x0c\x0bc\n", "abc\n"},
		{"c1 control", "a\u009b31mb\u0085c", "a31mbc"},
		{"invalid utf8", "ok \xff\xfe done \xc3( \xe2\x82", "ok \ufffd done \ufffd( "},
		{"valid utf8", "grüße 🦀 ✓\n", "grüße 🦀 ✓\n"},
		{"partial csi at end", "text\x1b[0;3", "text"},
		{"partial esc at end", "text\x1b", "text"},
		{"partial osc at end", "text\x1b]0;tit", "text"},
		{"partial st at end", "text\x1b]0;title\x1b", "text"},
		{"partial utf8 at end", "caf\xc3", "caf"},
		{"trailing cr", "abc \r", "abc "},
		{"cr before partial", "ab \r\x1b[", "ab "},
		{"interrupted csi", "a\x1b[12\nb", "a\nb"},
		{"can cancels osc", "a\x1b]0;x\x18b", "ab"},
		{"huge cursor move bounded", "a\x1b[999999999Cb", "a" + strings.Repeat(" ", maxMove) + "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clean([]byte(tc.in)); got != tc.want {
				t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCompletePrefix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"abc\x1b", 3},
		{"abc\x1b[", 3},
		{"abc\x1b[31", 3},
		{"abc\x1b[31m", 8},
		{"abc\x1b]0;title", 3},
		{"abc\x1b]0;title\x1b", 3},
		{"abc\x1b]0;title\x1b\\", 14},
		{"abc\x1b(", 3},
		{"é\xc3", 2},
		{"\xe2\x82", 0},
		{"\xe2\x82\xac", 3},
		{"bad\xff", 4},
		{"cr\r", 3},
		{"0\xc6\xe0", 1},         // \xc6 is invalid only because of what follows
		{"a\xc6\xc6\xc6\xe0", 1}, // and so on, back
		{"a\x1b[1\xe2\x82", 1},   // the CSI is interrupted only by the cut byte
		{"0\xed\x96\xd6", 1},     // \xed\x96 is invalid only because of \xd6
		{"x\x1b]" + strings.Repeat("a", maxHeldBack), 1 + 2 + maxHeldBack}, // too long to hold back
	} {
		if got := CompletePrefix([]byte(tc.in)); got != tc.want {
			t.Errorf("CompletePrefix(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestCleanWindows: cleaning a stream in windows cut with CompletePrefix
// gives the same text as cleaning it whole, whatever the window size, as
// long as no \r or \b reaches back across a window (none does here).
func TestCleanWindows(t *testing.T) {
	var stream []byte
	for i := range 200 {
		stream = append(stream, "\x1b[1;3"+string(rune('0'+i%8))+"mgrüße\x1b[0m \x1b]0;title\x07line\r\n"...)
	}
	want := Clean(stream)
	for _, size := range []int{1, 2, 3, 5, 7, 16, 100} {
		var got strings.Builder
		for cur := 0; cur < len(stream); {
			w := stream[cur:min(cur+size, len(stream))]
			n := CompletePrefix(w)
			if cur+len(w) == len(stream) {
				n = len(w)
			}
			if n == 0 {
				// The window holds only the start of a sequence: widen it.
				size++
				continue
			}
			got.WriteString(Clean(w[:n]))
			cur += n
		}
		if got.String() != want {
			t.Fatalf("window %d: got %q..., want %q...", size, got.String()[:80], want[:80])
		}
	}
}

// lastToken returns the last token of b, which is not empty.
func lastToken(b []byte) token {
	var t token
	for i := 0; i < len(b); i += t.n {
		t = nextToken(b[i:])
		if !t.complete {
			break
		}
	}
	return t
}

func TestRaw(t *testing.T) {
	if s, enc := Raw([]byte("tiny> \x1b[1m\r\n")); s != "tiny> \x1b[1m\r\n" || enc != "utf-8" {
		t.Errorf("Raw(valid) = %q, %q", s, enc)
	}
	in := []byte("a\xffb\x00")
	s, enc := Raw(in)
	if enc != "base64" {
		t.Fatalf("Raw(invalid) encoding %q", enc)
	}
	if dec, err := base64.StdEncoding.DecodeString(s); err != nil || !bytes.Equal(dec, in) {
		t.Fatalf("Raw(invalid) = %q does not decode back: %q, %v", s, dec, err)
	}
}

// FuzzClean: Clean never panics, always returns valid UTF-8 without ESC or
// other controls than \n and \t, ignores a cut tail, and stays within a
// bounded size. Seeds are in testdata/fuzz/FuzzClean.
func FuzzClean(f *testing.F) {
	f.Add([]byte("\x1b[31mred\x1b[0m\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := Clean(b)
		if !utf8.ValidString(got) {
			t.Fatalf("Clean(%q) = %q: not valid UTF-8", b, got)
		}
		for _, r := range got {
			if (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r < 0xa0) {
				t.Fatalf("Clean(%q) = %q: contains control %U", b, got, r)
			}
		}
		n := CompletePrefix(b)
		if n < 0 || n > len(b) || len(b)-n > maxHeldBack {
			t.Fatalf("CompletePrefix(%q) = %d", b, n)
		}
		if len(b) <= maxHeldBack {
			// The prefix ends with a complete token: cutting again does
			// nothing, and cleaning drops nothing at its end.
			if again := CompletePrefix(b[:n]); again != n {
				t.Fatalf("CompletePrefix(%q) = %d, but of that prefix %d", b, n, again)
			}
			if k := len(b[:n]); k > 0 {
				if tok := lastToken(b[:n]); !tok.complete {
					t.Fatalf("CompletePrefix(%q) = %d ends in an incomplete token", b, n)
				}
			}
		}
		// Each input byte yields at most one rune (3 bytes for U+FFFD),
		// except cursor moves, bounded by maxMove blanks per sequence.
		if len(got) > 3*len(b)+maxMove*(bytes.Count(b, []byte{0x1b})) {
			t.Fatalf("Clean(%d bytes) = %d bytes", len(b), len(got))
		}
	})
}
