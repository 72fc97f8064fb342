// Package instance runs a server's named QEMU guests. One guest's whole life
// (reap, repository lock, TAP, capture, QEMU, record) is one cleanup stack:
// each step of a boot pushes the function that undoes it, and the stack is
// unwound in reverse, once, from one place, whether the boot fails half-way,
// the guest is stopped, it powers itself off, or the server closes. Each
// instance has an explicit state (booting, running, stopping, stopped), and a
// stop ends a boot or a console wait in progress at once.
//
// A Manager holds the instances of one server and what they share: the
// runtime directory, the server's registry record (which names every
// instance's QEMU and TAP, so that a killed server's leftovers can be
// reaped), the repository lock (held while any instance of the repository
// runs), and the claims on writable disk images. It knows nothing of MCP.
package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
	"github.com/qemu-mcp/qemu-mcp/tap"
)

// DefaultMaxInstances is how many guests a server runs at once by default.
const DefaultMaxInstances = 4

// ErrClosed is returned by boots asked for after Close began.
var ErrClosed = errors.New("qemu-mcp is shutting down: no new guest is started")

// Config is what a Manager needs from the server that hosts it.
type Config struct {
	// RuntimeDir holds the FIFOs, QMP sockets and the record; it must
	// exist and be private (see internal/runtimedir). Transcripts and
	// captures go to its captures directory.
	RuntimeDir string
	// Record describes the server; it is written while an instance holds
	// something (see New), and every change to an instance rewrites it.
	// Its PID and start time name every file. Empty means this process's,
	// described by Transport, Address and Version.
	Record registry.Record
	// LockFile overrides the repository lock's path (see lock.Path).
	LockFile string
	// MaxInstances bounds the guests that run at once; 0 means
	// DefaultMaxInstances.
	MaxInstances int
	// RingSize is each console's in-memory buffer; 0 means serial's
	// default. Older output is read back from the transcript.
	RingSize int
	// Captures is where transcripts and captures are kept (see package
	// kept); empty means the runtime directory's captures directory.
	Captures string
	// KeepCap bounds the total size of what Captures keeps: the oldest
	// files not in use go first, checked at every boot and every
	// KeepInterval. 0 means kept.DefaultCap.
	KeepCap int64
	// KeepInterval is how often the cap is checked while the server runs;
	// 0 means 30 s.
	KeepInterval time.Duration
	// Snapshots is the snapshot store's directory: its size counts
	// towards KeepCap, though snapshots are never removed for it.
	Snapshots string
	// Recordings is the recording store's directory (package recording):
	// recordings count towards KeepCap and are never removed for it; their
	// checkpoints, a cache, are removed first.
	Recordings string
	// GDBTCP, if set, also serves debug guests' gdbstubs (unix sockets in
	// the runtime directory) on this loopback TCP address ("127.0.0.1:0":
	// a free port each), to the server's own user only.
	GDBTCP string
	// Logger receives what nobody else would see; nil means slog.Default().
	Logger *slog.Logger
	// Platforms are what the guests of each architecture boot with, by
	// the architecture's name (package archs): an architecture without
	// one boots its QEMU from PATH and has no built-in kernel.
	Platforms map[string]Platform
	// CacheDir keeps what was probed of QEMU binaries across runs
	// (empty: not kept).
	CacheDir string
	// Transport ("stdio" or "http"), Address and Version describe the
	// server in the record New makes when Record is not given.
	Transport, Address, Version string
	// HostPolicy is what host files a boot (BootArgs) may name; Boundary
	// what QEMU options it may add.
	HostPolicy hostpath.Policy
	Boundary   boundary.Policy
}

// Platform is what the guests of one architecture boot with.
type Platform struct {
	// QEMU is the system emulator, a path or a name looked up on PATH;
	// empty means the architecture's own name.
	QEMU string
	// Kernel is booted when a boot names no kernel, and Symbols is its
	// ELF, the debugger's symbols for it. Kernel also probes what the
	// architecture's QEMU binaries can do with saved state (package
	// qemu/caps); without it the server takes the safe path with them.
	Kernel, Symbols []byte
}

