package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
)

// The documents' examples of tool calls are what a reader copies: each is
// checked against the input schema the server lists, so that a parameter
// renamed or removed, or a tool gone, fails here and not in a user's hands.
// The forms an example takes are described in docs/tools.md, "Examples in
// these documents".
func TestDocsToolCalls(t *testing.T) {
	schemas := liveSchemas(t)
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md"}, files...)
	counts := map[callForm]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../")
		calls, errs := docCalls(name, b)
		for _, err := range errs {
			t.Error(err)
		}
		for _, c := range calls {
			counts[c.form]++
			if err := c.check(schemas); err != nil {
				t.Errorf("%s:%d: %s: %v", c.file, c.line, c.tool, err)
			}
		}
	}
	t.Logf("calls checked: %d in json blocks, %d in transcripts, %d in text (%d of them shorthand), %d inspector command lines",
		counts[jsonBlock], counts[transcript], counts[inlineJSON]+counts[inlineKeys], counts[inlineKeys], counts[inspector])
	// The documents hold examples of every form: finding none means the
	// extraction broke, and nothing was checked.
	for _, f := range []callForm{jsonBlock, transcript, inlineJSON, inlineKeys, inspector} {
		if counts[f] == 0 {
			t.Errorf("no %s found in the documents: the extraction is broken", f)
		}
	}
	if n := counts[jsonBlock] + counts[transcript] + counts[inlineJSON]; n < 60 {
		t.Errorf("only %d whole calls found in the documents, expected at least 60: the extraction is broken", n)
	}
}

// Every tool is on the README's map and has its reference in docs/.
func TestDocsNameEveryTool(t *testing.T) {
	schemas := liveSchemas(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var docs []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b...)
	}
	for _, name := range slices.Sorted(maps.Keys(schemas)) {
		if !strings.Contains(string(readme), "`"+name+"`") {
			t.Errorf("the README's map of the tools lacks %s", name)
		}
		if !strings.Contains(string(docs), "`"+name+"`") {
			t.Errorf("no document in docs/ describes %s", name)
		}
	}
}

// The checker itself fails on what it is there to catch.
func TestDocsToolCallsCatch(t *testing.T) {
	schemas := liveSchemas(t)
	doc := "# x\n\n```json\n" +
		`{"name": "qemu_boot", "arguments": {"memroy": "256M"}}` + "\n" +
		`{"name": "qemu_reboot", "arguments": {}}` + "\n" +
		`{"name": "serial_send", "arguments": {"data": 42}}` + "\n" +
		`{"name": "debug_break", "arguments": {}}` + "\n" +
		`{"tool": "qemu_boot", "arguments": {}}` + "\n" +
		"```\n\n```\n→ serial_read {\"since\": 0, \"max_byte\": 200}\n→ qemu_boot {... \"smp\": 4}\n```\n\n" +
		"Boot with `qemu_boot {netwrok: \"tap\"}` or `qemu_boot {\"gbd\": true}`.\n\n" +
		"```sh\nnpx @modelcontextprotocol/inspector --cli qemu-mcp --method tools/call --tool-name serial_send --tool-arg 'dta=x'\n```\n"
	calls, errs := docCalls("x.md", []byte(doc))
	var failed []string
	for _, err := range errs {
		failed = append(failed, err.Error())
	}
	for _, c := range calls {
		if err := c.check(schemas); err != nil {
			failed = append(failed, fmt.Sprintf("%s:%d: %s: %v", c.file, c.line, c.tool, err))
		}
	}
	want := []string{`x.md:4: qemu_boot`, `x.md:5: qemu_reboot`, `x.md:6: serial_send`, `x.md:7: debug_break`,
		`x.md:8`, `x.md:12: serial_read`, `x.md:13`, `x.md:16: qemu_boot: no parameter "netwrok"`,
		`x.md:16: qemu_boot: validating`, `x.md:19: serial_send: no parameter "dta"`}
	all := strings.Join(failed, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("the checker let through what %s names; it reported:\n%s", w, all)
		}
	}
	if len(failed) != len(want) {
		t.Errorf("%d failures, want %d:\n%s", len(failed), len(want), all)
	}
}

