package timetravel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// replayGuest is the guest a test's replay runs in: the QEMU the test
// started, and what the replay asked of it.
type replayGuest struct {
	mu       sync.Mutex
	m        *qemu.Process
	restart  func(context.Context) (*qemu.Process, error)
	holds    int
	released int
}

func (g *replayGuest) Running() (*qemu.Process, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		return nil, errors.New("no QEMU")
	}
	if _, exited := g.m.Exited(); exited {
		return nil, errors.New("QEMU exited")
	}
	return g.m, nil
}

func (g *replayGuest) Restart(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, err := g.restart(ctx)
	if err != nil {
		return err
	}
	g.m = m
	return nil
}

func (g *replayGuest) machine() *qemu.Process {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m
}

func (g *replayGuest) HoldExit() func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.released++
	}
}

// replaying is a replay of a recording, halted at its start in a QEMU of
// its own.
type replaying struct {
	rep     *Replayer
	g       *replayGuest
	buf     *serial.Buffer
	staged  string
	conFile string
	undone  []string // what was made, newest last
}

// replay checks meta and prepares its replay, starts its QEMU and the
// console reader.
func (r *rig) replay(ctx context.Context, meta recording.Meta, keep bool) *replaying {
	t := r.t
	t.Helper()
	cfg, rt := r.config(), r.runtime("rep")
	if err := Check(ctx, meta, cfg.Binary, r.dir); err != nil {
		t.Fatal(err)
	}
	p := &replaying{g: &replayGuest{}, buf: serial.NewBuffer(),
		staged: filepath.Join(r.dir, "stage.qcow2"), conFile: filepath.Join(r.dir, "rrcon.log")}
	var undos []func() error
	push := func(what string, undo func() error) {
		p.undone = append(p.undone, what)
		undos = append(undos, undo)
	}
	t.Cleanup(func() {
		for k := len(undos) - 1; k >= 0; k-- {
			if err := undos[k](); err != nil {
				t.Errorf("undo %s: %v", p.undone[k], err)
			}
		}
	})
	rep, err := Prepare(ctx, p.g, ReplayConfig{Store: r.store, Meta: meta, Staged: p.staged, ConsoleFile: p.conFile,
		RuntimeDir: r.dir, Keep: keep, Log: discard()}, &cfg, &rt, push)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RR == nil || !cfg.RR.Replay || cfg.RR.Log != meta.Log() || cfg.RR.Image != p.staged || cfg.ConsoleFile != p.conFile || !rt.Paused {
		t.Fatalf("Prepare left cfg.RR %+v, console file %q, paused %v", cfg.RR, cfg.ConsoleFile, rt.Paused)
	}
	p.rep = rep
	p.g.m = r.start(ctx, rt, cfg)
	// As a guest restarts its replay: the old QEMU goes, the console
	// reads from the start again, a new QEMU halts there.
	p.g.restart = func(ctx context.Context) (*qemu.Process, error) {
		p.g.m.Close()
		rep.Rewind()
		return qemu.Start(ctx, rt, cfg)
	}
	t.Cleanup(func() { p.g.machine().Close() })
	if err := rep.Start(p.g.m, p.buf, push); err != nil {
		t.Fatal(err)
	}
	return p
}

