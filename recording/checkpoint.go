package recording

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/durable"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
)

// CheckpointTag is the snapshot a checkpoint's image holds.
const CheckpointTag = "ck"

// Checkpoint is a start point a replay saved: the machine at an
// instruction count, in an image of its own in the recording's
// checkpoints directory (ck-<count>.<id>.qcow2), with its record beside it
// (ck-<count>.<id>.json), written once the image is whole. A checkpoint
// loads into the QEMU version that saved it.
type Checkpoint struct {
	ICount uint64 `json:"icount"`
	// Console is how many bytes the guest had printed at ICount.
	Console int64  `json:"console"`
	QEMU    string `json:"qemu"`
	// Cost is the replay time from the start point the replay that saved
	// it came from, in seconds: replays cost what the guest did, not the
	// instructions alone.
	Cost    float64   `json:"cost,omitempty"`
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	// Path is the image (not stored).
	Path string `json:"-"`
}

func (m Meta) ckDir() string { return filepath.Join(m.Dir, ckDir) }

func ckBase(icount uint64, id string) string {
	return "ck-" + strconv.FormatUint(icount, 10) + "." + id
}

// parseCk reads "ck-<count>.<id><suffix>".
func parseCk(name, suffix string) (uint64, string, bool) {
	rest, ok := strings.CutSuffix(name, suffix)
	if !ok {
		return 0, "", false
	}
	rest, ok = strings.CutPrefix(rest, "ck-")
	if !ok {
		return 0, "", false
	}
	n, id, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	c, err := strconv.ParseUint(n, 10, 64)
	if err != nil || strconv.FormatUint(c, 10) != n {
		return 0, "", false
	}
	if _, ok := store.ParseID(id); !ok {
		return 0, "", false
	}
	return c, id, true
}

// Checkpoints lists the recording's whole checkpoints that QEMU version
// qemu saved ("" for all), by instruction count.
func (m Meta) Checkpoints(qemu string) []Checkpoint {
	ents, err := os.ReadDir(m.ckDir())
	if err != nil {
		return nil
	}
	var out []Checkpoint
	for _, e := range ents {
		c, id, ok := parseCk(e.Name(), ".json")
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.ckDir(), e.Name()))
		if err != nil {
			continue
		}
		var ck Checkpoint
		if json.Unmarshal(b, &ck) != nil || ck.ICount != c || ck.ID != id || (qemu != "" && ck.QEMU != qemu) {
			continue
		}
		ck.Path = filepath.Join(m.ckDir(), ckBase(c, id)+".qcow2")
		if _, err := os.Stat(ck.Path); err != nil {
			continue
		}
		out = append(out, ck)
	}
	slices.SortFunc(out, func(a, b Checkpoint) int {
		return cmp.Or(cmp.Compare(a.ICount, b.ICount), strings.Compare(a.ID, b.ID))
	})
	return out
}

// NewCheckpoint names the image of a checkpoint at icount, for the caller
// to have QEMU save into; Commit it once the image is whole.
func (s Store) NewCheckpoint(m Meta, icount uint64) (Checkpoint, error) {
	if err := os.MkdirAll(m.ckDir(), 0o700); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	id := store.NewID(s.owner())
	return Checkpoint{ICount: icount, ID: id, Path: filepath.Join(m.ckDir(), ckBase(icount, id)+".qcow2")}, nil
}

// CommitCheckpoint checks the checkpoint's image and writes its record:
// from then on replays may load it.
func (s Store) CommitCheckpoint(ck Checkpoint) error {
	f, err := os.Open(ck.Path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	err = hasState(f, CheckpointTag)
	f.Close()
	if err != nil {
		return fmt.Errorf("checkpoint at %d: %w", ck.ICount, err)
	}
	if err := store.SyncFile(ck.Path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	ck.Created = time.Now().UTC()
	b, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	base := strings.TrimSuffix(ck.Path, ".qcow2")
	return durable.WriteFile(base+".json", base+".json.tmp", b, false)
}

// DropCheckpoint removes a checkpoint: its record first, then its image.
func (s Store) DropCheckpoint(ck Checkpoint) error {
	base := strings.TrimSuffix(ck.Path, ".qcow2")
	return store.Remove(base+".json", ck.Path)
}

// Evict removes checkpoints of every recording, the oldest first, until
// need bytes were freed (or there are none left); it returns what it
// freed.
func (s Store) Evict(need int64) (freed int64, n int) {
	var all []Checkpoint
	store.Walk(s.Dir, 1, nil, func(dir string) {
		ms, _ := s.recordsIn(dir)
		for _, m := range ms {
			if m.unreadable == "" {
				all = append(all, m.Checkpoints("")...)
			}
		}
	})
	slices.SortFunc(all, func(a, b Checkpoint) int { return a.Created.Compare(b.Created) })
	for _, ck := range all {
		if freed >= need {
			break
		}
		size := int64(0)
		if fi, err := os.Stat(ck.Path); err == nil {
			size = store.Allocated(fi)
		}
		if s.DropCheckpoint(ck) == nil {
			freed += size
			n++
		}
	}
	return freed, n
}
