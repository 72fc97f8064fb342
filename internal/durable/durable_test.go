package durable

import (
	"os"
	"path/filepath"
	"testing"
)

// CreateFile writes a new file whole, and refuses one that exists,
// leaving it as it was.
func TestCreateFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "image")
	if err := CreateFile(p, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if err := CreateFile(p, []byte("again")); err == nil {
		t.Error("CreateFile over an existing file succeeded")
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "new" {
		t.Errorf("the file: %q %v, want the first write", b, err)
	}
}

// WriteFile replaces path whole; with exclusive, a temporary file that is
// there already is another writer's, and it fails without touching it.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p, tmp := filepath.Join(dir, "rec.json"), filepath.Join(dir, ".rec.json.tmp")
	for _, v := range []string{"1", "2"} {
		if err := WriteFile(p, tmp, []byte(v), false); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(tmp, []byte("another's"), 0o600)
	if err := WriteFile(p, tmp, []byte("3"), true); err == nil {
		t.Error("an exclusive write through another's temporary file succeeded")
	}
	if b, _ := os.ReadFile(tmp); string(b) != "another's" {
		t.Errorf("the other writer's temporary file holds %q", b)
	}
	if b, _ := os.ReadFile(p); string(b) != "2" {
		t.Errorf("the record holds %q, want the last whole write", b)
	}
}
