package serial

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"
	"unicode/utf8"
)

func TestMatcherAnalysis(t *testing.T) {
	for _, tc := range []struct {
		re          string
		incremental bool
		maxLen      int
		lineLocal   bool
	}{
		{`login: `, true, 7, true},
		{`Hit any key to stop autoboot:`, true, 29, true},
		{`=> $`, true, 3, true},
		{`(?i)k`, true, 3, true}, // K (U+212A, Kelvin) folds to k
		{`a\nb`, true, 3, false},
		{`\d{1,3}\.\d{1,3}`, true, 7, true},
		{`foo.*bar`, true, -1, true},
		{`[^\n]+ok`, true, -1, true},
		{`(?s)foo.*bar`, true, -1, false}, // literal prefix "foo"
		{`login:\s*`, true, -1, false},    // literal prefix "login:"
		{`(?s).*bar`, false, -1, false},
		{`\s+\$ `, false, -1, false},
		{`[^a]+`, false, -1, false},
		{`^root@`, false, 5, true},
		{`(?m)^\$ `, false, 2, true},
		{`\bok\b`, false, 2, true},
		{`x{2,}`, true, -1, true},
		{`é{3}`, true, 6, true},
		{`[a-z\x{10000}]`, true, 4, true},
	} {
		m := newMatcher(regexp.MustCompile(tc.re))
		if m.incremental != tc.incremental || (tc.incremental && (m.maxLen != tc.maxLen || m.lineLocal != tc.lineLocal)) {
			t.Errorf("%q: incremental %v maxLen %d lineLocal %v; want %v %d %v",
				tc.re, m.incremental, m.maxLen, m.lineLocal, tc.incremental, tc.maxLen, tc.lineLocal)
		}
	}
}

// TestMatcherAgainstFullScan checks the suffix rescan against a plain scan
// from the window start after every chunk, for many patterns, texts and
// chunkings: they must agree on every submatch index.
func TestMatcherAgainstFullScan(t *testing.T) {
	patterns := []string{
		`abc`, `a.c`, `a\nb`, `b$`, `(?m)b$`, `c\z`, `x*`, `ab*`, `ab+c`, `a|ab`, `ab|a`,
		`(a)(b)?c`, `[^\n]+ok`, `a.*c`, `(?s)a.*c`, `é`, `.é.`, `\x{FFFD}`, `[^a]`, `..`,
		`(?i)k+`, `(?i)ſ`, `a{2,3}`, `(ab){2}`, `\d+\n`, `ok$`, `(?U)a.+c`, `a[^x]c`, `\n\n`,
		`(?s)ab.*c`, `ab\s+c`, `ok(?s:.)+b`, `éa[^b]*c`, `\x{FFFD}\x{FFFD}[^z]*`, `(?s)ok.*\z`,
	}
	alphabet := [][]byte{
		[]byte("a"), []byte("b"), []byte("c"), []byte("\n"), []byte("ok"), []byte("é"),
		[]byte("K"), []byte("\u212a"), []byte("ſ"), []byte("x"), []byte("1"), {0xc3}, {0xa9}, {0xff}, {0x80, 0x80, 0x80, 0x80},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, pat := range patterns {
		re := regexp.MustCompile(pat)
		longest := regexp.MustCompile(pat)
		longest.Longest()
		for iter := range 150 {
			var text []byte
			for range rng.IntN(40) {
				text = append(text, alphabet[rng.IntN(len(alphabet))]...)
			}
			for _, rx := range []*regexp.Regexp{re, longest} {
				m := newMatcher(rx)
				for end := 0; end <= len(text); {
					got := m.find(text[:end])
					want := rx.FindSubmatchIndex(text[:end])
					if !slices.Equal(got, want) {
						t.Fatalf("%q (longest %v) iter %d on %q[:%d]: got %v, want %v", pat, rx != re, iter, text, end, got, want)
					}
					if got != nil {
						break
					}
					if end == len(text) {
						break
					}
					end = min(len(text), end+1+rng.IntN(5))
				}
			}
		}
	}
}

func TestRuneStart(t *testing.T) {
	w := []byte("aé\x80\x80\x80\x80b𝄞c")
	// Boundaries as Go's regexp decodes w from the start.
	want := map[int]bool{}
	for i := 0; i < len(w); {
		want[i] = true
		_, n := utf8.DecodeRune(w[i:])
		i += n
	}
	want[len(w)] = true
	for p := 0; p <= len(w); p++ {
		q := runeStart(w, p)
		if q > p || q < p-3 || !want[q] {
			t.Errorf("runeStart(%d) = %d, not a boundary at or shortly before it (boundaries %v)", p, q, want)
		}
	}
}

func ExampleBuffer_Wait() {
	b := NewBuffer()
	b.Write([]byte("U-Boot SPL\n=> "))
	m, _ := b.Wait(context.Background(), 0, regexp.MustCompile(`=> `), 0)
	fmt.Printf("%v %q %d\n", m.Matched, m.Output, m.Cursor)
	// Output: true "U-Boot SPL\n=> " 14
}
