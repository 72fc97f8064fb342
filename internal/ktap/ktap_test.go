package ktap

import (
	"reflect"
	"strings"
	"testing"
)

// What Linux 6.1 prints for KUnit's example suite booted with
// kunit.enable=1 and printk.time=1, among other kernel messages.
const kunitBootLog = `[    0.412345] Run /init as init process
[    0.398000] KTAP version 1
[    0.398100] 1..1
[    0.398200]     KTAP version 1
[    0.398300]     # Subtest: example
[    0.398400]     1..4
[    0.398500]     # example_simple_test: initializing
[    0.398600]     ok 1 example_simple_test
[    0.398650] random: crng init done
[    0.398700]     # example_skip_test: initializing
[    0.398800]     # example_skip_test: You should not see a line below.
[    0.398900]     ok 2 example_skip_test # SKIP this test should be skipped
[    0.399000]     # example_mark_skipped_test: initializing
[    0.399100]     # example_mark_skipped_test: You should see a line below.
[    0.399200]     # example_mark_skipped_test: You should see this line.
[    0.399300]     ok 3 example_mark_skipped_test # SKIP this test should be skipped
[    0.399400]     # example_all_expect_macros_test: initializing
[    0.399500]     ok 4 example_all_expect_macros_test
[    0.399600] # example: pass:2 fail:0 skip:2 total:4
[    0.399700] # Totals: pass:2 fail:0 skip:2 total:4
[    0.399800] ok 1 example
[    0.400000] Freeing unused kernel image (initmem) memory: 2144K
`

func TestKUnitBootLog(t *testing.T) {
	s, ok := Parse([]byte(strings.ReplaceAll(kunitBootLog, "\n", "\r\n")))
	want := Summary{Passed: 2, Skipped: 2}
	if !ok || !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v %v, want %+v", s, ok, want)
	}
}

// The same suite's debugfs results file, with a failing test and a
// parameterised test nested a level deeper.
func TestKUnitNestedFailure(t *testing.T) {
	in := `KTAP version 1
1..1
    KTAP version 1
    # Subtest: example
    1..3
    ok 1 example_simple_test
    # example_fail_test: EXPECTATION FAILED at lib/kunit/kunit-example-test.c:30
    Expected 1 + 1 == 3, but
        1 + 1 == 2 (0x2)
        3 == 3 (0x3)
    not ok 2 example_fail_test
        KTAP version 1
        # Subtest: example_params_test
        ok 1 example value 3
        not ok 2 example value 2
        # example value 1 # SKIP unsupported
        ok 3 example value 1 # SKIP unsupported
    not ok 3 example_params_test
# example: pass:2 fail:2 skip:1 total:5
not ok 1 example
`
	s, ok := Parse([]byte(in))
	if !ok {
		t.Fatal("not detected")
	}
	if s.Passed != 2 || s.Failed != 2 || s.Skipped != 1 || s.Missing != 0 {
		t.Fatalf("totals %+v", s)
	}
	if len(s.Failures) != 2 || s.Failures[0].Name != "example.example_fail_test" || s.Failures[1].Name != "example.example_params_test.example value 2" {
		t.Fatalf("failures %+v", s.Failures)
	}
	d := strings.Join(s.Failures[0].Diagnostics, "\n")
	if !strings.Contains(d, "EXPECTATION FAILED at lib/kunit/kunit-example-test.c:30") || !strings.Contains(d, "1 + 1 == 2 (0x2)") {
		t.Errorf("diagnostics %q", d)
	}
	t.Log(s.String())
}

// kselftest's runner nests each test's own TAP behind "# ".
func TestKselftestNested(t *testing.T) {
	in := `TAP version 13
1..3
# selftests: timers: posix_timers
# TAP version 13
# 1..3
# ok 1 Check itimer virtual
# # itimer prof: expected 1.0 s, got 1.4 s
# not ok 2 Check itimer prof
# ok 3 Check timer_create # SKIP no per-thread clock
# # Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0
not ok 1 selftests: timers: posix_timers # exit=1
# selftests: timers: nanosleep
ok 2 selftests: timers: nanosleep
# selftests: timers: rtcpie
# Warning: file rtcpie is not executable
not ok 3 selftests: timers: rtcpie # TIMEOUT 45 seconds
`
	s, ok := Parse([]byte(in))
	if !ok {
		t.Fatal("not detected")
	}
	if s.Passed != 2 || s.Failed != 2 || s.Skipped != 1 {
		t.Fatalf("totals %+v", s)
	}
	if len(s.Failures) != 2 || s.Failures[0].Name != "selftests: timers: posix_timers.Check itimer prof" ||
		!reflect.DeepEqual(s.Failures[0].Diagnostics, []string{"# itimer prof: expected 1.0 s, got 1.4 s"}) {
		t.Fatalf("failures %+v", s.Failures)
	}
	if s.Failures[1].Name != "selftests: timers: rtcpie" || !reflect.DeepEqual(s.Failures[1].Diagnostics, []string{"# selftests: timers: rtcpie", "# Warning: file rtcpie is not executable"}) {
		t.Fatalf("failure 2 %+v", s.Failures[1])
	}
}

func TestPlainTAP(t *testing.T) {
	cases := []struct {
		in   string
		want Summary
		ok   bool
	}{
		{"hello\nok then\n", Summary{}, false},
		{"1..3\nok 1 - a\nnot ok 2 - b # TODO later\n", Summary{Passed: 1, Todo: 1, Missing: 1}, true},
		{"TAP version 14\n1..2\nnot ok 1 b\n  ---\n  message: boom\n  ...\nBail out! no disk\n",
			Summary{Failed: 1, Missing: 1, BailOut: "no disk", Failures: []Failure{{Name: "b", Diagnostics: []string{"  message: boom", "  ..."}}}}, true},
		// A crash in the middle of a nested block: the rest is missing.
		{"KTAP version 1\n1..2\n    KTAP version 1\n    1..3\n    ok 1 x\n", Summary{Passed: 1, Missing: 3}, true},
		// Two documents (a boot log, then a debugfs file) add up.
		{"KTAP version 1\n1..1\nok 1 a\nKTAP version 1\n1..1\nnot ok 1 b\n", Summary{Passed: 1, Failed: 1, Failures: []Failure{{Name: "b"}}}, true},
	}
	for _, c := range cases {
		s, ok := Parse([]byte(c.in))
		if ok != c.ok || !reflect.DeepEqual(s, c.want) {
			t.Errorf("%q: got %+v %v, want %+v %v", c.in, s, ok, c.want, c.ok)
		}
	}
}