// policy is the host-access boundary of a guest of cfg: its
// architecture's board commands, and the property types of its QEMU.
func (m *Manager) policy(cfg qemu.Config) boundary.Policy {
	p := m.cfg.Boundary
	p.Arch = cfg.Arch
	if pp, ok := p.Props.(*caps.PropProber); ok {
		p.Props = pp.For(cfg.BinaryName())
	}
	return p
}

// platform is what guests of a boot; nil a means the default architecture.
func (m *Manager) platform(a arch.Arch) Platform {
	if a == nil {
		a = archs.Default()
	}
	p := m.cfg.Platforms[a.Name()]
	if p.QEMU == "" {
		p.QEMU = a.QEMU().Binary
	}
	return p
}

// DefaultName is the name of the guest a call names none of.
const DefaultName = names.DefaultInstance

// CheckName says why name cannot name an instance, or nil.
func CheckName(name string) error { return names.CheckInstance(name) }

// Defaults fills in what a server's configuration may leave out: the
// captures directory in the runtime directory, the snapshot and recording
// stores beside it, the cache of probed QEMU binaries, the cap.
func (c Config) Defaults() (Config, error) {
	if c.RuntimeDir == "" {
		return c, errors.New("instance: RuntimeDir is required")
	}
	if c.Captures == "" {
		c.Captures = runtimedir.CapturesDir(c.RuntimeDir)
	}
	if c.Snapshots == "" {
		c.Snapshots = kept.Snapshots(c.Captures)
	}
	if c.Recordings == "" {
		c.Recordings = kept.Recordings(c.Captures)
	}
	if c.CacheDir == "" {
		c.CacheDir = caps.DefaultCacheDir()
	}
	if c.KeepCap <= 0 {
		c.KeepCap = kept.DefaultCap
	}
	return c, nil
}

// QEMUFilesDir is where QMP commands may have QEMU write files
// (screendump, pmemsave, ...): a directory of their own in the captures
// directory, so no transcript, capture or record of the server can be a
// target.
func QEMUFilesDir(captures string) string { return filepath.Join(captures, "qemu") }

// Manager runs the named instances of one server.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	owner names.Owner

	// reapMu serialises reaps: two boots reaping at once would each try to
	// remove the same leftovers.
	reapMu sync.Mutex

	cursors captureCursors // where reads of capture files ended

	mu        sync.Mutex // guards the fields below
	closed    bool
	instances map[string]*Instance
	boots     map[string]int          // boot attempts per instance name
	drives    map[string][]driveClaim // by real path
	record    registry.Record
	recGone   bool // the record was removed at Close: never written again

	keepMu   sync.Mutex // one cap enforcement at a time
	stopKeep chan struct{}
	stopOnce sync.Once

	// caps probe each architecture's QEMU binaries, by the
	// architecture's name: none for one without a built-in kernel.
	caps map[string]*caps.Prober
	// probing are the architectures whose first booted binary is probed
	// (one per architecture and server).
	probeMu sync.Mutex
	probing map[string]bool
	// qemuVersions are asked of each emulator on first use, then kept.
	versionsMu   sync.Mutex
	qemuVersions map[string]func() string
	// seq numbers the files the server keeps for guests (screenshots,
	// answers).
	seq atomic.Int64

	recs  *Recordings
	locks *repoLocks
	// steps, if set, changes a boot's steps (tests fail a boot at each).
	steps func([]bootStep) []bootStep
}

type driveClaim struct {
	instance string
	writable bool
}

