package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// RecordSpec records the guest's run as the project's recording Name.
type RecordSpec struct {
	Name string
}

// ErrNotRecordable is a boot that QEMU cannot record faithfully.
var ErrNotRecordable = errors.New("this guest cannot be recorded")

// checkRecordable names what of a machine QEMU cannot record so that it
// replays faithfully; restore tells which boot asks (a recording or a
// replay).
func (s Spec) checkRecordable(what string) error {
	c := s.QEMU
	var no []string
	if c.SMP > 1 {
		no = append(no, fmt.Sprintf("smp %d (QEMU records and replays one hart only)", c.SMP))
	}
	if s.TAP != nil || (c.Network != "" && c.Network != "none") {
		no = append(no, "a network (QEMU 7.2's replay of network traffic freezes; record with network: none)")
	}
	for k, d := range c.Drives {
		if !d.ReadOnly {
			no = append(no, fmt.Sprintf("drives[%d] %s writable (a replay must read what the recording read: attach it with readonly: true)", k, d.Path))
		}
	}
	if len(c.Shares) > 0 {
		no = append(no, "shares (a replay cannot give the guest the host directory as it was)")
	}
	if c.GPU || c.VNC {
		no = append(no, "gpu (QEMU 11's recording of a virtio display hangs the guest's boot)")
	}
	if s.Snapshot != nil {
		no = append(no, "a snapshot to start from (a recording starts from a boot)")
	}
	if len(no) > 0 {
		return fmt.Errorf("%w: %s cannot hold %s; nothing was started", ErrNotRecordable, what, strings.Join(no, "; "))
	}
	return nil
}

// recorder is a recording guest's recording.
type recorder struct {
	store recording.Store
	begun *recording.Begun

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

// beginRecording starts the transaction of a recording, makes its image,
// and has cfg record into it. The cleanup it pushes finishes the record
// (or removes what a boot that failed made).
func (i *Instance) beginRecording(ctx context.Context, cfg *qemu.Config) error {
	m := i.mgr
	if m.cfg.Recordings == "" {
		return errors.New("this server keeps no recordings (no state directory)")
	}
	name := i.spec.Record.Name
	if err := recording.CheckName(name); err != nil {
		return err
	}
	if who := m.recordingUser(i.spec.Root, name); who != "" {
		return fmt.Errorf("recording %q is being replayed by guest %q: shut it down first, or record under another name", name, who)
	}
	mach, err := snapshot.Describe(*cfg)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	meta := recording.Meta{Machine: mach, Instance: i.name, Binary: cfg.Binary}
	for _, d := range cfg.Drives {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return fmt.Errorf("record: %w", err)
		}
		meta.Drives = append(meta.Drives, recording.Drive{Path: d.Path, Size: fi.Size(), ModTime: fi.ModTime().UTC()})
	}
	// The log's format version, which QEMU writes only when it ends a
	// recording: a recording cut by a kill gets it from here.
	if meta.LogVersion, err = qemu.LogVersion(ctx, cfg.Binary, m.cfg.RuntimeDir); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	store := m.recordings()
	b, err := store.Begin(i.spec.Root, name, meta)
	if err != nil {
		return err
	}
	if err := b.NewImage(); err != nil {
		b.Abort()
		return fmt.Errorf("record %q: %w", name, err)
	}
	r := &recorder{store: store, begun: b, started: time.Now(), stopSeen: make(chan struct{}), seenDone: make(chan struct{})}
	r.meta = b.Meta
	i.mu.Lock()
	i.rec = r
	i.mu.Unlock()
	cfg.RR = &qemu.RR{Log: b.Meta.Log(), Image: b.Meta.Image()}
	i.push("recording", func() error { return i.finishRecording() })
	return nil
}

