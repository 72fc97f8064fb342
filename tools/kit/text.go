package kit

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The text content of a result is what Gemini CLI, Claude Desktop and
// agents built on content blocks give their model (Copilot CLI gives it
// beside the structured content): it carries every value of the
// structured content, rendered from that content's JSON, so a field any
// tool adds appears in it without more work. After the handler's one-line
// summary come the top-level fields that are text of several lines
// (console output, a hexdump) or long lists of strings (argv, a
// disassembly) as fenced blocks of plain lines, then every other field as
// one compact JSON object in the result's own order.
//
// Measured on every tool's results (docs/running.md, "What each client shows its
// model"): plain lines cost fewer tokens than the same text as a JSON
// string of escaped line breaks and quotes, and read as the console does;
// compact JSON costs fewer tokens than a "key: value" rendering with
// indentation (about 9% fewer in o200k for all results together, 30% for
// lists of objects such as QMP answers), so the fields stay JSON.
//
// Every value is there: a test walks each tool's structured content and
// finds each of its values in the text.

// RenderText is the text content of a result whose structured content is
// the compact JSON object structured, after summary.
func RenderText(summary string, structured []byte) string {
	var b strings.Builder
	if summary = strings.TrimRight(summary, "\n"); summary != "" {
		b.WriteString(summary)
		b.WriteByte('\n')
	}
	keys, vals, ok := topLevel(structured)
	if !ok {
		b.Write(structured)
		return b.String()
	}
	var rest bytes.Buffer
	for i, k := range keys {
		if lines, ok := blockLines(vals[i]); ok && plainKey(k) {
			writeBlock(&b, k, lines)
			continue
		}
		if rest.Len() == 0 {
			rest.WriteByte('{')
		} else {
			rest.WriteByte(',')
		}
		kb, _ := MarshalNoEscape(k)
		rest.Write(kb)
		rest.WriteByte(':')
		rest.Write(vals[i])
	}
	if rest.Len() > 0 {
		rest.WriteByte('}')
		b.Write(rest.Bytes())
		b.WriteByte('\n')
	}
	return b.String()
}

// topLevel splits a JSON object into its keys and raw values, in order.
func topLevel(b []byte) ([]string, []json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, false
	}
	var keys []string
	var vals []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, false
		}
		keys = append(keys, k)
		vals = append(vals, raw)
	}
	return keys, vals, true
}

// plainKey reports whether a key can label a block: a field name, not
// text that could be taken for a line of the rendering.
func plainKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// blockInline is the longest list of strings kept in the JSON; a longer
// one is a block, one element a line.
const blockInline = 120

// blockLines says whether a top-level field is written as a fenced block,
// and its lines: a string of more than one line, or a long list of strings
// none of which has a line break.
func blockLines(raw json.RawMessage) ([]string, bool) {
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || !strings.Contains(strings.TrimSpace(s), "\n") {
			return nil, false
		}
		return []string{s}, true
	case '[':
		if len(raw) <= blockInline {
			return nil, false
		}
		var lines []string
		if json.Unmarshal(raw, &lines) != nil || len(lines) == 0 {
			return nil, false
		}
		for _, l := range lines {
			if strings.ContainsAny(l, "\r\n") {
				return nil, false
			}
		}
		return lines, true
	}
	return nil, false
}

// writeBlock writes key and its lines between fences longer than any run
// of backticks in them, so nothing inside can end the block. The text is
// as it came: a final line break shows as an empty last line.
func writeBlock(b *strings.Builder, key string, lines []string) {
	text := strings.Join(lines, "\n")
	fence := strings.Repeat("`", max(3, longestRun(text, '`')+1))
	b.WriteString(key)
	b.WriteString(":\n")
	b.WriteString(fence)
	b.WriteByte('\n')
	b.WriteString(text)
	b.WriteByte('\n')
	b.WriteString(fence)
	b.WriteByte('\n')
}

func longestRun(s string, c byte) int {
	best, n := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			n++
			best = max(best, n)
		} else {
			n = 0
		}
	}
	return best
}

// MarshalNoEscape is json.Marshal without the escaping of <, > and & that
// only HTML needs: "<cmd_echo+0x6>" costs a model fewer tokens than
// "\u003ccmd_echo+0x6\u003e", and every client decodes both alike.
func MarshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// SetText makes the text content of res (the handler's summary, if any)
// the summary followed, with whole, by the rendering of structured; other
// content (an image) stays as it is.
func SetText(res *mcp.CallToolResult, structured []byte, whole bool) {
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			if whole || strings.TrimSpace(t.Text) == "" {
				t.Text = RenderText(t.Text, structured)
			}
			return
		}
	}
	res.Content = append(res.Content, &mcp.TextContent{Text: RenderText("", structured)})
}
