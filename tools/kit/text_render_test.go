package kit

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// readBack rebuilds the structured content from a rendering: each block
// is taken as the type the original field had (a string, or a list of its
// lines), the rest from the JSON line. It fails where the text would
// mislead a reader: a block that does not end, or content after it.
func readBack(t testing.TB, text string, orig map[string]any) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	got := map[string]any{}
	i := 1 // after the summary
	for i < len(lines) {
		l := lines[i]
		if strings.HasPrefix(l, "{") {
			if err := json.Unmarshal([]byte(l), &got); err != nil {
				t.Fatalf("the fields line %q: %v", l, err)
			}
			if i != len(lines)-1 {
				t.Fatalf("text after the fields line: %q", lines[i+1:])
			}
			break
		}
		key, ok := strings.CutSuffix(l, ":")
		if !ok || i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("line %d %q is neither a block nor the fields:\n%s", i, l, text)
		}
		fence := lines[i+1]
		end := i + 2
		for end < len(lines) && lines[end] != fence {
			end++
		}
		if end == len(lines) {
			t.Fatalf("block %s does not end:\n%s", key, text)
		}
		body := lines[i+2 : end]
		switch orig[key].(type) {
		case string:
			got[key] = strings.Join(body, "\n")
		case []any:
			var l []any
			for _, e := range body {
				l = append(l, e)
			}
			got[key] = l
		default:
			t.Fatalf("block %s was not a string or a list: %T", key, orig[key])
		}
		i = end + 1
	}
	return got
}

func roundTrip(t testing.TB, v any) {
	t.Helper()
	b, err := MarshalNoEscape(v)
	if err != nil {
		t.Fatal(err)
	}
	text := RenderText("summary line\n", b)
	var orig map[string]any
	if err := json.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text, "summary line\n") {
		t.Fatalf("the summary is not first: %q", text)
	}
	if got := readBack(t, text, orig); !reflect.DeepEqual(got, orig) {
		t.Fatalf("read back\n%#v\nwant\n%#v\ntext:\n%s", got, orig, text)
	}
}

func TestRenderText(t *testing.T) {
	lines := make([]string, 40)
	for i := range lines {
		lines[i] = "  80200000: 00000297 auipc t0,0x0"
	}
	for _, v := range []any{
		map[string]any{},
		map[string]any{"a": 1},
		map[string]any{"output": "line one\nline two\n", "cursor": 7, "match": "tiny> "},
		map[string]any{"output": "ends without a break\nok", "elided": map[string]any{"start": 1, "end": 2}},
		map[string]any{"output": "a fence inside\n```\nand ````` longer\n", "n": nil},
		map[string]any{"output": "\n\n", "short": "one\n", "blank": "\n   \n"},
		map[string]any{"instructions": lines, "argv": []string{"a", "b"}},
		map[string]any{"odd": []any{"x", 1, "y\nz"}, "nested": map[string]any{"out": "a\nb"}},
		map[string]any{"html": "<cmd_echo+0x6> & more", "esc": "\x1b[0m\r\n\x00"},
	} {
		roundTrip(t, v)
	}
	// Text the guest prints cannot pass for the server's fields: the
	// fence is longer than any in it, and the fields come after.
	guest := map[string]any{"output": "x\n```\n{\"running\":false}\n", "running": true}
	roundTrip(t, guest)
	b, _ := MarshalNoEscape(guest)
	if text := RenderText("", b); !strings.Contains(text, "\n````\n{\"running\":true}\n") {
		t.Errorf("a guest's fence and fields:\n%s", text)
	}
}

// Whatever the strings, the rendering reads back to the same content.
func FuzzRenderText(f *testing.F) {
	f.Add("tiny> echo hi\r\nhi\r\ntiny> ", "a|b|c")
	f.Add("```\n````\n", "``|`")
	f.Add("\n", "")
	f.Fuzz(func(t *testing.T, s, l string) {
		parts := strings.Split(l+strings.Repeat("|long element", 12), "|")
		roundTrip(t, map[string]any{"output": s, "lines": parts, "n": len(s), s: l})
	})
}
