package timetravel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

const tinyPrompt = `tiny> $`

// rig is a project's recordings store and a short private directory for
// QEMU's sockets (a unix socket's path is at most 107 bytes).
type rig struct {
	t     *testing.T
	dir   string
	root  string
	store recording.Store
	// guest is the QEMU and kernel the rig records; nil is tinyConfig.
	guest func(*testing.T) qemu.Config
}

// newRig is a rig for t, and t's context.
func newRig(t *testing.T) (context.Context, *rig) {
	t.Helper()
	return testContext(t), &rig{t: t, dir: testguest.SocketDir(t, "qmcp"), root: t.TempDir(), store: recording.Store{Dir: t.TempDir()}}
}

// tinyConfig is the built-in kernel on the virt board.
func tinyConfig(t *testing.T) qemu.Config {
	t.Helper()
	return qemu.NewConfig(qemu.WithBinary(testguest.QEMU(t)), qemu.WithKernel(testguest.Tiny(t)))
}

// config is the QEMU and kernel the rig records and replays.
func (r *rig) config() qemu.Config {
	if r.guest != nil {
		return r.guest(r.t)
	}
	return tinyConfig(r.t)
}

// runtime puts a QEMU's files in the rig's directory, named after what.
func (r *rig) runtime(what string) qemu.Runtime {
	return qemu.Runtime{SerialBase: filepath.Join(r.dir, what), QMPSocket: filepath.Join(r.dir, what+".qmp"), Logger: discard()}
}

// start starts cfg.
func (r *rig) start(ctx context.Context, rt qemu.Runtime, cfg qemu.Config) *qemu.Process {
	r.t.Helper()
	m, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { m.Close() })
	return m
}

// recordingGuest is a tiny kernel that records into one of the rig's
// recordings, committed, at its prompt.
type recordingGuest struct {
	rec    *Recorder
	m      *qemu.Process
	cursor int64
}

