package testguest

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// SourceLine is the 1-based number of the first line of a guest's source
// file that is text, but for leading and trailing space: where a test
// expects a breakpoint or a fault to be reported. It fails the test if
// there is none.
func SourceLine(t testing.TB, file, text string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == text {
			return n
		}
	}
	t.Fatalf("%s: no line %q", file, text)
	return 0
}
