package qemumcp

import (
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docFiles are the documents a reader follows links through: the README,
// docs/, and the READMEs beside the code and test data.
func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	// [text](target) and ![alt](target); a target has no spaces.
	mdLinkRE   = regexp.MustCompile(`!?\[[^\]]*\]\(([^()\s]+)\)`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	headingRE  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
)

// Every relative link in the documents resolves: the file exists, and an
// anchor names a heading of the file it points into. Moving a section from
// one document to another breaks links silently otherwise.
func TestDocsLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	var links int
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range docLinks(string(b)) {
			links++
			target, where := l.target, fmt.Sprintf("%s:%d", f, l.line)
			path, anchor, _ := strings.Cut(target, "#")
			if path == "" {
				path = f
			} else {
				path = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", where, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: link %s: an anchor into a file that is not Markdown", where, target)
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Fatal(err)
			}
			if !a[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", where, target, path, anchor)
			}
		}
	}
	if links < 50 {
		t.Errorf("only %d relative links found in the documents: the extraction is broken", links)
	}
}

type docLink struct {
	line   int
	target string
}

// proseLines yields a Markdown document's lines outside fenced code
// blocks, with their index.
func proseLines(doc string) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		fence := ""
		for i, l := range strings.Split(doc, "\n") {
			trimmed := strings.TrimSpace(l)
			if fence != "" {
				if strings.HasPrefix(trimmed, fence) {
					fence = ""
				}
				continue
			}
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				continue
			}
			if !yield(i, l) {
				return
			}
		}
	}
}

// docLinks returns the relative links of a Markdown document outside code
// blocks and code spans.
func docLinks(doc string) []docLink {
	var links []docLink
	for i, l := range proseLines(doc) {
		l = codeSpanRE.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range mdLinkRE.FindAllStringSubmatchIndex(l, -1) {
			target := l[m[2]:m[3]]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, docLink{i + 1, target})
		}
	}
	return links
}

// headingAnchors returns the anchors GitHub gives a document's headings:
// lower case, punctuation dropped (hyphens and underscores kept), spaces
// made hyphens, and -1, -2 ... after a repeated one.
func headingAnchors(doc string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(doc) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[2]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			a[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	return a
}

// docs/architecture.md's Layout table names every directory that holds Go
// code, so a reader finds any package there.
func TestArchitectureLayoutComplete(t *testing.T) {
	b, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## Layout\n")
	if i < 0 {
		t.Fatal("docs/architecture.md has no Layout section")
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(doc[i:], "\n") {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		first := strings.SplitN(l, "|", 3)[1]
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			listed[m[1]] = true
		}
	}
	var missing []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir := filepath.Dir(path)
		if !listed[dir] {
			missing = append(missing, dir)
			listed[dir] = true // once
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("docs/architecture.md's Layout table lacks %s", strings.Join(missing, ", "))
	}
}

// The README is the front door: what qemu-mcp is, the two commands,
// installing it, a map of the tools, the documents. The reference lives in
// docs/, and a README that grows past a few screens hides the door.
func TestREADMEStaysShort(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, more than 300: move the reference to docs/ and link it", n)
	}
}
