// Package kit is the MCP layer's plain helpers: tools' input schemas and
// their limits, the text of a result for clients that read text, and the
// result budget of each client. They take what they need as arguments
// (a budget, a schema), never the server.
package kit

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"

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
//     DefaultMaxString), which limits enforces with short errors.

// InputSchema is In's schema for tools/list.
func InputSchema[In any]() *jsonschema.Schema {
	s := MustFor[In]()
	plain(s, reflect.TypeFor[In]())
	return s
}

func MustFor[T any]() *jsonschema.Schema {
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
		if a := f.Tag.Get("anyof"); a != "" {
			p.AnyOf = anyOf(a)
		}
		// A field of several types has its limits on each of them.
		for _, q := range append([]*jsonschema.Schema{p}, p.AnyOf...) {
			setMaxLength(q, f.Tag.Get("max"))
			if m := f.Tag.Get("maxitems"); m != "" && q.Type == "array" {
				n, err := strconv.Atoi(m)
				if err != nil {
					panic(fmt.Sprintf("tools: maxitems tag %q", m))
				}
				q.MaxItems = &n
			}
		}
	}
}

// anyOf is the schema of a field that takes one of several types (an
// `anyof` tag such as "string,[]string"). Without it the field's schema
// has no type, and Codex, which rewrites schemas to the types it knows,
// gives its model an empty schema: no description.
func anyOf(tag string) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	for _, t := range strings.Split(tag, ",") {
		if elem, ok := strings.CutPrefix(t, "[]"); ok {
			out = append(out, &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{Type: elem}})
		} else {
			out = append(out, &jsonschema.Schema{Type: t})
		}
	}
	return out
}

// DefaultMaxString bounds a string argument without a max tag: names,
// paths, patterns and such are short; the server never holds a bigger one.
const DefaultMaxString = 4096

// setMaxLength gives a string schema (or the strings of an array schema)
// its limit.
func setMaxLength(p *jsonschema.Schema, tag string) {
	n := DefaultMaxString
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

// Input is a tool's input schema: its JSON for tools/list, and the
// schema resolved on first use, shared by every MCP server of the process.
type Input struct {
	Raw json.RawMessage
	gen func() *jsonschema.Schema // what the embedded schemas are generated from

	once     sync.Once
	Schema   *jsonschema.Schema
	resolved *jsonschema.Resolved
	err      error
}

var (
	inputsMu sync.Mutex
	inputs   = map[string]*Input{}
)

// InputOf returns the input of tool name, whose argument type gen
// describes.
func InputOf(name string, raw json.RawMessage, gen func() *jsonschema.Schema) *Input {
	inputsMu.Lock()
	defer inputsMu.Unlock()
	if ti := inputs[name]; ti != nil {
		return ti
	}
	ti := &Input{Raw: raw, gen: gen}
	if ti.Raw == nil {
		// Not generated before (a tool added since):
		// built here, at a start-up cost, until the file is regenerated.
		b, err := json.Marshal(gen())
		if err != nil {
			panic(fmt.Sprintf("tools: schema of %s: %v", name, err))
		}
		ti.Raw = b
	}
	inputs[name] = ti
	return ti
}

// load parses and resolves the schema.
func (ti *Input) Load() error {
	ti.once.Do(func() {
		var sch jsonschema.Schema
		if ti.err = json.Unmarshal(ti.Raw, &sch); ti.err != nil {
			return
		}
		ti.Schema = &sch
		ti.resolved, ti.err = sch.Resolve(nil)
	})
	return ti.err
}

// Generate builds the schema from the argument type, as it would be
// generated into the embedded file.
func (ti *Input) Generate() *jsonschema.Schema { return ti.gen() }

// Decode gives the arguments a the schema's defaults, validates them
// against it and decodes them into in; a tool error result if they do not
// validate.
func (ti *Input) Decode(a json.RawMessage, in any) *mcp.CallToolResult {
	args := map[string]any{}
	if len(a) > 0 {
		if err := json.Unmarshal(a, &args); err != nil {
			return ErrorResult(fmt.Errorf("validating \"arguments\": unmarshaling arguments: %w", err))
		}
	}
	var v any = args
	if err := ti.resolved.ApplyDefaults(&v); err != nil {
		return ErrorResult(fmt.Errorf("validating \"arguments\": applying schema defaults:\n%w", err))
	}
	if err := ti.resolved.Validate(&v); err != nil {
		return ErrorResult(fmt.Errorf("validating \"arguments\": %v", err))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ErrorResult(err)
	}
	if err := json.Unmarshal(b, in); err != nil {
		return ErrorResult(err)
	}
	return nil
}

// OnWarmStack runs f on one of a few long-lived goroutines and returns
// its result. The SDK handles each request on a new goroutine, whose
// stack starts small: the schema validator's recursion grew it, and the
// runtime copied it, three times a call (two thirds of the validation's
// CPU: 65 µs a serial_send against 20 µs on a goroutine whose stack has
// grown once). The handoff costs a microsecond.
func OnWarmStack(f func() *mcp.CallToolResult) *mcp.CallToolResult {
	warmOnce.Do(startWarm)
	done := make(chan *mcp.CallToolResult, 1)
	warmWork <- func() {
		// A panic is the call's, as it was on the call's goroutine.
		defer func() {
			if p := recover(); p != nil {
				done <- ErrorResult(fmt.Errorf("validating \"arguments\": %v", p))
			}
		}()
		done <- f()
	}
	return <-done
}

var (
	warmOnce sync.Once
	warmWork chan func()
)

// startWarm starts the goroutines of OnWarmStack: one per processor, as
// the work they do needs no more.
func startWarm() {
	warmWork = make(chan func())
	for range runtime.GOMAXPROCS(0) {
		go func() {
			for f := range warmWork {
				f()
			}
		}()
	}
}

func ErrorResult(err error) *mcp.CallToolResult {
	var r mcp.CallToolResult
	r.SetError(err)
	return &r
}
