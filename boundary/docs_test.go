package boundary

import (
	"os"
	"strings"
	"testing"
)

// docs/security.md shows every rule as the code has it: its tables are
// WriteRules' output, word for word. After a rule changes, paste the
// output of `go test ./boundary -run TestSecurityDocRules -v` there.
func TestSecurityDocRules(t *testing.T) {
	doc, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteRules(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), b.String()) {
		t.Errorf("docs/security.md's rule tables differ from the code's; replace them with:\n%s", b.String())
	}
}
