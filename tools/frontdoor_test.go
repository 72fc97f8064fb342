package tools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	qemumcp "github.com/qemu-mcp/qemu-mcp"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/selftest"
	"github.com/qemu-mcp/qemu-mcp/settings"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

// The documents' examples of results are what the code prints for the
// calls they show. A fenced block after a marker comment is run through
// the real MCP path and each result compared with what the block shows
// (docs/tools.md, "Examples in these documents"):
//
//	<!-- example: GUEST [NAME] -->                   a transcript: → calls, ← results
//	<!-- example: GUEST [NAME] → TOOL {...} ... -->  the block is the last call's result
//	<!-- example: selftest -->                       the block is qemu-mcp --selftest's output
//
// GUEST is the guest the examples run on (tiny, tutor, linux); the blocks
// that name the same GUEST and NAME run one after another on one server, in
// the order of the README and then docs/ by name. A result shown is the
// summary a client gets as its text (the whole text goes on with every
// field as JSON), compared with line breaks and runs of spaces as one
// space and with what differs from run to run taken out: pids, durations,
// cursors, byte counts and sizes, instruction counts, absolute paths.
// A position a call takes from an earlier result shown (an instruction
// count) is the one this run printed in its place. On another QEMU or
// another build of the Linux guest than the examples were printed with,
// addresses and line numbers are taken out too.
func TestDocsExamples(t *testing.T) {
	examples := docExamples(t)
	var sessions []string
	bySession := map[string][]docExample{}
	for _, e := range examples {
		if _, ok := bySession[e.session]; !ok {
			sessions = append(sessions, e.session)
		}
		bySession[e.session] = append(bySession[e.session], e)
	}
	for _, name := range sessions {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			runExamples(t, bySession[name])
		})
	}
}

// The README says how many tools the server has: as many as tools/list
// gives.
func TestREADMEToolCount(t *testing.T) {
	n := len(liveSchemas(t))
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	counts := regexp.MustCompile(`\b(\d+) (?:MCP )?tools\b`).FindAllStringSubmatch(string(b), -1)
	if len(counts) == 0 {
		t.Fatal("the README does not say how many tools there are")
	}
	for _, m := range counts {
		if m[1] != strconv.Itoa(n) {
			t.Errorf("the README says %q; tools/list has %d", m[0], n)
		}
	}
}

// CI runs exactly the command the README gives for the whole suite.
func TestCIRunsREADMETestCommand(t *testing.T) {
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^exec (\S+)$`).FindSubmatch(ci)
	if m == nil {
		t.Fatalf(".ci/run does not exec one command:\n%s", ci)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(string(m[1])) + `\s+#`).Match(readme) {
		t.Errorf(".ci/run runs %s, which no sh block of the README gives as a command", m[1])
	}
}

