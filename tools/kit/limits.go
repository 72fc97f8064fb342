package kit

import (
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
	// MaxToolName bounds a tool name in a call (and its echo in an error).
	MaxToolName = 64
	// maxErrorText bounds the text of a tool error: messages quote inputs
	// shortened, and this catches whatever does not.
	maxErrorText = 2048
	// MaxArguments bounds a call's arguments as JSON, checked before they
	// are decoded at all: the largest argument (data, 64 Ki characters of
	// up to six bytes each when escaped) fits with room to spare.
	MaxArguments = 1 << 20
	// maxResult bounds a whole result's structured content: results are
	// budgeted far below it, so passing it is a bug, reported as an error
	// rather than sent.
	maxResult = 2 << 20
)

// CheckSizes finds a string longer than its schema's maxLength, naming the
// argument and the limit but not quoting the value.
func CheckSizes(tool, path string, v any, sch *jsonschema.Schema) string {
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
			if err := CheckSizes(tool, fmt.Sprintf("%s[%d]", path, i), e, sch.Items); err != "" {
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
			if err := CheckSizes(tool, name, e, sch.Properties[k]); err != "" {
				return err
			}
		}
	}
	return ""
}

// CapResult shortens a tool error's text and replaces a result past
// maxResult with an error.
func CapResult(tool string, r *mcp.CallToolResult) {
	if r.IsError {
		for _, c := range r.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				t.Text = Shorten(t.Text, maxErrorText)
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
	*r = *ToolError(fmt.Sprintf("%s: the result (%d bytes) is over the %d-byte limit of any result: this is a bug of qemu-mcp; ask for less (max_bytes, offset, count)", tool, len(b), maxResult))
}

// ShortError bounds a protocol error's message.
func ShortError(err error) error {
	if msg := err.Error(); len(msg) > maxErrorText {
		return fmt.Errorf("%s", Shorten(msg, maxErrorText))
	}
	return err
}

// Shorten cuts s to about n bytes, on a rune boundary, saying how much went.
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(" ... (%d more bytes)", len(s)-cut)
}

// Quote quotes an input for an error message, shortened.
func Quote(s string) string {
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

func ToolError(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: strings.TrimSpace(msg)}}}
}
