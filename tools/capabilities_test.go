package tools_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The server declares tools and resources, and not MCP logging, to a client
// of either protocol era: 2026-07-28 deprecates logging for stderr, where
// the server logs, and it never sends a log message, so the capability
// would invite a client to set a level that changes nothing. The
// deprecation leaves the wire as it was, so a client of an older revision
// that sets a level anyway is still answered.
func TestCapabilities(t *testing.T) {
	for _, version := range []string{"2026-07-28", "2025-11-25", "2024-11-05"} {
		t.Run(version, func(t *testing.T) {
			cs := bareSession(t, &mcp.ClientSessionOptions{ProtocolVersion: version})
			init := cs.InitializeResult()
			if init.ProtocolVersion != version {
				t.Fatalf("negotiated protocol %s, want %s", init.ProtocolVersion, version)
			}
			b, err := json.Marshal(init.Capabilities)
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
			if version >= "2026-07-28" {
				return
			}
			//lint:ignore SA1019 an older revision's client may still set a level: it must not fail
			if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Errorf("logging/setLevel of a %s client: %v", version, err)
			}
		})
	}
}
