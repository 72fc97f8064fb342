package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// legacyAge is how old a leftover of the first version (whose names carry
// no owner) must be before it is judged dead: that version's saves took
// seconds.
const legacyAge = 10 * time.Minute

// Leftover is something a killed or failed save left: a file in the store,
// or a tag in a drive that no record names.
type Leftover struct {
	// Path is the file, or for a tag the drive holding it.
	Path string `json:"path"`
	// What it is: "partial image", "replaced image", "record being
	// written", "intent", "drive tag".
	What string `json:"what"`
	// Tag is a drive tag's name.
	Tag string `json:"tag,omitempty"`
	// Owner is the save's server, when its name says.
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

// ReapReport is what Reap did.
type ReapReport struct {
	Removed []Leftover `json:"removed,omitempty"`
	// Left are leftovers that could not be removed yet (a held drive),
	// and why.
	Left   []Leftover `json:"left,omitempty"`
	Errors []string   `json:"errors,omitempty"`
	// Broken are snapshots whose records name parts that are gone.
	Broken []string `json:"broken,omitempty"`
}

// Leftovers lists what dead saves left in the store and in the drives
// their intents name, changing nothing.
func (s Store) Leftovers() (ReapReport, error) { return s.sweep(false) }

// Reap removes what dead saves left: images and records no record names,
// intents of dead servers, and the tags those intents wrote into drives
// that no record names now (through qemu-img, which takes the drive's
// lock: a drive a QEMU holds is left, and reported, until it is free).
// Saves of live servers, this one included, are never touched.
func (s Store) Reap() (ReapReport, error) { return s.sweep(true) }

func (s Store) sweep(act bool) (ReapReport, error) {
	var rep ReapReport
	projects, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("snapshot store: %w", err)
	}
	for _, p := range projects {
		if !p.IsDir() {
			continue
		}
		machines, err := os.ReadDir(filepath.Join(s.Dir, p.Name()))
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			continue
		}
		for _, md := range machines {
			if md.IsDir() {
				s.sweepDir(filepath.Join(s.Dir, p.Name(), md.Name()), act, &rep)
			}
		}
	}
	return rep, nil
}

// alive tells whether o may still be saving: this process, a live
// process, or one that cannot be told.
func (s Store) alive(o names.Owner) bool {
	if o == s.owner() {
		return true
	}
	live, _, err := proc.Check(proc.Identity{PID: o.PID, StartTime: o.StartTime})
	return err != nil || live == proc.Alive
}

// idOf returns the save id in a store file's name, from its last dotted
// part before suffix: "NAME.ID.qcow2", ".NAME.ID.intent".
func idOf(file, suffix string) (string, names.Owner, bool) {
	base, ok := strings.CutSuffix(file, suffix)
	if !ok {
		return "", names.Owner{}, false
	}
	k := strings.LastIndexByte(base, '.')
	if k < 0 {
		return "", names.Owner{}, false
	}
	id := base[k+1:]
	o, ok := parseID(id)
	return id, o, ok
}

