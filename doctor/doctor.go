// Package doctor implements `qemu-mcp doctor`: it lists the servers that
// recorded themselves in the runtime directory (alive or not, running
// current code or not, orphaned or not), the entries dead servers left, and
// the lock; on request it reaps the leftovers of dead servers and terminates
// orphaned stdio servers. It only ever acts on what a record names, verified
// by PID, start time and executable, and never looks processes up by name.
package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
	"golang.org/x/sys/unix"
)

// Options select what the doctor does besides listing.
type Options struct {
	// Cleanup reaps what dead servers left (reaper.Reap) and prints it.
	Cleanup bool
	// TerminateOrphans sends SIGTERM to every live orphaned stdio server
	// whose record is verified (PID, start time and executable match).
	// Without it, the exact kill command is printed instead.
	TerminateOrphans bool
	// JSON prints one JSON document (Result) instead of text.
	JSON bool
	// Lock describes the repository lock (who holds it); nil omits it.
	Lock func() (string, error)
	// Self is the PID never acted upon; 0 means this process.
	Self int
	// DeleteTAP is passed to the reaper.
	DeleteTAP func(name string) error
	// Logger is passed to the reaper; nil discards.
	Logger *slog.Logger
	// Now is the clock for uptimes; nil means time.Now.
	Now func() time.Time
	// TermWait bounds the wait for a terminated orphan to exit; 0 means 2s.
	TermWait time.Duration
	// Kept is the directory of kept files (transcripts, captures,
	// screenshots) to report; empty omits it.
	Kept string
	// Snapshots is the snapshot store whose leftovers of killed saves to
	// report (and reap, with Cleanup); empty omits it.
	Snapshots string
	// Recordings is the recording store whose leftovers of killed
	// recording starts and checkpoint saves to report (and reap, with
	// Cleanup, which also marks recordings whose server died while they
	// recorded as cut); empty omits it.
	Recordings string
}

// Result is everything the doctor found and did.
type Result struct {
	Dir     string   `json:"dir"`
	Lock    *Lock    `json:"lock,omitempty"`
	Servers []Server `json:"servers"`
	// Leftovers are the entries of dead servers, with or without record.
	Leftovers []reaper.Owner `json:"leftovers"`
	// Undecided are entries without a record whose PID a live process has:
	// it may or may not be their owner, so they are left alone.
	Undecided []reaper.Owner `json:"undecided,omitempty"`
	// Unknown names entries that match no pattern: never touched.
	Unknown []string `json:"unknown,omitempty"`
	// Cleanup is what the reaper did, with Options.Cleanup.
	Cleanup *reaper.Report `json:"cleanup,omitempty"`
	// Orphans lists the live orphaned stdio servers and what was done.
	Orphans []Orphan `json:"orphans,omitempty"`
	// Kept is what the state directory keeps.
	Kept *Kept `json:"kept,omitempty"`
	// Snapshots lists what killed snapshot saves left (images, records,
	// intents, tags in drives) and snapshots with a part gone; with
	// Cleanup, what was removed and what stays (a drive a QEMU holds).
	Snapshots *store.Report `json:"snapshot_leftovers,omitempty"`
	// Recordings lists what killed recording starts and checkpoint saves
	// left; with Cleanup, what was removed and which recordings were
	// marked cut.
	Recordings *store.Report `json:"recording_leftovers,omitempty"`
}

// Kept is the kept-files section: how much, and the files, oldest first.
type Kept struct {
	Dir   string      `json:"dir"`
	Count int         `json:"count"`
	Bytes int64       `json:"bytes"`
	Files []kept.File `json:"files"`
}

