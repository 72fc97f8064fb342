package arch_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// regNames are architectures' registers, CSRs, instructions and
// disassemblers: what only the architecture packages may name. They are
// matched lowercased with underscores removed: anywhere in a name or word
// (esrEL1, readScause), the short ones only as a whole word (sie in
// "easier" is no CSR).
var (
	regNames = []string{
		// RISC-V
		"scause", "sepc", "stval", "satp", "sstatus", "stvec", "sscratch",
		"mstatus", "mepc", "mcause", "mtval", "mtvec", "medeleg", "mideleg", "mhartid",
		"sv39", "sv48", "sv57", "riscv64asm",
		// AArch64
		"esr_el1", "far_el1", "tcr_el1", "ttbr0_el1", "ttbr1_el1", "elr_el1", "spsr_el1", "vbar_el1",
		"arm64asm",
	}
	regWords = []string{"sie", "sip", "mie", "mip", "wfi", "sret", "mret", "ecall", "ebreak"}
)

// allowed are the few words outside the architecture packages that name a
// register because a tool's JSON parameter is named so, by file and word.
var allowed = map[[2]string]string{
	{"tools/debug.go", "satp"}: "debug_translate's JSON parameter satp, parsed and named in its error",
}

// TestNoArchNamesOutsideArch fails on every identifier and string literal
// outside arch/ that names an architecture's register, CSR or
// instruction: code that knows an architecture belongs behind arch.Arch.
// Comments, struct tags, JSON-named struct fields (and the selectors of
// fields so named) and MCP tool descriptions are documentation, not code.
func TestNoArchNamesOutsideArch(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	var files []*ast.File
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel == "arch", d.Name() == "testdata", d.Name() == "vendor",
				rel != "." && strings.HasPrefix(d.Name(), "."):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files, paths = append(files, f), append(paths, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Fields that carry a JSON name keep it as their Go name.
	jsonFields := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if fl, ok := n.(*ast.Field); ok && fl.Tag != nil && strings.Contains(fl.Tag.Value, `json:"`) {
				for _, id := range fl.Names {
					jsonFields[id.Name] = true
				}
			}
			return true
		})
	}
	var offenders int
	used := map[[2]string]bool{}
	for i, f := range files {
		report := func(pos token.Pos, what string) {
			for _, w := range archNames(what) {
				if k := [2]string{paths[i], w}; allowed[k] != "" {
					used[k] = true
					continue
				}
				offenders++
				p := fset.Position(pos)
				t.Errorf("%s:%d: %q names %s", paths[i], p.Line, what, w)
			}
		}
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				// The tag is the JSON name; a JSON-named field may
				// keep it.
				if n.Tag == nil || !strings.Contains(n.Tag.Value, `json:"`) {
					for _, id := range n.Names {
						report(id.Pos(), id.Name)
					}
				}
				ast.Inspect(n.Type, visit)
				return false
			case *ast.SelectorExpr:
				ast.Inspect(n.X, visit)
				if !jsonFields[n.Sel.Name] {
					report(n.Sel.Pos(), n.Sel.Name)
				}
				return false
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Description" {
					return false // an MCP tool's documentation
				}
			case *ast.CallExpr:
				// tools' tool(name, title, kind, description): the
				// description is an MCP tool's documentation.
				if f, ok := n.Fun.(*ast.Ident); ok && f.Name == "tool" && len(n.Args) == 4 {
					for _, a := range n.Args[:3] {
						ast.Inspect(a, visit)
					}
					return false
				}
			case *ast.Ident:
				report(n.Pos(), n.Name)
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					if s, err := strconv.Unquote(n.Value); err == nil {
						report(n.Pos(), s)
					}
				}
			}
			return true
		}
		ast.Inspect(f, visit)
	}
	for k, why := range allowed {
		if !used[k] {
			t.Errorf("%s no longer names %s (%s): take it off the allowed list", k[0], k[1], why)
		}
	}
	if offenders > 0 {
		t.Logf("%d names of registers, CSRs or instructions outside arch/", offenders)
	}
}

// archNames are the register, CSR and instruction names in s: an
// identifier, or the words of a string.
func archNames(s string) []string {
	var found []string
	words := strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' })
	for _, w := range words {
		norm := strings.ToLower(strings.ReplaceAll(w, "_", ""))
		for _, n := range regNames {
			if strings.Contains(norm, strings.ReplaceAll(n, "_", "")) {
				found = append(found, n)
			}
		}
		for _, part := range camelWords(w) {
			for _, n := range regWords {
				if part == n {
					found = append(found, n)
				}
			}
		}
	}
	return found
}

// camelWords splits a word at underscores and case changes, lowercased:
// readMip is read and mip, MIPBits mip and bits.
func camelWords(w string) []string {
	var out []string
	var cur []rune
	rs := []rune(w)
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	for i, r := range rs {
		switch {
		case r == '_':
			flush()
			continue
		case unicode.IsUpper(r) && i > 0 && (unicode.IsLower(rs[i-1]) ||
			i+1 < len(rs) && unicode.IsUpper(rs[i-1]) && unicode.IsLower(rs[i+1])):
			flush()
		}
		cur = append(cur, r)
	}
	flush()
	return out
}

// The matcher finds names inside identifiers and words, the short ones
// only as words of their own.
func TestArchNamesMatcher(t *testing.T) {
	for s, want := range map[string]string{
		"readScause": "scause", "SCAUSE": "scause", "esrEL1": "esr_el1", "read ESR_EL1": "esr_el1",
		"mstatus.TSR": "mstatus", "hasMip": "mip", "MIPBits": "mip", "waits in wfi": "wfi",
		"easier": "", "handle_break": "", "replay_delete_break": "", "mipmap": "", "hart": "", "Sv39x": "sv39",
	} {
		got := strings.Join(archNames(s), ",")
		if got != want {
			t.Errorf("archNames(%q) = %q, want %q", s, got, want)
		}
	}
}
