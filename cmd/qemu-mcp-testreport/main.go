// Command qemu-mcp-testreport reads `go test -json` and reports a run of the suite
// against one QEMU the way scripts/test needs it: go test's usual short
// output (a line per package, the whole log of each failing test, the
// build errors), and a summary kept in a file: the QEMU's version, the
// counts of tests run, passed, failed and skipped, and which tests were
// QEMU-facing (they carry testguest.Facing in their log). Once every QEMU
// has run, `testreport -summary` prints the counts per QEMU and fails the
// run if a test failed, or if a QEMU-facing test skipped on a QEMU without
// being listed as expected to (testdata/expected-skips).
//
//	go test -json ./... | testreport -label "QEMU 7.2.22" -out a.json
//	testreport -summary -skips testdata/expected-skips a.json b.json
//	testreport -run-regexp a.json   # the QEMU-facing tests: -run and packages
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// facing is testguest.Facing (not imported: this command builds alone).
const facing = "[qemu-facing]"

var (
	label     = flag.String("label", "", "what this run ran against, e.g. \"QEMU 7.2.22\"")
	out       = flag.String("out", "", "file to write the run's summary to (JSON)")
	summary   = flag.Bool("summary", false, "print the summary of the runs named as arguments and fail on failures and unexpected skips")
	skipsFile = flag.String("skips", "", "with -summary: the file of expected skips")
	runRegexp = flag.Bool("run-regexp", false, "print the -run pattern and the packages of the QEMU-facing tests of the run named as argument")
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// Test is one test's outcome in a run.
type Test struct {
	Package string `json:"package"`
	Name    string `json:"name"`
	Result  string `json:"result"` // pass, fail, skip
	Facing  bool   `json:"qemu_facing,omitempty"`
	Reason  string `json:"reason,omitempty"` // why it skipped
}

// Run is the summary of one run.
type Run struct {
	Label    string        `json:"label"`
	Elapsed  time.Duration `json:"elapsed"`
	Tests    []Test        `json:"tests"`
	Packages int           `json:"packages"`
	// Failed packages: a build failure or a failure outside any test.
	FailedPackages []string `json:"failed_packages,omitempty"`
}

func main() {
	flag.Parse()
	switch {
	case *summary:
		os.Exit(printSummary(flag.Args(), *skipsFile))
	case *runRegexp:
		os.Exit(printRunRegexp(flag.Arg(0)))
	}
	r, ok := report(os.Stdin, os.Stdout)
	r.Label = *label
	if *out != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
	}
	if !ok {
		os.Exit(1)
	}
}

type key struct{ pkg, test string }

// report reads the events of one run from r and writes go test's usual
// short output to w.
func report(r io.Reader, w io.Writer) (Run, bool) {
	start := time.Now()
	logs := map[key]*strings.Builder{}
	tests := map[key]*Test{}
	var order []key
	var run Run
	ok := true
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			// Not an event: go's own complaints (a build error before
			// the test binary ran, for instance).
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output)
		case "build-fail":
			ok = false
		case "run":
			if tests[k] == nil {
				tests[k] = &Test{Package: ev.Package, Name: ev.Test}
				order = append(order, k)
			}
		case "output":
			b := logs[k]
			if b == nil {
				b = &strings.Builder{}
				logs[k] = b
			}
			if b.Len() < 1<<20 {
				b.WriteString(ev.Output)
			}
			if ev.Test != "" && strings.Contains(ev.Output, facing) {
				if t := tests[k]; t != nil {
					t.Facing = true
				}
			}
		case "pass", "fail", "skip":
			out := ""
			if b := logs[k]; b != nil {
				out = b.String()
			}
			if ev.Test == "" {
				// The package's end.
				run.Packages++
				switch ev.Action {
				case "fail":
					ok = false
					run.FailedPackages = append(run.FailedPackages, ev.Package)
					fmt.Fprint(w, packageFailure(out))
					fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", ev.Package, ev.Elapsed)
				case "skip":
					fmt.Fprintf(w, "?   \t%s\t[no test files]\n", ev.Package)
				default:
					fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", ev.Package, ev.Elapsed)
				}
				continue
			}
			t := tests[k]
			if t == nil {
				t = &Test{Package: ev.Package, Name: ev.Test}
				tests[k] = t
				order = append(order, k)
			}
			t.Result = ev.Action
			switch ev.Action {
			case "fail":
				ok = false
				fmt.Fprintf(w, "--- FAIL: %s (%s)\n%s", ev.Test, ev.Package, out)
			case "skip":
				t.Reason = skipReason(out)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(w, "testreport: reading go test's output:", err)
		ok = false
	}
	// A subtest of a QEMU-facing test faces QEMU too, and a test whose
	// subtest faces QEMU does.
	for _, k := range order {
		t := tests[k]
		if !t.Facing {
			continue
		}
		for p := parent(t.Name); p != ""; p = parent(p) {
			if pt := tests[key{t.Package, p}]; pt != nil {
				pt.Facing = true
			}
		}
	}
	for _, k := range order {
		t := tests[k]
		if t.Facing {
			continue
		}
		for p := parent(t.Name); p != ""; p = parent(p) {
			if pt := tests[key{t.Package, p}]; pt != nil && pt.Facing && pt.Result != "skip" {
				t.Facing = true
				break
			}
		}
	}
	for _, k := range order {
		if t := tests[k]; t.Result != "" {
			run.Tests = append(run.Tests, *t)
		} else {
			// Started and never ended: the binary died under it.
			ok = false
			run.Tests = append(run.Tests, Test{Package: t.Package, Name: t.Name, Result: "fail", Facing: t.Facing})
		}
	}
	run.Elapsed = time.Since(start)
	return run, ok
}

