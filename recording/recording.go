// Package recording keeps deterministic recordings of guests (QEMU's
// record/replay: an instruction-count log and a qcow2 holding the machine
// at its first instruction) and the checkpoints replays take on the way, per
// project in the state directory, with the crash safety of package
// snapshot. It knows nothing of MCP or of instances.
//
// # The store
//
// Under the store directory, one directory per project (the same name as
// the snapshot store's: <base name>-<hash of the root>), and in it, for the
// recording NAME:
//
//   - NAME.json, the record (Meta): the machine, the QEMU that recorded,
//     its state (recording, complete or cut), how the run ended, its length
//     in instructions and console bytes, and the ID of its directory. The
//     record is the recording: written whole (a temporary file, fsync,
//     rename, fsync of the directory).
//   - NAME.ID/, its files: log.bin (QEMU's log), init.qcow2 (the machine at
//     instruction 0), console.log (what the guest printed), and
//     checkpoints/ (start points replays saved, see Checkpoint).
//   - .NAME.ID.intent while a recording starts: written and made durable
//     before anything else, naming the directory and the recording it
//     replaces, so that the reaper can remove what a killed start left.
//
// ID is "<pid>-<start time>-<n>": the recording server and a number, so a
// leftover tells by its name whether its server still runs.
//
// # A recording is a transaction
//
// Intent; the directory with an empty image; QEMU records (it saves the
// machine into the image before the guest runs); the image checked; the
// record written (state "recording", naming its server): from here the
// recording exists and an older one of the name is removed; the intent
// removed. At the end the record is rewritten with how the run ended. A
// recording whose server died while it recorded is cut: its log ends
// where the kill found it, and it replays up to there (the list says cut).
// Nothing partial is ever listed, and nothing is orphaned: Leftovers and
// Reap find what killed starts left.
//
// Checkpoints are a cache: a replay saves them, any replay of the same
// QEMU may load them, and Evict removes them before anything else when the
// kept files pass their cap.
package recording

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/internal/durable"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// States of a recording.
const (
	// Recording: its server records it now (or died doing so: then it
	// is listed as Cut).
	Recording = "recording"
	// Complete: the recording ended and knows its length.
	Complete = "complete"
	// Cut: the recording QEMU or its server was killed; the log ends
	// where the kill found it.
	Cut = "cut"
)

// EndedStopped is how a recording ended that its guest's stop ended (a
// shutdown, a restart, the server's exit): whole up to there.
const EndedStopped = "stopped"

// Files of a recording's directory.
const (
	LogFile     = "log.bin"
	ImageFile   = "init.qcow2"
	ConsoleFile = "console.log"
	ckDir       = "checkpoints"
)

// InitTag is the snapshot in the image that holds the machine at
// instruction 0 (QEMU's rrsnapshot).
const InitTag = "init"

// HeaderSize is the log's header: the format's version (a big-endian
// 32-bit word) and 8 bytes QEMU leaves zero.
const HeaderSize = 12

// Drive is a read-only disk of the recorded machine, known by size and
// modification time: a replay reads it as the recording did only if it
// is unchanged.
type Drive struct {
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mtime"`
}

