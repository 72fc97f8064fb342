package tools_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/tools/kit"
)

// A client that gives its model only the text content (Gemini CLI, Claude
// Desktop, agents built on content blocks) sees every value of each tool's
// structured content: this reads only the text of each result and finds
// each value there, under its key.
func TestTextCarriesEveryValue(t *testing.T) {
	snaps := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.Snapshots = snaps }, nil)
	calls := []struct {
		name string
		args map[string]any
	}{
		{"qemu_boot", map[string]any{"wait_for": prompt, "gdb": true}},
		{"serial_send", map[string]any{"data": "echo hello-42", "wait_for": prompt}},
		{"serial_send", map[string]any{"data": "flood 200000", "wait_for": prompt}},
		{"serial_send", map[string]any{"data": "help"}},
		{"serial_read", map[string]any{"since": 0, "max_bytes": 2000}},
		{"serial_read", map[string]any{"wait_for": "nothing-comes", "timeout": 0.2}},
		{"qmp_command", map[string]any{"command": "query-status"}},
		{"qmp_command", map[string]any{"command": "query-cpus-fast"}},
		{"qmp_command", map[string]any{"command": "query-qmp-schema", "offset": 100}},
		{"qemu_status", nil},
		{"qemu_list", nil},
		{"server_info", nil},
		{"debug_break", map[string]any{"location": "cmd_echo"}},
		{"serial_send", map[string]any{"data": "echo hit", "wait_for": "hit\r\ntiny> $", "timeout": 1}},
		{"debug_registers", nil},
		{"debug_backtrace", nil},
		{"debug_disassemble", map[string]any{"count": 40}},
		{"debug_memory", map[string]any{"location": "_start", "length": 200}},
		{"debug_symbolize", map[string]any{"address": "puts"}},
		{"debug_translate", map[string]any{"address": "_start"}},
		{"debug_watch", map[string]any{"location": "_start", "length": 4}},
		{"debug_step", map[string]any{"count": 3}},
		{"debug_break", map[string]any{"location": "cmd_echo", "remove": true}},
		{"debug_watch", map[string]any{"location": "_start", "length": 4, "remove": true}},
		{"debug_continue", map[string]any{"timeout": 0.2}},
		{"qemu_snapshot_save", map[string]any{"name": "text"}},
		{"qemu_snapshot_list", nil},
		{"qemu_snapshot_load", map[string]any{"name": "text"}},
		{"qemu_snapshot_delete", map[string]any{"name": "text"}},
		{"qemu_shutdown", nil},
		{"qemu_status", nil},
		{"qemu_status", map[string]any{"instance": "never"}},
	}
	for _, c := range calls {
		res := s.call(c.name, c.args, nil)
		if res.IsError {
			t.Fatalf("%s %v: %s", c.name, c.args, text(res))
		}
		js := structured(t, res)
		txt := text(res)
		t.Logf("%s %v: text %d characters, structured JSON %d", c.name, c.args, len(txt), len(js))
		for _, miss := range missingValues(js, txt) {
			t.Errorf("%s %v: the text lacks %s\ntext:\n%s", c.name, c.args, miss, txt)
		}
	}
}

// The clients that show their model the structured content get the
// summary alone as text (Copilot CLI shows both: each value once), unless
// the server is told to give every client the whole text.
func TestTextByClient(t *testing.T) {
	for _, c := range []struct {
		client string
		whole  bool
		want   bool
	}{
		{"copilot-cli", false, false},
		{"claude-code", false, false},
		{"codex-mcp-client", false, false},
		{"gemini-cli-mcp-client", false, true},
		{"claude-ai", false, true},
		{"copilot-cli", true, true},
	} {
		s := newSessionAs(t, c.client, func(cfg *testConfig) { cfg.WholeText = c.whole }, nil)
		res := s.call("qemu_status", map[string]any{"instance": "never"}, nil)
		txt := text(res)
		if whole := strings.Contains(txt, `"state":"none"`); whole != c.want || !strings.Contains(txt, "never") {
			t.Errorf("%s (whole-text %v): text %q, want the whole result %v", c.client, c.whole, txt, c.want)
		}
	}
}

// missingValues lists each key and value of the JSON js that the text
// does not show: a key before its value or block, a string as it is or
// as a JSON string, a number, boolean or null after its key (or in a
// list).
func missingValues(js, txt string) []string {
	dec := json.NewDecoder(strings.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{"(structured content is not JSON: " + err.Error() + ")"}
	}
	var miss []string
	var walk func(path, key string, v any)
	walk = func(path, key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !strings.Contains(txt, jsonString(k)+":") && !strings.Contains(txt, "\n"+k+":\n") {
					miss = append(miss, fmt.Sprintf("the key %s.%s", path, k))
				}
				walk(path+"."+k, k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), "", e)
			}
		case string:
			if !strings.Contains(txt, v) && !strings.Contains(txt, jsonString(v)) {
				miss = append(miss, fmt.Sprintf("%s = %q", path, v))
			}
		default:
			lit := fmt.Sprint(v)
			if v == nil {
				lit = "null"
			}
			found := strings.Contains(txt, jsonString(key)+":"+lit)
			if key == "" {
				found = found || strings.Contains(txt, lit)
			}
			if !found {
				miss = append(miss, fmt.Sprintf("%s = %s", path, lit))
			}
		}
	}
	walk("", "", v)
	return miss
}

// jsonString is s as a JSON string in the text content, unescaped as the
// server writes it.
func jsonString(s string) string {
	b, _ := kit.MarshalNoEscape(s)
	return string(b)
}