// New returns a Manager with no instances. The server's record is written
// with the first thing a boot holds that would outlive a killed server
// (the repository lock, a TAP, QEMU), before the rest is made, and removed
// once the last of them is released: it is what lets the next server reap
// after this one if it is killed, and a server that holds nothing leaves
// nothing behind however it dies (a SIGKILL right after SIGTERM included).
func New(cfg Config) (*Manager, error) {
	if cfg.RuntimeDir == "" {
		return nil, errors.New("instance: RuntimeDir is required")
	}
	if cfg.Record.PID == 0 {
		// This process's record, made once the server is about to
		// serve.
		transport := cfg.Transport
		if transport == "" {
			transport = registry.TransportStdio
		}
		rec, err := registry.Self(transport, cfg.Address, cfg.Version)
		if err != nil {
			return nil, fmt.Errorf("instance: %w", err)
		}
		cfg.Record = rec
	}
	if cfg.MaxInstances <= 0 {
		cfg.MaxInstances = DefaultMaxInstances
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Captures == "" {
		cfg.Captures = runtimedir.CapturesDir(cfg.RuntimeDir)
	}
	if cfg.KeepCap <= 0 {
		cfg.KeepCap = kept.DefaultCap
	}
	if cfg.KeepInterval <= 0 {
		cfg.KeepInterval = 30 * time.Second
	}
	if err := os.MkdirAll(cfg.Captures, 0o700); err != nil {
		return nil, fmt.Errorf("instance: captures directory: %w", err)
	}
	if err := os.MkdirAll(QEMUFilesDir(cfg.Captures), 0o700); err != nil {
		return nil, fmt.Errorf("instance: %w", err)
	}
	if err := cfg.Record.Validate(); err != nil {
		return nil, fmt.Errorf("instance: registry record: %w", err)
	}
	m := &Manager{
		cfg: cfg, log: cfg.Logger, owner: cfg.Record.Owner(),
		instances: map[string]*Instance{}, boots: map[string]int{},
		drives: map[string][]driveClaim{}, record: cfg.Record,
		stopKeep: make(chan struct{}),
	}
	m.recs = &Recordings{m: m, replays: map[string]string{}}
	m.locks = &repoLocks{log: cfg.Logger, lockFile: cfg.LockFile, runtimeDir: cfg.RuntimeDir, byPath: map[string]*lockRef{}}
	m.qemuVersions = map[string]func() string{}
	// What saves killed with an earlier server left goes at start.
	m.reapStores(nil)
	m.caps, m.probing = map[string]*caps.Prober{}, map[string]bool{}
	for _, a := range archs.All() {
		if k := m.platform(a).Kernel; len(k) > 0 && a.QEMU().Probe != nil {
			m.caps[a.Name()] = caps.New(caps.Config{CacheDir: cfg.CacheDir, WorkDir: cfg.RuntimeDir, Owner: m.owner.Tag(),
				Arch: a, Kernel: k, Logger: cfg.Logger.With("probe", "qemu", "arch", a.Name())})
		}
	}
	go m.keepLoop()
	return m, nil
}

// QEMUCaps says what is known of the QEMU binary's capabilities (see
// package qemu/caps): caps.NotProbed until a guest of it booted (or a
// cache of an earlier run has them).
func (m *Manager) QEMUCaps(binary string) (caps.State, *caps.Caps, error) {
	if len(m.caps) == 0 {
		return caps.NotProbed, nil, errors.New("this server does not probe QEMU")
	}
	// The binary is one architecture's; whichever Prober probes (or
	// probed) it knows, and any reads the cache.
	for _, a := range archs.All() {
		if p := m.caps[a.Name()]; p != nil {
			if st, c, err := p.Status(binary); st != caps.NotProbed || err != nil {
				return st, c, err
			}
		}
	}
	return caps.NotProbed, nil, nil
}

// probeQEMU decides the capabilities of the QEMU binary a guest of
// architecture a booted with (its path, as QEMU was started: a name from
// PATH would not be found again by the probe nor by a restore's question),
// in the background, unless they are known. It waits a little
// first: the probe boots guests of its own, which should not compete with
// the user's first boot, and a server that lives a few seconds (a one-off
// call from a command line) has no use for it.
func (m *Manager) probeQEMU(a arch.Arch, binary string) {
	if a == nil {
		a = archs.Default()
	}
	// The probe's guest is the architecture's built-in kernel.
	p := m.caps[a.Name()]
	if p == nil {
		return
	}
	m.probeMu.Lock()
	first := !m.probing[a.Name()]
	m.probing[a.Name()] = true
	m.probeMu.Unlock()
	if !first {
		return
	}
	// Answers cached by an earlier run count at once.
	if st, _, _ := p.Status(binary); st == caps.Probed {
		return
	}
	time.AfterFunc(probeDelay, func() { p.Start(binary) })
}

// probeDelay is how long after its first boot a binary is probed.
const probeDelay = 2 * time.Second

// keepLoop holds the kept files to their cap while the server runs: a
// flooding guest's transcript grows between boots too.
func (m *Manager) keepLoop() {
	t := time.NewTicker(m.cfg.KeepInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stopKeep:
			return
		case <-t.C:
			m.enforceCap()
		}
	}
}

