package shellwords

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"qemu-system-riscv64 -machine virt -bios none", []string{"qemu-system-riscv64", "-machine", "virt", "-bios", "none"}},
		{"a \\\n  b\\\r\n c", []string{"a", "b", "c"}},
		{`-append "console=ttyS0 root=/dev/vda"`, []string{"-append", "console=ttyS0 root=/dev/vda"}},
		{`-append 'a "b" c' x'y'z`, []string{"-append", `a "b" c`, "xyz"}},
		{`"" ''`, []string{"", ""}},
		{`a\ b "c\"d" "e\\f" "g\h"`, []string{"a b", `c"d`, `e\f`, `g\h`}},
		{"a # comment\nb", []string{"a", "b"}},
		{"a#b", []string{"a#b"}},
		{"  ", nil},
	} {
		got, err := Split(tc.line)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Split(%q) = %q, %v; want %q", tc.line, got, err, tc.want)
		}
		if err == nil {
			back, err := Split(Join(got))
			if err != nil || !reflect.DeepEqual(back, got) && len(got) > 0 {
				t.Errorf("Split(Join(%q)) = %q, %v", got, back, err)
			}
		}
	}
}

func TestSplitRefusesShell(t *testing.T) {
	for _, line := range []string{"a | b", "a > f", "a; b", "a && b", "a $HOME", "a `id`", `a "$(id)"`, "a $(id)", "a 'b", `a "b`, `a\`} {
		_, err := Split(line)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Split(%q) = %v, want a SyntaxError", line, err)
			continue
		}
		if strings.TrimSpace(se.Msg) == "" {
			t.Errorf("Split(%q): empty message", line)
		}
	}
}

func FuzzSplit(f *testing.F) {
	f.Add(`qemu -append "a b" 'c d' e\ f \` + "\n g")
	f.Fuzz(func(t *testing.T, line string) {
		words, err := Split(line)
		if err != nil {
			return
		}
		back, err := Split(Join(words))
		if err != nil {
			t.Fatalf("Join(%q) does not split: %v", words, err)
		}
		if len(words) > 0 && !reflect.DeepEqual(back, words) {
			t.Fatalf("Split(Join(%q)) = %q", words, back)
		}
	})
}
