package recording

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

// Leftover is something a killed recording start, or a killed checkpoint
// save, left in the store.
type Leftover struct {
	Path string `json:"path"`
	// What it is: "partial recording", "replaced recording", "intent",
	// "record being written", "partial checkpoint".
	What  string       `json:"what"`
	Owner *names.Owner `json:"owner,omitempty"`
	Why   string       `json:"why"`
}

func (l Leftover) String() string { return fmt.Sprintf("%s %s (%s)", l.What, l.Path, l.Why) }

// ReapReport is what Reap did (or, from Leftovers, would do).
type ReapReport struct {
	Removed []Leftover `json:"removed,omitempty"`
	// Cut are recordings whose server died while they recorded: marked
	// cut (they replay up to where the kill found them).
	Cut    []string `json:"cut,omitempty"`
	Errors []string `json:"errors,omitempty"`
}

// Leftovers lists what killed recording starts and checkpoint saves left,
// changing nothing.
func (s Store) Leftovers() (ReapReport, error) { return s.sweep(false) }

// Reap removes what killed recording starts and checkpoint saves left
// (directories and files no record names, of servers that are dead), and
// marks recordings whose server died while they recorded as cut. What
// live servers are making is never touched.
func (s Store) Reap() (ReapReport, error) { return s.sweep(true) }

func (s Store) sweep(act bool) (ReapReport, error) {
	var rep ReapReport
	projects, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("recording store: %w", err)
	}
	for _, p := range projects {
		if p.IsDir() {
			s.sweepProject(filepath.Join(s.Dir, p.Name()), act, &rep)
		}
	}
	slices.SortFunc(rep.Removed, func(a, b Leftover) int { return strings.Compare(a.Path, b.Path) })
	return rep, nil
}

// live tells whether o may still be working: this process, a live
// process, or one that cannot be told.
func (s Store) live(o names.Owner) bool { return o == s.owner() || alive(o) }

func (s Store) sweepProject(dir string, act bool, rep *ReapReport) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		return
	}
	recs, err := s.records(dir)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
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
		if act && m.State == Recording && m.Owner != nil && !s.live(*m.Owner) {
			m.State = Cut
			if m.Ended == "" {
				m.Ended = "its server (" + m.Owner.String() + ") was killed while it recorded"
			}
			m.Owner = nil
			if err := s.Update(m); err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			} else {
				rep.Cut = append(rep.Cut, m.Name)
			}
		}
		s.sweepCheckpoints(m, act, rep)
	}
	remove := func(l Leftover) {
		if act {
			if err := os.RemoveAll(l.Path); err != nil {
				rep.Errors = append(rep.Errors, err.Error())
				return
			}
		}
		rep.Removed = append(rep.Removed, l)
	}
	// Intents of live servers protect what they name.
	protected := map[string]bool{}
	for _, e := range ents {
		name, id, ok := splitNameID(e.Name(), ".intent")
		if !ok || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		o, _ := parseID(id)
		if s.live(o) {
			protected[name+"."+id] = true
			continue
		}
		remove(Leftover{Path: filepath.Join(dir, e.Name()), What: "intent", Owner: &o,
			Why: "its recording's server (" + o.String() + ") died before it finished starting or replacing"})
	}
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		switch {
		case e.IsDir() && !strings.HasPrefix(n, "."):
			_, id, ok := splitNameID(n, "")
			if !ok || named[n] || protected[n] || slices.ContainsFunc(unreadable, func(u string) bool { return strings.HasPrefix(n, u) }) {
				continue
			}
			o, _ := parseID(id)
			if s.live(o) {
				continue
			}
			remove(Leftover{Path: p, What: "partial recording", Owner: &o,
				Why: "no record names it and its server (" + o.String() + ") is dead: a recording that did not start, or one a later recording replaced"})
		case strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".json.tmp") || strings.HasSuffix(n, ".intent.tmp")):
			_, id, ok := splitNameID(n, ".json.tmp")
			if !ok {
				if _, id, ok = splitNameID(n, ".intent.tmp"); !ok {
					continue
				}
			}
			if o, _ := parseID(id); !s.live(o) {
				remove(Leftover{Path: p, What: "record being written", Owner: &o, Why: "its server (" + o.String() + ") is dead"})
			}
		}
	}
}

// splitNameID reads "[.]NAME.ID<suffix>".
func splitNameID(file, suffix string) (name, id string, ok bool) {
	base, ok := strings.CutSuffix(strings.TrimPrefix(file, "."), suffix)
	if !ok {
		return "", "", false
	}
	k := strings.LastIndexByte(base, '.')
	if k <= 0 {
		return "", "", false
	}
	name, id = base[:k], base[k+1:]
	if _, ok := parseID(id); !ok || !names.ValidUserName(name) {
		return "", "", false
	}
	return name, id, true
}

func (s Store) sweepCheckpoints(m Meta, act bool, rep *ReapReport) {
	dir := m.ckDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
	}
	remove := func(l Leftover) {
		if act {
			if err := os.Remove(l.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				rep.Errors = append(rep.Errors, err.Error())
				return
			}
		}
		rep.Removed = append(rep.Removed, l)
	}
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		for _, suffix := range []string{".qcow2", ".json", ".json.tmp"} {
			c, id, ok := parseCk(n, suffix)
			if !ok {
				continue
			}
			o, _ := parseID(id)
			base := ckBase(c, id)
			switch suffix {
			case ".qcow2":
				if !have[base+".json"] && !s.live(o) {
					remove(Leftover{Path: p, What: "partial checkpoint", Owner: &o, Why: "its replay's server (" + o.String() + ") died before the checkpoint was whole"})
				}
			case ".json":
				if !have[base+".qcow2"] {
					remove(Leftover{Path: p, What: "partial checkpoint", Why: "its image is gone"})
				}
			case ".json.tmp":
				if !s.live(o) {
					remove(Leftover{Path: p, What: "record being written", Owner: &o, Why: "its server (" + o.String() + ") is dead"})
				}
			}
		}
	}
}
