package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Hard limits: whatever a client sends, nothing it gets back, and nothing
// the server holds for it, is larger than these.
const (
	// maxToolName bounds a tool name in a call (and its echo in an error).
	maxToolName = 64
	// maxErrorText bounds the text of a tool error: messages quote inputs
	// shortened, and this catches whatever does not.
	maxErrorText = 2048
	// maxArguments bounds a call's arguments as JSON, checked before they
	// are decoded at all: the largest argument (data, 64 Ki characters of
	// up to six bytes each when escaped) fits with room to spare.
	maxArguments = 1 << 20
	// maxResult bounds a whole result's structured content: results are
	// budgeted far below it, so passing it is a bug, reported as an error
	// rather than sent.
	maxResult = 2 << 20
)

// limits is the receiving middleware that enforces the hard limits on tool
// calls, before the SDK sees the arguments (its schema validation quotes a
// value in full) and after the tool answered.
func (s *Server) limits(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
		if !ok || p == nil {
			return next(ctx, method, req)
		}
		if len(p.Name) > maxToolName {
			return toolError(fmt.Sprintf("unknown tool (a name of %d bytes; tool names are at most %d): tools/list names them", len(p.Name), maxToolName)), nil
		}
		// The SDK decodes null into a nil map and then panics applying
		// the schema's defaults to it.
		if a := bytes.TrimSpace(p.Arguments); len(a) == 0 || bytes.Equal(a, []byte("null")) {
			p.Arguments = json.RawMessage("{}")
		}
		if len(p.Arguments) > maxArguments {
			return toolError(fmt.Sprintf("%s: arguments of %d bytes, more than the limit of %d for a call", p.Name, len(p.Arguments), maxArguments)), nil
		}
		s.inputsMu.Lock()
		ti := s.inputs[p.Name]
		s.inputsMu.Unlock()
		if ti != nil && ti.load() == nil {
			var args any
			if json.Unmarshal(p.Arguments, &args) == nil {
				if err := checkSizes(p.Name, "", args, ti.schema); err != "" {
					return toolError(err), nil
				}
			}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, shortError(err)
		}
		if r, ok := res.(*mcp.CallToolResult); ok && r != nil {
			capResult(p.Name, r)
		}
		return res, nil
	}
}

// checkSizes finds a string longer than its schema's maxLength, naming the
// argument and the limit but not quoting the value.
func checkSizes(tool, path string, v any, sch *jsonschema.Schema) string {
	if sch == nil {
		return ""
	}
	// A value of a field of several types is held to the limits of the
	// type it has.
	for _, alt := range sch.AnyOf {
		_, isString := v.(string)
		_, isList := v.([]any)
		if isString && alt.Type == "string" || isList && alt.Type == "array" {
			sch = alt
			break
		}
	}
	switch v := v.(type) {
	case string:
		if sch.MaxLength != nil {
			if n := utf8.RuneCountInString(v); n > *sch.MaxLength {
				return fmt.Sprintf("%s: %s is %d characters, more than its limit of %d", tool, path, n, *sch.MaxLength)
			}
		}
	case []any:
		if sch.MaxItems != nil && len(v) > *sch.MaxItems {
			return fmt.Sprintf("%s: %s has %d items, more than its limit of %d", tool, path, len(v), *sch.MaxItems)
		}
		for i, e := range v {
			if err := checkSizes(tool, fmt.Sprintf("%s[%d]", path, i), e, sch.Items); err != "" {
				return err
			}
		}
	case map[string]any:
		for k, e := range v {
			name := k
			if path != "" {
				name = path + "." + k
			}
			if len(name) > 200 {
				name = name[:200] + "..."
			}
			if err := checkSizes(tool, name, e, sch.Properties[k]); err != "" {
				return err
			}
		}
	}
	return ""
}

// capResult shortens a tool error's text and replaces a result past
// maxResult with an error.
func capResult(tool string, r *mcp.CallToolResult) {
	if r.IsError {
		for _, c := range r.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				t.Text = shorten(t.Text, maxErrorText)
			}
		}
		return
	}
	if r.StructuredContent == nil {
		return
	}
	// The tools' results are JSON already (see add): no need to encode
	// them again to know their size.
	b, ok := r.StructuredContent.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(r.StructuredContent); err != nil {
			return
		}
	}
	if len(b) <= maxResult {
		return
	}
	*r = *toolError(fmt.Sprintf("%s: the result (%d bytes) is over the %d-byte limit of any result: this is a bug of qemu-mcp; ask for less (max_bytes, offset, count)", tool, len(b), maxResult))
}

// shortError bounds a protocol error's message.
func shortError(err error) error {
	if msg := err.Error(); len(msg) > maxErrorText {
		return fmt.Errorf("%s", shorten(msg, maxErrorText))
	}
	return err
}

// shorten cuts s to about n bytes, on a rune boundary, saying how much went.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(" ... (%d more bytes)", len(s)-cut)
}

// quote quotes an input for an error message, shortened.
func quote(s string) string {
	const n = 80
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:cut], len(s))
}

func toolError(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: strings.TrimSpace(msg)}}}
}