func parent(name string) string {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return ""
}

// packageFailure is what a failed package printed outside its tests
// (a panic, a TestMain that failed), without the "FAIL" lines go adds.
func packageFailure(out string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if l == "FAIL\n" || strings.HasPrefix(l, "FAIL\t") || strings.HasPrefix(l, "=== ") || l == "" {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

var skipLine = regexp.MustCompile(`(?m)^\s+\S+\.go:\d+: (.*)$`)

// skipReason is the last message a skipped test logged: t.Skip's.
func skipReason(out string) string {
	ms := skipLine.FindAllStringSubmatch(out, -1)
	for i := len(ms) - 1; i >= 0; i-- {
		if m := ms[i][1]; !strings.HasPrefix(m, facing) {
			return m
		}
	}
	return ""
}

func readRun(path string) (Run, error) {
	var r Run
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// printRunRegexp prints a -run pattern for the QEMU-facing top-level
// tests of a run, and on the next line their packages.
func printRunRegexp(path string) int {
	r, err := readRun(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 2
	}
	names, pkgs := map[string]bool{}, map[string]bool{}
	for _, t := range r.Tests {
		if t.Facing && !strings.Contains(t.Name, "/") {
			names[regexp.QuoteMeta(t.Name)] = true
			pkgs[t.Package] = true
		}
	}
	if len(names) == 0 {
		fmt.Fprintln(os.Stderr, "testreport: the run has no QEMU-facing test")
		return 1
	}
	fmt.Printf("^(%s)$\n%s\n", strings.Join(slices.Sorted(maps.Keys(names)), "|"), strings.Join(slices.Sorted(maps.Keys(pkgs)), " "))
	return 0
}

// expectedSkip is one line of the skips file: a test that may skip on
// the QEMUs whose label contains qemu, with the reason.
type expectedSkip struct {
	qemu, test, why string
}

func readSkips(path string) ([]expectedSkip, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var skips []expectedSkip
	for n, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want \"QEMU-VERSION-PREFIX PACKAGE.TEST REASON...\"", path, n+1)
		}
		skips = append(skips, expectedSkip{qemu: f[0], test: f[1], why: strings.Join(f[2:], " ")})
	}
	return skips, nil
}

func expected(skips []expectedSkip, label string, t Test) bool {
	full := t.Package[strings.LastIndexByte(t.Package, '/')+1:] + "." + t.Name
	for _, s := range skips {
		if strings.Contains(label, "QEMU "+s.qemu) && (s.test == full || s.test == t.Name) {
			return true
		}
	}
	return false
}

type counts struct{ run, pass, fail, skip int }

func (c *counts) add(t Test) {
	switch t.Result {
	case "pass":
		c.run++
		c.pass++
	case "fail":
		c.run++
		c.fail++
	case "skip":
		c.skip++
	}
}

// printSummary prints, per run, the counts of all tests and of the
// QEMU-facing ones, and fails on any failure or unexpected skip.
func printSummary(paths []string, skipsPath string) int {
	skips, err := readSkips(skipsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 2
	}
	status := 0
	var total counts
	fmt.Println()
	fmt.Println("=== the suite per QEMU")
	for _, p := range paths {
		r, err := readRun(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			return 2
		}
		var all, qemu counts
		var unexpected, fails []string
		for _, t := range r.Tests {
			all.add(t)
			total.add(t)
			if t.Result == "fail" {
				fails = append(fails, t.Package+" "+t.Name)
			}
			if !t.Facing {
				continue
			}
			qemu.add(t)
			if t.Result == "skip" && !expected(skips, r.Label, t) {
				unexpected = append(unexpected, fmt.Sprintf("%s %s: %s", t.Package, t.Name, t.Reason))
			}
		}
		fmt.Printf("%s: QEMU-facing tests: %d run (%d passed, %d failed), %d skipped; all tests of the run: %d run, %d skipped; %d packages in %s\n",
			r.Label, qemu.run, qemu.pass, qemu.fail, qemu.skip, all.run, all.skip, r.Packages, r.Elapsed.Round(time.Second))
		for _, f := range fails {
			fmt.Printf("  FAILED: %s\n", f)
		}
		for _, pkg := range r.FailedPackages {
			fmt.Printf("  FAILED package: %s\n", pkg)
		}
		slices.Sort(unexpected)
		for _, u := range unexpected {
			fmt.Printf("  SKIPPED, not listed in %s as expected: %s\n", skipsPath, u)
		}
		if len(fails) > 0 || len(r.FailedPackages) > 0 || len(unexpected) > 0 {
			status = 1
		}
		if len(r.Tests) == 0 {
			fmt.Printf("  no test ran\n")
			status = 1
		}
	}
	// The closing line CI reads.
	fmt.Printf("%d passed, %d failed, %d skipped\n", total.pass, total.fail, total.skip)
	return status
}
