// Package caps finds out what a QEMU binary can do with a guest's saved
// state, by trying it on the architecture's tiny kernel rather than
// reading its version: whether a loaded snapshot keeps the guest's timer,
// whether a snapshot loads into the QEMU that runs the guest (in place),
// and whether a checkpoint taken during a replay reloads faithfully with
// the double load. The answers are decided once per binary, keyed by its
// path, size and modification time, kept for the process and in a cache
// file (written atomically), and probing never hangs: every probe is
// bounded by a timeout, and one that fails says so (the server then takes
// the safe path). See docs in qemu-state.md for what the probes look for.
package caps

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/durable"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// probeVersion changes whenever a probe changes what it decides (its
// kernel included): cached answers of another version are probed again.
const probeVersion = 5

// Answers of a probe.
const (
	Yes    = "yes"
	No     = "no"
	Failed = "failed"
)

// Result is one capability's answer.
type Result struct {
	// Answer is Yes, No or Failed (the probe could not tell: the server
	// takes the safe path).
	Answer string `json:"answer"`
	// Detail says what the probe saw.
	Detail string `json:"detail,omitempty"`
	// Millis is how long the probe took.
	Millis int64 `json:"ms"`
}

// Yes reports whether the capability was probed and is there.
func (r Result) Yes() bool { return r.Answer == Yes }

// Caps is what one QEMU binary was found to do.
type Caps struct {
	Binary  string    `json:"binary"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mtime"`
	Version string    `json:"version,omitempty"`
	Probed  time.Time `json:"probed_at"`
	// ProbeVersion is probeVersion when the answers were decided.
	ProbeVersion int `json:"probe_version"`
	// TimerKept: a snapshot loaded into a fresh QEMU gives the guest its
	// timer back (its count where the save left it, and the timers it
	// had programmed still fire). Without it, the server repairs the
	// timer after every load.
	TimerKept Result `json:"timer_kept"`
	// InPlaceLoad: a snapshot loads into the QEMU that runs the guest and
	// the guest goes on (answers, and its time runs forward).
	InPlaceLoad Result `json:"in_place_load"`
	// ReplayCheckpoint: a checkpoint saved during a replay, loaded with
	// the double load (load, step one instruction, load again), replays
	// on to the same state as a replay from the start.
	ReplayCheckpoint Result `json:"replay_checkpoint"`
}

// Key identifies a binary: its path, size and modification time.
type Key struct {
	Path    string
	Size    int64
	ModTime time.Time
}

// KeyOf stats path (following symlinks: a link to a new QEMU is a new
// binary).
func KeyOf(path string) (Key, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Key{}, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return Key{}, err
	}
	return Key{Path: abs, Size: fi.Size(), ModTime: fi.ModTime().UTC()}, nil
}

func (k Key) matches(c *Caps) bool {
	return c.Binary == k.Path && c.Size == k.Size && c.ModTime.Equal(k.ModTime) && c.ProbeVersion == probeVersion
}

// failedAge is how long a cache file's answers stand when one of them is
// Failed: a probe that could not tell (a busy machine, a QEMU killed
// under it) is tried again by a server started later, where yes and no
// stand until the binary changes.
const failedAge = time.Hour

// retry says c holds an answer the probe could not decide, decided
// longer than failedAge before now.
func (c *Caps) retry(now time.Time) bool {
	failed := c.TimerKept.Answer == Failed || c.InPlaceLoad.Answer == Failed || c.ReplayCheckpoint.Answer == Failed
	return failed && now.Sub(c.Probed) > failedAge
}

// decided holds the answers any Prober of this process decided or read,
// by Key: the answers are facts about a binary, so whoever asks about it
// (Known, TimerKept) gets them. A Prober's Status says what it knows
// itself (from its own probing or cache).
var decided sync.Map // Key -> *Caps

// Known returns the answers for the binary at path if they are decided
// (probed by this process, or read from a cache by a Prober).
func Known(path string) (*Caps, bool) {
	k, err := KeyOf(path)
	if err != nil {
		return nil, false
	}
	c, ok := decided.Load(k)
	if !ok {
		return nil, false
	}
	return c.(*Caps), true
}

