// Package ktap summarises test output in TAP (kselftest, TAP 13/14) and
// KTAP (the kernel's, KUnit's) form: how many tests passed, failed and were
// skipped, and each failure's name with its diagnostic lines, so an agent
// reads a verdict instead of counting lines.
//
// Nesting is understood in both forms: KTAP indents a subtest's lines
// (four spaces), kselftest's runner prefixes them with "# ". Totals count
// the leaves, as KTAP (and kunit.py) do: a test with subtests counts as
// its subtests, and as one failure of its own when it failed while none of
// them did. A plan ("1..N") announcing more tests than reported counts the
// rest as missing (a crash or a hang cut the run short). Lines that are not
// part of the protocol (other kernel messages in a boot log) are skipped;
// a timestamp prefix before the version line ("[    0.5] KTAP version 1")
// is taken off every line.
package ktap

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Summary is what a TAP or KTAP stream reported.
type Summary struct {
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
	// Todo counts "not ok ... # TODO": expected failures, not failures.
	Todo int `json:"todo,omitempty"`
	// Missing counts tests a plan announced that never reported.
	Missing int `json:"missing,omitempty"`
	// BailOut is the reason of a "Bail out!" line.
	BailOut string `json:"bail_out,omitempty"`
	// Failures are the failed tests (at most MaxFailures), in order.
	Failures []Failure `json:"failures,omitempty"`
	// MoreFailures counts the failures past MaxFailures.
	MoreFailures int `json:"more_failures,omitempty"`
}

// Failure is one failed test.
type Failure struct {
	// Name is the test's name with its parents', joined by "." as KUnit
	// names them (suite.test: what kunit.filter_glob takes).
	Name string `json:"name"`
	// Diagnostics are the test's diagnostic lines (at most MaxDiagnostics,
	// the last ones), without the nesting prefix.
	Diagnostics []string `json:"diagnostics,omitempty"`
}

// Limits on what a Summary holds.
const (
	MaxFailures    = 20
	MaxDiagnostics = 16
	maxLineLen     = 300
)

var (
	versionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(K?TAP) version (\d+)\s*$`) })
	planRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^1\.\.(\d+)(\s.*)?$`) })
	resultRE  = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(not ok|ok)(?:\s+(\d+))?(?:\s*-)?(?:\s+(.*))?$`)
	})
	// A kernel log timestamp, as printk.time puts it before each line.
	stampRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\[\s*\d+\.\d+\]\s?`) })
)

// Detect reports whether out looks like TAP or KTAP output: a version
// line, or a plan followed by a test line.
func Detect(out []byte) bool {
	if bytes.Contains(out, []byte("TAP version ")) {
		return true
	}
	i := bytes.Index(out, []byte("1.."))
	if i < 0 {
		return false
	}
	return bytes.Contains(out[i:], []byte("ok "))
}

// frame is one level of nesting: a document or a subtest's block.
type frame struct {
	prefix  string
	name    string // from "# Subtest: NAME" (KTAP) or the result line closing it
	planned int    // -1 without a plan
	results int
	// diags are the diagnostic lines since the last result of this frame.
	diags []string
	// child is a subtest block that ended (its parent's result line
	// comes next): its counts go to that result.
	child *frame
	sum   Summary // counts of the results so far
	// yaml is set inside a TAP 13 YAML block after a result line.
	yaml     bool
	lastFail int // index into sum.Failures of the last result's failure, -1
}

// Parse summarises the TAP or KTAP output in out. It returns false when
// out holds no TAP (see Detect).
func Parse(out []byte) (Summary, bool) {
	if !Detect(out) {
		return Summary{}, false
	}
	p := parser{}
	for len(out) > 0 {
		line := out
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			line, out = out[:i], out[i+1:]
		} else {
			out = nil
		}
		p.line(strings.TrimRight(string(line), "\r"))
	}
	p.finish()
	if !p.seen {
		return Summary{}, false
	}
	return p.total, true
}

type parser struct {
	stack []*frame
	total Summary
	seen  bool
	// stamp says lines carry a kernel timestamp to take off.
	stamp bool
}

