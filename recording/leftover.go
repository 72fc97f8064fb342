package recording

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
)

// Leftovers lists what killed recording starts and checkpoint saves left,
// changing nothing.
func (s Store) Leftovers() (store.Report, error) { return s.sweep(false) }

// Reap removes what killed recording starts and checkpoint saves left
// (directories and files no record names, of servers that are dead), and
// marks recordings whose server died while they recorded as cut (listed
// in the report's Cut). What live servers are making is never touched.
func (s Store) Reap() (store.Report, error) { return s.sweep(true) }

func (s Store) sweep(act bool) (store.Report, error) {
	return store.SweepDirs(kind, s.Dir, 1, act, s.sweepProject)
}

// live tells whether o may still be working: this process, a live
// process, or one that cannot be told.
func (s Store) live(o names.Owner) bool { return store.Live(s.owner(), o) }

// sweepProject sweeps a project directory: it marks recordings whose
// server died while they recorded as cut, and removes what no record or
// live server's intent names.
func (s Store) sweepProject(dir string, sw *store.Sweep) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		sw.Fail(err)
		return
	}
	recs, err := s.recordsIn(dir)
	if err != nil {
		sw.Fail(err)
		return
	}
	named := map[string]bool{} // directory names records name
	var unreadable []string
	for _, m := range recs {
		if m.unreadable != "" {
			unreadable = append(unreadable, m.Name+".")
			continue
		}
		named[filepath.Base(m.Dir)] = true
		if sw.Act && m.State == Recording && m.Owner != nil && !s.live(*m.Owner) {
			s.markCut(m, sw)
		}
		s.sweepCheckpoints(m, sw)
	}
	protected := s.sweepIntents(dir, ents, sw)
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		switch {
		case e.IsDir() && !strings.HasPrefix(n, "."):
			_, _, o, ok := store.SplitName(n, "")
			if !ok || named[n] || protected[n] || slices.ContainsFunc(unreadable, func(u string) bool { return strings.HasPrefix(n, u) }) || s.live(o) {
				continue
			}
			sw.RemoveTree(p, store.Leftover{Path: p, What: "partial recording", Owner: &o,
				Why: "no record names it and its server (" + o.String() + ") is dead: a recording that did not start, or one a later recording replaced"})
		case strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".json.tmp") || strings.HasSuffix(n, ".intent.tmp")):
			if o, ok := store.TempOwner(n); ok && !s.live(o) {
				sw.RemoveTree(p, store.Leftover{Path: p, What: "record being written", Owner: &o, Why: "its server (" + o.String() + ") is dead"})
			}
		}
	}
}

// markCut rewrites the record of m, whose server died while it recorded,
// as cut.
func (s Store) markCut(m Meta, sw *store.Sweep) {
	m.State = Cut
	if m.Ended == "" {
		m.Ended = "its server (" + m.Owner.String() + ") was killed while it recorded"
	}
	m.Owner = nil
	if err := s.Update(m); err != nil {
		sw.Fail(err)
		return
	}
	sw.Cut = append(sw.Cut, m.Name)
}

// sweepIntents removes the intents of dead servers, and returns the
// recordings (NAME.ID) that live servers' intents name: those stay.
func (s Store) sweepIntents(dir string, ents []fs.DirEntry, sw *store.Sweep) map[string]bool {
	protected := map[string]bool{}
	for _, e := range ents {
		name, id, o, ok := store.SplitName(e.Name(), store.IntentSuffix)
		if !ok || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if s.live(o) {
			protected[name+"."+id] = true
			continue
		}
		p := filepath.Join(dir, e.Name())
		sw.RemoveTree(p, store.Leftover{Path: p, What: "intent", Owner: &o,
			Why: "its recording's server (" + o.String() + ") died before it finished starting or replacing"})
	}
	return protected
}

func (s Store) sweepCheckpoints(m Meta, sw *store.Sweep) {
	dir := m.ckDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
	}
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		for _, suffix := range []string{".qcow2", ".json", ".json.tmp"} {
			c, id, ok := parseCk(n, suffix)
			if !ok {
				continue
			}
			o, _ := store.ParseID(id)
			base := ckBase(c, id)
			switch suffix {
			case ".qcow2":
				if !have[base+".json"] && !s.live(o) {
					sw.Remove(p, store.Leftover{Path: p, What: "partial checkpoint", Owner: &o, Why: "its replay's server (" + o.String() + ") died before the checkpoint was whole"})
				}
			case ".json":
				if !have[base+".qcow2"] {
					sw.Remove(p, store.Leftover{Path: p, What: "partial checkpoint", Why: "its image is gone"})
				}
			case ".json.tmp":
				if !s.live(o) {
					sw.Remove(p, store.Leftover{Path: p, What: "record being written", Owner: &o, Why: "its server (" + o.String() + ") is dead"})
				}
			}
		}
	}
}