func (s Store) sweepDir(dir string, act bool, rep *ReapReport) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		return
	}
	recs, err := records(dir)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		return
	}
	byName := map[string]Meta{}
	named := map[string]bool{}
	var unreadable []string // names whose record cannot be read: their images stay
	for _, m := range recs {
		if m.unreadable != "" {
			unreadable = append(unreadable, m.Name)
			rep.Broken = append(rep.Broken, fmt.Sprintf("%s: its record is unreadable: %s", m.Name, m.unreadable))
			continue
		}
		byName[m.Name] = m
		named[m.Image] = true
		if err := verifyImage(m); err != "" {
			rep.Broken = append(rep.Broken, fmt.Sprintf("%s: %s", m.Name, err))
		}
	}
	type intentFile struct {
		path string
		in   Intent
	}
	var dead []intentFile
	replaced := map[string]bool{} // images dead saves replaced
	for _, e := range ents {
		id, o, ok := idOf(e.Name(), ".intent")
		if !ok || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		in, err := readIntent(p)
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			continue
		}
		if in.ID != id {
			rep.Errors = append(rep.Errors, fmt.Sprintf("intent %s names save %s: left alone", p, in.ID))
			continue
		}
		if s.alive(o) {
			named[in.Image] = true
			if in.Replaces != nil {
				named[in.Replaces.Image] = true
			}
			continue
		}
		dead = append(dead, intentFile{p, in})
		if in.Replaces != nil && !named[in.Replaces.Image] {
			replaced[in.Replaces.Image] = true
		}
	}
	remove := func(l Leftover) {
		if !act {
			rep.Removed = append(rep.Removed, l)
			return
		}
		if err := os.Remove(l.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			rep.Errors = append(rep.Errors, err.Error())
			return
		}
		rep.Removed = append(rep.Removed, l)
	}
	old := func(e fs.DirEntry) bool {
		fi, err := e.Info()
		return err == nil && time.Since(fi.ModTime()) > legacyAge
	}
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		if !e.Type().IsRegular() {
			continue
		}
		switch {
		case strings.HasSuffix(n, ".qcow2") && !strings.HasPrefix(n, "."):
			if named[n] || slices.ContainsFunc(unreadable, func(name string) bool { return imageOf(n, name) }) {
				continue
			}
			_, o, ok := idOf(n, ".qcow2")
			switch {
			case replaced[n]:
				remove(Leftover{Path: p, What: "replaced image", Why: "a later save of its name committed and was killed before removing it"})
			case ok && !s.alive(o):
				remove(Leftover{Path: p, What: "partial image", Owner: &o, Why: "its save's server (" + o.String() + ") is dead and no record names it"})
			case !ok && old(e):
				remove(Leftover{Path: p, What: "partial image", Why: "no record names it, and it is older than " + legacyAge.String()})
			}
		case strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".json.tmp") || strings.HasSuffix(n, ".intent.tmp")):
			suffix := ".json.tmp"
			if strings.HasSuffix(n, ".intent.tmp") {
				suffix = ".intent.tmp"
			}
			if _, o, ok := idOf(n, suffix); ok && !s.alive(o) {
				remove(Leftover{Path: p, What: "record being written", Owner: &o, Why: "its save's server (" + o.String() + ") is dead"})
			}
		case strings.HasPrefix(n, ".") && strings.Contains(n, ".qcow2.tmp-"), // the first version's partial images
			!strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".json.tmp"): // and records
			if old(e) {
				remove(Leftover{Path: p, What: "partial image", Why: "left by a save of an older version, older than " + legacyAge.String()})
			}
		}
	}
	for _, d := range dead {
		in := d.in
		o := in.Owner
		if slices.Contains(unreadable, in.Name) {
			continue // which tag its record names cannot be told
		}
		var orphans []string
		cur := byName[in.Name].Tag
		for _, t := range []string{in.Tag, tagOf(in.Replaces)} {
			if t != "" && t != cur {
				orphans = append(orphans, t)
			}
		}
		done := true
		for _, drive := range in.Drives {
			for _, tag := range orphans {
				f, err := os.Open(drive)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					rep.Errors = append(rep.Errors, err.Error())
					done = false
					continue
				}
				_, has, err := hasTag(f, tag)
				f.Close()
				if err != nil {
					rep.Errors = append(rep.Errors, fmt.Sprintf("drive %s: %v", drive, err))
					done = false
					continue
				}
				if !has {
					continue
				}
				l := Leftover{Path: drive, What: "drive tag", Tag: tag, Owner: &o, Why: "written by a save whose server (" + o.String() + ") died; no record names it"}
				if !act {
					rep.Removed = append(rep.Removed, l)
					continue
				}
				held, err := s.deleteDriveTag(drive, tag)
				switch {
				case held:
					l.Held, l.Why = true, l.Why+"; a QEMU holds the drive: removed once it is free (the next start or boot), or with qemu-img snapshot -d "+tag+" "+drive
					rep.Left = append(rep.Left, l)
					done = false
				case err != nil:
					rep.Errors = append(rep.Errors, err.Error())
					done = false
				default:
					rep.Removed = append(rep.Removed, l)
				}
			}
		}
		if done {
			remove(Leftover{Path: d.path, What: "intent", Owner: &o, Why: "its save's server (" + o.String() + ") is dead; what it wrote is gone"})
		}
	}
	slices.SortFunc(rep.Removed, func(a, b Leftover) int { return strings.Compare(a.Path+a.Tag, b.Path+b.Tag) })
}

// imageOf tells whether file is an image of the snapshot name: NAME.qcow2
// (the first version) or NAME.ID.qcow2, an ID having no dot; not the image
// of a snapshot whose name merely begins with NAME and a dot.
func imageOf(file, name string) bool {
	rest, ok := strings.CutPrefix(file, name+".")
	return ok && (rest == "qcow2" || strings.Count(rest, ".") == 1 && strings.HasSuffix(rest, ".qcow2"))
}

func tagOf(p *Part) string {
	if p == nil {
		return ""
	}
	return p.Tag
}

// deleteDriveTag removes tag from the qcow2 drive through qemu-img, which
// takes the image's write lock: held reports that a QEMU has it open.
func (s Store) deleteDriveTag(drive, tag string) (held bool, err error) {
	bin := s.QEMUImg
	if bin == "" {
		bin = "qemu-img"
	}
	out, err := exec.Command(bin, "snapshot", "-d", tag, drive).CombinedOutput()
	if err == nil {
		return false, nil
	}
	if bytes.Contains(out, []byte("lock")) {
		return true, nil
	}
	return false, fmt.Errorf("qemu-img snapshot -d %s %s: %v: %s", tag, drive, err, bytes.TrimSpace(out))
}
