package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// Sweep is one pass over a store: what killed servers left in it,
// described as L, and with Act, removed.
type Sweep[L any] struct {
	Act     bool
	Removed []L
	Errors  []string
}

// SweepDirs passes each directory depth levels below a store's root (see
// Walk) to each, with the sweep that gathers what it finds.
func SweepDirs[L any](k Kind, root string, depth int, act bool, each func(dir string, sw *Sweep[L])) (Sweep[L], error) {
	sw := Sweep[L]{Act: act}
	if err := Walk(root, depth, sw.Fail, func(dir string) { each(dir, &sw) }); err != nil {
		return sw, fmt.Errorf("%s store: %w", k, err)
	}
	return sw, nil
}

// Fail notes what could not be done.
func (sw *Sweep[L]) Fail(err error) { sw.Errors = append(sw.Errors, err.Error()) }

// Found lists l, a leftover whose removal is the caller's (done, or to be
// done when Act).
func (sw *Sweep[L]) Found(l L) { sw.Removed = append(sw.Removed, l) }

// Remove lists l, the leftover file at path, and with Act removes it:
// l is not listed if that fails.
func (sw *Sweep[L]) Remove(path string, l L) {
	if sw.Act {
		if err := Remove(path); err != nil {
			sw.Fail(err)
			return
		}
	}
	sw.Found(l)
}

// RemoveTree is Remove for a directory and everything in it.
func (sw *Sweep[L]) RemoveTree(path string, l L) {
	if sw.Act {
		if err := os.RemoveAll(path); err != nil {
			sw.Fail(err)
			return
		}
	}
	sw.Found(l)
}
