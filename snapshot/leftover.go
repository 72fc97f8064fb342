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
	"github.com/qemu-mcp/qemu-mcp/internal/store"
)

// legacyAge is how old a leftover of the first version (whose names carry
// no owner) must be before it is judged dead: that version's saves took
// seconds.
const legacyAge = 10 * time.Minute

// Leftovers lists what dead saves left in the store and in the drives
// their intents name, changing nothing.
func (s Store) Leftovers() (store.Report, error) { return s.sweep(false) }

// Reap removes what dead saves left: images and records no record names,
// intents of dead servers, and the tags those intents wrote into drives
// that no record names now (through qemu-img, which takes the drive's
// lock: a drive a QEMU holds is left, and reported, until it is free).
// Snapshots whose records name parts that are gone are listed in the
// report's Broken. Saves of live servers, this one included, are never
// touched.
func (s Store) Reap() (store.Report, error) { return s.sweep(true) }

func (s Store) sweep(act bool) (store.Report, error) {
	return store.SweepDirs(kind, s.Dir, 2, act, s.sweepDir)
}

// alive tells whether o may still be saving: this process, a live
// process, or one that cannot be told.
func (s Store) alive(o names.Owner) bool { return store.Live(s.owner(), o) }

// dirSweep is the sweep of one machine directory: what its records name
// stays, and what dead saves' intents say they wrote goes.
type dirSweep struct {
	s   Store
	dir string
	sw  *store.Sweep
	// byName are the readable records; named the images they, and the
	// intents of live saves, name; unreadable the names whose record
	// cannot be read (their images stay: which one it names is unknown).
	byName     map[string]Meta
	named      map[string]bool
	unreadable []string
	// dead are the intents of dead saves; replaced the images they
	// replaced.
	dead     []intentFile
	replaced map[string]bool
}

type intentFile struct {
	path string
	in   Intent
}

func (s Store) sweepDir(dir string, sw *store.Sweep) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		sw.Fail(err)
		return
	}
	d := &dirSweep{s: s, dir: dir, sw: sw, byName: map[string]Meta{}, named: map[string]bool{}, replaced: map[string]bool{}}
	if err := d.readRecords(); err != nil {
		sw.Fail(err)
		return
	}
	d.readIntents(ents)
	for _, e := range ents {
		if e.Type().IsRegular() {
			d.sweepFile(e)
		}
	}
	for _, f := range d.dead {
		if !slices.Contains(d.unreadable, f.in.Name) { // else which tag its record names cannot be told
			d.sweepIntent(f)
		}
	}
}

// readRecords reads the directory's records, noting the snapshots that
// cannot load.
func (d *dirSweep) readRecords() error {
	recs, err := records.In(d.dir)
	if err != nil {
		return err
	}
	for _, m := range recs {
		if m.unreadable != "" {
			d.unreadable = append(d.unreadable, m.Name)
			d.sw.Broken = append(d.sw.Broken, fmt.Sprintf("%s: its record is unreadable: %s", m.Name, m.unreadable))
			continue
		}
		d.byName[m.Name] = m
		d.named[m.Image] = true
		if err := verifyImage(m); err != "" {
			d.sw.Broken = append(d.sw.Broken, fmt.Sprintf("%s: %s", m.Name, err))
		}
	}
	return nil
}

// readIntents reads the intents: a live save's protect what they name; a
// dead save's are swept once the files are judged.
func (d *dirSweep) readIntents(ents []fs.DirEntry) {
	for _, e := range ents {
		_, id, o, ok := store.SplitName(e.Name(), store.IntentSuffix)
		if !ok || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(d.dir, e.Name())
		in, err := readIntent(p)
		if err != nil {
			d.sw.Fail(err)
			continue
		}
		if in.ID != id {
			d.sw.Fail(fmt.Errorf("intent %s names save %s: left alone", p, in.ID))
			continue
		}
		if d.s.alive(o) {
			d.named[in.Image] = true
			if in.Replaces != nil {
				d.named[in.Replaces.Image] = true
			}
			continue
		}
		d.dead = append(d.dead, intentFile{p, in})
		if in.Replaces != nil && !d.named[in.Replaces.Image] {
			d.replaced[in.Replaces.Image] = true
		}
	}
}