// liveSchemas is every tool's input schema as tools/list gives it. Listing
// the tools needs no QEMU, so neither does this.
func liveSchemas(t *testing.T) map[string]*toolSchema {
	t.Helper()
	cs := bareSession(t, nil)
	ctx := context.Background()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*toolSchema{}
	for _, tool := range res.Tools {
		b, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var sch jsonschema.Schema
		if err := json.Unmarshal(b, &sch); err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		r, err := sch.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: resolve its input schema: %v", tool.Name, err)
		}
		m[tool.Name] = &toolSchema{schema: &sch, resolved: r}
	}
	return m
}

type toolSchema struct {
	schema   *jsonschema.Schema
	resolved *jsonschema.Resolved
}

type callForm int

const (
	jsonBlock  callForm = iota // {"name": ..., "arguments": ...} in a ```json block
	transcript                 // → TOOL {arguments} in a fenced block
	inlineJSON                 // `TOOL {arguments}` in running text
	inlineKeys                 // `TOOL {key: ..., ...}`: the keys only
	inspector                  // --tool-name TOOL --tool-arg 'KEY=VALUE'
)

func (f callForm) String() string {
	return [...]string{"call in a json block", "call in a transcript", "call in running text",
		"shorthand call in running text", "inspector command line"}[f]
}

// docCall is a tool call found in a document.
type docCall struct {
	file string
	line int
	form callForm
	tool string
	args json.RawMessage // whole arguments, or
	keys []string        // the argument names only
}

func (c docCall) check(schemas map[string]*toolSchema) error {
	s := schemas[c.tool]
	if s == nil {
		return fmt.Errorf("no such tool (tools/list has %s)", strings.Join(slices.Sorted(maps.Keys(schemas)), ", "))
	}
	for _, k := range c.keys {
		if _, ok := s.schema.Properties[k]; !ok {
			return fmt.Errorf("no parameter %q (it has %s)", k, strings.Join(slices.Sorted(maps.Keys(s.schema.Properties)), ", "))
		}
	}
	if c.args == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(c.args, &v); err != nil {
		return err
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("arguments %s are not an object", c.args)
	}
	if err := s.resolved.Validate(&v); err != nil {
		return fmt.Errorf("validating %s: %v", c.args, err)
	}
	return nil
}

var (
	fenceRE = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([A-Za-z0-9_+-]*)")
	// A transcript's call: "→ TOOL" and its arguments, if any.
	arrowRE = regexp.MustCompile(`^\s*→\s+([a-z][a-z0-9_]*)\s*(.*)$`)
	// A call in running text: `TOOL {...}` in a code span.
	inlineRE    = regexp.MustCompile("`([a-z][a-z0-9_]*) (\\{[^`]*\\})`")
	toolNameRE  = regexp.MustCompile(`^(qemu|serial|qmp|debug|guest|server)_[a-z0-9_]+$`)
	toolArgRE   = regexp.MustCompile(`--tool-name\s+([a-z0-9_]+)`)
	toolArgKVRE = regexp.MustCompile(`--tool-arg\s+'([^'=]+)=`)
	paramRE     = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// docCalls finds the tool calls in a Markdown document, and the errors of
// examples that look like calls but cannot be read as one.
func docCalls(file string, doc []byte) (calls []docCall, errs []error) {
	lines := strings.Split(string(doc), "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			calls = append(calls, inlineCalls(file, i+1, lines[i], &errs)...)
			continue
		}
		fence, lang, start := m[1], m[2], i+1
		end := start
		for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), fence) {
			end++
		}
		body := lines[start:end]
		i = end
		switch lang {
		case "json":
			calls = append(calls, jsonBlockCalls(file, start+1, strings.Join(body, "\n"), &errs)...)
		case "sh", "bash", "console":
			for k, l := range body {
				if m := toolArgRE.FindStringSubmatch(l); m != nil {
					c := docCall{file: file, line: start + 1 + k, form: inspector, tool: m[1], keys: []string{}}
					for _, kv := range toolArgKVRE.FindAllStringSubmatch(l, -1) {
						c.keys = append(c.keys, kv[1])
					}
					calls = append(calls, c)
				}
			}
		default:
			calls = append(calls, transcriptCalls(file, start+1, body, &errs)...)
		}
	}
	return calls, errs
}