// TimerKept reports whether the binary at path is known to keep a loaded
// guest's timer; false when it is not known (the safe answer).
func TimerKept(path string) bool {
	c, ok := Known(path)
	return ok && c.TimerKept.Yes()
}

// Config configures a Prober.
type Config struct {
	// CacheDir holds the cached answers (one file per binary); empty
	// means no cache file.
	CacheDir string
	// WorkDir is where probes put their guests' FIFOs, sockets and images
	// (a private directory of its own is made in it for each run and
	// removed after); it should be short (unix socket paths) and private.
	WorkDir string
	// Owner names the work directory: "probe-<Owner>-<digits>" (a tag of
	// names.Owner), so that a reaper can tell whose it is; empty means
	// this process.
	Owner string
	// Arch is the architecture of the binaries probed (nil: the
	// default), and Kernel its tiny kernel, which the probes boot (its
	// bytes).
	Arch   arch.Arch
	Kernel []byte
	// Timeout bounds each probe; 0 means 30 s.
	Timeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// State is how far a binary's probing is.
type State string

const (
	NotProbed State = "not probed yet"
	Probing   State = "probing"
	Probed    State = "probed"
)

// Prober decides the answers for binaries, in the background, once each.
type Prober struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	inflight map[Key]chan struct{}
	errs     map[Key]error
	known    map[Key]*Caps
}

// learn records c as this Prober's and the process's answers for k.
func (p *Prober) learn(k Key, c *Caps) {
	p.mu.Lock()
	p.known[k] = c
	p.mu.Unlock()
	decided.Store(k, c)
}

// knows returns this Prober's answers for k, reading its cache if need be.
func (p *Prober) knows(k Key) *Caps {
	p.mu.Lock()
	c := p.known[k]
	p.mu.Unlock()
	if c != nil {
		return c
	}
	if c = p.readCache(k); c != nil {
		p.learn(k, c)
	}
	return c
}

// New returns a Prober; Close stops its probes.
func New(cfg Config) *Prober {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	ctx, cancel := context.WithCancel(context.Background())
	return &Prober{cfg: cfg, log: log, ctx: ctx, cancel: cancel, inflight: map[Key]chan struct{}{}, errs: map[Key]error{}, known: map[Key]*Caps{}}
}

// Close stops probes in progress (their QEMUs are killed, their files
// removed) and waits for them.
func (p *Prober) Close() {
	p.cancel()
	p.wg.Wait()
}

// Status says how far the binary at path is, and its answers once
// probed. It reads the cache file if the answers are not known yet.
func (p *Prober) Status(path string) (State, *Caps, error) {
	k, err := KeyOf(path)
	if err != nil {
		return NotProbed, nil, err
	}
	if c := p.knows(k); c != nil {
		return Probed, c, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.inflight[k]; ok {
		return Probing, nil, nil
	}
	return NotProbed, nil, p.errs[k]
}

// Start decides the answers for the binary at path in the background,
// unless they are known (or in the cache) or being decided. It returns a
// channel closed when they are.
func (p *Prober) Start(path string) <-chan struct{} {
	done := make(chan struct{})
	k, err := KeyOf(path)
	if err != nil {
		close(done)
		return done
	}
	if p.knows(k) != nil {
		close(done)
		return done
	}
	p.mu.Lock()
	if ch, ok := p.inflight[k]; ok {
		p.mu.Unlock()
		return ch
	}
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		close(done)
		return done
	}
	p.inflight[k] = done
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		c, err := p.decide(p.ctx, k)
		stopped := p.ctx.Err() != nil // closed: nothing failed
		p.mu.Lock()
		delete(p.inflight, k)
		if err != nil && !stopped {
			p.errs[k] = err
		} else {
			delete(p.errs, k)
		}
		p.mu.Unlock()
		switch {
		case stopped:
			p.log.Debug("probing QEMU stopped", "binary", k.Path)
		case err != nil:
			p.log.Warn("probing QEMU failed", "binary", k.Path, "err", err)
		default:
			p.log.Info("probed QEMU", "binary", k.Path, "timer_kept", c.TimerKept.Answer,
				"in_place_load", c.InPlaceLoad.Answer, "replay_checkpoint", c.ReplayCheckpoint.Answer)
		}
		close(done)
	}()
	return done
}