// The reading and the comparison fail on what they are there to catch: a
// result shown without a marker, a marker of another form, a result that
// differs in a word, a number that is not run-dependent, or an address on
// the platform the examples were printed with; and they let through a
// result that differs only in what changes from run to run.
func TestDocsExamplesCatch(t *testing.T) {
	doc := "# x\n\n```\n→ qemu_status {}\n← \"default\": none\n```\n\n" +
		"<!-- example tiny -->\n```\n```\n\n" +
		"<!-- example: tiny -->\n```\n→ qemu_boot {\"wait_for\": \"x\",\n" +
		"             \"gdb\": true}                      (a note)\n" +
		"← booted \"default\": qemu pid 41 in 96 ms\n  matched \"x\" at cursor 10; output 0..12; next read from cursor 12\n" +
		"→ debug_last_write {\"location\": \"x\", \"before\": 12}\n" +
		"what is this line\n```\n"
	examples, errs := examplesIn("x.md", doc)
	var all []string
	for _, err := range errs {
		all = append(all, err.Error())
	}
	for _, want := range []string{"x.md:5: a result (←) in a block without a marker", "x.md:8: a marker that is not",
		"x.md:19: a line of a transcript that is neither"} {
		if !strings.Contains(strings.Join(all, "\n"), want) {
			t.Errorf("the reading let through what %q names; it reported:\n%s", want, strings.Join(all, "\n"))
		}
	}
	if len(examples) != 0 || len(errs) != 3 {
		t.Errorf("%d examples and %d errors, want none and 3: %q", len(examples), len(errs), all)
	}

	shown := "booted \"default\": qemu pid 41 in 96 ms\n  matched \"x\" at cursor 10; output 0..12; next read from cursor 12"
	for _, c := range []struct {
		got         string
		build, same bool
	}{
		{"booted \"default\": qemu pid 7 in 1.5 s matched \"x\" at cursor 3; output 0..5; next read from cursor 5\n", false, true},
		{"booted \"other\": qemu pid 41 in 96 ms\nmatched \"x\" at cursor 10; output 0..12; next read from cursor 12", false, false},
		{"booted \"default\": qemu pid 41 in 96 ms\nmatched \"y\" at cursor 10; output 0..12; next read from cursor 12", false, false},
	} {
		want, _ := normalize(shown, c.build)
		have, _ := normalize(c.got, c.build)
		if (want == have) != c.same {
			t.Errorf("%q against %q: same %v, want %v", c.got, shown, want == have, c.same)
		}
	}
	addr := "breakpoint set at sys_newuname (kernel/sys.c:1299) 0xffffffff8001787e; 1 set"
	moved := "breakpoint set at sys_newuname (kernel/sys.c:1301) 0xffffffff8001783a; 1 set"
	count := "breakpoint set at sys_newuname (kernel/sys.c:1299) 0xffffffff8001787e; 2 set"
	for _, c := range []struct {
		a, b  string
		build bool
		same  bool
	}{{addr, moved, false, false}, {addr, moved, true, true}, {addr, count, true, false}} {
		x, _ := normalize(c.a, c.build)
		y, _ := normalize(c.b, c.build)
		if (x == y) != c.same {
			t.Errorf("%q against %q (build taken out: %v): same %v, want %v", c.a, c.b, c.build, x == y, c.same)
		}
	}
	// The position a call takes from the result before it is this run's.
	_, pos := normalize("last write before instruction 900 [icount 800]", false)
	args, err := substitute(json.RawMessage(`{"before": 800, "timeout": 20}`), map[string]string{pos[1]: "812"})
	if err != nil || fmt.Sprint(args["before"]) != "812" || fmt.Sprint(args["timeout"]) != "20" {
		t.Errorf("substituted %v (%v), want before 812 and timeout 20", args, err)
	}
}

// docExample is a marked block: its calls and the results it shows.
type docExample struct {
	file    string
	line    int // of the marker
	session string
	guest   string
	calls   []exampleCall
	output  string // selftest: the output shown
}

type exampleCall struct {
	line  int
	tool  string
	args  json.RawMessage
	want  string // the result shown; "" when none is
	shown bool
}

var markerRE = regexp.MustCompile(`^<!-- example: ([a-z]+)((?: [a-z0-9-]+)?)((?: → [a-z_]+ \{.*\})*) -->$`)

// docExamples reads the marked blocks of the README and docs/.
func docExamples(t *testing.T) []docExample {
	t.Helper()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	files = append([]string{"../README.md"}, files...)
	var out []docExample
	guests := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		examples, errs := examplesIn(strings.TrimPrefix(f, "../"), string(b))
		for _, err := range errs {
			t.Error(err)
		}
		for _, e := range examples {
			guests[e.guest]++
		}
		out = append(out, examples...)
	}
	// The README's session, the debugger's walk-throughs and the
	// selftest's output are marked: none found means the markers or their
	// reading broke, and nothing was checked.
	for _, g := range []string{"selftest", "tiny", "linux"} {
		if guests[g] == 0 {
			t.Errorf("no example on the %s guest found in the documents", g)
		}
	}
	return out
}