// enforceCap removes the oldest kept files, never the transcript or capture
// of an instance that is not stopped, until the rest fits the cap.
func (m *Manager) enforceCap() []kept.File {
	m.keepMu.Lock()
	defer m.keepMu.Unlock()
	inUse := map[string]bool{}
	for _, i := range m.List() {
		if i.State() == Stopped {
			continue
		}
		inUse[i.Transcript()] = true
		if st, active, ok := i.net.CaptureStats(); ok && active {
			inUse[st.Path] = true
		}
	}
	var snapshots int64
	if m.cfg.Snapshots != "" {
		snapshots = snapshot.Store{Dir: m.cfg.Snapshots}.Total()
	}
	if m.cfg.Recordings != "" {
		// Checkpoints are a cache: they go before anything kept.
		store := m.recs.store()
		total, cks := store.Total()
		files, _ := kept.List(m.cfg.Captures)
		if over := kept.Total(files) + snapshots + total - m.cfg.KeepCap; over > 0 && cks > 0 {
			freed, n := store.Evict(over)
			total -= freed
			m.log.Info("removed replay checkpoints: the kept files passed their cap", "checkpoints", n, "bytes", freed, "cap", m.cfg.KeepCap)
		}
		snapshots += total
	}
	removed, err := kept.Enforce(m.cfg.Captures, m.cfg.KeepCap, snapshots, func(p string) bool {
		if inUse[p] {
			return true
		}
		// Another live server's files may be in use by it: never ours
		// to remove.
		o, ok := names.KeptOwner(filepath.Base(p))
		if !ok || o == m.owner {
			return false
		}
		live, _, err := proc.Check(proc.Identity{PID: o.PID, StartTime: o.StartTime})
		return err != nil || live == proc.Alive
	})
	if err != nil {
		m.log.Warn("hold kept files to their cap", "dir", m.cfg.Captures, "err", err)
	}
	for _, f := range removed {
		m.log.Info("removed the oldest kept file: the kept files passed their cap", "path", f.Path, "size", f.Size, "cap", m.cfg.KeepCap)
	}
	return removed
}

// keptPath is a new file of the kept files: kind (names.Kept*) for
// instance name, with extension ext.
func (m *Manager) keptPath(kind, name, ext string) string {
	return filepath.Join(m.cfg.Captures, fmt.Sprintf("%s-%d%s", names.Kept(kind, m.owner, name), m.seq.Add(1), ext))
}

// Owner is the identity every name the server gives carries.
func (m *Manager) Owner() names.Owner { return m.owner }

// KeepCap is the total size of the kept files (transcripts, captures,
// snapshots, recordings) the server holds itself to.
func (m *Manager) KeepCap() int64 { return m.cfg.KeepCap }

// MaxInstances is the most guests that run at once.
func (m *Manager) MaxInstances() int { return m.cfg.MaxInstances }

// Record returns the server's record as last written.
func (m *Manager) Record() registry.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.record
	r.Instances = slices.Clone(r.Instances)
	return r
}

// Get returns the instance of that name, running or not.
func (m *Manager) Get(name string) (*Instance, error) {
	if err := names.CheckInstance(name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := m.instances[name]; i != nil {
		return i, nil
	}
	return nil, m.noSuchLocked(name)
}

func (m *Manager) noSuchLocked(name string) error {
	var known []string
	for n := range m.instances {
		known = append(known, n)
	}
	slices.Sort(known)
	return &NotFoundError{Name: name, Known: known}
}

// List returns every instance, ordered by name.
func (m *Manager) List() []*Instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Instance, 0, len(m.instances))
	for _, i := range m.instances {
		out = append(out, i)
	}
	slices.SortFunc(out, func(a, b *Instance) int { return strings.Compare(a.name, b.name) })
	return out
}

