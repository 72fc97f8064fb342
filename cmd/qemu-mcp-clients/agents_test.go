package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// Each client's prefix is found, and a tool is never taken for another
// whose name ends the same way.
func TestModelName(t *testing.T) {
	tools := map[string]json.RawMessage{"mcp__qemu__qemu_status": nil, "mcp_qemu_qemu_boot": nil, "qemu-serial_read": nil,
		"mcp__qemu.debug_step": nil, "status": nil, "Bash": nil}
	for tool, want := range map[string]string{"qemu_status": "mcp__qemu__qemu_status", "qemu_boot": "mcp_qemu_qemu_boot",
		"serial_read": "qemu-serial_read", "debug_step": "mcp__qemu.debug_step", "qemu_list": "", "status": "status"} {
		if got := modelName(tools, tool); got != want {
			t.Errorf("modelName(%s) = %q, want %q", tool, got, want)
		}
	}
}

// A value counts as seen as it is, as JSON string content, or as that
// inside another JSON string; a value seen nowhere is reported.
func TestMissing(t *testing.T) {
	structured := []byte(`{"output":"a \"b\"\nc","pid":4242,"paths":{"qmp":"/run/q.sock"},"frames":[{"function":"puts"}]}`)
	inner, _ := json.Marshal(string(structured))
	for name, saw := range map[string]string{
		"JSON":             string(structured),
		"text":             "output:\n```\na \"b\"\nc\n```\n{\"pid\":4242,\"paths\":{\"qmp\":\"/run/q.sock\"},\"frames\":[{\"function\":\"puts\"}]}",
		"JSON in a string": string(inner),
	} {
		if m := missing(structured, saw); len(m) > 0 {
			t.Errorf("%s: missing %v", name, m)
		}
	}
	if m := missing(structured, `wrote 14 bytes; qmp query-status: 59 bytes of answer`); len(m) != 4 {
		t.Errorf("a summary alone: missing %v, want all 4 values", m)
	}
}

// The fakes answer a tool call in each API's wire format, and read the
// results back from the next request as the client sends them.
func TestFakes(t *testing.T) {
	script := []step{{"qemu_boot", map[string]any{"gdb": true}}}
	for name, c := range map[string]struct {
		a    api
		path string
		req  string
		want string
	}{
		"anthropic": {anthropic{}, "/v1/messages", `{"tools":[{"name":"mcp__qemu__qemu_boot","input_schema":{}}],"messages":[{"role":"user","content":"go"}]}`, `"name":"mcp__qemu__qemu_boot"`},
		"responses": {responses{}, "/v1/responses", `{"tools":[{"type":"function","name":"mcp__qemu__qemu_boot","parameters":{}}],"input":[]}`, `"arguments":"{\"gdb\":true}"`},
		"chat":      {chat{}, "/v1/chat/completions", `{"tools":[{"type":"function","function":{"name":"qemu-qemu_boot","parameters":{}}}],"messages":[]}`, `"name":"qemu-qemu_boot"`},
		"gemini":    {gemini{}, "/v1beta/models/m:streamGenerateContent", `{"tools":[{"functionDeclarations":[{"name":"mcp_qemu_qemu_boot","parametersJsonSchema":{}}]}],"contents":[]}`, `"functionCall":{"args":{"gdb":true},"name":"mcp_qemu_qemu_boot"}`},
	} {
		f := &fake{api: c.a, script: script, dir: t.TempDir()}
		w := httptest.NewRecorder()
		f.ServeHTTP(w, httptest.NewRequest("POST", c.path, strings.NewReader(c.req)))
		if !strings.Contains(w.Body.String(), c.want) {
			t.Errorf("%s: answer %s lacks %s", name, w.Body.String(), c.want)
		}
		if ex, _ := f.Exchanges(); len(ex) != 1 || ex[0].Called == "" {
			t.Errorf("%s: exchanges %+v", name, ex)
		}
	}
	_, res, err := chat{}.parse([]byte(`{"messages":[{"role":"tool","content":"summary\n\n{\"pid\":1}"},{"role":"tool","content":[{"type":"text","text":"x"}]}]}`))
	if err != nil || len(res) != 2 || res[0].Text != "summary\n\n{\"pid\":1}" || res[1].Text != "x" {
		t.Errorf("chat results: %+v %v", res, err)
	}
}
