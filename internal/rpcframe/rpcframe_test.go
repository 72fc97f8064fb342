package rpcframe

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// run filters input and returns what passed and what was answered.
func run(t testing.TB, input string, maxLine int) (passed, answered []string) {
	t.Helper()
	var out bytes.Buffer
	r := Filter(strings.NewReader(input), &out, maxLine)
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("filter: %v", err)
	}
	split := func(s string) []string {
		var l []string
		for _, x := range strings.Split(s, "\n") {
			if x != "" {
				l = append(l, x)
			}
		}
		return l
	}
	return split(string(b)), split(out.String())
}

func TestFilter(t *testing.T) {
	req := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	notif := `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	resp := `{"jsonrpc":"2.0","id":"a","result":{}}`
	input := strings.Join([]string{
		req, "", "   ", "this is not json", `[` + req + `]`, `42`, `{"id":7,"method":"x"}`,
		`{"jsonrpc":"2.0","id":{"x":1},"method":"x"}`, `{"jsonrpc":"2.0","id":8,"method":3}`,
		`{"jsonrpc":"2.0","id":9}`, `{"jsonrpc":"2.0","result":{}}`, `{"jsonrpc":"2.0","id":1e400,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":6,"error":"x"}`, notif, `{"jsonrpc":"2.0","id":2,"method":"x"` /* cut */, resp,
		strings.Repeat("x", 200), req,
	}, "\n")
	passed, answered := run(t, input, 100)
	if want := []string{req, notif, resp, req}; strings.Join(passed, "|") != strings.Join(want, "|") {
		t.Errorf("passed %q, want %q", passed, want)
	}
	want := []struct {
		id   string
		code int
	}{{"null", CodeParseError}, {"null", CodeInvalidRequest}, {"null", CodeInvalidRequest}, {"7", CodeInvalidRequest},
		{"null", CodeInvalidRequest}, {"8", CodeInvalidRequest}, {"9", CodeInvalidRequest}, {"null", CodeInvalidRequest},
		{"null", CodeInvalidRequest}, {"6", CodeInvalidRequest}, {"null", CodeParseError}, {"null", CodeInvalidRequest}}
	if len(answered) != len(want) {
		t.Fatalf("answered %d lines, want %d: %q", len(answered), len(want), answered)
	}
	for i, a := range answered {
		var m struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(a), &m); err != nil || m.JSONRPC != "2.0" || string(m.ID) != want[i].id || m.Error.Code != want[i].code || m.Error.Message == "" {
			t.Errorf("answer %d = %s, want id %s code %d", i, a, want[i].id, want[i].code)
		}
	}
	if !strings.Contains(answered[len(answered)-1], "longer than 100 bytes") {
		t.Errorf("long line answer: %s", answered[len(answered)-1])
	}
}

// FuzzFilter: whatever the input, the filter passes only lines that are
// each one JSON-RPC message, answers with valid JSON-RPC errors, and never
// loses a well-formed message that follows garbage.
func FuzzFilter(f *testing.F) {
	for _, s := range []string{"", "\n", "x\n", `{"jsonrpc":"2.0","id":1,"method":"a"}`, "[]\n{}\n", "\xff\xfe\n", `{"jsonrpc":"2.0","id":1e400,"method":"a"}`} {
		f.Add(s)
	}
	const good = `{"jsonrpc":"2.0","id":"last","method":"ping"}`
	f.Fuzz(func(t *testing.T, input string) {
		passed, answered := run(t, input+"\n"+good+"\n", 256)
		if len(passed) == 0 || passed[len(passed)-1] != good {
			t.Fatalf("the good message after %q was lost: passed %q", input, passed)
		}
		for _, p := range passed {
			if _, code, reason := Check([]byte(p)); code != 0 {
				t.Fatalf("passed %q: %s", p, reason)
			}
			// What passes, the SDK decodes: nothing passed ends its
			// session.
			if _, err := jsonrpc.DecodeMessage([]byte(p)); err != nil {
				t.Fatalf("passed %q, which the SDK refuses: %v", p, err)
			}
		}
		for _, a := range answered {
			var m struct {
				JSONRPC string `json:"jsonrpc"`
				Error   *struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(a), &m); err != nil || m.JSONRPC != "2.0" || m.Error == nil {
				t.Fatalf("answer %q is not a JSON-RPC error", a)
			}
		}
	})
}

// A line over the limit is answered with its top-level id, wherever the id
// stands (the TypeScript SDK writes it after params), without the line
// being held.
func TestLongLineID(t *testing.T) {
	big := strings.Repeat("x", 3000)
	for _, c := range []struct{ line, id string }{
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a","arguments":{"data":"` + big + `","id":99}},"id":42}`, "42"},
		{`{"id":"req-\"7\"","jsonrpc":"2.0","method":"x","params":{"s":"` + big + `"}}`, `"req-\"7\""`},
		{`{ "jsonrpc" : "2.0" , "params" : ["` + big + `", {"id": 5}] , "id" : -3 }`, "-3"},
		{`{"jsonrpc":"2.0","method":"x","params":"` + big + `\\"id\\":8"}`, "null"},
		{`{"jsonrpc":"2.0","id":{"a":1},"params":"` + big + `"}`, "null"},
		{`{"jsonrpc":"2.0","id":1.5,"params":"` + big + `"}`, "null"},
		{`{"jsonrpc":"2.0","id":"` + big + `"}`, "null"},
		{`[{"id":3,"p":"` + big + `"}]`, "null"},
		{`{"jsonrpc":"2.0","params":"` + big + `","id":7`, "7"}, // cut before its end: still the id it named
	} {
		_, answered := run(t, c.line+"\n"+`{"jsonrpc":"2.0","id":1,"method":"ping"}`+"\n", 1000)
		if len(answered) != 1 {
			t.Fatalf("%.60s: answered %q", c.line, answered)
		}
		var m struct {
			ID    json.RawMessage    `json:"id"`
			Error struct{ Code int } `json:"error"`
		}
		if err := json.Unmarshal([]byte(answered[0]), &m); err != nil || string(m.ID) != c.id || m.Error.Code != CodeInvalidRequest {
			t.Errorf("%.60s: answer %s, want id %s", c.line, answered[0], c.id)
		}
	}
}

// A 10 MB line streams through: memory stays far below its size.
func TestLongLineNotHeld(t *testing.T) {
	line := `{"jsonrpc":"2.0","method":"tools/call","params":{"data":"` + strings.Repeat("y", 10<<20) + `"},"id":"big"}` + "\n"
	var out bytes.Buffer
	r := Filter(io.MultiReader(strings.NewReader(line)), &out, 0)
	if _, err := io.ReadAll(r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"id":"big"`) {
		t.Errorf("answer %s", out.String())
	}
	allocs := testing.AllocsPerRun(1, func() {
		s := &idScanner{}
		for i := 0; i < 160; i++ {
			s.feed([]byte(line[i*65536 : min(len(line), (i+1)*65536)]))
		}
	})
	if allocs > 20 {
		t.Errorf("%v allocations scanning 10 MB", allocs)
	}
}
