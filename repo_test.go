package qemumcp

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// What git tracks is source: a compiled binary or a large file committed by
// mistake bloats every clone for good, and a script without its run bit
// breaks the README's commands. Only testdata/ may hold built images.
func TestTrackedFilesAreSource(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed (scripts/deps installs it): cannot list tracked files")
	}
	out, err := exec.Command("git", "ls-files", "-s", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v): nothing to check", err)
	}
	const maxSize = 1 << 20
	var checked int
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		// "<mode> <object> <stage>\t<path>"
		meta, path, ok := strings.Cut(string(rec), "\t")
		if !ok {
			t.Fatalf("git ls-files: unexpected record %q", rec)
		}
		mode := strings.Fields(meta)[0]
		if strings.HasPrefix(path, "scripts/") && !strings.Contains(path, "/ts-client/") &&
			!strings.HasSuffix(path, ".md") && mode != "100755" && mode != "120000" {
			t.Errorf("%s is tracked with mode %s: scripts keep their run bit (git update-index --chmod=+x %s)", path, mode, path)
		}
		if strings.HasPrefix(path, "testdata/") || strings.Contains(path, "/testdata/") {
			continue
		}
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		checked++
		if fi.Size() > maxSize {
			t.Errorf("%s is %d bytes: no tracked file over 1 MiB outside testdata/", path, fi.Size())
		}
		if kind := binaryKind(path); kind != "" {
			t.Errorf("%s is a compiled %s: build outputs do not belong in git (git rm --cached %s, and list it in .gitignore)", path, kind, path)
		}
	}
	if checked == 0 {
		t.Fatal("git ls-files listed no files to check")
	}
}

// binaryKind names the executable format a file's first bytes announce.
func binaryKind(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := f.Read(head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "ELF binary"
	case bytes.HasPrefix(head, []byte("MZ")):
		return "PE (Windows) binary"
	case bytes.HasPrefix(head, []byte{0xcf, 0xfa, 0xed, 0xfe}), bytes.HasPrefix(head, []byte{0xca, 0xfe, 0xba, 0xbe}):
		return "Mach-O binary"
	case bytes.HasPrefix(head, []byte("\x00asm")):
		return "WebAssembly module"
	}
	return ""
}
