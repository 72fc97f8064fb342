package tools_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// structured is what Claude Code shows the model of a result:
// JSON.stringify(structuredContent).
func structured(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every result stays small by default, each piece of console text once,
// and nothing is lost: a long output is a head and a tail, and the cursors
// page through every byte of the rest.
func TestResultBudget(t *testing.T) {
	s := newSession(t)
	res := s.call("qemu_boot", map[string]any{"wait_for": prompt}, nil)
	boot := structured(t, res)
	t.Logf("qemu_boot of the built-in kernel: %d characters", len(boot))
	if res.IsError || len(boot) >= 2000 {
		t.Errorf("boot result is %d characters, want < 2,000: %s", len(boot), boot)
	}
	if n := len(text(res)); n > len(boot)+300 {
		t.Errorf("boot text is %d characters, want at most the JSON's %d and a summary: %s", n, len(boot), text(res))
	}

	// A 200 KB flood with a wait.
	res = s.call("serial_send", map[string]any{"data": "flood 200000", "wait_for": prompt}, nil)
	flood := structured(t, res)
	var w struct {
		Output      string `json:"output"`
		OutputStart int64  `json:"output_start"`
		Truncated   bool   `json:"truncated"`
		Elided      *struct {
			Start int64 `json:"start"`
			End   int64 `json:"end"`
		} `json:"elided"`
		Cursor int64 `json:"cursor"`
	}
	json.Unmarshal([]byte(flood), &w)
	t.Logf("flood of 200000 bytes with a wait: %d characters", len(flood))
	// What each client shows its model of it stays under 40,000
	// characters with the console output once: the JSON (Claude Code,
	// Codex), the text (Gemini CLI), and Copilot CLI's text (a summary
	// for it), a blank line and the JSON.
	cp := newSessionAs(t, "copilot-cli", nil, nil)
	cp.bootTiny()
	cres := cp.call("serial_send", map[string]any{"data": "flood 200000", "wait_for": prompt}, nil)
	views := map[string]string{"JSON": flood, "text": text(res), "Copilot CLI's view": text(cres) + "\n\n" + structured(t, cres)}
	for view, v := range views {
		t.Logf("flood, the %s: %d characters", view, len(v))
		if len(v) >= 40000 || strings.Count(v, "flood done 200000") != 1 {
			t.Errorf("flood, the %s: %d characters, %d copies of the end marker", view, len(v), strings.Count(v, "flood done 200000"))
		}
	}
	// Copilot CLI hides a result over 20 KiB from its model (it saves it
	// to a file): its largest pages and answers stay under that, with the
	// rest a cursor or an offset away.
	for _, c := range []struct {
		name string
		args map[string]any
		more string
	}{
		{"serial_read", map[string]any{"since": 0, "max_bytes": 32768}, `"truncated":true`},
		{"qmp_command", map[string]any{"command": "query-qmp-schema"}, `"next_offset":`},
	} {
		res := cp.call(c.name, c.args, nil)
		view := text(res) + "\n\n" + structured(t, res)
		t.Logf("Copilot CLI's view of %s %v: %d characters", c.name, c.args, len(view))
		if res.IsError || len(view) >= 20<<10 || !strings.Contains(view, c.more) {
			t.Errorf("Copilot CLI's view of %s %v: %d characters: %.300s", c.name, c.args, len(view), view)
		}
	}
	if len(flood) >= 40000 || !w.Truncated || w.Elided == nil || strings.Count(flood, "flood done 200000") != 1 {
		t.Fatalf("flood result: %d characters, truncated %v, elided %+v, %d copies of the end marker", len(flood), w.Truncated, w.Elided, strings.Count(flood, "flood done 200000"))
	}
	// Page through the elided middle with serial_read: every byte, in
	// order, no gap, no overlap.
	var paged int64
	for since := w.Elided.Start; since < w.Elided.End; {
		var r struct {
			Output      string `json:"output"`
			OutputStart int64  `json:"output_start"`
			Cursor      int64  `json:"cursor"`
		}
		res := s.call("serial_read", map[string]any{"since": since, "raw": true}, &r)
		if res.IsError || r.OutputStart != since || r.Cursor <= since {
			t.Fatalf("page from %d: %s %+v", since, text(res), r)
		}
		if n := len(structured(t, res)); n >= 40000 {
			t.Fatalf("page from %d is %d characters", since, n)
		}
		paged += min(r.Cursor, w.Elided.End) - since
		since = r.Cursor
	}
	if paged != w.Elided.End-w.Elided.Start {
		t.Errorf("paged %d bytes of the %d elided", paged, w.Elided.End-w.Elided.Start)
	}
	s.wantError("serial_read", map[string]any{"since": 0, "max_bytes": 1000000000}, "at most 32768", "cursors")

	// The other tools, on what makes them largest here.
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"serial_read", map[string]any{"since": 0, "max_bytes": 32768}},
		{"qemu_status", nil},
		{"qemu_list", nil},
		{"server_info", nil},
		{"qmp_command", map[string]any{"command": "query-qmp-schema"}},
		{"qmp_command", map[string]any{"command": "query-qmp-schema", "offset": 1000}},
	} {
		res := s.call(c.name, c.args, nil)
		if res.IsError {
			t.Fatalf("%s: %s", c.name, text(res))
		}
		n := len(structured(t, res))
		t.Logf("%s %v: %d characters", c.name, c.args, n)
		// Claude Code refuses over 25,000 tokens; 100,000 characters is
		// about that, and results stay well below.
		if n > 80000 {
			t.Errorf("%s %v: %d characters", c.name, c.args, n)
		}
	}
}

