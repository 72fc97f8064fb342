package instance

import (
	"context"
	"errors"
	"os/exec"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// Health is what a server can tell of itself on the host: the repository
// lock of a project, whether its executable changed on disk since it
// started, what dead servers left in the runtime directory, its QEMU, and
// what is wrong with the guests that are not stopped.
type Health struct {
	// RuntimeDir is the server's private runtime directory.
	RuntimeDir string
	LockFile   string
	LockState  lock.State
	LockHolder int
	LockIsOurs bool
	// LockErr says why the lock could not be found or read.
	LockErr error
	// ExeChanged says how the executable changed since the server
	// started ("" if it did not): it runs stale code.
	ExeChanged string
	// DeadServers are the PIDs of dead servers whose leftovers are in the
	// runtime directory; ScanErr says why it could not be read.
	DeadServers []int
	ScanErr     error
	// QEMUVersion is the default architecture's QEMU's version line,
	// QEMU what is known of its capabilities.
	QEMUVersion string
	QEMU        QEMUCaps
	// Arches are the architectures the server knows, the default first,
	// each with its QEMU on this host.
	Arches []ArchHealth
	// Guests are the guests that are not stopped, by name.
	Guests []GuestHealth
}

// Degraded reports whether something needs the user: the lock could not
// be read, the server runs stale code, dead servers left files, or a
// guest cannot be driven as it should.
func (h Health) Degraded() bool {
	if h.LockErr != nil || h.ExeChanged != "" || h.ScanErr != nil || len(h.DeadServers) > 0 {
		return true
	}
	for _, g := range h.Guests {
		if g.Degraded() {
			return true
		}
	}
	return false
}

// GuestHealth is what is wrong with a guest that is not stopped, if
// anything.
type GuestHealth struct {
	Name string
	// Transcript is the state of a console transcript that stopped being
	// written (a full disk): nil while it is written.
	Transcript *serial.TranscriptStatus
	// Stalled is since when QEMU has not taken a QMP command (stopped, or
	// hung): QMP calls fail until it does. Zero while it takes them.
	Stalled time.Time
	// MonitorErr is why QEMU's monitor closed while QEMU runs.
	MonitorErr error
}

// Degraded reports whether the guest cannot be driven as it should.
func (g GuestHealth) Degraded() bool {
	return g.Transcript != nil || !g.Stalled.IsZero() || g.MonitorErr != nil
}

// guestHealth is what is wrong with guest i.
func guestHealth(i *Instance) GuestHealth {
	g := GuestHealth{Name: i.name}
	if con := i.Console(); con != nil {
		if st := con.Buffer().TranscriptStatus(); st.Err != nil {
			g.Transcript = &st
		}
	}
	if mch, err := i.Running(); err == nil {
		if since, stalled := mch.Monitor().Stalled(); stalled {
			g.Stalled = since
		} else {
			g.MonitorErr = mch.Monitor().Err()
		}
	}
	return g
}

// QEMUCaps is what is known of the QEMU binary's capabilities (package
// qemu/caps), as a server reports it.
type QEMUCaps struct {
	Binary string `json:"binary"`
	// State is "not probed yet", "probing", "probed" or "probe failed".
	State    string       `json:"state"`
	ProbedAt string       `json:"probed_at,omitempty"`
	Error    string       `json:"error,omitempty"`
	Timer    *caps.Result `json:"timer_kept,omitempty" jsonschema:"a loaded snapshot keeps the guest's timer (else the server repairs it after each load)"`
	InPlace  *caps.Result `json:"in_place_load,omitempty" jsonschema:"a snapshot loads into the running QEMU"`
	Replay   *caps.Result `json:"replay_checkpoint,omitempty" jsonschema:"a checkpoint taken during a replay reloads faithfully (double load)"`
}

// ProbeFailed is QEMUCaps.State when the probe could not answer.
const ProbeFailed = "probe failed"

// Health reports the server's health with root as the project whose
// repository lock counts ("" the host-path policy's working directory).
func (m *Manager) Health(root string) Health {
	if root == "" {
		root = m.cfg.HostPolicy.WorkDir
	}
	rec := m.Record()
	h := Health{RuntimeDir: m.cfg.RuntimeDir}
	if path, err := m.locks.path(root); err != nil {
		h.LockErr = err
	} else {
		h.LockFile = path
		st, err := lock.Inspect(path)
		h.LockErr = err
		h.LockState, h.LockHolder = st.State, st.Record.PID
		h.LockIsOurs = st.Record.PID == rec.PID && st.State == lock.Held
	}
	if a := registry.Assess(rec); a.ExeMatch == registry.No {
		h.ExeChanged = a.ExeDetail
	}
	if inv, err := reaper.Scan(m.cfg.RuntimeDir, reaper.Options{Self: rec.Owner()}); err != nil {
		h.ScanErr = err
	} else {
		for _, o := range inv.Dead() {
			h.DeadServers = append(h.DeadServers, o.PID)
		}
	}
	h.Arches = m.arches()
	h.QEMUVersion = h.Arches[0].Version
	h.QEMU = m.qemuCaps(archs.Default(), h.Arches[0].Binary)
	for _, i := range m.List() {
		if i.State() != Stopped {
			h.Guests = append(h.Guests, guestHealth(i))
		}
	}
	return h
}

// ArchHealth is one architecture and its QEMU on this host.
type ArchHealth struct {
	Name string `json:"name"`
	// Binary is its QEMU, by its path when it is found; Found says
	// whether it is, and Version is its version line when it is.
	Binary  string `json:"binary"`
	Found   bool   `json:"found"`
	Version string `json:"version,omitempty"`
	// Builtin says whether a boot without a kernel has one.
	Builtin bool `json:"builtin_kernel"`
	// Caps is what is known of its capabilities (probed with the
	// built-in kernel), when it is found.
	Caps *QEMUCaps `json:"capabilities,omitempty" jsonschema:"as qemu_capabilities, for this QEMU"`
}

// arches reports each architecture's QEMU.
func (m *Manager) arches() []ArchHealth {
	var out []ArchHealth
	for _, a := range archs.All() {
		p := m.platform(a)
		h := ArchHealth{Name: a.Name(), Binary: p.QEMU, Builtin: len(p.Kernel) > 0}
		if path, err := exec.LookPath(p.QEMU); err == nil {
			h.Binary, h.Found = path, true
			h.Version = m.qemuVersion(path)
			if m.caps[a.Name()] != nil {
				q := m.qemuCaps(a, path)
				h.Caps = &q
			}
		}
		out = append(out, h)
	}
	return out
}

// qemuVersion is bin's version line, asked once.
func (m *Manager) qemuVersion(bin string) string {
	m.versionsMu.Lock()
	ask, ok := m.qemuVersions[bin]
	if !ok {
		ask = sync.OnceValue(func() string { return askVersion(bin) })
		m.qemuVersions[bin] = ask
	}
	m.versionsMu.Unlock()
	return ask()
}

// qemuCaps reports what is known of architecture a's QEMU binary bin.
func (m *Manager) qemuCaps(a arch.Arch, bin string) QEMUCaps {
	out := QEMUCaps{Binary: bin}
	st, c, err := caps.NotProbed, (*caps.Caps)(nil), errors.New("this server does not probe QEMU")
	if p := m.caps[a.Name()]; p != nil {
		st, c, err = p.Status(bin)
	}
	out.State = string(st)
	if st == caps.NotProbed && err != nil {
		out.State, out.Error = ProbeFailed, err.Error()
	}
	if c != nil {
		out.ProbedAt = c.Probed.Format(time.RFC3339)
		out.Timer, out.InPlace, out.Replay = &c.TimerKept, &c.InPlaceLoad, &c.ReplayCheckpoint
	}
	return out
}

// askVersion asks the emulator for its version line. The server asks
// once (Manager.qemuVersion): the binary does not change under a running
// server in a way that matters more than the cost of asking on every call.
func askVersion(bin string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	line, err := qemu.VersionLine(ctx, bin)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return line
}