// Boot starts the instance spec.Name. A live instance of that name is an
// error unless spec.Restart, which stops it first; a stopped one is
// replaced. The boot's steps are undone if any fails, if ctx ends, or if
// the instance is stopped meanwhile. The reaper's report is non-nil when it
// found something of dead servers.
func (m *Manager) Boot(ctx context.Context, spec Spec) (*Instance, *reaper.Report, error) {
	owned := true // the symbols, until an instance takes them
	defer func() {
		if owned && spec.Debug != nil && spec.Debug.Symbols != nil {
			spec.Debug.Symbols.Close()
		}
	}()
	if err := names.CheckInstance(spec.Name); err != nil {
		return nil, nil, err
	}
	if err := spec.check(); err != nil {
		return nil, nil, err
	}
	if spec.Snapshot != nil {
		if err := m.Snapshots().findBoot(&spec); err != nil {
			return nil, nil, err
		}
	}
	if spec.Replay != nil {
		if err := m.recs.findReplay(&spec); err != nil {
			return nil, nil, err
		}
	}
	i, err := m.admit(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	owned = false // the instance closes them now
	reaped, err := i.run(ctx)
	if err != nil {
		return nil, reaped, err
	}
	return i, reaped, nil
}

// admit places a new booting instance in the table, stopping the previous
// one first if spec.Restart says so.
func (m *Manager) admit(ctx context.Context, spec Spec) (*Instance, error) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		prev := m.instances[spec.Name]
		if prev != nil && prev.State() != Stopped {
			m.mu.Unlock()
			if prev.State() == Stopping || (!spec.Restart && prev.vm.exited()) {
				// Going away (its guest exited, or a stop runs): the name
				// is free once its cleanup has run, milliseconds from now.
				// A client that boots again as soon as it saw the exit
				// must not be told the guest is busy.
				select {
				case <-prev.Done():
					continue
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				case <-time.After(5 * time.Second):
				}
			}
			if !spec.Restart {
				return nil, busyError(prev)
			}
			// What would refuse the new boot refuses it before the
			// running guest is stopped, not after.
			if err := m.precheck(spec, prev); err != nil {
				return nil, err
			}
			if _, err := prev.Stop(ctx, qemu.Quit, 5*time.Second); err != nil {
				return nil, fmt.Errorf("stop the running guest %q before the restart: %w", spec.Name, err)
			}
			continue // someone may have booted the name meanwhile: look again
		}
		if live := m.liveLocked(); len(live) >= m.cfg.MaxInstances {
			m.mu.Unlock()
			return nil, &TooManyError{Live: live, Max: m.cfg.MaxInstances}
		}
		m.boots[spec.Name]++
		i := newInstance(m, spec, m.boots[spec.Name])
		m.instances[spec.Name] = i
		m.pruneLocked()
		m.mu.Unlock()
		return i, nil
	}
}

func (m *Manager) liveLocked() []string {
	var live []string
	for n, i := range m.instances {
		if i.State() != Stopped {
			live = append(live, n)
		}
	}
	slices.Sort(live)
	return live
}

// pruneLocked forgets the oldest stopped instances once there are more than
// MaxInstances of them: each holds its console's ring in memory, and its
// transcript keeps the output on disk anyway.
func (m *Manager) pruneLocked() {
	var stopped []*Instance
	for _, i := range m.instances {
		if i.State() == Stopped {
			stopped = append(stopped, i)
		}
	}
	if len(stopped) <= m.cfg.MaxInstances {
		return
	}
	slices.SortFunc(stopped, func(a, b *Instance) int { return a.created.Compare(b.created) })
	for _, i := range stopped[:len(stopped)-m.cfg.MaxInstances] {
		delete(m.instances, i.name)
	}
}

// Close refuses new boots, stops every instance (QMP quit, then signals)
// and removes the server's record. It waits for boots in progress to
// unwind. Safe to call more than once.
func (m *Manager) Close(ctx context.Context) error {
	m.stopOnce.Do(func() { close(m.stopKeep) })
	for _, p := range m.caps {
		p.Close() // a probe's QEMU goes before the record does
	}
	m.mu.Lock()
	m.closed = true
	all := make([]*Instance, 0, len(m.instances))
	for _, i := range m.instances {
		all = append(all, i)
	}
	m.mu.Unlock()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for k, i := range all {
		wg.Go(func() {
			if _, err := i.Stop(ctx, qemu.Quit, 5*time.Second); err != nil {
				errs[k] = fmt.Errorf("stop %q: %w", i.name, err)
			}
		})
	}
	wg.Wait()
	m.mu.Lock()
	m.recGone = true
	m.mu.Unlock()
	if err := registry.Remove(m.cfg.RuntimeDir, m.owner); err != nil {
		errs = append(errs, fmt.Errorf("remove registry record: %w", err))
	}
	return errors.Join(errs...)
}

