package tools_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The domain packages know nothing of MCP: no string of theirs (comments
// may) names a tool, or an argument of one in the form a call writes it
// (project_root, restart: true). Only package tools turns their typed
// errors into what an agent reads (tools/errors.go), so that a renamed
// tool or argument changes one package.
func TestDomainNamesNoTool(t *testing.T) {
	s := newSession(t)
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	words := map[string]bool{}
	for _, tool := range res.Tools {
		words[regexp.QuoteMeta(tool.Name)] = true
		var schema struct {
			Properties map[string]struct {
				Type any `json:"type"`
			} `json:"properties"`
		}
		b, _ := json.Marshal(tool.InputSchema)
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatalf("%s: input schema: %v", tool.Name, err)
		}
		for arg, p := range schema.Properties {
			// A one-word argument (kernel, memory, name) is also plain
			// English; the domain may use the word, not the call's syntax.
			if strings.Contains(arg, "_") {
				words[regexp.QuoteMeta(arg)] = true
			}
			if p.Type == "boolean" {
				words[regexp.QuoteMeta(arg)+`: ?true`] = true
			}
		}
	}
	var alts []string
	for w := range words {
		alts = append(alts, w)
	}
	sort.Strings(alts)
	re := regexp.MustCompile(`\b(` + strings.Join(alts, "|") + `)\b`)

	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}}", "github.com/qemu-mcp/qemu-mcp/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// Not domain: the adapter itself, the programs, and selftest (an MCP
	// client of the server, which calls the tools by name).
	skip := regexp.MustCompile(`/(tools|tools/kit|selftest)$|/cmd/`)
	var found []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, _ := strings.Cut(line, " ")
		if skip.MatchString(pkg) {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			found = append(found, toolNamesIn(t, file, re)...)
		}
	}
	for _, f := range found {
		if why := allowedNames(f); why != "" {
			t.Logf("allowed (%s): %s", why, f)
			continue
		}
		t.Error(f)
	}
	if t.Failed() {
		t.Errorf("%d strings of domain packages name tools or arguments: give the package a typed error, and the advice to tools/errors.go", len(found))
	}
}

// allowedNames says why a string found may name an argument: known
// exceptions, each with its reason.
func allowedNames(found string) string {
	switch {
	case strings.HasPrefix(found, "profile/profile.go:") && (strings.Contains(found, `"panic_patterns"`) || strings.Contains(found, `"command_line"`)):
		return "a field of .qemu-mcp.json: the profile file's own schema"
	case strings.HasPrefix(found, "boundary/boundary.go:") && strings.Contains(found, `" in "Q`):
		return "the headings of the boundary's reference tables (docs), which name the tool each table polices"
	}
	return ""
}

// toolNamesIn lists the string literals of file (not struct tags: the JSON
// of a domain type is its own) that re matches.
func toolNamesIn(t *testing.T, file string, re *regexp.Regexp) []string {
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	tags := map[*ast.BasicLit]bool{}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			if n.Tag != nil {
				tags[n.Tag] = true
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING || tags[n] {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			if m := re.FindString(s); m != "" {
				rel, _ := filepath.Rel(filepath.Dir(filepath.Dir(file)), file)
				out = append(out, rel+":"+strconv.Itoa(fset.Position(n.Pos()).Line)+": "+strconv.Quote(m)+" in "+strconv.Quote(s))
			}
		}
		return true
	})
	return out
}