// Meta is a recording's record.
type Meta struct {
	Name    string           `json:"name"`
	Project string           `json:"project"`
	ID      string           `json:"id"`
	Machine snapshot.Machine `json:"machine"`
	// QEMU is the version that recorded (a replay needs the same), Binary
	// its path then, LogVersion the log format's version word.
	QEMU       string    `json:"qemu"`
	Binary     string    `json:"binary"`
	LogVersion uint32    `json:"log_version"`
	Created    time.Time `json:"created"`
	// State is Recording, Complete or Cut (as stored; Status says what it
	// is now).
	State string `json:"state"`
	// Owner is the recording server, while it records.
	Owner *names.Owner `json:"owner,omitempty"`
	// Instance is the guest that recorded.
	Instance string `json:"instance"`
	// Instructions is the recording's length, the instruction count of
	// its last state: known when it completed, or once a replay of a cut
	// recording reached its end (EndFound).
	Instructions uint64 `json:"instructions,omitempty"`
	EndFound     bool   `json:"end_found,omitempty"`
	// Seen is the highest instruction count seen while it recorded: a
	// cut recording reaches at least about there.
	Seen uint64 `json:"seen,omitempty"`
	// Ended says how the run ended: EndedStopped, or in words.
	Ended        string  `json:"ended,omitempty"`
	ConsoleBytes int64   `json:"console_bytes,omitempty"`
	Seconds      float64 `json:"seconds,omitempty"`
	Drives       []Drive `json:"drives,omitempty"`

	// Dir is the recording's directory (not stored).
	Dir string `json:"-"`
	// unreadable says why the record could not be read.
	unreadable string
}

// Log, Image and Console are the paths of the recording's files.
func (m Meta) Log() string     { return filepath.Join(m.Dir, LogFile) }
func (m Meta) Image() string   { return filepath.Join(m.Dir, ImageFile) }
func (m Meta) Console() string { return filepath.Join(m.Dir, ConsoleFile) }

// Status is the recording's state now: a recording whose server is gone is
// cut.
func (m Meta) Status() string {
	if m.State == Recording && (m.Owner == nil || !store.Alive(*m.Owner)) {
		return Cut
	}
	return m.State
}

// Unreadable says why the record could not be read, "" if it could.
func (m Meta) Unreadable() string { return m.unreadable }

// Store is the recordings directory.
type Store struct {
	Dir string
	// Owner is the server whose recordings these are; zero means this
	// process.
	Owner names.Owner
	// Logger receives what could not be undone; nil discards.
	Logger *slog.Logger
}

func (s Store) owner() names.Owner { return store.Self(s.Owner) }

// kind is what this store keeps, in its messages.
const kind store.Kind = "recording"

// CheckName accepts a recording name (see store.Kind.CheckName).
func CheckName(name string) error { return kind.CheckName(name) }

func (s Store) projectDir(root string) string { return filepath.Join(s.Dir, names.Project(root)) }

// ErrNotFound is a recording name the project does not have; a
// *NotFoundError wraps it.
var ErrNotFound = errors.New("no such recording")

// NotFoundError is a recording name project Root does not have.
type NotFoundError struct {
	Name, Root string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%v %q in project %s", ErrNotFound, e.Name, e.Root)
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// MachineError is a replay asked of another machine than the recording's:
// Diffs says how they differ (see snapshot.Diff).
type MachineError struct {
	Name  string
	Diffs []string
}

func (e *MachineError) Error() string {
	return fmt.Sprintf("recording %q was made on another machine than the one given: %s", e.Name, strings.Join(e.Diffs, "; "))
}

func read(path string) (Meta, error) {
	var m Meta
	if err := kind.ReadRecord(path, &m); err != nil {
		return Meta{}, err
	}
	if !names.ValidUserName(m.Name) || m.ID == "" || m.ID != filepath.Base(m.ID) || strings.HasPrefix(m.ID, ".") {
		return Meta{}, fmt.Errorf("recording record %s: names a directory outside the store", path)
	}
	m.Dir = filepath.Join(filepath.Dir(path), m.Name+"."+m.ID)
	return m, nil
}

// List returns the project's recordings, newest first. A record that cannot
// be read is listed by name, with Unreadable saying why.
func (s Store) List(root string) ([]Meta, error) {
	return s.recordsIn(s.projectDir(root))
}

// recordsIn reads the records of a project directory, newest first.
func (s Store) recordsIn(dir string) ([]Meta, error) {
	out, err := records.In(dir)
	slices.SortFunc(out, func(a, b Meta) int { return b.Created.Compare(a.Created) })
	return out, err
}

// records reads a project directory's records; one that cannot be read is
// listed by name, with Unreadable saying why.
var records = store.Reader[Meta]{Kind: kind, Read: read,
	Name: func(m Meta) string { return m.Name },
	Unreadable: func(name, _ string, err error) Meta {
		return Meta{Name: name, unreadable: err.Error()}
	},
}

// Get returns the project's recording name.
func (s Store) Get(root, name string) (Meta, error) {
	if err := CheckName(name); err != nil {
		return Meta{}, err
	}
	m, err := read(filepath.Join(s.projectDir(root), name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, &NotFoundError{Name: name, Root: root}
	}
	return m, err
}

// Size is the disk space the recording takes, and its checkpoints' part
// of it.
func (m Meta) Size() (total, checkpoints int64) {
	_ = filepath.WalkDir(m.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n := store.Allocated(fi)
			total += n
			if filepath.Base(filepath.Dir(p)) == ckDir {
				checkpoints += n
			}
		}
		return nil
	})
	return total, checkpoints
}

