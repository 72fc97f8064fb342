package tools_test

import (
	"encoding/json"
	"testing"
)

// The server declares tools and resources, and not MCP logging, which
// protocol 2026-07-28 deprecates in favour of stderr, where the server
// logs: a client is not invited to set a log level that would change
// nothing.
func TestCapabilities(t *testing.T) {
	s := newSession(t)
	b, err := json.Marshal(s.cs.InitializeResult().Capabilities)
	if err != nil {
		t.Fatal(err)
	}
	var caps map[string]json.RawMessage
	if err := json.Unmarshal(b, &caps); err != nil {
		t.Fatal(err)
	}
	if _, ok := caps["logging"]; ok {
		t.Errorf("the server declares MCP logging: %s", b)
	}
	for _, want := range []string{"tools", "resources"} {
		if _, ok := caps[want]; !ok {
			t.Errorf("the server does not declare %s: %s", want, b)
		}
	}
}