// Probe decides the answers for the binary at path now (or returns the
// known ones).
func (p *Prober) Probe(ctx context.Context, path string) (*Caps, error) {
	done := p.Start(path)
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st, c, err := p.Status(path)
	if st != Probed {
		if err == nil {
			err = errors.New("probing was stopped")
		}
		return nil, err
	}
	return c, nil
}

// decide probes k, unless another process is probing the same binary
// into the same cache: then it waits for that one's answers.
func (p *Prober) decide(ctx context.Context, k Key) (*Caps, error) {
	unlock, err := p.lockCache(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c := p.knows(k); c != nil { // decided while we waited
		return c, nil
	}
	c, err := p.probeAll(ctx, k)
	if err != nil {
		return nil, err
	}
	p.learn(k, c)
	if err := p.writeCache(k, c); err != nil {
		p.log.Warn("cannot cache QEMU's probed capabilities", "err", err)
	}
	return c, nil
}

func (p *Prober) cacheFile(k Key) string { return cachePath(p.cfg.CacheDir, k, ".json") }

// cachePath is a file about binary k in the cache directory dir: one name
// per binary path, ending in suffix (".json" for the capabilities).
func cachePath(dir string, k Key, suffix string) string {
	sum := sha256.Sum256([]byte(k.Path))
	return filepath.Join(dir, "qemu-caps", hex.EncodeToString(sum[:8])+suffix)
}

func (p *Prober) readCache(k Key) *Caps {
	c := readJSON[Caps](p.cfg.CacheDir, p.cacheFile(k))
	if c == nil || !k.matches(c) || c.retry(time.Now()) {
		return nil
	}
	return c
}

// readJSON decodes the JSON file f of the cache directory dir: nil without
// a cache directory, or if f cannot be read or decoded.
func readJSON[T any](dir, f string) *T {
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return nil
	}
	var v T
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return &v
}

// writeCache writes c atomically: a reader sees the old file or the new.
func (p *Prober) writeCache(k Key, c *Caps) error {
	if p.cfg.CacheDir == "" {
		return nil
	}
	return writeJSONAtomic(p.cacheFile(k), c)
}

// writeJSONAtomic writes v as JSON to f through a temporary file renamed
// over it: a reader sees the old file or the new.
func writeJSONAtomic(f string, v any) error {
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f), ".caps-*.tmp")
	if err != nil {
		return err
	}
	err = durable.WriteClose(tmp, append(b, '\n'))
	if err == nil {
		err = os.Rename(tmp.Name(), f)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// lockCache takes an exclusive flock on the binary's cache entry, so that
// servers started together probe it once; it waits for ctx at most.
func (p *Prober) lockCache(ctx context.Context, k Key) (func(), error) {
	if p.cfg.CacheDir == "" {
		return func() {}, nil
	}
	return lockFile(ctx, p.cacheFile(k)+".lock")
}

// lockFile takes an exclusive flock on f (made if need be); it waits for
// ctx at most.
func lockFile(ctx context.Context, f string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(f, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { lf.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			lf.Close()
			return nil, fmt.Errorf("lock %s: %w", f, err)
		}
		select {
		case <-ctx.Done():
			lf.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// workDir makes this run's private directory.
func (p *Prober) workDir() (string, error) {
	base := p.cfg.WorkDir
	if base == "" {
		base = os.TempDir()
	}
	owner := p.cfg.Owner
	if owner == "" {
		id, err := proc.Self()
		if err != nil {
			return "", err
		}
		owner = names.Owner{PID: id.PID, StartTime: id.StartTime}.Tag()
	}
	return os.MkdirTemp(base, names.ProbePrefix+owner+"-")
}

// CacheEnv overrides DefaultCacheDir (the scripts' caches use it too).
const CacheEnv = "QEMU_MCP_CACHE"

// DefaultCacheDir is $QEMU_MCP_CACHE, else $XDG_CACHE_HOME/qemu-mcp, else
// ~/.cache/qemu-mcp; "" if there is no home.
func DefaultCacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "qemu-mcp")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "qemu-mcp")
	}
	return ""
}
