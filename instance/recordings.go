package instance

import (
	"errors"
	"fmt"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// Recordings are the server's recordings, as Snapshots are its saved
// states: one store, the match of a recording to the machine a replay
// boots, which guest records or replays which, listing, deleting, and
// their part of the cap on kept files.
type Recordings struct {
	m *Manager

	mu sync.Mutex
	// replays are the recordings guests replay, by directory: the
	// instance's name.
	replays map[string]string
}

// Recordings are the server's recordings.
func (m *Manager) Recordings() *Recordings { return m.recs }

// ErrRecordingInUse is wrapped by a *RecordingInUseError.
var ErrRecordingInUse = errors.New("the recording is in use")

// RecordingInUseError is a recording that cannot be deleted (or recorded
// over) while a guest records or replays it.
type RecordingInUseError struct {
	Name  string
	Guest string
	// Replayed says the guest replays it (else it records it).
	Replayed bool
}

func (e *RecordingInUseError) Error() string {
	how := "recorded"
	if e.Replayed {
		how = "replayed"
	}
	return fmt.Sprintf("recording %q is being %s by guest %q", e.Name, how, e.Guest)
}

func (e *RecordingInUseError) Is(target error) bool { return target == ErrRecordingInUse }

// Find returns the project root's recording name, or a
// *recording.NotFoundError.
func (rs *Recordings) Find(root, name string) (recording.Meta, error) {
	m := rs.m
	if m.cfg.Recordings == "" {
		return recording.Meta{}, errNoRecordings
	}
	return rs.store().Get(root, name)
}

// errNoRecordings is a server without a state directory.
var errNoRecordings = errors.New("this server keeps no recordings (no state directory)")

// Machine is the machine the project root's recording name was
// made on, as boot arguments, for a replay that gives none.
func (rs *Recordings) Machine(root, name string) (profile.Profile, error) {
	meta, err := rs.Find(root, name)
	if err != nil {
		return profile.Profile{}, err
	}
	return rs.m.machineArgs(meta.Machine), nil
}

// findReplay finds the recording spec.Replay names and checks that it
// was made on the machine spec.QEMU gives.
func (rs *Recordings) findReplay(spec *Spec) error {
	r := spec.Replay
	if r.Meta.Dir == "" {
		meta, err := rs.Find(spec.Root, r.Name)
		if err != nil {
			return err
		}
		r = &ReplaySpec{Name: r.Name, Meta: meta}
	}
	mach, err := snapshot.Describe(spec.QEMU)
	if err != nil {
		return err
	}
	if mach.Hash() != r.Meta.Machine.Hash() {
		return &recording.MachineError{Name: r.Meta.Name, Diffs: snapshot.Diff(r.Meta.Machine, mach)}
	}
	spec.Replay = r
	return nil
}

// RecordingList is a project's recordings, newest first, and what all
// recordings (of every project) take against the cap on kept files.
type RecordingList struct {
	Recordings []recording.Meta
	Total, Cap int64
}

// List lists the project root's recordings.
func (rs *Recordings) List(root string) (RecordingList, error) {
	m := rs.m
	l := RecordingList{Cap: m.cfg.KeepCap}
	if m.cfg.Recordings == "" {
		return l, nil
	}
	store := rs.store()
	metas, err := store.List(root)
	if err != nil {
		return l, err
	}
	l.Recordings = metas
	l.Total, _ = store.Total()
	return l, nil
}

// Delete deletes the project root's recording name, unless a
// guest records or replays it (a *RecordingInUseError).
func (rs *Recordings) Delete(root, name string) (recording.Meta, error) {
	m := rs.m
	meta, err := rs.Find(root, name)
	if err != nil {
		return recording.Meta{}, err
	}
	if who := rs.user(root, name); who != "" {
		return meta, &RecordingInUseError{Name: name, Guest: who, Replayed: true}
	}
	for _, i := range m.List() {
		if rm, ok := i.Recording(); ok && rm.Dir == meta.Dir && i.State() != Stopped {
			return meta, &RecordingInUseError{Name: name, Guest: i.Name()}
		}
	}
	return meta, rs.store().Delete(meta)
}

// store is the recording store.
func (rs *Recordings) store() recording.Store {
	m := rs.m
	return recording.Store{Dir: m.cfg.Recordings, Owner: m.owner, Logger: m.log}
}

// claim marks meta as replayed by instance name until release:
// it is neither deleted nor replaced meanwhile.
func (rs *Recordings) claim(meta recording.Meta, name string) (release func(), err error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if who, ok := rs.replays[meta.Dir]; ok && who != name {
		return nil, fmt.Errorf("recording %q is being replayed by guest %q already: one replay of a recording at a time", meta.Name, who)
	}
	rs.replays[meta.Dir] = name
	return func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if rs.replays[meta.Dir] == name {
			delete(rs.replays, meta.Dir)
		}
	}, nil
}

// user is the guest that replays the project's recording name,
// "" if none does.
func (rs *Recordings) user(root, name string) string {
	meta, err := rs.store().Get(root, name)
	if err != nil {
		return ""
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.replays[meta.Dir]
}

// Advice is what a caller can do: shut the guest down first.
func (e *RecordingInUseError) Advice() advice.Advice {
	return advice.Advice{Action: advice.ShutdownFirst}
}