// examplesIn reads the marked blocks of a document. A block that shows a
// result (←) without a marker is an error: nothing would check it.
func examplesIn(name, doc string) (out []docExample, errs []error) {
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "<!-- example") && (i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```")) {
			errs = append(errs, fmt.Errorf("%s:%d: the marker is not followed by a fenced block", name, i+1))
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(l), "```") {
			continue
		}
		fence := strings.TrimSpace(l)[:3]
		end := i + 1
		for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), fence) {
			end++
		}
		body := lines[i+1 : min(end, len(lines))]
		start := i + 2 // the line number of body[0]
		marker := ""
		if i > 0 {
			marker = lines[i-1]
		}
		i = end
		if !strings.HasPrefix(marker, "<!-- example") {
			for k, l := range body {
				if strings.HasPrefix(strings.TrimSpace(l), "←") {
					errs = append(errs, fmt.Errorf("%s:%d: a result (←) in a block without a marker (<!-- example: GUEST -->): nothing checks that the code prints it", name, start+k))
					break
				}
			}
			continue
		}
		m := markerRE.FindStringSubmatch(marker)
		if m == nil {
			errs = append(errs, fmt.Errorf("%s:%d: a marker that is not <!-- example: GUEST [NAME] [→ TOOL {arguments} ...] -->: %s", name, start-2, marker))
			continue
		}
		e := docExample{file: name, line: start - 2, guest: m[1], session: m[1] + m[2]}
		switch {
		case e.guest == "selftest":
			e.output = strings.Join(body, "\n")
		case m[3] != "":
			// " → TOOL {arguments}", one after another.
			for _, c := range strings.Split(m[3], " → ")[1:] {
				tool, args, _ := strings.Cut(c, " ")
				e.calls = append(e.calls, exampleCall{line: e.line, tool: tool, args: json.RawMessage(args)})
			}
			last := &e.calls[len(e.calls)-1]
			last.want, last.shown = strings.Join(body, "\n"), true
		default:
			calls, err := transcriptOf(name, start, body)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			e.calls = calls
		}
		out = append(out, e)
	}
	return out, errs
}

// transcriptOf reads a transcript: "→ TOOL {arguments}" (the arguments
// whole JSON, over several lines if need be, a note in parentheses after
// them), then the result shown, "← " and the lines indented below it.
func transcriptOf(file string, first int, body []string) ([]exampleCall, error) {
	var calls []exampleCall
	for k := 0; k < len(body); k++ {
		l := body[k]
		m := arrowRE.FindStringSubmatch(l)
		if m == nil {
			if strings.TrimSpace(l) != "" {
				return nil, fmt.Errorf("%s:%d: a line of a transcript that is neither a call (→) nor a result (←): %s", file, first+k, l)
			}
			continue
		}
		c := exampleCall{line: first + k, tool: m[1], args: json.RawMessage("{}")}
		if rest := m[2]; strings.HasPrefix(rest, "{") {
			text := rest + "\n" + strings.Join(body[k+1:], "\n")
			dec := json.NewDecoder(strings.NewReader(text))
			if err := dec.Decode(&c.args); err != nil {
				return nil, fmt.Errorf("%s:%d: %s: arguments that are not whole JSON: %v", file, c.line, c.tool, err)
			}
			k += strings.Count(text[:dec.InputOffset()], "\n")
		}
		var want []string
		for k+1 < len(body) && !arrowRE.MatchString(body[k+1]) {
			l := body[k+1]
			switch {
			case strings.HasPrefix(l, "← "):
				if c.shown {
					return nil, fmt.Errorf("%s:%d: two results (←) for one call", file, first+k+1)
				}
				c.shown = true
				want = append(want, strings.TrimPrefix(l, "← "))
			case c.shown && strings.HasPrefix(l, " "):
				want = append(want, l)
			case strings.TrimSpace(l) == "":
			default:
				return nil, fmt.Errorf("%s:%d: a line of a transcript that is neither a call (→) nor a result (← and the lines indented below it): %s", file, first+k+1, l)
			}
			k++
		}
		c.want = strings.Join(want, "\n")
		calls = append(calls, c)
	}
	return calls, nil
}

