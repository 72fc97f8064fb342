package tools

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
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

// schemasJSON holds every tool's input schema as tools/list shows it,
// generated from the argument types (go test ./tools -run
// TestSchemasFile -update; the test fails when it is stale). Building the
// schemas by reflection and resolving them costs about 5 ms, more than the
// rest of start-up together; read from here, the server answers
// initialize at once, and each schema is resolved for validation when its
// tool is first called.
//
//go:embed schemas.json
var schemasJSON []byte

var embeddedSchemas = sync.OnceValue(func() map[string]json.RawMessage {
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(schemasJSON, &m); err != nil {
		panic(fmt.Sprintf("tools: schemas.json: %v", err))
	}
	return m
})

// toolInput is a tool's input schema: its JSON for tools/list, and the
// schema resolved on first use, shared by every MCP server of the process.
type toolInput struct {
	raw json.RawMessage
	gen func() *jsonschema.Schema // what schemas.json is generated from

	once     sync.Once
	schema   *jsonschema.Schema
	resolved *jsonschema.Resolved
	err      error
}

var (
	inputsMu sync.Mutex
	inputs   = map[string]*toolInput{}
)

// inputOf returns the input of tool name, whose argument type gen
// describes.
func inputOf(name string, gen func() *jsonschema.Schema) *toolInput {
	inputsMu.Lock()
	defer inputsMu.Unlock()
	if ti := inputs[name]; ti != nil {
		return ti
	}
	ti := &toolInput{raw: embeddedSchemas()[name], gen: gen}
	if ti.raw == nil {
		// Not in schemas.json (a tool added since it was generated):
		// built here, at a start-up cost, until the file is regenerated.
		b, err := json.Marshal(gen())
		if err != nil {
			panic(fmt.Sprintf("tools: schema of %s: %v", name, err))
		}
		ti.raw = b
	}
	inputs[name] = ti
	return ti
}

// load parses and resolves the schema.
func (ti *toolInput) load() error {
	ti.once.Do(func() {
		var sch jsonschema.Schema
		if ti.err = json.Unmarshal(ti.raw, &sch); ti.err != nil {
			return
		}
		ti.schema = &sch
		ti.resolved, ti.err = sch.Resolve(nil)
	})
	return ti.err
}

// decode gives the arguments a the schema's defaults, validates them
// against it and decodes them into in; a tool error result if they do not
// validate.
func (ti *toolInput) decode(a json.RawMessage, in any) *mcp.CallToolResult {
	args := map[string]any{}
	if len(a) > 0 {
		if err := json.Unmarshal(a, &args); err != nil {
			return errorResult(fmt.Errorf("validating \"arguments\": unmarshaling arguments: %w", err))
		}
	}
	var v any = args
	if err := ti.resolved.ApplyDefaults(&v); err != nil {
		return errorResult(fmt.Errorf("validating \"arguments\": applying schema defaults:\n%w", err))
	}
	if err := ti.resolved.Validate(&v); err != nil {
		return errorResult(fmt.Errorf("validating \"arguments\": %v", err))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return errorResult(err)
	}
	if err := json.Unmarshal(b, in); err != nil {
		return errorResult(err)
	}
	return nil
}

// onWarmStack runs f on one of a few long-lived goroutines and returns
// its result. The SDK handles each request on a new goroutine, whose
// stack starts small: the schema validator's recursion grew it, and the
// runtime copied it, three times a call (two thirds of the validation's
// CPU: 65 µs a serial_send against 20 µs on a goroutine whose stack has
// grown once). The handoff costs a microsecond.
func onWarmStack(f func() *mcp.CallToolResult) *mcp.CallToolResult {
	warmOnce.Do(startWarm)
	done := make(chan *mcp.CallToolResult, 1)
	warmWork <- func() {
		// A panic is the call's, as it was on the call's goroutine.
		defer func() {
			if p := recover(); p != nil {
				done <- errorResult(fmt.Errorf("validating \"arguments\": %v", p))
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

// startWarm starts the goroutines of onWarmStack: one per processor, as
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

// add registers a tool with a plain input schema, no output schema (see
// above), and the shared call handling: its arguments get the schema's
// defaults and are validated against it, as the SDK's typed tools are.
func add[In, Out any](s *Server, ms *mcp.Server, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) {
	ti := inputOf(t.Name, inputSchema[In])
	t.InputSchema = ti.raw
	s.inputsMu.Lock()
	s.inputs[t.Name] = ti
	s.inputsMu.Unlock()
	ms.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := ti.load(); err != nil {
			return nil, fmt.Errorf("tools: input schema of %s: %w", t.Name, err)
		}
		var in In
		if res := onWarmStack(func() *mcp.CallToolResult { return ti.decode(req.Params.Arguments, &in) }); res != nil {
			return res, nil
		}
		s.calls.Store(req, readerOf(req, s.cfg.WholeText))
		defer s.calls.Delete(req)
		if s.closing.Load() {
			return errorResult(ErrClosed), nil
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(s.base, cancel)()
		res, out, err := h(ctx, req, in)
		if err != nil {
			var wire *jsonrpc.Error
			if errors.As(err, &wire) {
				return nil, wire
			}
			return errorResult(advise(err)), nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		ob, err := marshalNoEscape(out)
		if err != nil {
			return nil, fmt.Errorf("tools: %s: marshal the result: %w", t.Name, err)
		}
		res.StructuredContent = json.RawMessage(ob)
		setText(res, ob, !s.reader(req).structured)
		return res, nil
	})
}

func errorResult(err error) *mcp.CallToolResult {
	var r mcp.CallToolResult
	r.SetError(err)
	return &r
}
