package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGoodFile(t *testing.T) {
	f, err := Load("testdata/..") // a dir without the file
	if err != nil || f != nil {
		t.Fatalf("no file: %v %v", f, err)
	}
	b, err := os.ReadFile("testdata/rvos.json")
	if err != nil {
		t.Fatal(err)
	}
	f, err = Parse("testdata/rvos.json", b)
	if err != nil {
		t.Fatal(err)
	}
	p, ok, err := f.Pick("")
	if err != nil || !ok || p.Prompt != "rvos> $" || len(p.Drives) != 2 || !p.Drives[0].ReadOnly {
		t.Fatalf("default profile: %+v %v %v", p, ok, err)
	}
	p, ok, err = f.Pick("gui")
	if err != nil || !ok || !p.GPU || p.SMP != 2 || p.Network != "user" {
		t.Fatalf("gui: %+v %v %v", p, ok, err)
	}
	if _, _, err := f.Pick("nope"); err == nil || !strings.Contains(err.Error(), `no profile "nope"`) || !strings.Contains(err.Error(), "gui, release") {
		t.Errorf("Pick(nope) = %v", err)
	}
	var none *File
	if _, ok, err := none.Pick(""); ok || err != nil {
		t.Errorf("nil file, no name: %v %v", ok, err)
	}
	if _, _, err := none.Pick("x"); err == nil || !strings.Contains(err.Error(), FileName) {
		t.Errorf("nil file, a name: %v", err)
	}
}

// Each bad file is refused by the schema, and the message names the file,
// the profile and the field where it can.
func TestBadFiles(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"profiles": {"a": {"kernal": "k"}}}`, `profile "a": unknown field "kernal"`},
		{`{"profiles": {"a": {"smp": "two"}}}`, `profile "a": field "smp": want int`},
		{`{"profiles": {"a": {"smp": 0}}}`, `schema`},
		{`{"profiles": {"a": {"memory": "lots"}}}`, `schema`},
		{`{"profiles": {"a": {"network": "bridge"}}}`, `schema`},
		{`{"profiles": {"a": {"prompt": "(x"}}}`, `profile "a": field "prompt"`},
		{`{"profiles": {"a": {"panic_patterns": ["ok", "[z-a]"]}}}`, `field "panic_patterns"[1]`},
		{`{"profiles": {"a": {"drives": [{"readonly": true}]}}}`, `schema`},
		{`{"default": "b", "profiles": {"a": {}}}`, `default names profile "b"`},
		{`{"profiles": {}}`, `schema`},
		{`{"profile": {"a": {}}}`, `schema`},
		{`{"profiles": {"a": {}}, "extra": 1}`, `schema`},
		{`{"profiles": {"a": {}}`, `not valid JSON`},
	} {
		path := filepath.Join("proj", FileName)
		_, err := Parse(path, []byte(tc.doc))
		if err == nil {
			t.Errorf("%s: accepted", tc.doc)
			continue
		}
		if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q, want it to name %s and contain %q", tc.doc, err, path, tc.want)
		}
	}
}

// The schema itself is valid and accepts the profiles docs/tools.md shows
// (the original server's layout and the Linux guest's).
func TestSchemaAcceptsDocumentedProfiles(t *testing.T) {
	doc, err := os.ReadFile("../docs/tools.md")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, block := range strings.Split(string(doc), "```json\n")[1:] {
		block = block[:strings.Index(block, "```")]
		if !strings.Contains(block, `"profiles"`) {
			continue
		}
		n++
		if _, err := Parse("docs/tools.md", []byte(block)); err != nil {
			t.Errorf("the profile example %.60q...: %v", block, err)
		}
	}
	if n < 2 {
		t.Errorf("docs/tools.md has %d profile examples, want the original server's and the Linux guest's", n)
	}
}