// Lock is the lock section.
type Lock struct {
	Status string `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Server is one record and its assessment.
type Server struct {
	Path   string           `json:"path"`
	PID    int              `json:"pid"`
	Record *registry.Record `json:"record,omitempty"`
	Health *registry.Health `json:"health,omitempty"`

	owner names.Owner // what the record's file name says
	// Error says why the record could not be used.
	Error string `json:"error,omitempty"`
}

// Orphan is a live stdio server whose client is gone.
type Orphan struct {
	PID int `json:"pid"`
	// Command terminates exactly it ("kill -TERM <pid>"); empty when the
	// record could not be verified.
	Command string `json:"command,omitempty"`
	// Verified: PID, start time and executable match the record.
	Verified bool `json:"verified"`
	// Terminated: SIGTERM was sent (with TerminateOrphans).
	Terminated bool `json:"terminated"`
	// Exited: it was gone within the wait after SIGTERM.
	Exited bool   `json:"exited"`
	Note   string `json:"note,omitempty"`
}

// Run examines dir, acts as opts say and writes the report to w.
func Run(dir string, w io.Writer, opts Options) error {
	res, err := Collect(dir, opts)
	if opts.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if eerr := enc.Encode(res); eerr != nil {
			return eerr
		}
		return err
	}
	if werr := res.WriteText(w, opts.now()); werr != nil {
		return werr
	}
	return err
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o Options) self() int {
	if o.Self > 0 {
		return o.Self
	}
	return os.Getpid()
}

// Collect examines dir and acts as opts say (Cleanup, TerminateOrphans),
// returning what it found and did. The listing is taken before any action.
func Collect(dir string, opts Options) (Result, error) {
	res := Result{Dir: dir}
	var errs []error
	if opts.Lock != nil {
		s, err := opts.Lock()
		res.Lock = &Lock{Status: s}
		if err != nil {
			res.Lock.Error = err.Error()
		}
	}
	errs = append(errs, res.collectServers(dir))
	ropts := reaper.Options{Self: names.Owner{PID: opts.self()}, Logger: opts.Logger, DeleteTAP: opts.DeleteTAP}
	errs = append(errs, res.collectLeftovers(dir, ropts))
	if opts.Cleanup {
		rep, err := reaper.Reap(dir, ropts)
		errs = append(errs, err)
		res.Cleanup = &rep
	}
	errs = append(errs, res.sweepStores(opts))
	if opts.Kept != "" {
		files, err := kept.List(opts.Kept)
		errs = append(errs, err)
		res.Kept = &Kept{Dir: opts.Kept, Count: len(files), Bytes: kept.Total(files), Files: files}
	}
	for _, s := range res.Servers {
		if s.Health != nil && s.Health.Orphaned {
			res.Orphans = append(res.Orphans, orphan(s, opts))
		}
	}
	return res, errors.Join(errs...)
}

// collectServers lists the records of servers in dir, each assessed.
func (res *Result) collectServers(dir string) error {
	entries, err := registry.List(dir)
	for _, e := range entries {
		s := Server{Path: e.Path, PID: e.PID, owner: e.Owner}
		if e.Err != nil {
			s.Error = e.Err.Error()
		} else {
			rec := e.Record
			h := registry.Assess(rec)
			s.Record, s.Health = &rec, &h
		}
		res.Servers = append(res.Servers, s)
	}
	return err
}

// collectLeftovers lists the entries of dead servers, and those whose
// owner cannot be told.
func (res *Result) collectLeftovers(dir string, ropts reaper.Options) error {
	inv, err := reaper.Scan(dir, ropts)
	for _, o := range inv.Owners {
		switch {
		case o.Dead:
			res.Leftovers = append(res.Leftovers, o)
		case o.Record == nil && !o.Self:
			res.Undecided = append(res.Undecided, o)
		}
	}
	res.Unknown = inv.Unknown
	return err
}

// sweepStores lists what killed work left in the snapshot and recording
// stores, or with Cleanup removes it; a store with nothing to say is left
// out.
func (res *Result) sweepStores(opts Options) error {
	self := names.Owner{PID: opts.self()}
	var errs []error
	if opts.Snapshots != "" {
		st := snapshot.Store{Dir: opts.Snapshots, Owner: self, Logger: opts.Logger}
		var err error
		res.Snapshots, err = sweepStore(st.Leftovers, st.Reap, opts.Cleanup)
		errs = append(errs, err)
	}
	if opts.Recordings != "" {
		st := recording.Store{Dir: opts.Recordings, Owner: self, Logger: opts.Logger}
		var err error
		res.Recordings, err = sweepStore(st.Leftovers, st.Reap, opts.Cleanup)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sweepStore is list, or with cleanup reap, of either kind of store; its
// report, nil when it has nothing to say.
func sweepStore(list, reap func() (store.Report, error), cleanup bool) (*store.Report, error) {
	if cleanup {
		list = reap
	}
	r, err := list()
	if len(r.Removed)+len(r.Left)+len(r.Cut)+len(r.Errors)+len(r.Broken) == 0 {
		return nil, err
	}
	return &r, err
}

func orphan(s Server, opts Options) Orphan {
	rec, h := s.Record, s.Health
	o := Orphan{PID: rec.PID, Verified: h.Verified()}
	if !o.Verified {
		o.Note = "the process with pid " + strconv.Itoa(rec.PID) +
			" could not be verified to run the recorded executable (image match: " + h.ImageMatch.String() + "): not signalled, no command offered"
		return o
	}
	o.Command = "kill -TERM " + strconv.Itoa(rec.PID)
	if !opts.TerminateOrphans {
		return o
	}
	if rec.PID == opts.self() {
		o.Note = "this process: not signalled"
		return o
	}
	if err := proc.Signal(rec.Identity(), unix.SIGTERM); err != nil {
		o.Note = "SIGTERM failed: " + err.Error()
		return o
	}
	o.Terminated = true
	wait := opts.TermWait
	if wait <= 0 {
		wait = 2 * time.Second
	}
	o.Exited = reaper.WaitGone(rec.Identity(), wait)
	if !o.Exited {
		o.Note = fmt.Sprintf("still running %v after SIGTERM", wait)
	}
	return o
}

// WriteText writes the human-readable report.
func (res Result) WriteText(w io.Writer, now time.Time) error {
	p := &printer{w: w}
	p.f("runtime dir: %s\n", res.Dir)
	if res.Lock != nil {
		if res.Lock.Error != "" {
			p.f("lock: %s (error: %s)\n", orDash(res.Lock.Status), res.Lock.Error)
		} else {
			p.f("lock: %s\n", orDash(res.Lock.Status))
		}
	}
	res.writeServers(p, now)
	res.writeLeftovers(p)
	if k := res.Kept; k != nil {
		p.f("\nkept in %s: %d file(s), %.1f MiB (the oldest go first past the server's --max-kept cap)\n", k.Dir, k.Count, float64(k.Bytes)/(1<<20))
		for _, f := range k.Files {
			p.f("  %s  %10d  %s\n", f.ModTime.Format(time.RFC3339), f.Size, filepath.Base(f.Path))
		}
	}
	if res.Snapshots != nil {
		section("killed snapshot saves", "snapshot store", res.Snapshots).write(p, res.Cleanup != nil)
	}
	if res.Recordings != nil {
		section("killed recordings and checkpoint saves", "recording store", res.Recordings).write(p, res.Cleanup != nil)
	}
	if r := res.Cleanup; r != nil {
		writeCleanup(p, r)
	}
	res.writeOrphans(p)
	return p.err
}

func (res Result) writeServers(p *printer, now time.Time) {
	p.f("\nservers: %d record(s)\n", len(res.Servers))
	leftovers := make(map[names.Owner]int)
	for _, o := range res.Leftovers {
		leftovers[o.Owner()] = len(o.Files)
	}
	for _, s := range res.Servers {
		if s.Error != "" {
			p.f("  pid %d: unusable record: %s\n", s.PID, s.Error)
			continue
		}
		writeServer(p, s, now, leftovers[s.owner])
	}
}

// writeLeftovers writes the entries of dead servers, and those left alone.
func (res Result) writeLeftovers(p *printer) {
	p.f("\nleftovers of dead servers: %d server(s)\n", len(res.Leftovers))
	for _, o := range res.Leftovers {
		p.f("  pid %d: %s\n", o.PID, o.Why)
		if o.RecordErr != "" {
			p.f("    unusable record: %s\n", o.RecordErr)
		}
		for _, f := range o.Files {
			if f.Problem != "" {
				p.f("    %s (%s): %s\n", f.Path, f.Type, f.Problem)
			} else {
				p.f("    %s (%s)\n", f.Path, f.Type)
			}
		}
		if o.Record != nil {
			for _, c := range o.Record.Children() {
				p.f("    qemu: pid %d (%s)\n", c.PID, c.Executable)
			}
			for _, t := range taps(*o.Record) {
				p.f("    tap: %s\n", t)
			}
		}
	}
	if len(res.Leftovers) > 0 && res.Cleanup == nil {
		p.f("  remove them with: qemu-mcp doctor --cleanup\n")
	}
	if len(res.Undecided) > 0 {
		p.f("\nentries without a record whose pid is in use (left alone):\n")
		for _, o := range res.Undecided {
			names := make([]string, len(o.Files))
			for i, f := range o.Files {
				names[i] = f.Name
			}
			p.f("  pid %d: %s\n", o.PID, strings.Join(names, " "))
		}
	}
	if len(res.Unknown) > 0 {
		p.f("\nunknown entries (never touched): %s\n", strings.Join(res.Unknown, " "))
	}
}

// storeSection is a store's part of the report, of either kind: what
// killed work left there, and what its sweep says of the store's entries.
type storeSection struct {
	// killed is the work whose leftovers these are; store names the store.
	killed, store string
	// removed were found (or removed), held stay while a QEMU holds the
	// file they are in; notes are about entries, one sentence each.
	removed, held, notes, errors []string
}

// section is the part of the report r of the store called name, whose
// leftovers killed left.
func section(killed, name string, r *store.Report) storeSection {
	s := storeSection{killed: killed, store: name, removed: lines(r.Removed), held: lines(r.Left), errors: r.Errors}
	for _, b := range r.Broken {
		s.notes = append(s.notes, "incomplete snapshot (cannot load; delete it): "+b)
	}
	for _, n := range r.Cut {
		s.notes = append(s.notes, "recording "+n+": its server was killed while it recorded; marked cut (it replays up to there)")
	}
	return s
}

func lines(items []store.Leftover) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.String()
	}
	return out
}

// write writes the section; cleanup says the leftovers were removed.
func (s storeSection) write(p *printer, cleanup bool) {
	if len(s.removed) > 0 {
		if cleanup {
			p.f("\nleft by %s, removed:\n", s.killed)
		} else {
			p.f("\nleft by %s (doctor --cleanup removes them):\n", s.killed)
		}
		for _, l := range s.removed {
			p.f("  %s\n", l)
		}
	}
	if len(s.held) > 0 {
		p.f("\nleft by %s, in drives a QEMU holds (removed once free):\n", s.killed)
		for _, l := range s.held {
			p.f("  %s\n", l)
		}
	}
	for _, n := range s.notes {
		p.f("\n%s\n", n)
	}
	for _, e := range s.errors {
		p.f("\n%s: %s\n", s.store, e)
	}
}

func writeCleanup(p *printer, r *reaper.Report) {
	p.f("\ncleanup:\n")
	for _, k := range r.KilledQEMU {
		p.f("  killed QEMU pid %d (%s) of dead server %d\n", k.PID, k.Executable, k.ServerPID)
	}
	for _, t := range r.DeletedTAPs {
		p.f("  deleted TAP %s\n", t)
	}
	for _, path := range r.Removed {
		p.f("  removed %s\n", path)
	}
	for _, s := range r.Skipped {
		p.f("  skipped %s: %s\n", s.Path, s.Reason)
	}
	for _, e := range r.Errors {
		p.f("  error: %s\n", e)
	}
	p.f("  %s\n", r.String())
}

func (res Result) writeOrphans(p *printer) {
	if len(res.Orphans) == 0 {
		return
	}
	p.f("\norphaned stdio servers (their client is gone):\n")
	for _, o := range res.Orphans {
		switch {
		case o.Terminated && o.Exited:
			p.f("  pid %d: sent SIGTERM; it exited\n", o.PID)
		case o.Terminated:
			p.f("  pid %d: sent SIGTERM; %s\n", o.PID, o.Note)
		case o.Command != "" && o.Note == "":
			p.f("  pid %d: terminate it with: %s\n", o.PID, o.Command)
		case o.Command != "":
			p.f("  pid %d: %s; terminate it with: %s\n", o.PID, o.Note, o.Command)
		default:
			p.f("  pid %d: %s\n", o.PID, o.Note)
		}
	}
}

func writeServer(p *printer, s Server, now time.Time, leftovers int) {
	rec, h := s.Record, s.Health
	state := "dead (" + h.State + ")"
	if h.Alive {
		state = "alive"
	}
	transport := orDash(rec.Transport)
	if rec.Address != "" {
		transport += " " + rec.Address
	}
	p.f("  pid %d: %s, %s, version %s\n", rec.PID, state, transport, orDash(rec.Version))
	exe := "executable: " + orDash(rec.Executable) + " (current binary: " + h.ExeMatch.String()
	if h.ExeDetail != "" && h.ExeMatch != registry.Yes {
		exe += ": " + h.ExeDetail
	}
	if h.Alive {
		exe += "; process runs the recorded image: " + h.ImageMatch.String()
	}
	p.f("    %s)\n", exe)
	p.f("    cwd: %s\n", orDash(rec.Cwd))
	started := "-"
	if !rec.Started.IsZero() {
		started = rec.Started.Format(time.RFC3339)
		if h.Alive {
			started += " (up " + now.Sub(rec.Started).Round(time.Second).String() + ")"
		}
	}
	p.f("    started: %s\n", started)
	parent := "parent: " + strconv.Itoa(rec.PPID) + " at start (alive: " + h.ParentAlive.String() + ")"
	if h.Alive {
		parent += ", now " + strconv.Itoa(h.ParentNow)
	}
	p.f("    %s\n", parent)
	children := rec.Children()
	if len(children) == 0 {
		p.f("    qemu: none\n")
	}
	for i, c := range children {
		if i < len(h.QEMU) {
			p.f("    qemu: pid %d %s (%s, executable matches: %s)\n", c.PID, h.QEMU[i].State, c.Executable, h.QEMU[i].ExeMatch)
		}
	}
	for _, in := range rec.Instances {
		line := "    instance " + in.Name + ":"
		if in.QEMU != nil {
			line += " qemu pid " + strconv.Itoa(in.QEMU.PID)
		}
		if in.TAP != "" {
			line += " tap " + in.TAP
		}
		if in.Lock != "" {
			line += " lock " + in.Lock
		}
		p.f("%s\n", line)
	}
	if rec.TAP != "" {
		p.f("    tap: %s\n", rec.TAP)
	}
	if rec.Lock != "" {
		p.f("    lock: %s\n", rec.Lock)
	}
	p.f("    record: %s\n", s.Path)
	if h.Orphaned {
		p.f("    orphaned: stdio server whose client (pid %d) is gone\n", rec.PPID)
	}
	if !h.Alive && leftovers > 0 {
		p.f("    stale: %d leftover entr%s (see below)\n", leftovers, plural(leftovers, "y", "ies"))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, format, args...)
}

// taps lists the TAP devices a record names.
func taps(rec registry.Record) []string {
	var out []string
	if rec.TAP != "" {
		out = append(out, rec.TAP)
	}
	for _, in := range rec.Instances {
		if in.TAP != "" {
			out = append(out, in.TAP)
		}
	}
	return out
}
