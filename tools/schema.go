package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Every client has to convert these schemas (the MCP Inspector turns
// command-line strings into arguments by them), and every turn of the model
// pays for them, so they are plain and small:
//   - no nullable unions: a Go slice or pointer is inferred as ["null", T],
//     which some clients cannot convert; absent means default here;
//   - defaults as JSON Schema "default", from a field's `default` tag; the
//     SDK writes them into the arguments, so no field a boot profile can
//     set has one (an argument given overrides the profile);
//   - output schemas keep names and types but not descriptions: what a
//     model needs to know of a result is in the tool's description.

// inputSchema is In's schema for tools/list.
func inputSchema[In any]() *jsonschema.Schema {
	s := mustFor[In]()
	plain(s, reflect.TypeFor[In](), true)
	return s
}

// outputSchema is Out's schema for tools/list.
func outputSchema[Out any]() *jsonschema.Schema {
	s := mustFor[Out]()
	plain(s, reflect.TypeFor[Out](), false)
	return s
}

func mustFor[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("tools: schema of %T: %v", *new(T), err))
	}
	return s
}

// plain rewrites s, the schema of t, as the comment above says; keepDesc
// keeps descriptions (input schemas).
func plain(s *jsonschema.Schema, t reflect.Type, keepDesc bool) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	if !keepDesc {
		s.Description = ""
		if b, _ := json.Marshal(s); string(b) == "true" {
			// An empty schema is the boolean schema true: valid, but the
			// TypeScript SDK refuses a tools/list with one in it.
			s.Description = "any JSON value"
		}
	}
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice) {
		t = t.Elem()
	}
	if s.Items != nil {
		plain(s.Items, t, keepDesc)
	}
	if t == nil || t.Kind() != reflect.Struct {
		for _, p := range s.Properties {
			plain(p, nil, keepDesc)
		}
		return
	}
	fields := map[string]reflect.StructField{}
	collectFields(t, fields)
	for name, p := range s.Properties {
		f, ok := fields[name]
		if !ok {
			plain(p, nil, keepDesc)
			continue
		}
		plain(p, f.Type, keepDesc)
		if d, ok := f.Tag.Lookup("default"); ok && keepDesc {
			p.Default = defaultValue(p, d)
		}
	}
}

// collectFields maps JSON names to fields, embedded structs included.
func collectFields(t reflect.Type, out map[string]reflect.StructField) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				collectFields(ft, out)
			}
			continue
		}
		if name != "" && name != "-" {
			out[name] = f
		}
	}
}

// defaultValue encodes a `default` tag as JSON of the property's type.
func defaultValue(p *jsonschema.Schema, d string) json.RawMessage {
	if p.Type == "string" {
		b, _ := json.Marshal(d)
		return b
	}
	if !json.Valid([]byte(d)) {
		panic(fmt.Sprintf("tools: default %q is not JSON", d))
	}
	return json.RawMessage(d)
}

// add registers a tool with plain schemas and the shared call handling.
func add[In, Out any](s *Server, ms *mcp.Server, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) {
	t.InputSchema = inputSchema[In]()
	t.OutputSchema = outputSchema[Out]()
	mcp.AddTool(ms, t, handle(s, h))
}