func (p *parser) line(l string) {
	if p.stamp || len(p.stack) == 0 {
		if loc := stampRE().FindStringIndex(l); loc != nil {
			rest := l[loc[1]:]
			if len(p.stack) == 0 && strings.Contains(rest, "TAP version ") {
				p.stamp = true
			}
			if p.stamp {
				l = rest
			}
		}
	}
	// The deepest frame whose prefix the line has.
	k := len(p.stack) - 1
	for ; k >= 0; k-- {
		if strings.HasPrefix(l, p.stack[k].prefix) {
			break
		}
	}
	if k < 0 {
		// Outside every frame: only a version line (or a plan, for TAP
		// without one) starts a document; anything else is another
		// program's output (a kernel message in a boot log).
		t := strings.TrimSpace(l)
		if versionRE().MatchString(t) {
			p.closeAll()
			p.push(leading(l), "")
		} else if m := planRE().FindStringSubmatch(t); m != nil && len(p.stack) == 0 {
			f := p.push(leading(l), "")
			f.planned, _ = strconv.Atoi(m[1])
		}
		return
	}
	f := p.stack[k]
	rest := l[len(f.prefix):]
	// A nested block starts with a version line (or a plan) at a longer
	// prefix: more indentation, or kselftest's "# ".
	if nest, body, ok := nested(rest); ok {
		switch {
		case versionRE().MatchString(body):
			p.truncate(k + 1)
			p.push(f.prefix+nest, "")
			return
		case planRE().MatchString(body) && k == len(p.stack)-1 && strings.TrimSpace(nest) == "":
			// An older KUnit nests without a version line.
			p.truncate(k + 1)
			c := p.push(f.prefix+nest, "")
			m := planRE().FindStringSubmatch(body)
			c.planned, _ = strconv.Atoi(m[1])
			return
		}
	}
	switch {
	case versionRE().MatchString(rest):
		// A new document (or block) at this level: the last one ended.
		p.truncate(k)
		p.push(f.prefix, "")
		return
	case resultRE().MatchString(rest) || planRE().MatchString(rest) || strings.HasPrefix(rest, "Bail out!"):
		p.truncate(k + 1)
	case k < len(p.stack)-1:
		// Not part of a deeper block, and no reason to end it: a
		// message from elsewhere.
		return
	}
	p.inFrame(f, rest)
}

// nested splits the nesting a line adds to its frame's prefix (spaces,
// "# " marks) from its body; ok is false when it adds none.
func nested(rest string) (nest, body string, ok bool) {
	i := 0
	for i < len(rest) {
		switch {
		case rest[i] == ' ' || rest[i] == '\t':
			i++
		case strings.HasPrefix(rest[i:], "# ") && !strings.HasPrefix(rest[i:], "# Subtest:"):
			i += 2
		default:
			return rest[:i], rest[i:], i > 0
		}
	}
	return rest, "", false
}

func leading(l string) string { return l[:len(l)-len(strings.TrimLeft(l, " \t"))] }

func (p *parser) push(prefix, name string) *frame {
	p.seen = true
	f := &frame{prefix: prefix, name: name, planned: -1, lastFail: -1}
	p.stack = append(p.stack, f)
	return f
}

// truncate closes the frames from depth n on: a block that ended keeps
// its counts for its parent's next result.
func (p *parser) truncate(n int) {
	for len(p.stack) > n {
		c := p.stack[len(p.stack)-1]
		p.stack = p.stack[:len(p.stack)-1]
		c.end()
		if len(p.stack) > 0 {
			parent := p.stack[len(p.stack)-1]
			if parent.child != nil {
				// A second block before any result: count the first.
				parent.add(parent.child.sum)
			}
			parent.child = c
		} else {
			p.total.merge(c.sum)
		}
	}
}

func (p *parser) closeAll() {
	p.truncate(0)
}

func (p *parser) finish() {
	p.closeAll()
}

// end counts what a plan announced and never came.
func (f *frame) end() {
	if f.child != nil {
		// A block whose result line never came: it stands for that
		// test, and its own missing tests say what was lost.
		f.add(f.child.sum)
		f.child = nil
		f.results++
	}
	if f.planned > f.results {
		f.sum.Missing += f.planned - f.results
	}
}

func (f *frame) add(s Summary) {
	f.sum.merge(s)
}

func (s *Summary) merge(o Summary) {
	s.Passed += o.Passed
	s.Failed += o.Failed
	s.Skipped += o.Skipped
	s.Todo += o.Todo
	s.Missing += o.Missing
	if s.BailOut == "" {
		s.BailOut = o.BailOut
	}
	for _, fl := range o.Failures {
		if len(s.Failures) < MaxFailures {
			s.Failures = append(s.Failures, fl)
		} else {
			s.MoreFailures++
		}
	}
	s.MoreFailures += o.MoreFailures
}

