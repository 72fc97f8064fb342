package tools

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/qemu-mcp/qemu-mcp/tools/kit"
)

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

// What a tool does, as its annotations tell a client (which may ask its
// user before a mutating call): mutating changes a guest or files,
// reading only looks, querying only looks and gives the same answer to
// the same call.
var (
	mutating = mcp.ToolAnnotations{DestructiveHint: new(true)}
	reading  = mcp.ToolAnnotations{ReadOnlyHint: true}
	querying = mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
)

// tool describes a tool for add: kind's annotations with its title. No
// tool is open-world: each acts on this server's guests and files only.
func tool(name, title string, kind mcp.ToolAnnotations, description string) *mcp.Tool {
	kind.Title = title
	kind.OpenWorldHint = new(false)
	return &mcp.Tool{Name: name, Description: description, Annotations: &kind}
}

// add registers a tool with a plain input schema, no output schema (see
// above), and the shared call handling: its arguments get the schema's
// defaults and are validated against it, as the SDK's typed tools are.
func add[In, Out any](s *Server, ms *mcp.Server, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) {
	ti := kit.InputOf(t.Name, embeddedSchemas()[t.Name], kit.InputSchema[In])
	t.InputSchema = ti.Raw
	s.inputsMu.Lock()
	s.inputs[t.Name] = ti
	s.inputsMu.Unlock()
	ms.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := ti.Load(); err != nil {
			return nil, fmt.Errorf("tools: input schema of %s: %w", t.Name, err)
		}
		var in In
		if res := kit.OnWarmStack(func() *mcp.CallToolResult { return ti.Decode(req.Params.Arguments, &in) }); res != nil {
			return res, nil
		}
		s.calls.Store(req, kit.BudgetOf(req, s.cfg.WholeText))
		defer s.calls.Delete(req)
		if s.closing.Load() {
			return kit.ErrorResult(ErrClosed), nil
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
			return kit.ErrorResult(advise(err)), nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		ob, err := kit.MarshalNoEscape(out)
		if err != nil {
			return nil, fmt.Errorf("tools: %s: marshal the result: %w", t.Name, err)
		}
		res.StructuredContent = json.RawMessage(ob)
		kit.SetText(res, ob, !s.budget(req).Structured)
		return res, nil
	})
}

// limits is the receiving middleware that enforces the hard limits on tool
// calls, before the SDK sees the arguments (its schema validation quotes a
// value in full) and after the tool answered.
func (s *Server) limits(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
		if !ok || p == nil {
			return next(ctx, method, req)
		}
		if len(p.Name) > kit.MaxToolName {
			return kit.ToolError(fmt.Sprintf("unknown tool (a name of %d bytes; tool names are at most %d): tools/list names them", len(p.Name), kit.MaxToolName)), nil
		}
		// The SDK decodes null into a nil map and then panics applying
		// the schema's defaults to it.
		if a := bytes.TrimSpace(p.Arguments); len(a) == 0 || bytes.Equal(a, []byte("null")) {
			p.Arguments = json.RawMessage("{}")
		}
		if len(p.Arguments) > kit.MaxArguments {
			return kit.ToolError(fmt.Sprintf("%s: arguments of %d bytes, more than the limit of %d for a call", p.Name, len(p.Arguments), kit.MaxArguments)), nil
		}
		s.inputsMu.Lock()
		ti := s.inputs[p.Name]
		s.inputsMu.Unlock()
		if ti != nil && ti.Load() == nil {
			var args any
			if json.Unmarshal(p.Arguments, &args) == nil {
				if err := kit.CheckSizes(p.Name, "", args, ti.Schema); err != "" {
					return kit.ToolError(err), nil
				}
			}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, kit.ShortError(err)
		}
		if r, ok := res.(*mcp.CallToolResult); ok && r != nil {
			kit.CapResult(p.Name, r)
		}
		return res, nil
	}
}

// budget is the result budget of req's client under this server's
// settings, decided once per call (see Server.calls).
func (s *Server) budget(req *mcp.CallToolRequest) kit.Budget {
	if r, ok := s.calls.Load(req); ok {
		return r.(kit.Budget)
	}
	return kit.BudgetOf(req, s.cfg.WholeText)
}
