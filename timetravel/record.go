package timetravel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// Recorder is a recording guest's recording.
type Recorder struct {
	log      *slog.Logger
	instance string
	store    recording.Store
	begun    *recording.Begun

	mu        sync.Mutex
	meta      recording.Meta // as committed
	committed bool
	end       uint64 // the instruction count where a stop paused it
	ended     bool
	seen      uint64
	stopSeen  chan struct{}
	seenDone  chan struct{}
	started   time.Time
}

// RecordConfig is a recording to begin.
type RecordConfig struct {
	Store      recording.Store
	Root, Name string
	// Instance is the guest that records.
	Instance string
	// RuntimeDir is where the log-version probe runs.
	RuntimeDir string
	Log        *slog.Logger
}

// Begin starts the transaction of a recording, makes its image, and has
// cfg record into it. Finish ends it (or Abort, for a boot that failed
// before QEMU started).
func Begin(ctx context.Context, c RecordConfig, cfg *qemu.Config) (*Recorder, error) {
	if err := recording.CheckName(c.Name); err != nil {
		return nil, err
	}
	mach, err := snapshot.Describe(*cfg)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	meta := recording.Meta{Machine: mach, Instance: c.Instance, Binary: cfg.Binary}
	for _, d := range cfg.Drives {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return nil, fmt.Errorf("record: %w", err)
		}
		meta.Drives = append(meta.Drives, recording.Drive{Path: d.Path, Size: fi.Size(), ModTime: fi.ModTime().UTC()})
	}
	// The log's format version, which QEMU writes only when it ends a
	// recording: a recording cut by a kill gets it from here.
	if meta.LogVersion, err = qemu.LogVersion(ctx, cfg.Binary, c.RuntimeDir); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	b, err := c.Store.Begin(c.Root, c.Name, meta)
	if err != nil {
		return nil, err
	}
	if err := b.NewImage(); err != nil {
		b.Abort()
		return nil, fmt.Errorf("record %q: %w", c.Name, err)
	}
	r := &Recorder{log: c.Log, instance: c.Instance, store: c.Store, begun: b, started: time.Now(), stopSeen: make(chan struct{}), seenDone: make(chan struct{})}
	r.meta = b.Meta
	cfg.RR = &qemu.RR{Log: b.Meta.Log(), Image: b.Meta.Image()}
	return r, nil
}

// Name is the recording's name.
func (r *Recorder) Name() string { return r.begun.Meta.Name }

// Commit makes the recording the project's, once QEMU saved the machine
// at its first instruction (before the guest ran).
func (r *Recorder) Commit(mch *qemu.Process) error {
	ver := mch.Version()
	meta := r.begun.Meta
	meta.QEMU, meta.Binary = ver, mch.Argv()[0]
	meta, err := r.begun.Commit(meta)
	if err != nil {
		return err
	}
	// The record exists from here: whatever follows, Finish writes how
	// the recording ended.
	r.mu.Lock()
	r.meta, r.committed = meta, true
	r.mu.Unlock()
	go r.follow(mch)
	// QEMU leaves the header to its end; written now, a kill cannot leave
	// a log no QEMU replays (and a replay writes it if this fails).
	if err := recording.WriteHeader(meta.Log(), meta.LogVersion); err != nil {
		return fmt.Errorf("record %q: %w", meta.Name, err)
	}
	return nil
}

// follow notes, once a second, how far the recording got: a
// recording cut by a kill reaches about there.
func (r *Recorder) follow(mch *qemu.Process) {
	defer close(r.seenDone)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.stopSeen:
			return
		case <-mch.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		n, err := Position(ctx, mch)
		cancel()
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.seen = n
		meta := r.meta
		meta.Seen = n
		r.meta = meta
		r.mu.Unlock()
		if err := r.store.Update(meta); err != nil {
			r.log.Debug("note a recording's progress", "instance", r.instance, "err", err)
		}
	}
}

// Pause stops a recording guest where it is and notes the instruction
// count: the recording ends there, so that its replay stops there too.
// Called before a stop asks QEMU to quit.
func (r *Recorder) Pause(ctx context.Context, mch *qemu.Process) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := mch.Monitor().Execute(ctx, "stop", nil); err != nil {
		return
	}
	n, err := Position(ctx, mch)
	if err != nil {
		return
	}
	r.mu.Lock()
	r.end, r.ended = n, true
	r.mu.Unlock()
}