// sweepFile judges a file of the directory by its name: an image no
// record names, a record being written, a first version's leftover.
func (d *dirSweep) sweepFile(e fs.DirEntry) {
	n := e.Name()
	p := filepath.Join(d.dir, n)
	old := func() bool {
		fi, err := e.Info()
		return err == nil && time.Since(fi.ModTime()) > legacyAge
	}
	switch {
	case strings.HasSuffix(n, ".qcow2") && !strings.HasPrefix(n, "."):
		d.sweepImage(n, p, old)
	case strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".json.tmp") || strings.HasSuffix(n, ".intent.tmp")):
		if o, ok := store.TempOwner(n); ok && !d.s.alive(o) {
			d.sw.Remove(p, store.Leftover{Path: p, What: "record being written", Owner: &o, Why: "its save's server (" + o.String() + ") is dead"})
		}
	case strings.HasPrefix(n, ".") && strings.Contains(n, ".qcow2.tmp-"), // the first version's partial images
		!strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".json.tmp"): // and records
		if old() {
			d.sw.Remove(p, store.Leftover{Path: p, What: "partial image", Why: "left by a save of an older version, older than " + legacyAge.String()})
		}
	}
}

// sweepImage judges the image n at p that no record may name.
func (d *dirSweep) sweepImage(n, p string, old func() bool) {
	if d.named[n] || slices.ContainsFunc(d.unreadable, func(name string) bool { return imageOf(n, name) }) {
		return
	}
	_, _, o, ok := store.SplitName(n, ".qcow2")
	switch {
	case d.replaced[n]:
		d.sw.Remove(p, store.Leftover{Path: p, What: "replaced image", Why: "a later save of its name committed and was killed before removing it"})
	case ok && !d.s.alive(o):
		d.sw.Remove(p, store.Leftover{Path: p, What: "partial image", Owner: &o, Why: "its save's server (" + o.String() + ") is dead and no record names it"})
	case !ok && old():
		d.sw.Remove(p, store.Leftover{Path: p, What: "partial image", Why: "no record names it, and it is older than " + legacyAge.String()})
	}
}

// sweepIntent removes the tags a dead save wrote into its drives that no
// record names, then, once none is left, its intent.
func (d *dirSweep) sweepIntent(f intentFile) {
	in := f.in
	o := in.Owner
	var orphans []string
	cur := d.byName[in.Name].Tag
	for _, t := range []string{in.Tag, tagOf(in.Replaces)} {
		if t != "" && t != cur {
			orphans = append(orphans, t)
		}
	}
	done := true
	for _, drive := range in.Drives {
		for _, tag := range orphans {
			done = d.sweepDriveTag(drive, tag, o) && done
		}
	}
	if done {
		d.sw.Remove(f.path, store.Leftover{Path: f.path, What: "intent", Owner: &o, Why: "its save's server (" + o.String() + ") is dead; what it wrote is gone"})
	}
}

// sweepDriveTag removes tag, which the dead server o's save wrote, from
// drive if it has it; done says the drive does not have it now.
func (d *dirSweep) sweepDriveTag(drive, tag string, o names.Owner) (done bool) {
	f, err := os.Open(drive)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		d.sw.Fail(err)
		return false
	}
	_, has, err := hasTag(f, tag)
	f.Close()
	if err != nil {
		d.sw.Fail(fmt.Errorf("drive %s: %v", drive, err))
		return false
	}
	if !has {
		return true
	}
	l := store.Leftover{Path: drive, What: "drive tag", Tag: tag, Owner: &o, Why: "written by a save whose server (" + o.String() + ") died; no record names it"}
	if !d.sw.Act {
		d.sw.Found(l)
		return true
	}
	held, err := d.s.deleteDriveTag(drive, tag)
	switch {
	case held:
		l.Held, l.Why = true, l.Why+"; a QEMU holds the drive: removed once it is free (the next start or boot), or with qemu-img snapshot -d "+tag+" "+drive
		d.sw.Left = append(d.sw.Left, l)
		return false
	case err != nil:
		d.sw.Fail(err)
		return false
	}
	d.sw.Found(l)
	return true
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
