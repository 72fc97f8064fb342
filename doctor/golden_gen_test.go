//go:build fixturegen

package doctor_test

import (
	"os"
	"testing"
)

// TestWriteGolden writes testdata/json-keys.golden and
// testdata/report.golden from this code. Run it once, where the report is
// defined:
//
//	go test -tags fixturegen -run TestWriteGolden ./doctor/
func TestWriteGolden(t *testing.T) {
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("testdata/json-keys.golden", goldenKeys(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("testdata/report.golden", goldenReport(t), 0o644); err != nil {
		t.Fatal(err)
	}
}