// Finish writes how the recording ended, with what the guest printed on
// con, or removes a recording that never started. mch, the QEMU that
// recorded (nil if none started), has stopped.
func (r *Recorder) Finish(mch *qemu.Process, con *serial.Console) error {
	r.mu.Lock()
	committed := r.committed
	r.mu.Unlock()
	if !committed {
		r.begun.Abort()
		return nil
	}
	close(r.stopSeen)
	<-r.seenDone
	r.mu.Lock()
	defer r.mu.Unlock()
	meta := r.meta
	meta.Owner = nil
	meta.Seconds = time.Since(r.started).Seconds()
	var exit qemu.Exit
	exited := false
	if mch != nil {
		exit, exited = mch.Exited()
	}
	switch {
	case r.ended && exited && exit.Signal == "" && exit.Code == 0:
		meta.State, meta.Instructions = recording.Complete, r.end
		meta.Ended = recording.EndedStopped
	case exited && exit.Signal == "" && exit.Code == 0:
		// The guest powered off: the log is whole, and its replay finds
		// where it ends.
		meta.State = recording.Complete
		meta.Ended = "the guest shut down"
	default:
		meta.State = recording.Cut
		meta.Ended = "QEMU " + exit.String()
		if !exited {
			meta.Ended = "QEMU did not stop"
		}
	}
	if con != nil {
		// What QEMU printed last may still be in the pipe: the watcher
		// that drains it at QEMU's exit runs beside this stop.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := con.Sync(ctx); err != nil {
			r.log.Warn("a recording's console: the last output may be missing", "instance", r.instance, "err", err)
		}
		cancel()
		meta.ConsoleBytes = con.Buffer().End()
		if err := saveConsole(con.Buffer(), meta.Console()); err != nil {
			r.log.Warn("keep a recording's console", "instance", r.instance, "err", err)
		}
	}
	r.meta = meta
	if err := r.store.Update(meta); err != nil {
		return fmt.Errorf("recording %q: %w", meta.Name, err)
	}
	return nil
}

// saveConsole copies what the guest printed into path.
func saveConsole(b *serial.Buffer, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	for since := int64(0); since < b.End(); {
		p, err := b.ReadPage(since, 1<<20)
		if err != nil || len(p.Data) == 0 {
			break
		}
		if _, err := f.Write(p.Data); err != nil {
			f.Close()
			return err
		}
		since = p.Start + int64(len(p.Data))
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Meta is the recording, and whether it was committed.
func (r *Recorder) Meta() (recording.Meta, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.meta, r.committed
}

// typeChunk is how many bytes a recording guest is given at a time: QEMU
// hands what arrives to the UART at once, whatever its FIFO holds, and 4
// bytes each after the guest's echo of the last lost none (qemu-state.md).
const typeChunk = 4

// echoWait bounds the wait for a guest's echo of one chunk.
const echoWait = 2 * time.Second

// ErrNoEcho is input a recording guest did not echo: it may not have
// taken it, so nothing more was typed. A *NoEchoError wraps it.
var ErrNoEcho = errors.New("the guest did not echo what was typed")

// NoEchoError is the chunk of input a recording guest did not echo within
// Within; the bytes before From were taken.
type NoEchoError struct {
	Within time.Duration
	From   int
	Chunk  []byte
}

func (e *NoEchoError) Error() string {
	return fmt.Sprintf("%v within %v of bytes %d..%d (%q): a recording guest is given input only as fast as it takes it, which its echo shows",
		ErrNoEcho, e.Within, e.From, e.From+len(e.Chunk), e.Chunk)
}

func (e *NoEchoError) Is(target error) bool { return target == ErrNoEcho }

// TypePaced types p on a recording guest's console a few bytes at a
// time, each chunk after the guest echoed the last, and returns how many
// bytes it took (echoed). Control characters count as taken once the
// guest printed anything after them.
func TypePaced(ctx context.Context, con *serial.Console, p []byte) (int, error) {
	b := con.Buffer()
	n := 0
	for n < len(p) {
		chunk := p[n:min(n+typeChunk, len(p))]
		// A line ending goes alone: its echo is a new line. CR LF is one
		// ending, echoed once: a guest that ends the line at the CR may
		// ignore the LF after it and echo nothing for it.
		if k := strings.IndexAny(string(chunk), "\r\n"); k == 0 {
			chunk = chunk[:1]
			if len(p) > n+1 && p[n] == '\r' && p[n+1] == '\n' {
				chunk = p[n : n+2]
			}
		} else if k > 0 {
			chunk = chunk[:k]
		}
		from := b.End()
		if _, err := con.Write(ctx, chunk); err != nil {
			return n, err
		}
		var want string
		for _, c := range chunk {
			if c >= 0x20 && c < 0x7f {
				want += string(c)
			}
		}
		re := `(?s).`
		switch {
		case want != "":
			re = regexp.QuoteMeta(want)
		case chunk[0] == '\r' || chunk[0] == '\n':
			re = `\n`
		}
		m, err := b.Wait(ctx, from, regexp.MustCompile(re), echoWait)
		if err != nil {
			return n, err
		}
		if !m.Matched {
			return n, &NoEchoError{Within: echoWait, From: n, Chunk: chunk}
		}
		n += len(chunk)
	}
	return n, nil
}

// Advice is what a caller can do: type a byte at a time.
func (e *NoEchoError) Advice() advice.Advice { return advice.Advice{Action: advice.TypeSlowly} }