func (r *rig) record(ctx context.Context, name string) *recordingGuest {
	r.t.Helper()
	cfg := r.config()
	rec, err := Begin(ctx, RecordConfig{Store: r.store, Root: r.root, Name: name, Instance: "a", RuntimeDir: r.dir, Log: discard()}, &cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	m := r.start(ctx, r.runtime("rec-"+name), cfg)
	if err := rec.Commit(m); err != nil {
		r.t.Fatal(err)
	}
	g := &recordingGuest{rec: rec, m: m}
	g.expect(r.t, ctx, tinyPrompt)
	return g
}

func (g *recordingGuest) expect(t *testing.T, ctx context.Context, re string) {
	t.Helper()
	g.cursor = expect(t, ctx, g.m.Console().Buffer(), g.cursor, re)
}

// typeLine types line and a CR, paced as a recording guest is.
func (g *recordingGuest) typeLine(t *testing.T, ctx context.Context, line string) {
	t.Helper()
	if n, err := TypePaced(ctx, g.m.Console(), []byte(line+"\r")); err != nil || n != len(line)+1 {
		t.Fatalf("type %q: %d, %v", line, n, err)
	}
}

// stop pauses the recording where it is and has QEMU quit, as a guest's
// echo has the guest echo text, and waits for it and the prompt after it.
func (g *recordingGuest) echo(t *testing.T, ctx context.Context, text string) {
	t.Helper()
	g.typeLine(t, ctx, "echo "+text)
	g.expect(t, ctx, text+"\r\n"+tinyPrompt)
}

// stop does; then the recording is finished.
func (g *recordingGuest) stop(t *testing.T, ctx context.Context) recording.Meta {
	t.Helper()
	g.rec.Pause(ctx, g.m)
	if _, err := g.m.Shutdown(ctx, qemu.Quit, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return g.finish(t)
}

// kill kills the recording QEMU; then the recording is finished.
func (g *recordingGuest) kill(t *testing.T, ctx context.Context) recording.Meta {
	t.Helper()
	if _, err := g.m.Shutdown(ctx, qemu.Kill, time.Second); err != nil {
		t.Fatal(err)
	}
	return g.finish(t)
}

func (g *recordingGuest) finish(t *testing.T) recording.Meta {
	t.Helper()
	if err := g.rec.Finish(g.m, g.m.Console()); err != nil {
		t.Fatal(err)
	}
	meta, committed := g.rec.Meta()
	if !committed {
		t.Fatal("a committed recording says it is not")
	}
	return meta
}

func expect(t *testing.T, ctx context.Context, b *serial.Buffer, since int64, re string) int64 {
	t.Helper()
	m, err := b.Wait(ctx, since, regexp.MustCompile(re), 10*time.Second)
	if err != nil || !m.Matched {
		t.Fatalf("console: waiting for %q: %v; got %q", re, err, m.Output)
	}
	return m.Cursor
}

// get is the recording as the store has it.
func (r *rig) get(name string) recording.Meta {
	r.t.Helper()
	m, err := r.store.Get(r.root, name)
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// stores checks that the store has the recording as its recorder finished
// it.
func (r *rig) stores(meta recording.Meta) {
	r.t.Helper()
	got := r.get(meta.Name)
	if got.Status() != meta.State || got.State != meta.State || got.Ended != meta.Ended || got.Seen != meta.Seen || got.Instructions != meta.Instructions {
		r.t.Errorf("the store has %+v, the recorder %+v", got, meta)
	}
}

// A recording stopped by its guest's stop is complete up to the instruction
// where the stop paused it, with what the guest printed.
func TestRecordCompleteAfterPause(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	g := r.record(ctx, "run")
	if g.rec.Name() != "run" {
		t.Errorf("Name %q", g.rec.Name())
	}
	live := r.get("run")
	if live.Status() != recording.Recording || live.Instance != "a" || live.QEMU != g.m.Version() || live.Binary != g.m.Argv()[0] {
		t.Errorf("the record while it records: %+v", live)
	}
	if h, err := recording.ReadHeader(live.Log()); err != nil || h == 0 || h != live.LogVersion {
		t.Errorf("the log's header while it records: %#x %v, want %#x", h, err, live.LogVersion)
	}
	g.echo(t, ctx, "recorded")

	meta := g.stop(t, ctx)
	if meta.State != recording.Complete || meta.Ended != recording.EndedStopped || meta.Instructions == 0 || meta.Owner != nil || meta.Seconds <= 0 {
		t.Fatalf("finished: %+v", meta)
	}
	r.stores(meta)
	out, err := os.ReadFile(meta.Console())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(out, []byte("\r\nqemu-mcp tiny kernel 1.0 (hart 0)\r\ntype 'help' for commands\r\ntiny> echo recorded\r\nrecorded\r\ntiny> ")) || int64(len(out)) != meta.ConsoleBytes {
		t.Errorf("console.log (%d bytes, record says %d): %q", len(out), meta.ConsoleBytes, out)
	}
}

// A guest that powers itself off ends a whole recording whose length its
// replay finds.
func TestRecordGuestShutDown(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	g := r.record(ctx, "off")
	g.typeLine(t, ctx, "poweroff")
	select {
	case <-g.m.Done():
	case <-ctx.Done():
		t.Fatal("QEMU did not exit after poweroff")
	}
	meta := g.finish(t)
	if meta.State != recording.Complete || meta.Ended != "the guest shut down" || meta.Instructions != 0 || meta.EndFound {
		t.Fatalf("finished: %+v", meta)
	}
	r.stores(meta)
}

// A recording whose QEMU was killed is cut; how far it got was noted while
// it ran.
func TestRecordCutByKill(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	g := r.record(ctx, "cut")
	// Progress is noted once a second.
	deadline := time.Now().Add(5 * time.Second)
	for r.get("cut").Seen == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the record never noted the recording's progress")
		}
		time.Sleep(50 * time.Millisecond)
	}
	meta := g.kill(t, ctx)
	if meta.State != recording.Cut || meta.Ended != "QEMU killed by SIGKILL" || meta.Instructions != 0 || meta.Seen == 0 {
		t.Fatalf("finished: %+v", meta)
	}
	r.stores(meta)
}

// A recording whose QEMU never started (or never saved its first state)
// is removed, and the recording of that name made before stays.
func TestRecordNeverCommittedIsAborted(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	before := r.record(ctx, "run").stop(t, ctx)

	cfg := tinyConfig(t)
	rec, err := Begin(ctx, RecordConfig{Store: r.store, Root: r.root, Name: "run", Instance: "b", RuntimeDir: r.dir, Log: discard()}, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	begun, committed := rec.Meta()
	if committed || cfg.RR == nil || cfg.RR.Replay || cfg.RR.Log != begun.Log() || cfg.RR.Image != begun.Image() {
		t.Fatalf("after Begin: %+v (committed %v), cfg.RR %+v", begun, committed, cfg.RR)
	}
	if _, err := os.Stat(begun.Image()); err != nil {
		t.Fatalf("Begin made no image: %v", err)
	}
	if err := rec.Finish(nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(begun.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the aborted recording's directory: %v", err)
	}
	if got := r.get("run"); got.ID != before.ID || got.Dir != before.Dir || got.Instance != "a" {
		t.Errorf("the earlier recording became %+v", got)
	}
	if _, err := os.Stat(before.Image()); err != nil {
		t.Errorf("the earlier recording's image: %v", err)
	}
}

// Begin refuses a bad name, and a drive it cannot read.
func TestRecordBeginRefuses(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	cfg := tinyConfig(t)
	if _, err := Begin(ctx, RecordConfig{Store: r.store, Root: r.root, Name: "../x", RuntimeDir: r.dir, Log: discard()}, &cfg); err == nil {
		t.Error("Begin took the name ../x")
	}
	cfg.Drives = []qemu.Drive{{Path: filepath.Join(r.dir, "missing.img"), ReadOnly: true}}
	if _, err := Begin(ctx, RecordConfig{Store: r.store, Root: r.root, Name: "d", RuntimeDir: r.dir, Log: discard()}, &cfg); err == nil {
		t.Error("Begin took a drive that is not there")
	}
	if list, err := r.store.List(r.root); err != nil || len(list) != 0 {
		t.Errorf("refused recordings left %+v %v", list, err)
	}
	if cfg.RR != nil {
		t.Errorf("a refused recording set cfg.RR %+v", cfg.RR)
	}
}

// A commit that fails once the record is written (its log's header could
// not be written) still leaves a recording that ends: cut, not one this
// server records for ever.
func TestRecordCommitFailsAfterTheRecord(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	cfg := tinyConfig(t)
	rec, err := Begin(ctx, RecordConfig{Store: r.store, Root: r.root, Name: "half", Instance: "a", RuntimeDir: r.dir, Log: discard()}, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := r.start(ctx, r.runtime("rec"), cfg)
	// The header goes through no symlink.
	log := cfg.RR.Log
	if err := os.Rename(log, log+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(log+".real", log); err != nil {
		t.Fatal(err)
	}
	if err := rec.Commit(m); err == nil {
		t.Fatal("Commit wrote the header through a symlink")
	}
	// The boot fails: its QEMU is killed, and the recording finished.
	if _, err := m.Shutdown(ctx, qemu.Kill, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := rec.Finish(m, m.Console()); err != nil {
		t.Fatal(err)
	}
	if got := r.get("half"); got.Status() != recording.Cut || got.Owner != nil {
		t.Errorf("the record after a failed commit: status %q, owner %v", got.Status(), got.Owner)
	}
}
