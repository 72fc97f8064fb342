package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/internal/filecopy"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/qcow2state"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// ReplaySpec replays a recording instead of booting: the guest is the
// recording's machine, halted at its first instruction, and its debugger
// goes back and forth through the recording.
type ReplaySpec struct {
	// Name is the project's recording; Manager.Boot finds it (Meta) and
	// checks that the boot gives its machine.
	Name string
	Meta recording.Meta
}

// ErrReplay is input or a change asked of a guest that replays a
// recording: what it does comes from the recording.
var ErrReplay = errors.New("the guest replays a recording")

// replayer is a replaying guest's recording and how it moves through it:
// the debugger's Timeline.
type replayer struct {
	i     *Instance
	store recording.Store
	meta  recording.Meta
	// end is the last instruction count the replay stops at.
	end uint64
	// staged is the copy of the recording's image this QEMU loads (it
	// writes into it); conFile where QEMU writes the console.
	staged, conFile string
	// inPlace: this QEMU reloads a checkpoint taken during a replay
	// faithfully with the double load (probed: until it is known, the
	// replay goes back by starting over); version is its version, whose
	// checkpoints it loads.
	bin     string
	inPlace bool
	version string
	pump    *pump

	mu      sync.Mutex
	failed  map[uint64]bool
	runFrom uint64 // the position the last run or checkpoint began at
	// regions is where RAM is in the machine's physical address space
	// (asked of QEMU once); states the start points' saved states, read
	// without loading them.
	regions []qcow2state.Region
	states  *qcow2state.Cache
}

// savedStates is how many start points' saved states stay indexed and
// open (a 10^9-instruction recording with idle stretches has 60 to 100
// checkpoints; the index of a 256 MiB guest's state is about 130 KB).
const savedStates = 128

