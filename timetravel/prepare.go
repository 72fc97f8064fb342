package timetravel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/filecopy"
	"github.com/qemu-mcp/qemu-mcp/internal/qcow2state"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// ReplayConfig is where a replay keeps its files and what it tells.
type ReplayConfig struct {
	Store recording.Store
	Meta  recording.Meta
	// Staged is the path of the copy of the recording's image the
	// replaying QEMU loads (it writes into it); ConsoleFile where QEMU
	// writes the console. Both are made and removed by the replay.
	Staged, ConsoleFile string
	// RuntimeDir is where the log-version probe runs.
	RuntimeDir string
	// Keep says checkpoints are kept; Kept runs after one was.
	Keep bool
	Kept func()
	// Files gives the host files' descriptors for a QEMU that replays to
	// find the recording's end.
	Files func() (map[string]*os.File, error)
	Log   *slog.Logger
}

// Check says why meta cannot be replayed by the QEMU binary, if it
// cannot: unreadable, still recording, a log format of another QEMU, a
// drive changed since. A log cut before QEMU wrote its header gets it.
func Check(ctx context.Context, meta recording.Meta, binary, runtimeDir string) error {
	if u := meta.Unreadable(); u != "" {
		return fmt.Errorf("recording %q cannot be replayed: %s", meta.Name, u)
	}
	if meta.Status() == recording.Recording {
		return fmt.Errorf("recording %q is still being recorded (by guest %q): stop that guest first", meta.Name, meta.Instance)
	}
	lv, err := qemu.LogVersion(ctx, binary, runtimeDir)
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
	return nil
}

// Prepare makes cfg and rt replay the recording c.Meta (Check it first):
// a copy of its image, the console into a file, halted at the start. A
// recording whose end is not known yet is replayed once to find it. Each
// thing it makes is given to push with its undo, newest last.
func Prepare(ctx context.Context, g Guest, c ReplayConfig, cfg *qemu.Config, rt *qemu.Runtime, push func(what string, undo func() error)) (*Replayer, error) {
	meta := c.Meta
	r := &Replayer{g: g, log: c.Log, keep: c.Keep, kept: c.Kept, store: c.Store, meta: meta, failed: map[uint64]bool{},
		staged: c.Staged, conFile: c.ConsoleFile, states: qcow2state.NewCache(savedStates)}
	push("replay saved states", func() error { r.states.Close(); return nil })
	for _, p := range []string{r.staged, r.conFile} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("replay: %w", err)
		}
	}
	if err := filecopy.New(meta.Image(), r.staged); err != nil {
		return nil, fmt.Errorf("replay %q: copy its image: %w", meta.Name, err)
	}
	push("replay image", func() error { return removeIfThere(r.staged) })
	f, err := os.OpenFile(r.conFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	f.Close()
	push("replay console", func() error { return removeIfThere(r.conFile) })
	cfg.RR = &qemu.RR{Replay: true, Log: meta.Log(), Image: r.staged}
	cfg.ConsoleFile = r.conFile
	rt.Paused = true
	r.bin = cfg.Binary
	if r.bin == "" {
		r.bin = qemu.DefaultBinary
	}
	switch {
	case meta.State == recording.Complete && meta.Instructions > 0:
		// It stopped at Instructions, and QEMU replays its quit there.
		r.end = meta.Instructions - 1
	case meta.EndFound:
		r.end = meta.Instructions
	default:
		if r.end, err = r.findEnd(ctx, *cfg, *rt, c.Files); err != nil {
			return nil, err
		}
		meta.Instructions, meta.EndFound = r.end, true
		if err := r.store.Update(meta); err != nil {
			r.log.Warn("note where a recording ends", "recording", meta.Name, "err", err)
		}
		r.meta = meta
	}
	return r, nil
}

// findEnd replays a recording whose end is not known (cut by a kill, or
// ended by the guest) to its end, where QEMU exits, watching how far it
// gets: one instruction before the last count seen is where later
// replays stop.
func (r *Replayer) findEnd(ctx context.Context, cfg qemu.Config, rt qemu.Runtime, files func() (map[string]*os.File, error)) (uint64, error) {
	rt.GDBSocket, rt.GDBTCP, rt.Paused, rt.BeforeCont = "", "", false, nil
	cfg.Files = nil
	if files != nil {
		fs, err := files()
		if err != nil {
			return 0, err
		}
		cfg.Files = fs
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
			// before the break stops the replay). One instruction
			// before, the last event is still running.
			end := last - 1
			r.log.Info("found where a recording ends", "recording", r.meta.Name, "icount", end, "last_seen", last)
			os.Truncate(r.conFile, 0)
			return end, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		case <-t.C:
			if n, err := Position(ctx, mch); err == nil && n > last {
				last = n
			}
		}
	}
}

// Start starts reading what the replaying QEMU prints into buf, once it
// runs; its undo goes to push.
func (r *Replayer) Start(mch *qemu.Process, buf *serial.Buffer, push func(what string, undo func() error)) error {
	p, err := newPump(r.conFile, buf, r.log, recorded{path: r.meta.Console(), end: r.meta.ConsoleBytes})
	if err != nil {
		return err
	}
	r.pump = p
	push("replay console reader", func() error { p.close(); return nil })
	if mch != nil {
		r.version = mch.Version()
	}
	return nil
}

// Meta is the recording replayed.
func (r *Replayer) Meta() recording.Meta { return r.meta }

// Rewind says the QEMU starts over at the recording's start: what the
// console shows stays, and the next output is read from there.
func (r *Replayer) Rewind() { r.pump.reset(0) }

func removeIfThere(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