// runExamples runs the examples of one session on one server.
func runExamples(t *testing.T, examples []docExample) {
	if examples[0].guest == "selftest" {
		for _, e := range examples {
			checkSelftest(t, e)
		}
		return
	}
	guest := examples[0].guest
	s := exampleSession(t, guest)
	loose := otherPlatform(t, guest)
	if loose != "" {
		t.Logf("%s: addresses, offsets and line numbers are not compared", loose)
	}
	took := map[string]string{} // a number shown -> this run's
	for _, e := range examples {
		for _, c := range e.calls {
			where := fmt.Sprintf("%s:%d: %s", e.file, c.line, c.tool)
			args, err := substitute(c.args, took)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			t0 := time.Now()
			res := s.call(c.tool, args, nil)
			got := text(res)
			t.Logf("%s (%v): %s", where, time.Since(t0).Round(time.Millisecond), firstLine(got))
			if !c.shown {
				if res.IsError {
					t.Errorf("%s: a tool error the document does not show: %s", where, got)
				}
				continue
			}
			want, wantPos := normalize(c.want, loose != "")
			have, havePos := normalize(got, loose != "")
			if want != have {
				t.Errorf("%s: the document shows\n%s\nand the code prints\n%s", where, c.want, strings.TrimRight(got, "\n"))
				continue
			}
			if len(wantPos) == len(havePos) {
				for i, v := range wantPos {
					took[v] = havePos[i]
				}
			}
		}
	}
}

// exampleSession starts the server the examples of a guest run on. Its
// client is one that shows its model the structured content, so the text
// of a result is the summary alone; the project root is where the guest's
// files are, so that the examples name them as a project does.
func exampleSession(t *testing.T, guest string) *session {
	switch guest {
	case "tiny":
		return newSessionAs(t, "claude-code", nil, nil)
	case "tutor":
		dir := testguest.Tutor(t, nil)
		return newSessionAs(t, "claude-code", func(c *testConfig) { c.WorkDir = dir }, nil)
	case "linux":
		lin := testguest.LinuxGuest(t)
		state := t.TempDir()
		return newSessionAs(t, "claude-code", func(c *testConfig) {
			c.WorkDir = lin.Dir
			c.Captures = filepath.Join(state, "captures")
			os.MkdirAll(c.Captures, 0o700)
		}, nil)
	}
	t.Fatalf("no guest %q for examples (tiny, tutor, linux, selftest)", guest)
	return nil
}

// substitute replaces each number of args that an earlier result showed
// with what this run printed in its place.
func substitute(args json.RawMessage, took map[string]string) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			if r, ok := took[n.String()]; ok {
				m[k] = json.Number(r)
			}
		}
	}
	return m, nil
}

// variableRE finds what differs from run to run in a result; each group
// is a value taken out. The groups named pos are positions (cursors and
// instruction counts), which later calls may take as arguments.
var variableRE = regexp.MustCompile(strings.Join([]string{
	`\bpid (\d+)`,
	`\bcursors? (?P<pos>\d+)(?: to (?P<pos>\d+))?`,
	`\b(?P<pos>\d+)\.\.(?P<pos>\d+)\b`,
	`\b(\d+) bytes\b`,
	`\b(\d+(?:\.\d+)?) (?:KiB|MiB|GiB)\b`,
	`\b(\d+m\d+(?:\.\d+)?s|\d+(?:\.\d+)? ?(?:ns|µs|us|ms|s))\b`,
	`\b(?P<pos>\d+) instructions\b`,
	`\binstruction (?P<pos>\d+)(?: of (?P<pos>\d+))?`,
	`\bicount (?P<pos>\d+)`,
	`(?:^|[\s"'(=])(/[^\s"',;)]+)`,
}, "|"))

// buildRE finds what depends on the build of the guest and its firmware:
// addresses, offsets and line numbers.
var buildRE = regexp.MustCompile(`\b(0x[0-9a-f]+)\b|\b([0-9a-f]{16})\b|\.(?:c|h|S):(\d+)\b`)

// normalize returns s with runs of white space as one space and each
// variable value as "#", and the positions among them in order; with
// build, also what depends on the build.
func normalize(s string, build bool) (string, []string) {
	s = strings.Join(strings.Fields(s), " ")
	s, pos := takeOut(s, variableRE)
	if build {
		s, _ = takeOut(s, buildRE)
	}
	return s, pos
}