// Total is the disk space all recordings take (every project's), and
// their checkpoints' part of it.
func (s Store) Total() (total, checkpoints int64) {
	store.Walk(s.Dir, 1, nil, func(dir string) {
		ms, _ := s.recordsIn(dir)
		for _, m := range ms {
			if m.unreadable != "" {
				continue
			}
			t, c := m.Size()
			total += t
			checkpoints += c
		}
	})
	return total, checkpoints
}

// Delete removes a recording: its record first (from then on it does not
// exist), then its directory.
func (s Store) Delete(m Meta) error {
	rec := filepath.Join(filepath.Dir(m.Dir), m.Name+".json")
	if cur, err := read(rec); err == nil && cur.ID == m.ID {
		if err := store.Remove(rec); err != nil {
			return fmt.Errorf("delete recording %q: %w", m.Name, err)
		}
		durable.SyncDir(filepath.Dir(rec))
	}
	if m.Dir == "" {
		return nil
	}
	if err := os.RemoveAll(m.Dir); err != nil {
		return fmt.Errorf("delete recording %q: its files: %w", m.Name, err)
	}
	return nil
}

// Update rewrites the record of m (the same recording: its ID), durably.
func (s Store) Update(m Meta) error {
	dir := filepath.Dir(m.Dir)
	rec := filepath.Join(dir, store.RecordName(m.Name))
	if cur, err := read(rec); err != nil || cur.ID != m.ID {
		return fmt.Errorf("update recording %q: it was replaced or deleted meanwhile", m.Name)
	}
	return writeRecord(dir, m)
}

func writeRecord(dir string, m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return store.WriteRecord(dir, m.Name, m.ID, b, false)
}

// Intent is what a starting recording is about to make.
type Intent struct {
	Name     string      `json:"name"`
	ID       string      `json:"id"`
	Owner    names.Owner `json:"owner"`
	Replaces string      `json:"replaces,omitempty"`
}

// Begun is a recording that is starting: its directory exists and QEMU
// may record into it; Commit makes it the project's recording of its name,
// Abort removes it.
type Begun struct {
	s      Store
	Meta   Meta
	intent string
	old    *Meta
	done   bool
}

// Begin starts a recording name of project root: it writes the intent,
// then makes the recording's directory. The caller makes the image
// (ImageFile) and has QEMU record into it, then calls Commit or Abort.
func (s Store) Begin(root, name string, m Meta) (*Begun, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	pdir := s.projectDir(root)
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return nil, fmt.Errorf("recording %q: %w", name, err)
	}
	o := s.owner()
	m.Name, m.Project, m.ID, m.State, m.Owner = name, filepath.Clean(root), store.NewID(o), Recording, &o
	m.Created = time.Now().UTC()
	m.Dir = filepath.Join(pdir, name+"."+m.ID)
	b := &Begun{s: s, Meta: m}
	in := Intent{Name: name, ID: m.ID, Owner: o}
	if old, err := read(filepath.Join(pdir, name+".json")); err == nil {
		b.old = &old
		in.Replaces = old.ID
	}
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	if b.intent, err = store.WriteIntent(pdir, name, m.ID, raw); err != nil {
		return nil, fmt.Errorf("recording %q: write its intent: %w", name, err)
	}
	if err := os.Mkdir(m.Dir, 0o700); err != nil {
		os.Remove(b.intent)
		return nil, fmt.Errorf("recording %q: %w", name, err)
	}
	durable.SyncDir(pdir)
	return b, nil
}

