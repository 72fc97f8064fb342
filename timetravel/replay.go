// Package timetravel records a guest's run and replays it: a recording
// from the boot that makes it to its end, and a replay the debugger moves
// back and forth through (a Replayer is its debugger.Timeline). It knows
// the guest only through Guest.
package timetravel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/qcow2state"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"golang.org/x/sys/unix"
)

// Guest is what a replay asks of the guest that replays it.
type Guest interface {
	// Running is the guest's QEMU, or why there is none.
	Running() (*qemu.Process, error)
	// Restart replaces the replaying QEMU with a new one at the
	// recording's start, halted, on the same console.
	Restart(ctx context.Context) error
	// HoldExit keeps the QEMU's exit from ending the guest until
	// release; a QEMU that died meanwhile and was not replaced ends it
	// then.
	HoldExit() (release func())
}

// Replayer is a replaying guest's recording and how it moves through it:
// the debugger's Timeline.
type Replayer struct {
	g   Guest
	log *slog.Logger
	// keep says checkpoints are kept (the server has a state
	// directory); kept runs after one was.
	keep  bool
	kept  func()
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

// Position is the record or replay position, in instructions.
func Position(ctx context.Context, mch *qemu.Process) (uint64, error) {
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

func (r *Replayer) mch() (*qemu.Process, error) { return r.g.Running() }

func (r *Replayer) Position(ctx context.Context) (uint64, error) {
	m, err := r.mch()
	if err != nil {
		return 0, err
	}
	return Position(ctx, m)
}

func (r *Replayer) End() uint64 { return r.end }

func (r *Replayer) StopAt(ctx context.Context, n uint64) error {
	m, err := r.mch()
	if err != nil {
		return err
	}
	if pos, err := Position(ctx, m); err == nil {
		r.mu.Lock()
		r.runFrom = pos
		r.mu.Unlock()
	}
	_, err = m.Monitor().Execute(ctx, "replay-break", map[string]any{"icount": n})
	return err
}

func (r *Replayer) InPlace() bool {
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

func (r *Replayer) checkpoints() []recording.Checkpoint {
	if !r.InPlace() || r.version == "" {
		return nil
	}
	return r.meta.Checkpoints(r.version)
}

func (r *Replayer) Starts(n uint64) []uint64 {
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

func (r *Replayer) Load(ctx context.Context, n uint64) error {
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
func (r *Replayer) withImage(ctx context.Context, m *qemu.Process, path string, f func() error) error {
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

func (r *Replayer) Failed(n uint64, why string) {
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
				r.log.Warn("drop a checkpoint that does not load", "path", c.Path, "err", err)
			}
			r.states.Forget(c.Path)
		}
	}
}

func (r *Replayer) Restart(ctx context.Context) error { return r.g.Restart(ctx) }

// Guard holds the replaying QEMU's exit for the debugger until release:
// QEMU 11 can crash loading a checkpoint (SIGSEGV), and that is not the
// guest's end but a failed load, after which the debugger starts a new
// QEMU (Restart). A QEMU that died under the guard and was not replaced
// ends the guest when the guard is released.
func (r *Replayer) Guard() (release func()) { return r.g.HoldExit() }

// checkpointSpacing is how much replay time apart checkpoints are kept:
// going back costs at most about that, plus a load.
const checkpointSpacing = 300 * time.Millisecond

func (r *Replayer) Spacing() time.Duration {
	if !r.InPlace() || r.version == "" || !r.keep {
		return 0
	}
	return checkpointSpacing
}

func (r *Replayer) Checkpoint(ctx context.Context, n uint64, spent time.Duration) error {
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
			r.log.Debug("replay checkpoint not needed: one is near", "icount", n, "near", c.ICount, "gap", gap)
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
	r.log.Debug("replay checkpoint saved", "icount", n, "spent", spent, "save", t1.Sub(t0), "commit", time.Since(t1))
	if r.kept != nil {
		go r.kept()
	}
	// Index its saved state now, while the file is in the page cache and
	// the replay runs on: reading the state later costs a read, not an
	// index (a few ms for each of tens of checkpoints).
	go r.states.Use(ck.Path, recording.CheckpointTag, func(*qcow2state.State) error { return nil })
	return nil
}

func (r *Replayer) Sync() { r.pump.sync() }

// ReadPhysical reads guest-physical memory at start point n out of its
// saved state: a checkpoint's image, or the recording's own at
// instruction 0.
func (r *Replayer) ReadPhysical(ctx context.Context, n, pa uint64, length int) ([]byte, error) {
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
func (r *Replayer) ramRegions(ctx context.Context) ([]qcow2state.Region, error) {
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

// pump copies what the replaying QEMU writes into its console file into
// the guest's console, once: the console shows the recording's output up
// to the furthest point the replay reached, and going back (which makes
// QEMU print the same bytes again) adds nothing; going ahead past it (a
// load) fills what was skipped from what the recording printed. Positions
// are in the recording's console stream: the file's start is at base.
type pump struct {
	path string
	f    *os.File
	buf  *serial.Buffer
	log  interface {
		Warn(string, ...any)
	}
	rec recorded

	mu    sync.Mutex
	base  int64 // stream position of the file's first byte
	off   int64 // file bytes read
	shown int64 // stream bytes the console has

	ino    int
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

// recorded is what the recording printed: its console.log, which ends at
// stream position end (its ConsoleBytes; the file may lack the stream's
// start, which the recording console's ring dropped).
type recorded struct {
	path string
	end  int64
}

func newPump(path string, buf *serial.Buffer, log interface{ Warn(string, ...any) }, rec recorded) (*pump, error) {
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
	p := &pump{path: path, f: f, buf: buf, log: log, rec: rec, ino: ino, stop: make(chan struct{}), done: make(chan struct{})}
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
			if len(chunk) > 0 && at > p.shown {
				// A load past the furthest point the replay reached
				// (a checkpoint an earlier replay kept) skipped it.
				p.skippedLocked(at)
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

// skippedLocked brings the console up to stream position to, which QEMU
// did not print in this replay: from what the recording printed, as far
// as it has it; what it lacks is not shown.
func (p *pump) skippedLocked(to int64) {
	defer func() { p.shown = max(p.shown, to) }()
	f, err := os.Open(p.rec.path)
	if err != nil {
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	start := p.rec.end - fi.Size() // the stream position of its first byte
	from := max(p.shown, start)
	if from >= to {
		return
	}
	b := make([]byte, to-from)
	n, _ := f.ReadAt(b, from-start)
	if n > 0 {
		_, _ = p.buf.Write(b[:n])
		p.shown = from + int64(n)
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