func (p *parser) inFrame(f *frame, rest string) {
	body := strings.TrimLeft(rest, " \t")
	if f.yaml {
		if body == "..." {
			f.yaml = false
		}
		if f.lastFail >= 0 && f.lastFail < len(f.sum.Failures) {
			fl := &f.sum.Failures[f.lastFail]
			fl.Diagnostics = appendDiag(fl.Diagnostics, rest)
		}
		return
	}
	switch {
	case body == "---" && f.results > 0:
		f.yaml = true
		return
	case strings.HasPrefix(body, "Bail out!"):
		f.sum.BailOut = strings.TrimSpace(strings.TrimPrefix(body, "Bail out!"))
		if f.sum.BailOut == "" {
			f.sum.BailOut = "Bail out!"
		}
		return
	case body != rest:
		// An indented line in a frame is a diagnostic continuation.
		f.diags = appendDiag(f.diags, rest)
		return
	}
	if m := planRE().FindStringSubmatch(body); m != nil {
		f.planned, _ = strconv.Atoi(m[1])
		return
	}
	if versionRE().MatchString(body) {
		return
	}
	m := resultRE().FindStringSubmatch(body)
	if m == nil {
		// At the top of a document a line without "#" is some other
		// program's output; inside a block it continues a diagnostic
		// (KUnit's "Expected ... but").
		if strings.HasPrefix(body, "#") || f.prefix != "" {
			f.diags = appendDiag(f.diags, rest)
		}
		return
	}
	f.results++
	desc, directive := splitDirective(m[3])
	name := strings.TrimSpace(desc)
	child := f.child
	f.child = nil
	diags := f.diags
	f.diags = nil
	f.lastFail = -1
	dir := strings.ToUpper(directive)
	ok := m[1] == "ok"
	var leaf Summary
	switch {
	case strings.HasPrefix(dir, "SKIP"):
		leaf.Skipped = 1
	case strings.HasPrefix(dir, "TODO") || strings.HasPrefix(dir, "XFAIL"):
		if ok {
			leaf.Passed = 1
		} else {
			leaf.Todo = 1
		}
	case ok:
		leaf.Passed = 1
	default:
		leaf.Failed = 1
	}
	if child != nil {
		child.end()
		sub := child.sum
		for i := range sub.Failures {
			sub.Failures[i].Name = joinName(name, sub.Failures[i].Name)
		}
		if leaf.Failed == 1 && sub.Failed == 0 && sub.Missing == 0 {
			// Failed by itself (a suite's init or exit): one failure.
			sub.Failed++
			sub.Failures = append(sub.Failures, Failure{Name: name, Diagnostics: clean(diags)})
		} else if leaf.Skipped == 1 && sub.Passed+sub.Failed+sub.Skipped+sub.Todo == 0 {
			sub.Skipped++
		}
		before := len(f.sum.Failures)
		f.add(sub)
		if len(f.sum.Failures) > before {
			f.lastFail = len(f.sum.Failures) - 1
		}
		return
	}
	if leaf.Failed == 1 {
		leaf.Failures = []Failure{{Name: name, Diagnostics: clean(diags)}}
	}
	before := len(f.sum.Failures)
	f.add(leaf)
	if len(f.sum.Failures) > before {
		f.lastFail = len(f.sum.Failures) - 1
	}
}

func joinName(parent, child string) string {
	switch {
	case parent == "":
		return child
	case child == "":
		return parent
	}
	return parent + "." + child
}

// splitDirective splits "name # SKIP why" at the first unescaped " #".
func splitDirective(s string) (desc, directive string) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '#':
			return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:])
		}
	}
	return s, ""
}

func appendDiag(d []string, l string) []string {
	l = strings.TrimRight(l, " \t")
	if len(l) > maxLineLen {
		l = l[:maxLineLen] + "..."
	}
	return append(d, l)
}

// clean keeps the last MaxDiagnostics lines that say something: the
// subtest header and totals lines are bookkeeping.
func clean(d []string) []string {
	out := make([]string, 0, len(d))
	for _, l := range d {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "# Subtest:") || strings.HasPrefix(t, "# Totals:") || t == "#" || t == "" {
			continue
		}
		out = append(out, t)
	}
	if len(out) > MaxDiagnostics {
		out = out[len(out)-MaxDiagnostics:]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// String is a one-line account: "4 tests: 2 passed, 0 failed, 2 skipped".
func (s Summary) String() string {
	var b strings.Builder
	n := s.Passed + s.Failed + s.Skipped + s.Todo
	b.WriteString(strconv.Itoa(n) + " tests: " + strconv.Itoa(s.Passed) + " passed, " + strconv.Itoa(s.Failed) + " failed, " + strconv.Itoa(s.Skipped) + " skipped")
	if s.Todo > 0 {
		b.WriteString(", " + strconv.Itoa(s.Todo) + " todo")
	}
	if s.Missing > 0 {
		b.WriteString(", " + strconv.Itoa(s.Missing) + " missing (planned, never reported)")
	}
	if s.BailOut != "" {
		b.WriteString("; bailed out: " + s.BailOut)
	}
	for _, f := range s.Failures {
		b.WriteString("\nFAIL " + f.Name)
		for _, d := range f.Diagnostics {
			b.WriteString("\n    " + d)
		}
	}
	if s.MoreFailures > 0 {
		b.WriteString("\n... and " + strconv.Itoa(s.MoreFailures) + " more failures")
	}
	return b.String()
}