// jsonBlockCalls reads a json block, a stream of JSON values; every
// object with "arguments" is a call.
func jsonBlockCalls(file string, first int, body string, errs *[]error) (calls []docCall) {
	dec := json.NewDecoder(strings.NewReader(body))
	for {
		off := skipSpace(body, int(dec.InputOffset()))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			if !errors.Is(err, io.EOF) {
				*errs = append(*errs, fmt.Errorf("%s:%d: a json block that is not JSON: %v", file, first+strings.Count(body[:off], "\n"), err))
			}
			return calls
		}
		line := first + strings.Count(body[:off], "\n")
		var call struct {
			Name      *string         `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if json.Unmarshal(v, &call) != nil || call.Arguments == nil {
			continue // a configuration, a profile: not a call
		}
		if call.Name == nil {
			*errs = append(*errs, fmt.Errorf(`%s:%d: a call without "name": %s (write {"name": TOOL, "arguments": {...}})`, file, line, v))
			continue
		}
		calls = append(calls, docCall{file: file, line: line, form: jsonBlock, tool: *call.Name, args: call.Arguments})
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
		i++
	}
	return i
}

// transcriptCalls reads the "→ TOOL {arguments}" lines of a transcript; the
// arguments may go on over the next lines until the object closes.
func transcriptCalls(file string, first int, body []string, errs *[]error) (calls []docCall) {
	for k, l := range body {
		m := arrowRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		c := docCall{file: file, line: first + k, form: transcript, tool: m[1], args: json.RawMessage("{}")}
		if rest := m[2]; strings.HasPrefix(rest, "{") {
			text := rest + "\n" + strings.Join(body[k+1:], "\n")
			var v json.RawMessage
			if err := json.NewDecoder(strings.NewReader(text)).Decode(&v); err != nil {
				*errs = append(*errs, fmt.Errorf("%s:%d: %s: the arguments of a call in a transcript must be whole JSON: %v", file, c.line, c.tool, err))
				continue
			}
			c.args = v
		}
		calls = append(calls, c)
	}
	return calls
}

// inlineCalls reads the `TOOL {...}` code spans of a line of text.
func inlineCalls(file string, line int, l string, errs *[]error) (calls []docCall) {
	for _, m := range inlineRE.FindAllStringSubmatch(l, -1) {
		tool, obj := m[1], m[2]
		if !toolNameRE.MatchString(tool) {
			continue // `TOOL {arguments}` and the like
		}
		c := docCall{file: file, line: line, form: inlineJSON, tool: tool}
		if json.Valid([]byte(obj)) {
			c.args = json.RawMessage(obj)
		} else {
			c.form, c.keys = inlineKeys, shorthandKeys(obj)
			if len(c.keys) == 0 {
				*errs = append(*errs, fmt.Errorf("%s:%d: %s: cannot read the arguments of `%s %s`", file, line, tool, tool, obj))
				continue
			}
		}
		calls = append(calls, c)
	}
	return calls
}

// shorthandKeys returns the top-level keys of {key: value, key2, ...}, a
// shorthand whose values need not be JSON.
func shorthandKeys(obj string) []string {
	var keys []string
	depth, quoted, start := 0, false, -1
	flush := func(end int) {
		if start >= 0 {
			k := strings.TrimSpace(obj[start:end])
			k = strings.Trim(k, `"`)
			if k != "" && k != "..." {
				keys = append(keys, k)
			}
		}
		start = -1
	}
	for i := 0; i < len(obj); i++ {
		c := obj[i]
		switch {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{' || c == '[':
			depth++
			if depth == 1 {
				start = i + 1
			}
		case c == '}' || c == ']':
			if depth == 1 {
				flush(i)
			}
			depth--
		case depth == 1 && c == ':':
			flush(i)
		case depth == 1 && c == ',':
			start = i + 1
		}
	}
	var out []string
	for _, k := range keys {
		if paramRE.MatchString(k) {
			out = append(out, k)
		}
	}
	return out
}

// documentedProfile is the .qemu-mcp.json example of docs/tools.md that
// contains marker, so that the profile a test boots is the one users copy.
func documentedProfile(t *testing.T, marker string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/tools.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(doc), "```json\n")[1:] {
		block = block[:strings.Index(block, "```")]
		if strings.Contains(block, marker) {
			return block
		}
	}
	t.Fatalf("docs/tools.md has no profile example with %s", marker)
	return ""
}