// replayPosition is the record or replay position, in instructions.
func replayPosition(ctx context.Context, mch *qemu.Machine) (uint64, error) {
	raw, err := mch.Monitor().Execute(ctx, "query-replay", nil)
	if err != nil {
		return 0, err
	}
	var r struct {
		ICount uint64 `json:"icount"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, fmt.Errorf("query-replay: %w", err)
	}
	return r.ICount, nil
}

// prepareReplay makes cfg and rt replay the recording: its log (whole: a
// log QEMU was killed writing gets its header), a copy of its image, the
// console into a file the instance reads, halted at the start. A
// recording whose end is not known yet is replayed once to find it.
func (i *Instance) prepareReplay(ctx context.Context, cfg *qemu.Config, rt *qemu.Runtime) error {
	m := i.mgr
	meta := i.spec.Replay.Meta
	if u := meta.Unreadable(); u != "" {
		return fmt.Errorf("recording %q cannot be replayed: %s", meta.Name, u)
	}
	if meta.Status() == recording.Recording {
		return fmt.Errorf("recording %q is still being recorded (by guest %q): stop that guest first", meta.Name, meta.Instance)
	}
	lv, err := qemu.LogVersion(ctx, cfg.Binary, m.cfg.RuntimeDir)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if meta.LogVersion != 0 && lv != meta.LogVersion {
		return fmt.Errorf("recording %q was made by QEMU %s (log format %#x) and this QEMU writes format %#x: replay it with the QEMU that recorded it (%s)", meta.Name, meta.QEMU, meta.LogVersion, lv, meta.Binary)
	}
	for _, d := range meta.Drives {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return fmt.Errorf("recording %q read drive %s: %w", meta.Name, d.Path, err)
		}
		if fi.Size() != d.Size || !fi.ModTime().Equal(d.ModTime) {
			return fmt.Errorf("drive %s changed since recording %q was made (%d bytes modified %s, then %d bytes modified %s): a replay reads it as the recording did only if it is unchanged",
				d.Path, meta.Name, d.Size, d.ModTime.Format(time.RFC3339), fi.Size(), fi.ModTime().UTC().Format(time.RFC3339))
		}
	}
	if h, err := recording.ReadHeader(meta.Log()); err != nil {
		return fmt.Errorf("recording %q: its log: %w", meta.Name, err)
	} else if h == 0 {
		// Cut before QEMU wrote its header (a recording of an older
		// version, killed).
		if err := recording.WriteHeader(meta.Log(), lv); err != nil {
			return fmt.Errorf("recording %q: complete its log: %w", meta.Name, err)
		}
	}
	release, err := m.claimRecording(meta, i.name)
	if err != nil {
		return err
	}
	i.push("recording claim", func() error { release(); return nil })
	dir := m.cfg.RuntimeDir
	r := &replayer{i: i, store: m.recordings(), meta: meta, failed: map[uint64]bool{},
		staged:  filepath.Join(dir, names.Name(names.ReplayStage, m.owner, i.name)),
		conFile: filepath.Join(dir, names.Name(names.ReplayConsole, m.owner, i.name)),
		states:  qcow2state.NewCache(savedStates)}
	i.push("replay saved states", func() error { r.states.Close(); return nil })
	for _, p := range []string{r.staged, r.conFile} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replay: %w", err)
		}
	}
	if err := filecopy.New(meta.Image(), r.staged); err != nil {
		return fmt.Errorf("replay %q: copy its image: %w", meta.Name, err)
	}
	i.push("replay image", func() error { return removeIfThere(r.staged) })
	f, err := os.OpenFile(r.conFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	f.Close()
	i.push("replay console", func() error { return removeIfThere(r.conFile) })
	cfg.RR = &qemu.RR{Replay: true, Log: meta.Log(), Image: r.staged}
	cfg.ConsoleFile = r.conFile
	rt.Paused = true
	r.bin = cfg.Binary
	if r.bin == "" {
		r.bin = qemu.DefaultBinary
	}
	// Reads what an earlier run probed of the binary, if anything.
	m.QEMUCaps(r.bin)
	switch {
	case meta.State == recording.Complete && meta.Instructions > 0:
		// It stopped at Instructions, and QEMU replays its quit there.
		r.end = meta.Instructions - 1
	case meta.EndFound:
		r.end = meta.Instructions
	default:
		if r.end, err = i.findEnd(ctx, *cfg, *rt, r); err != nil {
			return err
		}
		meta.Instructions, meta.EndFound = r.end, true
		if err := r.store.Update(meta); err != nil {
			m.log.Warn("note where a recording ends", "recording", meta.Name, "err", err)
		}
		r.meta = meta
	}
	i.mu.Lock()
	i.rep = r
	i.mu.Unlock()
	return nil
}

// findEnd replays a recording whose end is not known (cut by a kill, or
// ended by the guest) to its end, where QEMU exits, watching how far it
// gets: one instruction before the last count seen is where later
// replays stop.
func (i *Instance) findEnd(ctx context.Context, cfg qemu.Config, rt qemu.Runtime, r *replayer) (uint64, error) {
	rt.GDBSocket, rt.GDBTCP, rt.Paused, rt.BeforeCont = "", "", false, nil
	cfg.Files = nil
	if len(i.spec.QEMU.Files) > 0 {
		files, err := dupFiles(i.spec.QEMU.Files)
		if err != nil {
			return 0, err
		}
		cfg.Files = files
	}
	mch, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return 0, fmt.Errorf("replay %q to find its end: %w", r.meta.Name, err)
	}
	defer mch.Close()
	var last uint64
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-mch.Done():
			if last == 0 {
				return 0, fmt.Errorf("recording %q does not replay: QEMU %s: %s", r.meta.Name, mch.Stderr(), "its log holds nothing QEMU can replay")
			}
			// The last count seen may be the very instruction where the
			// log runs out: a break there races QEMU's exit (its main
			// loop reads past the log's last event, fails and exits
			// before the break stops the replay, as a loaded 11.1 did).
			// One instruction before, the last event is still running.
			end := last - 1
			i.mgr.log.Info("found where a recording ends", "recording", r.meta.Name, "icount", end, "last_seen", last)
			os.Truncate(r.conFile, 0)
			return end, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		case <-t.C:
			if n, err := replayPosition(ctx, mch); err == nil && n > last {
				last = n
			}
		}
	}
}

// startReplay starts reading what the replaying QEMU prints into the
// console, once it runs.
func (i *Instance) startReplay() error {
	r := i.replayer()
	p, err := newPump(r.conFile, i.console.Buffer(), i.mgr.log.With("instance", i.name))
	if err != nil {
		return err
	}
	r.pump = p
	i.push("replay console reader", func() error { p.close(); return nil })
	if mch := i.Machine(); mch != nil {
		r.version = mch.Version()
	}
	return nil
}

func (i *Instance) replayer() *replayer {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.rep
}

// Replaying is the recording the guest replays, if it replays one.
func (i *Instance) Replaying() (recording.Meta, bool) {
	r := i.replayer()
	if r == nil {
		return recording.Meta{}, false
	}
	return r.meta, true
}

// Input says why the guest takes no input, if it does not: a replay's
// input comes from its recording.
func (i *Instance) Input() error {
	if r := i.replayer(); r != nil {
		return fmt.Errorf("guest %q %w (%q): its console input is the recording's, so nothing typed reaches it; boot it live (without replay) to type on it", i.name, ErrReplay, r.meta.Name)
	}
	return nil
}

// The Timeline of a replaying guest.

func (r *replayer) mch() (*qemu.Machine, error) { return r.i.Running() }

func (r *replayer) Position(ctx context.Context) (uint64, error) {
	m, err := r.mch()
	if err != nil {
		return 0, err
	}
	return replayPosition(ctx, m)
}

func (r *replayer) End() uint64 { return r.end }

func (r *replayer) StopAt(ctx context.Context, n uint64) error {
	m, err := r.mch()
	if err != nil {
		return err
	}
	if pos, err := replayPosition(ctx, m); err == nil {
		r.mu.Lock()
		r.runFrom = pos
		r.mu.Unlock()
	}
	_, err = m.Monitor().Execute(ctx, "replay-break", map[string]any{"icount": n})
	return err
}

func (r *replayer) InPlace() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.inPlace {
		if p, err := exec.LookPath(r.bin); err == nil {
			c, ok := caps.Known(p)
			r.inPlace = ok && c.ReplayCheckpoint.Yes()
		}
	}
	return r.inPlace
}

func (r *replayer) checkpoints() []recording.Checkpoint {
	if !r.InPlace() || r.version == "" {
		return nil
	}
	return r.meta.Checkpoints(r.version)
}

func (r *replayer) Starts(n uint64) []uint64 {
	cks := r.checkpoints()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for k := len(cks) - 1; k >= 0; k-- {
		if c := cks[k].ICount; c <= n && c > 0 && !r.failed[c] && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	if !r.failed[0] {
		out = append(out, 0)
	}
	return out
}

// node is where a checkpoint's image is attached while it is loaded or
// saved.
const ckNode = "qmcp-ck"

func (r *replayer) Load(ctx context.Context, n uint64) error {
	m, err := r.mch()
	if err != nil {
		return err
	}
	if n == 0 {
		if err := m.Monitor().RunJob(ctx, "snapshot-load", map[string]any{"tag": qemu.RRSnapshot, "vmstate": qemu.RRNode, "devices": []string{qemu.RRNode}}); err != nil {
			return fmt.Errorf("load the recording's start: %w", err)
		}
		r.pump.reset(0)
		return nil
	}
	var ck *recording.Checkpoint
	for _, c := range r.checkpoints() {
		if c.ICount == n {
			ck = &c
		}
	}
	if ck == nil {
		return fmt.Errorf("no checkpoint at instruction %d any more (evicted)", n)
	}
	err = r.withImage(ctx, m, ck.Path, func() error {
		return m.Monitor().RunJob(ctx, "snapshot-load", map[string]any{"tag": recording.CheckpointTag, "vmstate": ckNode, "devices": []string{ckNode}})
	})
	if err != nil {
		return fmt.Errorf("load the checkpoint at instruction %d: %w", n, err)
	}
	r.pump.reset(ck.Console)
	return nil
}

// withImage runs f with the qcow2 at path attached as ckNode.
func (r *replayer) withImage(ctx context.Context, m *qemu.Machine, path string, f func() error) error {
	mon := m.Monitor()
	// No flush at each stop and cont while it is attached: a save is
	// synced when it is committed, a load only reads.
	if _, err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": ckNode, "cache": qemu.SnapshotCache,
		"file": map[string]any{"driver": "file", "filename": path}}); err != nil {
		return err
	}
	ferr := f()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := mon.Execute(dctx, "blockdev-del", map[string]any{"node-name": ckNode})
	return errors.Join(ferr, err)
}

func (r *replayer) Failed(n uint64, why string) {
	r.mu.Lock()
	r.failed[n] = true
	r.mu.Unlock()
	if n == 0 {
		return
	}
	for _, c := range r.checkpoints() {
		if c.ICount == n {
			// A point that does not load is no use to any replay.
			if err := r.store.DropCheckpoint(c); err != nil {
				r.i.mgr.log.Warn("drop a checkpoint that does not load", "path", c.Path, "err", err)
			}
			r.states.Forget(c.Path)
		}
	}
}

func (r *replayer) Restart(ctx context.Context) error { return r.i.restartReplay(ctx) }

// Guard holds the replaying QEMU's exit for the debugger until release:
// QEMU 11 can crash loading a checkpoint (SIGSEGV), and that is not the
// guest's end but a failed load, after which the debugger starts a new
// QEMU (Restart). A QEMU that died under the guard and was not replaced
// ends the guest when the guard is released.
func (r *replayer) Guard() (release func()) {
	i := r.i
	i.mu.Lock()
	mch := i.machine
	i.guarded++
	i.mu.Unlock()
	return func() {
		i.mu.Lock()
		i.guarded--
		dead := i.guarded == 0 && !i.replacing && i.machine == mch && mch != nil
		i.mu.Unlock()
		if !dead {
			return
		}
		if exit, ok := mch.Exited(); ok {
			i.lost(fmt.Errorf("QEMU %s while it loaded a replay checkpoint", exit))
		}
	}
}

// checkpointSpacing is how much replay time apart checkpoints are kept:
// going back costs at most about that, plus a load.
const checkpointSpacing = 300 * time.Millisecond

func (r *replayer) Spacing() time.Duration {
	if !r.InPlace() || r.version == "" || r.i.mgr.cfg.Recordings == "" {
		return 0
	}
	return checkpointSpacing
}

func (r *replayer) Checkpoint(ctx context.Context, n uint64, spent time.Duration) error {
	if r.Spacing() == 0 || n == 0 {
		return nil
	}
	r.mu.Lock()
	from := r.runFrom
	r.runFrom = n
	r.mu.Unlock()
	// No second checkpoint within half the spacing's replay of another.
	gap := uint64(0)
	if n > from && spent > 0 {
		gap = uint64(float64(n-from) * float64(checkpointSpacing) / float64(spent) / 2)
	}
	for _, c := range r.checkpoints() {
		if c.ICount+gap >= n && c.ICount <= n+gap {
			r.i.mgr.log.Debug("replay checkpoint not needed: one is near", "icount", n, "near", c.ICount, "gap", gap)
			return nil
		}
	}
	m, err := r.mch()
	if err != nil {
		return err
	}
	t0 := time.Now()
	r.pump.sync()
	ck, err := r.store.NewCheckpoint(r.meta, n)
	if err != nil {
		return err
	}
	ck.Console, ck.QEMU, ck.Cost = r.pump.position(), r.version, spent.Seconds()
	if err := ck.NewImage(); err != nil {
		return err
	}
	err = r.withImage(ctx, m, ck.Path, func() error {
		return m.Monitor().RunJob(ctx, "snapshot-save", map[string]any{"tag": recording.CheckpointTag, "vmstate": ckNode, "devices": []string{ckNode}})
	})
	t1 := time.Now()
	if err == nil {
		err = r.store.CommitCheckpoint(ck)
	}
	if err != nil {
		r.store.DropCheckpoint(ck)
		return err
	}
	r.i.mgr.log.Debug("replay checkpoint saved", "icount", n, "spent", spent, "save", t1.Sub(t0), "commit", time.Since(t1))
	go r.i.mgr.enforceCap()
	// Index its saved state now, while the file is in the page cache and
	// the replay runs on: reading the state later costs a read, not an
	// index (a few ms for each of tens of checkpoints).
	go r.states.Use(ck.Path, recording.CheckpointTag, func(*qcow2state.State) error { return nil })
	return nil
}

func (r *replayer) Sync() { r.pump.sync() }

// ReadPhysical reads guest-physical memory at start point n out of its
// saved state: a checkpoint's image, or the recording's own at
// instruction 0.
func (r *replayer) ReadPhysical(ctx context.Context, n, pa uint64, length int) ([]byte, error) {
	path, tag := r.meta.Image(), recording.InitTag
	if n > 0 {
		path = ""
		for _, c := range r.checkpoints() {
			if c.ICount == n {
				path, tag = c.Path, recording.CheckpointTag
			}
		}
		if path == "" {
			return nil, fmt.Errorf("no checkpoint at instruction %d any more (evicted)", n)
		}
	}
	regions, err := r.ramRegions(ctx)
	if err != nil {
		return nil, err
	}
	b := make([]byte, length)
	err = r.states.Use(path, tag, func(st *qcow2state.State) error { return st.ReadPhysical(regions, pa, b) })
	if err != nil {
		return nil, fmt.Errorf("read the saved state at instruction %d: %w", n, err)
	}
	return b, nil
}

// ramRegions is where RAM is in the replaying machine's physical address
// space, as its QEMU says (HMP info mtree -f), asked once: a new QEMU of
// the same replay has the same machine.
func (r *replayer) ramRegions(ctx context.Context) ([]qcow2state.Region, error) {
	r.mu.Lock()
	regions := r.regions
	r.mu.Unlock()
	if regions != nil {
		return regions, nil
	}
	m, err := r.mch()
	if err != nil {
		return nil, err
	}
	raw, err := m.Monitor().Execute(ctx, "human-monitor-command", map[string]any{"command-line": "info mtree -f"})
	if err != nil {
		return nil, fmt.Errorf("ask QEMU where RAM is: %w", err)
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("ask QEMU where RAM is: %w", err)
	}
	if regions, err = qcow2state.ParseFlatView(out); err != nil {
		return nil, err
	}
	if len(regions) == 0 {
		return nil, errors.New("QEMU names no RAM in the machine's address space")
	}
	r.mu.Lock()
	r.regions = regions
	r.mu.Unlock()
	return regions, nil
}

// restartReplay replaces the replaying QEMU with a new one at the
// recording's start, on the same console, halted.
func (i *Instance) restartReplay(ctx context.Context) error {
	i.restoreMu.Lock()
	defer i.restoreMu.Unlock()
	old, err := i.Running()
	if errors.Is(err, ErrExited) {
		// Under a guard (a checkpoint load it crashed in): replaced.
		i.mu.Lock()
		guarded := i.guarded > 0
		old = i.machine
		i.mu.Unlock()
		if guarded {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	r := i.replayer()
	i.mu.Lock()
	i.replacing = true
	i.mu.Unlock()
	defer func() {
		i.mu.Lock()
		i.replacing = false
		i.mu.Unlock()
	}()
	// A replay has nothing to save: it goes at once.
	if _, err := old.Shutdown(ctx, qemu.Kill, 0); err != nil {
		i.mgr.log.Warn("stop QEMU to replay again", "instance", i.name, "err", err)
	}
	if err := old.Close(); err != nil {
		i.mgr.log.Warn("clean up after QEMU to replay again", "instance", i.name, "err", err)
	}
	r.pump.reset(0)
	cfg := i.cfg
	if cfg.Files, err = dupFiles(i.files); err != nil {
		return i.lost(fmt.Errorf("replay again: %w", err))
	}
	rt := i.runtime(true)
	rt.Paused = true
	mch, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return i.lost(fmt.Errorf("replay again: %w", err))
	}
	i.mu.Lock()
	i.machine = mch
	i.replacing = false
	i.mu.Unlock()
	i.recordQEMU(mch)
	go i.watch(mch, i.follow(mch))
	return nil
}

// debugTimeline is the Timeline the debugger of a replaying guest uses;
// nil for a live guest.
func (i *Instance) debugTimeline() debugger.Timeline {
	if r := i.replayer(); r != nil {
		return r
	}
	return nil
}

func removeIfThere(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// pump copies what the replaying QEMU writes into its console file into
// the guest's console, once: the console shows the recording's output up
// to the furthest point the replay reached, and going back (which makes
// QEMU print the same bytes again) adds nothing. Positions are in the
// recording's console stream: the file's start is at base.
type pump struct {
	path string
	f    *os.File
	buf  *serial.Buffer
	log  interface {
		Warn(string, ...any)
	}

	mu    sync.Mutex
	base  int64 // stream position of the file's first byte
	off   int64 // file bytes read
	shown int64 // stream bytes the console has

	ino    int
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

func newPump(path string, buf *serial.Buffer, log interface{ Warn(string, ...any) }) (*pump, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay console: %w", err)
	}
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("replay console: inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(ino, path, unix.IN_MODIFY); err != nil {
		unix.Close(ino)
		f.Close()
		return nil, fmt.Errorf("replay console: inotify: %w", err)
	}
	p := &pump{path: path, f: f, buf: buf, log: log, ino: ino, stop: make(chan struct{}), done: make(chan struct{})}
	go p.follow()
	return p, nil
}

// follow copies output as QEMU writes it.
func (p *pump) follow() {
	defer close(p.done)
	ev := make([]byte, 4096)
	fds := []unix.PollFd{{Fd: int32(p.ino), Events: unix.POLLIN}}
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			p.log.Warn("replay console: poll", "err", err)
			return
		}
		if n > 0 {
			for {
				if _, err := unix.Read(p.ino, ev); err != nil {
					break
				}
			}
			p.sync()
		}
	}
}

// sync copies what the file has that was not read yet.
func (p *pump) sync() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncLocked()
}

func (p *pump) syncLocked() {
	if p.closed {
		return
	}
	b := make([]byte, 32<<10)
	for {
		n, err := p.f.ReadAt(b, p.off)
		if n > 0 {
			at := p.base + p.off
			p.off += int64(n)
			chunk := b[:n]
			if at < p.shown {
				skip := min(p.shown-at, int64(n))
				chunk, at = chunk[skip:], at+skip
			}
			if len(chunk) > 0 && at == p.shown {
				_, _ = p.buf.Write(chunk)
				p.shown += int64(len(chunk))
			}
		}
		if err != nil || n < len(b) {
			return
		}
	}
}

// position is the stream position QEMU's next byte goes to.
func (p *pump) position() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.base + p.off
}

// reset says QEMU starts over at stream position base: what it printed
// so far is read, and the file begins again.
func (p *pump) reset(base int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncLocked()
	if err := os.Truncate(p.path, 0); err != nil {
		p.log.Warn("replay console: truncate", "err", err)
	}
	p.base, p.off = base, 0
}

func (p *pump) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.syncLocked()
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	unix.Close(p.ino)
	p.f.Close()
}
