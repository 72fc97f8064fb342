package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
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
//   - no output schemas: a client such as Claude Code gives the model the
//     name, description and input schema of a tool, never its output
//     schema, so output schemas would only cost tools/list its budget
//     (about 9,000 of its 32,000 characters); results are described in
//     the tools' descriptions and the README, and still come as
//     structured content;
//   - every string argument has a maxLength (its `max` tag, or
//     defaultMaxString), which limits enforces with short errors.

// inputSchema is In's schema for tools/list.
func inputSchema[In any]() *jsonschema.Schema {
	s := mustFor[In]()
	plain(s, reflect.TypeFor[In]())
	return s
}

func mustFor[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("tools: schema of %T: %v", *new(T), err))
	}
	return s
}

// plain rewrites s, the schema of t, as the comment above says.
func plain(s *jsonschema.Schema, t reflect.Type) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	if b, _ := json.Marshal(s); string(b) == "true" {
		// An empty schema is the boolean schema true: valid, but the
		// TypeScript SDK refuses a tools/list with one in it.
		s.Description = "any JSON value"
	}
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice) {
		t = t.Elem()
	}
	if s.Items != nil {
		plain(s.Items, t)
	}
	if t == nil || t.Kind() != reflect.Struct {
		for _, p := range s.Properties {
			plain(p, nil)
		}
		return
	}
	fields := map[string]reflect.StructField{}
	collectFields(t, fields)
	for name, p := range s.Properties {
		f, ok := fields[name]
		if !ok {
			plain(p, nil)
			continue
		}
		plain(p, f.Type)
		if d, ok := f.Tag.Lookup("default"); ok {
			p.Default = defaultValue(p, d)
		}
		setMaxLength(p, f.Tag.Get("max"))
		if m := f.Tag.Get("maxitems"); m != "" && p.Type == "array" {
			n, err := strconv.Atoi(m)
			if err != nil {
				panic(fmt.Sprintf("tools: maxitems tag %q", m))
			}
			p.MaxItems = &n
		}
	}
}

// defaultMaxString bounds a string argument without a max tag: names,
// paths, patterns and such are short; the server never holds a bigger one.
const defaultMaxString = 4096

// setMaxLength gives a string schema (or the strings of an array schema)
// its limit.
func setMaxLength(p *jsonschema.Schema, tag string) {
	n := defaultMaxString
	if tag != "" {
		var err error
		if n, err = strconv.Atoi(tag); err != nil {
			panic(fmt.Sprintf("tools: max tag %q", tag))
		}
	}
	switch {
	case p.Type == "string":
		p.MaxLength = &n
	case p.Type == "array" && p.Items != nil && p.Items.Type == "string":
		p.Items.MaxLength = &n
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

// add registers a tool with a plain input schema, no output schema (see
// above: the SDK infers one unless the output is typed any), and the
// shared call handling.
func add[In, Out any](s *Server, ms *mcp.Server, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) {
	in := inputSchema[In]()
	t.InputSchema = in
	s.inputs[t.Name] = in
	mcp.AddTool(ms, t, handle(s, func(ctx context.Context, req *mcp.CallToolRequest, args In) (*mcp.CallToolResult, any, error) {
		res, out, err := h(ctx, req, args)
		if err != nil {
			return res, nil, err
		}
		return res, out, nil
	}))
}