// recordInstance changes the record's entry for instance name (adding it
// if needed) and writes the record.
func (m *Manager) recordInstance(name string, f func(*registry.Instance)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := slices.IndexFunc(m.record.Instances, func(in registry.Instance) bool { return in.Name == name })
	if k < 0 {
		m.record.Instances = append(m.record.Instances, registry.Instance{Name: name})
		k = len(m.record.Instances) - 1
	}
	f(&m.record.Instances[k])
	if in := m.record.Instances[k]; in.QEMU == nil && in.TAP == "" && in.Lock == "" {
		m.record.Instances = slices.Delete(m.record.Instances, k, k+1)
	}
	m.writeRecordLocked()
}

func (m *Manager) writeRecordLocked() {
	if m.recGone {
		return
	}
	if len(m.record.Instances) == 0 {
		// Nothing left that the next server would reap.
		if err := registry.Remove(m.cfg.RuntimeDir, m.owner); err != nil {
			m.log.Warn("remove registry record", "err", err)
		}
		return
	}
	if err := registry.Write(m.cfg.RuntimeDir, m.record); err != nil {
		m.log.Warn("update registry record", "err", err)
	}
}

// reap removes what dead servers left. Failing to reap is not a reason to
// refuse a boot: it is reported instead.
func (m *Manager) reap() *reaper.Report {
	m.reapMu.Lock()
	defer m.reapMu.Unlock()
	rep, err := reaper.Reap(m.cfg.RuntimeDir, reaper.Options{Self: m.owner, Logger: m.log, DeleteTAP: m.deleteDeadTAP})
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	// After the dead servers' QEMUs are gone: their drives are free.
	m.reapStores(&rep)
	if len(rep.DeadServers) == 0 && len(rep.Errors) == 0 && len(rep.Skipped) == 0 && len(rep.Removed) == 0 {
		return nil
	}
	m.log.Info("reaped leftovers of dead servers", "report", rep.String())
	return &rep
}

// reapStores removes what killed saves, recording starts and checkpoint
// saves left in the snapshot and recording stores, and marks recordings
// whose server died while they recorded as cut (see the stores' Reap),
// adding it to rep if there is one.
func (m *Manager) reapStores(rep *reaper.Report) {
	if m.cfg.Snapshots != "" {
		r, err := m.Snapshots().Store().Reap()
		m.noteReap("snapshot save", "snapshot store", r, err, rep)
	}
	if m.cfg.Recordings != "" {
		r, err := m.recs.store().Reap()
		m.noteReap("recording", "recording store", r, err, rep)
	}
}

// noteReap logs the reap r of the store called name, whose leftovers
// killed work of the kind killed left, and adds it to rep if there is one.
func (m *Manager) noteReap(killed, name string, r store.Report, err error, rep *reaper.Report) {
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	for _, l := range r.Removed {
		m.log.Info("removed a leftover of a killed "+killed, "what", l.String())
	}
	for _, l := range r.Left {
		m.log.Warn("a leftover of a killed "+killed+" stays for now", "what", l.String())
	}
	for _, n := range r.Cut {
		m.log.Info("a recording's server was killed while it recorded: the recording is cut", "recording", n)
	}
	for _, e := range r.Errors {
		m.log.Warn(name, "err", e)
	}
	if rep == nil {
		return
	}
	for _, l := range r.Removed {
		p := l.Path
		if l.Tag != "" {
			p += " (tag " + l.Tag + ")"
		}
		rep.Removed = append(rep.Removed, p)
	}
	for _, l := range r.Left {
		rep.Skipped = append(rep.Skipped, reaper.Skip{Path: l.Path + " (tag " + l.Tag + ")", Reason: l.Why})
	}
	rep.Errors = append(rep.Errors, r.Errors...)
}

