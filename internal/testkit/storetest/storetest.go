// Package storetest holds what the tests of the snapshot and recording
// stores (and of doctor, which reports on them) share: a store copied from
// a fixture for a test to change, a server that is not running, the files
// of a directory, and golden files of what a store reads.
package storetest

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

// Dead is a server that is not running: no process has PID_MAX_LIMIT as
// its PID.
var Dead = names.Owner{PID: names.MaxPID, StartTime: 1}

// Root is the project of the fixtures' entries, Time a time they name.
const Root = "/src/os"

var Time = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Copy copies the fixture store src into a directory of the test's, and
// returns that: a test may change its copy.
func Copy(t testing.TB, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Entries is what a store says of its entries, for a golden file: each
// entry as it lists it, and each readable one as it gets it by name.
type Entries[V any] struct {
	List []V `json:"list"`
	Get  []V `json:"get"`
}

// ReadEntries is the Entries of what list lists, got by get where
// readable says they can be, each seen through view; and what list
// listed.
func ReadEntries[M, V any](t testing.TB, list func() ([]M, error), readable func(M) bool, get func(M) (M, error), view func(M) V) (Entries[V], []M) {
	t.Helper()
	listed, err := list()
	if err != nil {
		t.Fatal(err)
	}
	var e Entries[V]
	for _, m := range listed {
		e.List = append(e.List, view(m))
		if !readable(m) {
			continue
		}
		got, err := get(m)
		if err != nil {
			t.Fatal(err)
		}
		e.Get = append(e.Get, view(got))
	}
	return e, listed
}

// Files lists the names in dir, sorted.
func Files(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// View is v as a golden file holds it: indented JSON in which the store
// directory dir reads $STORE.
func View(t testing.TB, dir string, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(bytes.ReplaceAll(b, []byte(dir), []byte("$STORE")), '\n')
}

// Golden fails the test unless got is the golden file path.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("what the code reads or writes changed:\n%s\nwant (%s):\n%s", got, path, want)
	}
}