// Commit checks the image holds the machine at instruction 0 and writes
// the record: the recording exists from here, as a recording in progress
// of this server; an older one of the name is removed.
func (b *Begun) Commit(m Meta) (Meta, error) {
	if b.done {
		return Meta{}, errors.New("recording: committed or aborted already")
	}
	if err := VerifyImage(b.Meta.Image()); err != nil {
		return Meta{}, fmt.Errorf("recording %q: %w", b.Meta.Name, err)
	}
	m.Name, m.Project, m.ID, m.Dir, m.Created, m.State, m.Owner = b.Meta.Name, b.Meta.Project, b.Meta.ID, b.Meta.Dir, b.Meta.Created, Recording, b.Meta.Owner
	if err := writeRecord(filepath.Dir(m.Dir), m); err != nil {
		return Meta{}, fmt.Errorf("recording %q: write its record: %w", m.Name, err)
	}
	b.done = true
	b.Meta = m
	if b.old != nil {
		if err := os.RemoveAll(b.old.Dir); err != nil {
			store.Logger(b.s.Logger).Warn("remove the recording this one replaced: the reaper finishes it", "dir", b.old.Dir, "err", err)
			return m, nil // the intent stays for the reaper
		}
	}
	if err := os.Remove(b.intent); err != nil {
		store.Logger(b.s.Logger).Warn("remove a committed recording's intent", "err", err)
	}
	return m, nil
}

// Abort removes what the recording made; the older recording of the name,
// if any, stays as it was.
func (b *Begun) Abort() {
	if b.done {
		return
	}
	b.done = true
	if err := os.RemoveAll(b.Meta.Dir); err != nil {
		store.Logger(b.s.Logger).Warn("remove a recording that did not start: the reaper finishes it", "dir", b.Meta.Dir, "err", err)
		return
	}
	os.Remove(b.intent)
}

// VerifyImage checks that image holds the machine at instruction 0.
func VerifyImage(image string) error {
	f, err := os.Open(image)
	if err != nil {
		return fmt.Errorf("its image: %w", err)
	}
	defer f.Close()
	if err := hasState(f, InitTag); err != nil {
		return fmt.Errorf("its image %s: %w", image, err)
	}
	return nil
}

// hasState checks that the qcow2 image r holds a machine state tagged tag.
func hasState(r io.ReaderAt, tag string) error {
	snaps, err := snapshot.InternalSnapshots(r)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Name == tag && sn.VMStateSize > 0 {
			return nil
		}
	}
	return fmt.Errorf("no machine state %q in it", tag)
}

// WriteHeader writes the log's version word at its start. QEMU writes it
// only when it finishes a recording, so a log it was killed writing has
// none and no QEMU would replay it; the bytes are QEMU's own (it leaves
// them alone until it finishes, when it writes the same).
func WriteHeader(log string, version uint32) error {
	f, err := os.OpenFile(log, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], version)
	_, err = f.WriteAt(b[:], 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadHeader returns the log's version word (0: QEMU did not finish it).
func ReadHeader(log string) (uint32, error) {
	f, err := os.Open(log)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

// Advice is what a caller can do: list the recordings.
func (e *NotFoundError) Advice() advice.Advice { return advice.Advice{Action: advice.ListRecordings} }

// Advice is what a caller can do: replay it on its own machine.
func (e *MachineError) Advice() advice.Advice {
	return advice.Advice{Action: advice.ReplayOwnMachine,
		Keep: fmt.Sprintf("recording %q was made on another machine than these arguments give: %s", e.Name, strings.Join(e.Diffs, "; "))}
}