// A wait that serial_send starts matches the guest's answer, not its echo
// of the line just typed; match_echo: true matches the echo as before.
func TestWaitAfterEcho(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	var w struct {
		Output     string `json:"output"`
		Match      string `json:"match"`
		MatchStart int64  `json:"match_start"`
		EchoEnd    int64  `json:"echo_end"`
		Cursor     int64  `json:"cursor"`
	}
	s.mustCall("serial_send", map[string]any{"data": "zz-42", "wait_for": "zz-42"}, &w)
	if w.Output != "zz-42\nunknown command: zz-42" || w.MatchStart <= w.EchoEnd {
		t.Errorf("wait for what was typed ended at %d on %q (echo ended at %d)", w.MatchStart, w.Output, w.EchoEnd)
	}
	s.mustCall("serial_read", map[string]any{"wait_for": prompt}, nil)
	s.mustCall("serial_send", map[string]any{"data": "zz-43", "wait_for": "zz-43", "match_echo": true}, &w)
	if w.Output != "zz-43" || w.EchoEnd != 0 {
		t.Errorf("match_echo: %+v", w)
	}
}

// Every schema in tools/list is valid JSON Schema, with plain types (no
// nullable unions) and descriptions without raw control characters.
func TestSchemas(t *testing.T) {
	s := newSession(t)
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		for kind, sch := range map[string]any{"input": tl.InputSchema, "output": tl.OutputSchema} {
			b, _ := json.Marshal(sch)
			var js jsonschema.Schema
			if err := json.Unmarshal(b, &js); err != nil {
				t.Errorf("%s %s schema: %v", tl.Name, kind, err)
				continue
			}
			if _, err := js.Resolve(nil); err != nil {
				t.Errorf("%s %s schema is not valid: %v", tl.Name, kind, err)
			}
			var walk func(path string, v any)
			walk = func(path string, v any) {
				switch v := v.(type) {
				case map[string]any:
					if ty, ok := v["type"].([]any); ok {
						t.Errorf("%s %s schema: %s has a union type %v", tl.Name, kind, path, ty)
					}
					// A boolean schema is valid, but the TypeScript SDK
					// refuses a tools/list with one as a property.
					if props, ok := v["properties"].(map[string]any); ok {
						for name, p := range props {
							if _, isBool := p.(bool); isBool {
								t.Errorf("%s %s schema: %s.%s is a boolean schema", tl.Name, kind, path, name)
							}
						}
					}
					for k, e := range v {
						walk(path+"."+k, e)
					}
				case []any:
					for _, e := range v {
						walk(path, e)
					}
				case string:
					for _, r := range v {
						if unicode.IsControl(r) {
							t.Errorf("%s %s schema: %s has the control character %q", tl.Name, kind, path, r)
						}
					}
				}
			}
			var tree any
			json.Unmarshal(b, &tree)
			walk(tl.Name, tree)
		}
		for _, r := range tl.Description {
			if unicode.IsControl(r) {
				t.Errorf("%s description has the control character %q", tl.Name, r)
			}
		}
	}
}