// runTo runs the replay until it stops at n.
func (p *replaying) runTo(t *testing.T, ctx context.Context, n uint64) {
	t.Helper()
	if err := p.rep.StopAt(ctx, n); err != nil {
		t.Fatal(err)
	}
	mon := p.g.machine().Monitor()
	if _, err := mon.Execute(ctx, "cont", nil); err != nil {
		t.Fatal(err)
	}
	for {
		running, err := mon.Running(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !running {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pos, err := p.rep.Position(ctx); err != nil || pos != n {
		t.Fatalf("stopped at %d (%v), want %d", pos, err, n)
	}
}

// shows is what the replay's console shows.
func (p *replaying) shows() []byte {
	b, _ := p.buf.Read(0, 1<<20)
	return b
}

// A replay of a recording its guest's stop ended goes where it is told,
// up to the recording's end, and its console shows what the recording
// printed, once. Without checkpoints (QEMU 7.2 does not reload one
// faithfully) its only start point is 0.
func TestReplayTimeline(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	g := r.record(ctx, "run")
	g.echo(t, ctx, "one")
	meta := g.stop(t, ctx)
	printed, err := os.ReadFile(meta.Console())
	if err != nil {
		t.Fatal(err)
	}

	p := r.replay(ctx, meta, false)
	if want := []string{"replay saved states", "replay image", "replay console", "replay console reader"}; !slices.Equal(p.undone, want) {
		t.Errorf("Prepare and Start made %q, want %q", p.undone, want)
	}
	rep := p.rep
	if rep.Meta().ID != meta.ID || rep.End() != meta.Instructions-1 {
		t.Errorf("replays %q to %d, want %q to %d", rep.Meta().ID, rep.End(), meta.ID, meta.Instructions-1)
	}
	if pos, err := rep.Position(ctx); err != nil || pos != 0 {
		t.Fatalf("position %d %v at the start", pos, err)
	}
	if rep.InPlace() || rep.Spacing() != 0 {
		t.Errorf("InPlace %v, Spacing %v: QEMU %s has not been found to reload checkpoints", rep.InPlace(), rep.Spacing(), p.g.machine().Version())
	}
	if got := rep.Starts(rep.End()); !slices.Equal(got, []uint64{0}) {
		t.Errorf("Starts(end) = %v, want [0]", got)
	}

	// Half way, the console shows the start of what the recording printed.
	mid := rep.End() / 2
	p.runTo(t, ctx, mid)
	rep.Sync()
	if got := p.shows(); !bytes.HasPrefix(printed, got) {
		t.Errorf("at %d the console shows %q, not the start of the recording's %q", mid, got, printed)
	}
	// A checkpoint offered is not kept: the timeline keeps none.
	if err := rep.Checkpoint(ctx, mid, time.Second); err != nil {
		t.Errorf("Checkpoint: %v", err)
	}
	if cks := rep.Meta().Checkpoints(p.g.machine().Version()); len(cks) != 0 {
		t.Errorf("checkpoints kept: %+v", cks)
	}
	if ents, _ := os.ReadDir(filepath.Join(meta.Dir, "checkpoints")); len(ents) != 0 {
		t.Errorf("checkpoint files: %v", ents)
	}

	// At the end, all of it, and the QEMU is still there to go back.
	p.runTo(t, ctx, rep.End())
	rep.Sync()
	if got := p.shows(); !bytes.Equal(got, printed) {
		t.Errorf("at the end the console shows %q, want the recording's %q", got, printed)
	}

	// Back to the start in a new QEMU (this one does not reload in
	// place faithfully): the same output again adds nothing.
	if err := rep.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if pos, err := rep.Position(ctx); err != nil || pos != 0 {
		t.Fatalf("position %d %v after the restart", pos, err)
	}
	p.runTo(t, ctx, rep.End())
	rep.Sync()
	if got := p.shows(); !bytes.Equal(got, printed) {
		t.Errorf("replayed twice, the console shows %q, want the recording's %q once", got, printed)
	}
	if err := rep.Load(ctx, mid); err == nil || !strings.Contains(err.Error(), "no checkpoint at instruction") {
		t.Errorf("Load of a point that is no checkpoint: %v", err)
	}

	// A start point that failed is not offered again.
	rep.Failed(mid, "test")
	if got := rep.Starts(rep.End()); !slices.Equal(got, []uint64{0}) {
		t.Errorf("Starts after a checkpoint failed = %v, want [0]", got)
	}
	rep.Failed(0, "test")
	if got := rep.Starts(rep.End()); len(got) != 0 {
		t.Errorf("Starts after the start failed = %v, want none", got)
	}

	// Guard is the guest's hold.
	release := rep.Guard()
	if p.g.holds != 1 || p.g.released != 0 {
		t.Errorf("Guard: held %d released %d", p.g.holds, p.g.released)
	}
	release()
	if p.g.released != 1 {
		t.Errorf("Guard's release released %d", p.g.released)
	}
}

// Memory at the recording's start is read out of its image without
// loading it: the kernel where OpenSBI left it.
func TestReplayReadPhysical(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	meta := r.record(ctx, "mem").stop(t, ctx)
	kernel, err := os.ReadFile(testguest.Tiny(t))
	if err != nil {
		t.Fatal(err)
	}
	p := r.replay(ctx, meta, true)
	if p.rep.Spacing() != 0 {
		t.Errorf("Spacing %v, kept checkpoints, on a QEMU not found to reload them", p.rep.Spacing())
	}
	const at = 0x80200000
	got, err := p.rep.ReadPhysical(ctx, 0, at, 64)
	if err != nil || !bytes.Equal(got, kernel[:64]) {
		t.Fatalf("ReadPhysical(0, %#x) = %x, %v; want the kernel's first bytes %x", at, got, err, kernel[:64])
	}
	// Again, from what the first read indexed.
	if again, err := p.rep.ReadPhysical(ctx, 0, at+64, 32); err != nil || !bytes.Equal(again, kernel[64:96]) {
		t.Errorf("ReadPhysical(0, %#x) = %x, %v; want %x", at+64, again, err, kernel[64:96])
	}
	if _, err := p.rep.ReadPhysical(ctx, 1000, at, 8); err == nil || !strings.Contains(err.Error(), "no checkpoint at instruction 1000") {
		t.Errorf("ReadPhysical at a point that is no checkpoint: %v", err)
	}
	// Outside RAM there is nothing to read.
	if _, err := p.rep.ReadPhysical(ctx, 0, 0x10, 8); err == nil {
		t.Error("ReadPhysical read below RAM")
	}
}

// A recording cut by a kill is replayed once to find where it ends; the
// record notes it, and the replay goes there, printing what the recording
// printed up to there.
func TestReplayFindsTheEndOfACutRecording(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	g := r.record(ctx, "cut")
	g.echo(t, ctx, "before the kill")
	meta := g.kill(t, ctx)
	if meta.State != recording.Cut {
		t.Fatalf("killed: %+v", meta)
	}

	p := r.replay(ctx, meta, false)
	stored := r.get("cut")
	if p.rep.End() == 0 || !stored.EndFound || stored.Instructions != p.rep.End() || p.rep.Meta().Instructions != p.rep.End() {
		t.Fatalf("end %d; the record says %d (found %v)", p.rep.End(), stored.Instructions, stored.EndFound)
	}
	if fi, err := os.Stat(p.conFile); err != nil || fi.Size() != 0 {
		t.Errorf("the console file after finding the end: %v %v, want it empty", fi, err)
	}
	if pos, err := p.rep.Position(ctx); err != nil || pos != 0 {
		t.Fatalf("position %d %v at the start", pos, err)
	}
	// QEMU writes its log in blocks: a kill loses the last events, and
	// the replay ends before the kill did.
	printed, err := os.ReadFile(meta.Console())
	if err != nil {
		t.Fatal(err)
	}
	p.runTo(t, ctx, p.rep.End())
	p.rep.Sync()
	if got := p.shows(); len(got) == 0 || !bytes.HasPrefix(printed, got) {
		t.Errorf("at the end the console shows %q, not the start of the recording's %q", got, printed)
	}

	// A second replay knows the end without looking for it.
	p.g.machine().Close()
	again := r.replay(ctx, stored, false)
	if again.rep.End() != p.rep.End() {
		t.Errorf("the second replay ends at %d, the first at %d", again.rep.End(), p.rep.End())
	}
}