// deleteDeadTAP deletes a dead server's TAP; a name one of our instances
// uses is never deleted, whatever a record says.
func (m *Manager) deleteDeadTAP(name string) error {
	m.mu.Lock()
	for _, in := range m.record.Instances {
		if in.TAP == name {
			m.mu.Unlock()
			return fmt.Errorf("TAP %s belongs to this server's instance %q: not deleted", name, in.Name)
		}
	}
	m.mu.Unlock()
	return DeleteTAP(name)
}

// DeleteTAP deletes a TAP of that name if it is a tun/tap link; a missing one
// is fine. It is the reaper's hook, for doctor too.
func DeleteTAP(name string) error {
	_, err := tap.DeleteIfTAP(name)
	return err
}

// precheck tells whether a boot of spec would be refused by what can be
// known before it starts: another instance's drives, a repository lock
// that another process holds, the TAP (privilege, or the named one), the
// capture filter, the snapshot to start from. A restart runs it before it
// stops prev, the running guest of the same name, which it leaves alone
// when the boot would fail.
func (m *Manager) precheck(spec Spec, prev *Instance) error {
	m.mu.Lock()
	err := m.drivesFreeLocked(spec.Name, driveClaims(spec.Name, spec.QEMU.Drives))
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if c := spec.Capture; c != nil {
		if _, err := pcap.Compile(c.Filter); err != nil {
			return fmt.Errorf("capture at boot: %w", err)
		}
	}
	if t := spec.TAP; t != nil {
		if t.Name != "" {
			// The guest being restarted may hold it: it lets go first.
			held := prev != nil && prev.TAP() != nil && prev.TAP().Name == t.Name
			if _, err := tap.Existing(t.Name, held); err != nil {
				return fmt.Errorf("network tap %s: %w", t.Name, err)
			}
		} else if err := tap.CheckCreate(t.Bridge); err != nil {
			return fmt.Errorf("network tap: %w", newTAPError(err))
		}
	}
	if s := spec.Snapshot; s != nil {
		if err := m.Snapshots().Store().CheckStage(s.meta, m.cfg.RuntimeDir); err != nil {
			return err
		}
	}
	path, err := m.locks.path(spec.Root)
	if err != nil {
		return fmt.Errorf("find the repository lock for %s: %w", spec.Root, err)
	}
	if _, ours := m.locks.holds(path); ours {
		return nil
	}
	if st, err := lock.Inspect(path); err == nil && st.Refuses() {
		return fmt.Errorf("cannot boot: %v", st.Held)
	}
	return nil
}

// driveClaims are the claims instance name makes for drives, by real path.
func driveClaims(name string, drives []qemu.Drive) map[string]driveClaim {
	claims := make(map[string]driveClaim, len(drives))
	for _, d := range drives {
		key := d.Path
		if real, err := filepath.EvalSymlinks(d.Path); err == nil {
			key = real
		}
		c := claims[key]
		claims[key] = driveClaim{instance: name, writable: c.writable || !d.ReadOnly}
	}
	return claims
}

// drivesFreeLocked refuses claims that conflict with another instance's.
func (m *Manager) drivesFreeLocked(name string, claims map[string]driveClaim) error {
	for key, w := range claims {
		for _, c := range m.drives[key] {
			if c.instance != name && (w.writable || c.writable) {
				how := "read-only"
				if c.writable {
					how = "writable"
				}
				return fmt.Errorf("drive %s is in use (%s) by the running instance %q: a writable image backs one running guest at a time; stop %q first, or attach the image readonly in both",
					key, how, c.instance, c.instance)
			}
		}
	}
	return nil
}

// claimDrives makes sure no other live instance uses a drive that one of
// these writes, nor writes one these use. The returned function releases
// the claims.
func (m *Manager) claimDrives(name string, drives []qemu.Drive) (func() error, error) {
	claims := driveClaims(name, drives)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.drivesFreeLocked(name, claims); err != nil {
		return nil, err
	}
	for key, w := range claims {
		m.drives[key] = append(m.drives[key], w)
	}
	return func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for key := range claims {
			m.drives[key] = slices.DeleteFunc(m.drives[key], func(c driveClaim) bool { return c.instance == name })
			if len(m.drives[key]) == 0 {
				delete(m.drives, key)
			}
		}
		return nil
	}, nil
}
