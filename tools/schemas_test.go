package tools

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"slices"
	"testing"

	"maps"

	"github.com/qemu-mcp/qemu-mcp/instance"
)

var update = flag.Bool("update", false, "rewrite schemas.json from the argument types")

// schemas.json is what tools/list shows: it must be what the argument
// types say. Regenerate it with go test ./tools -run TestSchemasFile -update.
func TestSchemasFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "qsch")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o700)
	s, err := New(Config{Version: "test", Guests: func() (*instance.Manager, error) { return instance.New(instance.Config{RuntimeDir: dir}) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(t.Context())
	s.registerAll(s.NewMCPServer())
	want := map[string]json.RawMessage{}
	for _, name := range slices.Sorted(maps.Keys(s.inputs)) {
		b, err := json.Marshal(s.inputs[name].Generate())
		if err != nil {
			t.Fatal(err)
		}
		want[name] = b
	}
	// One tool a line, each schema compact: what the server sends.
	var buf bytes.Buffer
	buf.WriteString("{\n")
	names := slices.Sorted(maps.Keys(want))
	for i, name := range names {
		k, _ := json.Marshal(name)
		buf.Write(k)
		buf.WriteString(": ")
		buf.Write(want[name])
		if i < len(names)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("}\n")
	b := buf.Bytes()
	if *update {
		if err := os.WriteFile("schemas.json", b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(b, schemasJSON) {
		t.Fatalf("schemas.json is stale: run go test ./tools -run TestSchemasFile -update")
	}
}
