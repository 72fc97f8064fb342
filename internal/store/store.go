// Package store is the skeleton the snapshot and recording stores share:
// whose work an entry is (the server an id names, and whether it still
// runs), the names users give entries, records and intents written
// durably under the names both stores use, the disk space files take, and
// the sweep that finds, and on request removes, what killed servers left.
// It knows nothing of what a snapshot or a recording holds.
//
// Each store keeps, per project directory (and below it, for snapshots,
// per machine), for the entry NAME and the id ID of the work that wrote it:
// the record NAME.json, written whole through .NAME.ID.json.tmp, and while
// the work is under way its intent .NAME.ID.intent. An id is
// "<pid>-<start time>-<n>": the server, as the runtime directory's names
// carry it (package names), and a number, so that what a killed server
// left tells by its name alone whether that server still runs.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/durable"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// Kind is what a store keeps, as messages name it: "snapshot",
// "recording".
type Kind string

// CheckName accepts the name a user gives an entry: letters, digits, '.',
// '_', '-', at most 64, not starting with a punctuation mark (it names
// files, and a leading dot would hide them among the store's own).
func (k Kind) CheckName(name string) error {
	if !names.ValidUserName(name) {
		return fmt.Errorf("%s name %q: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", k, name)
	}
	return nil
}

// Self is the server whose work a store's new entries are: owner, or this
// process when owner is zero.
func Self(owner names.Owner) names.Owner {
	if owner.PID > 0 {
		return owner
	}
	if id, err := proc.Self(); err == nil {
		return names.Owner{PID: id.PID, StartTime: id.StartTime}
	}
	return names.Owner{PID: os.Getpid()}
}

// Alive tells whether o may still be working: a live process, or one that
// cannot be told (what may be another's work in progress is never taken
// for a leftover).
func Alive(o names.Owner) bool {
	live, _, err := proc.Check(proc.Identity{PID: o.PID, StartTime: o.StartTime})
	return err != nil || live == proc.Alive
}

// Live tells whether o may still be working, self (see Self) counting as
// working whatever its process.
func Live(self, o names.Owner) bool { return o == self || Alive(o) }

// NewID names a piece of work of owner o: "<pid>-<start time>-<n>", n
// growing with the time.
func NewID(o names.Owner) string {
	return o.Tag() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// ParseID returns the server an id names.
func ParseID(id string) (names.Owner, bool) {
	parts := strings.Split(id, "-")
	if len(parts) != 3 || parts[2] == "" {
		return names.Owner{}, false
	}
	o, ok := names.ParseTag(parts[0] + "-" + parts[1])
	if !ok || o.Legacy() {
		return names.Owner{}, false
	}
	if _, err := strconv.ParseUint(parts[2], 36, 64); err != nil {
		return names.Owner{}, false
	}
	return o, true
}

// SplitName reads a file name "NAME.ID<suffix>" or ".NAME.ID<suffix>" of
// the entry NAME and the work ID, and the server ID names.
func SplitName(file, suffix string) (name, id string, o names.Owner, ok bool) {
	base, ok := strings.CutSuffix(strings.TrimPrefix(file, "."), suffix)
	if !ok {
		return "", "", names.Owner{}, false
	}
	k := strings.LastIndexByte(base, '.')
	if k <= 0 {
		return "", "", names.Owner{}, false
	}
	name, id = base[:k], base[k+1:]
	o, ok = ParseID(id)
	if !ok || !names.ValidUserName(name) {
		return "", "", names.Owner{}, false
	}
	return name, id, o, true
}

// RecordName is the file of the record of the entry name.
func RecordName(name string) string { return name + ".json" }

// RecordTemp is the temporary file the record of the entry name is written
// through by the work id.
func RecordTemp(name, id string) string { return "." + name + "." + id + ".json.tmp" }

// IntentSuffix ends the name of an intent.
const IntentSuffix = ".intent"

// IntentName is the file of the intent of the work id on the entry name.
func IntentName(name, id string) string { return "." + name + "." + id + IntentSuffix }

// TempOwner returns the server that was writing file, if file is a record
// or an intent being written (.NAME.ID.json.tmp, .NAME.ID.intent.tmp).
func TempOwner(file string) (names.Owner, bool) {
	if !strings.HasPrefix(file, ".") {
		return names.Owner{}, false
	}
	for _, suffix := range []string{".json.tmp", IntentSuffix + ".tmp"} {
		if _, _, o, ok := SplitName(file, suffix); ok {
			return o, true
		}
	}
	return names.Owner{}, false
}

// WriteRecord writes b as the record of the entry name in dir, durably
// (see package durable), through RecordTemp(name, id). With once, the work
// id writes the record once and owns that temporary file: one found there
// fails the write. Otherwise the work rewrites its record (an update), and
// a temporary file a killed update left is overwritten.
func WriteRecord(dir, name, id string, b []byte, once bool) error {
	return durable.WriteFile(filepath.Join(dir, RecordName(name)), filepath.Join(dir, RecordTemp(name, id)), b, once)
}

// WriteIntent writes b as the intent of the work id on the entry name in
// dir, durably, before the work writes anything else, and returns its path.
func WriteIntent(dir, name, id string, b []byte) (string, error) {
	p := filepath.Join(dir, IntentName(name, id))
	if err := durable.WriteFile(p, p+".tmp", b, true); err != nil {
		return "", err
	}
	return p, nil
}

// ReadRecord reads the record at path into v.
func (k Kind) ReadRecord(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s record: %w", k, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s record %s: %w", k, path, err)
	}
	return nil
}

// SyncFile makes a file's contents durable (an image QEMU wrote, before a
// record names it).
func SyncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Remove removes the files at paths, in order: one already gone is not an
// error, and the errors of the others are joined.
func Remove(paths ...string) error {
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Allocated is the disk space a file takes: images are sparse, so their
// size says little.
func Allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// Logger is l, or a logger that discards.
func Logger(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}
