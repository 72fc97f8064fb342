package instance

// A guest that records or replays (the mechanics are timetravel's): the
// boot's steps for it, what it refuses, and the guest's side of a replay
// (timetravel.Guest).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/timetravel"
)

// RecordSpec records the guest's run as the project's recording Name.
type RecordSpec struct {
	Name string
}

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

// ErrNoEcho is input a recording guest did not echo (see
// timetravel.TypePaced).
var ErrNoEcho = timetravel.ErrNoEcho

// NoEchoError is the chunk of input a recording guest did not echo.
type NoEchoError = timetravel.NoEchoError

// beginRecording starts the recording the boot asks for and has cfg
// record into it. The cleanup it pushes finishes the record (or removes
// what a boot that failed made).
func (b *booting) beginRecording(ctx context.Context) error {
	i, cfg := b.i, &b.cfg
	if i.spec.Record == nil {
		return nil
	}
	m := i.mgr
	if m.cfg.Recordings == "" {
		return errNoRecordings
	}
	name := i.spec.Record.Name
	if who := m.recs.user(i.spec.Root, name); who != "" {
		return fmt.Errorf("recording %q is being replayed by guest %q: shut it down first, or record under another name", name, who)
	}
	r, err := timetravel.Begin(ctx, timetravel.RecordConfig{Store: m.recs.store(), Root: i.spec.Root, Name: name,
		Instance: i.name, RuntimeDir: m.cfg.RuntimeDir, Log: m.log}, cfg)
	if err != nil {
		return err
	}
	i.tt.mu.Lock()
	i.tt.recording = r
	i.tt.mu.Unlock()
	i.push("recording", func() error {
		i.mu.Lock()
		con := i.console
		i.mu.Unlock()
		return r.Finish(i.Process(), con)
	})
	return nil
}

// travel is a guest's recording or replay, if it has one.
type travel struct {
	mu        sync.Mutex
	recording *timetravel.Recorder
	replay    *timetravel.Replayer
}

func (t *travel) recorder() *timetravel.Recorder {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.recording
}

func (t *travel) replayer() *timetravel.Replayer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.replay
}

// timeline is the Timeline the debugger of a replaying guest uses; nil
// for a live guest.
func (t *travel) timeline() debugger.Timeline {
	if r := t.replayer(); r != nil {
		return r
	}
	return nil
}

// Recording is what the guest records into, if it records.
func (i *Instance) Recording() (recording.Meta, bool) {
	if r := i.tt.recorder(); r != nil {
		return r.Meta()
	}
	return recording.Meta{}, false
}

// prepareReplay makes cfg and rt replay the recording the boot names.
func (b *booting) prepareReplay(ctx context.Context) error {
	i, cfg, rt := b.i, &b.cfg, &b.rt
	if i.spec.Replay == nil {
		return nil
	}
	m := i.mgr
	meta := i.spec.Replay.Meta
	if err := timetravel.Check(ctx, meta, cfg.Binary, m.cfg.RuntimeDir); err != nil {
		return err
	}
	release, err := m.recs.claim(meta, i.name)
	if err != nil {
		return err
	}
	i.push("recording claim", func() error { release(); return nil })
	// Reads what an earlier run probed of the binary, if anything: a
	// replay goes back in place only where the probe found it can.
	m.QEMUCaps(cfg.Binary)
	dir := m.cfg.RuntimeDir
	r, err := timetravel.Prepare(ctx, replayGuest{i}, timetravel.ReplayConfig{
		Store: m.recs.store(), Meta: meta, RuntimeDir: dir,
		Staged:      filepath.Join(dir, names.Name(names.ReplayStage, m.owner, i.name)),
		ConsoleFile: filepath.Join(dir, names.Name(names.ReplayConsole, m.owner, i.name)),
		Keep:        m.cfg.Recordings != "", Kept: func() { m.enforceCap() },
		Files: func() (map[string]*os.File, error) { return dupFiles(i.spec.QEMU.Files) },
		Log:   m.log.With("instance", i.name),
	}, cfg, rt, i.push)
	if err != nil {
		return err
	}
	i.tt.mu.Lock()
	i.tt.replay = r
	i.tt.mu.Unlock()
	i.vm.cfg.RR, i.vm.cfg.ConsoleFile = cfg.RR, cfg.ConsoleFile
	return nil
}

// Replaying is the recording the guest replays, if it replays one.
func (i *Instance) Replaying() (recording.Meta, bool) {
	if r := i.tt.replayer(); r != nil {
		return r.Meta(), true
	}
	return recording.Meta{}, false
}

// Input says why the guest takes no input, if it does not: a replay's
// input comes from its recording.
func (i *Instance) Input() error {
	if r := i.tt.replayer(); r != nil {
		return fmt.Errorf("guest %q %w (%q): its console input is the recording's, so nothing typed reaches it; boot it live (without replay) to type on it", i.name, ErrReplay, r.Meta().Name)
	}
	return nil
}

// notRecorded refuses what would break a recording or a replay: its
// machine's state must be what the recording holds.
func (i *Instance) notRecorded(what string) error {
	if r := i.tt.recorder(); r != nil {
		return fmt.Errorf("cannot %s guest %q: it records %q, whose replay must reproduce the run exactly; shut it down to end the recording first", what, i.name, r.Name())
	}
	if r := i.tt.replayer(); r != nil {
		return &ReplayingError{What: what, Name: i.name, Recording: r.Meta().Name}
	}
	return nil
}

// replayGuest is a replaying instance as its replay sees it.
type replayGuest struct{ i *Instance }

func (g replayGuest) Running() (*qemu.Process, error) { return g.i.Running() }

// Restart replaces the replaying QEMU with a new one at the recording's
// start, on the same console, halted.
func (g replayGuest) Restart(ctx context.Context) error {
	i := g.i
	i.restoreMu.Lock()
	defer i.restoreMu.Unlock()
	old, err := i.Running()
	if errors.Is(err, ErrExited) {
		// Under a hold (a checkpoint load it crashed in): replaced.
		var held bool
		if old, held = i.vm.held(); held {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	r := i.tt.replayer()
	// A replay has nothing to save: it goes at once.
	_, err = i.vm.replace(ctx, old, replacement{
		method:  qemu.Kill,
		gone:    r.Rewind,
		prepare: func(_ *qemu.Config, rt *qemu.Runtime) { rt.Paused = true },
	})
	if err != nil {
		return i.lost(fmt.Errorf("replay again: %w", err))
	}
	return nil
}

// HoldExit holds the replaying QEMU's exit for the debugger until
// release: QEMU can crash loading a checkpoint, and that is not the
// guest's end but a failed load, after which the debugger starts a new
// QEMU (Restart). A QEMU that died under the hold and was not replaced
// ends the guest when the hold is released.
func (g replayGuest) HoldExit() (release func()) {
	return g.i.vm.holdExit("while it loaded a replay checkpoint")
}

// Type writes p on the guest's console, as a typed line does: a recording
// guest is given it paced by its echo (or, with charDelay, a byte at a
// time), so that no byte is lost; a replaying guest takes none. It
// returns how many bytes went to (or, recording, were taken by) the
// guest.
func (i *Instance) Type(ctx context.Context, p []byte, charDelay time.Duration) (int, error) {
	if err := i.Input(); err != nil {
		return 0, err
	}
	mch, err := i.Running()
	if err != nil {
		return 0, err
	}
	con := mch.Console()
	switch {
	case charDelay > 0:
		return con.WriteSlow(ctx, p, charDelay)
	case i.tt.recorder() != nil:
		return timetravel.TypePaced(ctx, con, p)
	}
	return con.Write(ctx, p)
}
