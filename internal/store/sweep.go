package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

// Reader reads the records of one kind of store.
type Reader[M any] struct {
	Kind Kind
	// Read reads the record at path.
	Read func(path string) (M, error)
	// Name is the entry a record names.
	Name func(M) string
	// Unreadable is what is listed for the record name at path that
	// could not be read, and why.
	Unreadable func(name, path string, err error) M
}

// In reads the records in dir (NAME.json), in no order. A record that
// cannot be read is listed all the same: an entry that cannot load, which
// a user still sees and deletes. A record gone meanwhile is not, nor one
// that names another entry than its file does. A dir that does not exist
// has none.
func (r Reader[M]) In(dir string) ([]M, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %ss: %w", r.Kind, err)
	}
	var out []M
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		m, err := r.Read(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // replaced or deleted meanwhile
		}
		if err != nil {
			m = r.Unreadable(name, p, err)
		}
		if r.Name(m) == name {
			out = append(out, m)
		}
	}
	return out, nil
}

// Walk calls each for every directory depth levels below root (1: the
// projects; 2: their machines), in name order. A directory between that
// cannot be read is passed to fail (nil: passed over); a root that does
// not exist has none.
func Walk(root string, depth int, fail func(error), each func(dir string)) error {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(root, e.Name())
		if depth <= 1 {
			each(p)
			continue
		}
		if err := Walk(p, depth-1, fail, each); err != nil && fail != nil {
			fail(err)
		}
	}
	return nil
}

// Leftover is something killed work left in a store: a file or a
// directory, or a tag in a drive.
type Leftover struct {
	// Path is the file, or for a tag the drive holding it.
	Path string `json:"path"`
	// What it is: "partial image", "partial recording", "intent",
	// "record being written", "drive tag", ...
	What string `json:"what"`
	// Tag is a drive tag's name.
	Tag string `json:"tag,omitempty"`
	// Owner is the server that left it, when its name says.
	Owner *names.Owner `json:"owner,omitempty"`
	// Held says a QEMU holds the drive open: the tag goes once it is free.
	Held bool `json:"held,omitempty"`
	// Why it is a leftover, or why it stays.
	Why string `json:"why"`
}

func (l Leftover) String() string {
	if l.Tag != "" {
		return fmt.Sprintf("%s %s in %s (%s)", l.What, l.Tag, l.Path, l.Why)
	}
	return fmt.Sprintf("%s %s (%s)", l.What, l.Path, l.Why)
}

// Report is what a sweep of a store did (a reap) or would do (a listing).
type Report struct {
	Removed []Leftover `json:"removed,omitempty"`
	// Left are leftovers that cannot be removed yet (a tag in a drive a
	// QEMU holds), and why.
	Left []Leftover `json:"left,omitempty"`
	// Cut are recordings whose server died while they recorded, marked
	// cut: they replay up to where the kill found them.
	Cut    []string `json:"cut,omitempty"`
	Errors []string `json:"errors,omitempty"`
	// Broken are snapshots whose records name parts that are gone.
	Broken []string `json:"broken,omitempty"`
}

// Sweep is one pass over a store: what killed servers left in it, and
// with Act, removed.
type Sweep struct {
	Act bool
	Report
}

// SweepDirs passes each directory depth levels below a store's root (see
// Walk) to each, with the sweep that gathers what it finds; the report
// lists what was removed in path order.
func SweepDirs(k Kind, root string, depth int, act bool, each func(dir string, sw *Sweep)) (Report, error) {
	sw := Sweep{Act: act}
	err := Walk(root, depth, sw.Fail, func(dir string) { each(dir, &sw) })
	slices.SortFunc(sw.Removed, func(a, b Leftover) int { return strings.Compare(a.Path+a.Tag, b.Path+b.Tag) })
	if err != nil {
		return sw.Report, fmt.Errorf("%s store: %w", k, err)
	}
	return sw.Report, nil
}

// Fail notes what could not be done.
func (sw *Sweep) Fail(err error) { sw.Errors = append(sw.Errors, err.Error()) }

// Found lists l, a leftover whose removal is the caller's (done, or to be
// done when Act).
func (sw *Sweep) Found(l Leftover) { sw.Removed = append(sw.Removed, l) }

// Remove lists l, the leftover file at path, and with Act removes it:
// l is not listed if that fails.
func (sw *Sweep) Remove(path string, l Leftover) {
	if sw.Act {
		if err := Remove(path); err != nil {
			sw.Fail(err)
			return
		}
	}
	sw.Found(l)
}

// RemoveTree is Remove for a directory and everything in it.
func (sw *Sweep) RemoveTree(path string, l Leftover) {
	if sw.Act {
		if err := os.RemoveAll(path); err != nil {
			sw.Fail(err)
			return
		}
	}
	sw.Found(l)
}
