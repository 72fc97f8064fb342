package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func events(t *testing.T, evs ...event) string {
	t.Helper()
	var b strings.Builder
	for _, e := range evs {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// A run's report: the QEMU-facing tests are those whose log carries the
// mark (and their subtests), skips keep their reason, a failure fails.
func TestReport(t *testing.T) {
	in := events(t,
		event{Action: "run", Package: "p/a", Test: "TestQ"},
		event{Action: "output", Package: "p/a", Test: "TestQ", Output: "    x_test.go:9: [qemu-facing] /usr/bin/qemu\n"},
		event{Action: "run", Package: "p/a", Test: "TestQ/sub"},
		event{Action: "pass", Package: "p/a", Test: "TestQ/sub"},
		event{Action: "pass", Package: "p/a", Test: "TestQ"},
		event{Action: "run", Package: "p/a", Test: "TestS"},
		event{Action: "output", Package: "p/a", Test: "TestS", Output: "    x_test.go:9: [qemu-facing] /usr/bin/qemu\n"},
		event{Action: "output", Package: "p/a", Test: "TestS", Output: "    x_test.go:12: needs a thing\n"},
		event{Action: "skip", Package: "p/a", Test: "TestS"},
		event{Action: "run", Package: "p/a", Test: "TestPlain"},
		event{Action: "pass", Package: "p/a", Test: "TestPlain"},
		event{Action: "pass", Package: "p/a"},
	)
	var out strings.Builder
	r, ok := report(strings.NewReader(in), &out)
	if !ok || r.Packages != 1 || len(r.Tests) != 4 {
		t.Fatalf("report = %+v, %v\n%s", r, ok, out.String())
	}
	want := map[string]Test{
		"TestQ":     {Package: "p/a", Name: "TestQ", Result: "pass", Facing: true},
		"TestQ/sub": {Package: "p/a", Name: "TestQ/sub", Result: "pass", Facing: true},
		"TestS":     {Package: "p/a", Name: "TestS", Result: "skip", Facing: true, Reason: "needs a thing"},
		"TestPlain": {Package: "p/a", Name: "TestPlain", Result: "pass"},
	}
	for _, tt := range r.Tests {
		if tt != want[tt.Name] {
			t.Errorf("%s: %+v, want %+v", tt.Name, tt, want[tt.Name])
		}
	}
	if !strings.Contains(out.String(), "ok  \tp/a") {
		t.Errorf("output:\n%s", out.String())
	}

	// A failure, and a test that never ended (the binary died).
	in = events(t,
		event{Action: "run", Package: "p/b", Test: "TestF"},
		event{Action: "output", Package: "p/b", Test: "TestF", Output: "    x_test.go:3: boom\n"},
		event{Action: "fail", Package: "p/b", Test: "TestF"},
		event{Action: "run", Package: "p/b", Test: "TestDied"},
		event{Action: "fail", Package: "p/b"},
	)
	out.Reset()
	r, ok = report(strings.NewReader(in), &out)
	if ok || len(r.FailedPackages) != 1 || len(r.Tests) != 2 || r.Tests[1].Result != "fail" {
		t.Fatalf("report = %+v, %v", r, ok)
	}
	if !strings.Contains(out.String(), "--- FAIL: TestF (p/b)\n    x_test.go:3: boom") {
		t.Errorf("output:\n%s", out.String())
	}
}

// The summary fails on a QEMU-facing skip that the skips file does not
// list for that QEMU, and passes once it does.
func TestSummarySkips(t *testing.T) {
	dir := t.TempDir()
	run := Run{Label: "QEMU 11.1.3 (Debian)", Tests: []Test{
		{Package: "x/tools", Name: "TestA", Result: "pass", Facing: true},
		{Package: "x/tools", Name: "TestB", Result: "skip", Facing: true, Reason: "why"},
		{Package: "x/tools", Name: "TestC", Result: "skip"},
	}}
	b, _ := json.Marshal(run)
	rp := filepath.Join(dir, "run.json")
	os.WriteFile(rp, b, 0o644)
	skips := filepath.Join(dir, "skips")
	os.WriteFile(skips, []byte("# none\n7.2 tools.TestB only on 7.2\n"), 0o644)
	if st := printSummary([]string{rp}, skips); st != 1 {
		t.Errorf("unexpected skip on 11.1: status %d, want 1", st)
	}
	os.WriteFile(skips, []byte("11.1 tools.TestB not on 11.1\n"), 0o644)
	if st := printSummary([]string{rp}, skips); st != 0 {
		t.Errorf("listed skip: status %d, want 0", st)
	}
	os.WriteFile(skips, []byte("11.1 tools.TestB\n"), 0o644)
	if st := printSummary([]string{rp}, skips); st != 2 {
		t.Errorf("a line without a reason: status %d, want 2", st)
	}
}