// commitRecording makes the recording the project's, once QEMU saved the
// machine at its first instruction (before the guest ran).
func (i *Instance) commitRecording(ctx context.Context, mch *qemu.Machine) error {
	r := i.recorder()
	ver := mch.Version()
	meta := r.begun.Meta
	meta.QEMU, meta.Binary = ver, mch.Argv()[0]
	meta, err := r.begun.Commit(meta)
	if err != nil {
		return err
	}
	// QEMU leaves the header to its end; written now, a kill cannot leave
	// a log no QEMU replays.
	if err := recording.WriteHeader(meta.Log(), meta.LogVersion); err != nil {
		return fmt.Errorf("record %q: %w", meta.Name, err)
	}
	r.mu.Lock()
	r.meta, r.committed = meta, true
	r.mu.Unlock()
	go i.followRecording(mch, r)
	return nil
}

func (i *Instance) recorder() *recorder {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.rec
}

// followRecording notes, once a second, how far the recording got: a
// recording cut by a kill reaches about there.
func (i *Instance) followRecording(mch *qemu.Machine, r *recorder) {
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
		n, err := replayPosition(ctx, mch)
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
			i.mgr.log.Debug("note a recording's progress", "instance", i.name, "err", err)
		}
	}
}

// pauseRecording stops a recording guest where it is and notes the
// instruction count: the recording ends there, so that its replay
// stops there too. Called before a stop asks QEMU to quit.
func (i *Instance) pauseRecording(ctx context.Context, mch *qemu.Machine) {
	r := i.recorder()
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := mch.Monitor().Execute(ctx, "stop", nil); err != nil {
		return
	}
	n, err := replayPosition(ctx, mch)
	if err != nil {
		return
	}
	r.mu.Lock()
	r.end, r.ended = n, true
	r.mu.Unlock()
}

// finishRecording writes how the recording ended, or removes a recording
// that never started. QEMU has stopped (it is the newer cleanup).
func (i *Instance) finishRecording() error {
	r := i.recorder()
	r.mu.Lock()
	committed := r.committed
	r.mu.Unlock()
	if !committed {
		r.begun.Abort()
		return nil
	}
	close(r.stopSeen)
	<-r.seenDone
	mch := i.Machine()
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
	if con := i.console; con != nil {
		// What QEMU printed last may still be in the pipe: the watcher
		// that drains it at QEMU's exit runs beside this stop.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := con.Sync(ctx); err != nil {
			i.mgr.log.Warn("a recording's console: the last output may be missing", "instance", i.name, "err", err)
		}
		cancel()
		meta.ConsoleBytes = con.Buffer().End()
		if err := saveConsole(con.Buffer(), meta.Console()); err != nil {
			i.mgr.log.Warn("keep a recording's console", "instance", i.name, "err", err)
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

// Recording is what the guest records into, if it records.
func (i *Instance) Recording() (recording.Meta, bool) {
	r := i.recorder()
	if r == nil {
		return recording.Meta{}, false
	}
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

// typeRecorded types p on a recording guest's console a few bytes at a
// time, each chunk after the guest echoed the last, and returns how many
// bytes it took (echoed). Control characters count as taken once the
// guest printed anything after them.
func typeRecorded(ctx context.Context, con *serial.Console, p []byte) (int, error) {
	b := con.Buffer()
	n := 0
	for n < len(p) {
		chunk := p[n:min(n+typeChunk, len(p))]
		// A line ending goes alone: its echo is a new line.
		if k := strings.IndexAny(string(chunk), "\r\n"); k == 0 {
			chunk = chunk[:1]
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

// Type writes p on the guest's console, as serial_send and guest_exec
// do: a recording guest is given it paced by its echo (or, with
// charDelay, a byte at a time), so that no byte is lost; a replaying
// guest takes none. It returns how many bytes went to (or, recording,
// were taken by) the guest.
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
	case i.recorder() != nil:
		return typeRecorded(ctx, con, p)
	}
	return con.Write(ctx, p)
}

// typist is the console a shell runs on, typed on through Type.
type typist struct {
	i   *Instance
	con *serial.Console
}

func (t typist) Write(ctx context.Context, p []byte) (int, error) { return t.i.Type(ctx, p, 0) }
func (t typist) Buffer() *serial.Buffer                           { return t.con.Buffer() }