// takeOut replaces each group re finds in s with "#", and returns the
// values of the groups named pos in order.
func takeOut(s string, re *regexp.Regexp) (string, []string) {
	names := re.SubexpNames()
	var pos []string
	var b strings.Builder
	last := 0
	for _, m := range re.FindAllStringSubmatchIndex(s, -1) {
		for g := 2; g < len(m); g += 2 {
			if m[g] < 0 {
				continue
			}
			b.WriteString(s[last:m[g]])
			b.WriteString("#")
			if names[g/2] == "pos" {
				pos = append(pos, s[m[g]:m[g+1]])
			}
			last = m[g+1]
		}
	}
	b.WriteString(s[last:])
	return b.String(), pos
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// platformRE finds, in docs/tools.md, the Linux source package and the
// QEMU the examples were printed with.
var platformRE = regexp.MustCompile("printed with `linux-source-6.1` (\\S+) on QEMU (\\d+\\.\\d+)")

// otherPlatform says how the platform of this run differs from the one
// the examples were printed with, "" if it does not: another QEMU has
// other firmware, and another build of the Linux guest (Debian updates
// linux-source-6.1 often) other addresses and line numbers.
func otherPlatform(t *testing.T, guest string) string {
	b, err := os.ReadFile("../docs/tools.md")
	if err != nil {
		t.Fatal(err)
	}
	m := platformRE.FindStringSubmatch(strings.Join(strings.Fields(string(b)), " "))
	if m == nil {
		t.Fatal("docs/tools.md does not say what the examples were printed with (\"printed with `linux-source-6.1` VERSION on QEMU X.Y\")")
	}
	var differs []string
	out, err := exec.Command(testguest.QEMU(t), "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", testguest.QEMU(t), err)
	}
	v := regexp.MustCompile(`version ((\d+\.\d+)\S*)`).FindSubmatch(out)
	if v == nil || string(v[2]) != m[2] {
		have := firstLine(string(out))
		if v != nil {
			have = string(v[1])
		}
		differs = append(differs, fmt.Sprintf("QEMU %s, not %s", have, m[2]))
	}
	if guest == "linux" {
		info, _ := os.ReadFile(filepath.Join(testguest.LinuxGuest(t).Dir, "build-info.txt"))
		src := regexp.MustCompile(`(?m)^linux-source-6\.1 (\S+)$`).FindSubmatch(info)
		if src == nil || string(src[1]) != m[1] {
			have := "an unknown version"
			if src != nil {
				have = string(src[1])
			}
			differs = append(differs, fmt.Sprintf("the Linux guest built from linux-source-6.1 %s, not %s", have, m[1]))
		}
	}
	return strings.Join(differs, "; ")
}

// selftestToken is the random text the selftest echoes.
var selftestToken = regexp.MustCompile(`\bst-[0-9a-f]{12}\b`)

// checkSelftest runs the selftest as qemu-mcp --selftest does and
// compares its output, line by line, with the one shown.
func checkSelftest(t *testing.T, e docExample) {
	needQEMU(t)
	kernel, symbols := testImage(t, "tiny.bin"), testImage(t, "tiny.elf")
	dir := testguest.SocketDir(t, "qmcp")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	platforms := map[string]instance.Platform{}
	for _, a := range archs.All()[1:] {
		k := qemumcp.Tiny(a.Name())
		platforms[a.Name()] = instance.Platform{QEMU: testguest.ArchQEMU(t, a), Kernel: k.Kernel, Symbols: k.ELF}
	}
	set := settings.Settings{RuntimeDir: dir, BuiltinKernel: kernel, BuiltinSymbols: symbols, Version: "test",
		Logger: slog.New(slog.DiscardHandler), QEMUBinary: testguest.QEMU(t), Platforms: platforms}
	if err := selftest.Run(ctx, &out, set, tools.Config{Version: "test", Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatalf("selftest: %v\n%s", err, out.String())
	}
	got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := strings.Split(strings.TrimRight(e.output, "\n"), "\n")
	norm := func(l string) string {
		n, _ := normalize(selftestToken.ReplaceAllString(l, "st-#"), false)
		return n
	}
	if len(got) != len(want) {
		t.Errorf("%s:%d: the document shows %d lines of selftest output, and it prints %d:\n%s", e.file, e.line, len(want), len(got), out.String())
		return
	}
	for i := range got {
		if norm(got[i]) != norm(want[i]) {
			t.Errorf("%s:%d: the document shows\n%s\nand the selftest prints\n%s", e.file, e.line, want[i], got[i])
		}
	}
}
