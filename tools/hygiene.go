package tools

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/tap"
)

// writeRecord rewrites this server's registry record when f changes it, so
// that a later server (or doctor) can tell what to reap if we are killed.
// Once the record is removed at shutdown it is never written again.
func (s *Server) writeRecord(f func(*registry.Record) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recRemoved || !f(&s.rec) {
		return
	}
	if err := registry.Write(s.cfg.RuntimeDir, s.rec); err != nil {
		s.log.Warn("update registry record", "err", err)
	}
}

// removeRecord removes the registry record for good.
func (s *Server) removeRecord() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recRemoved = true
	return registry.Remove(s.cfg.RuntimeDir, s.pid)
}

// reap removes what dead servers left before a boot. Failing to reap is not
// a reason to refuse the boot: it is reported instead.
func (s *Server) reap() *reaper.Report {
	rep, err := reaper.Reap(s.cfg.RuntimeDir, reaper.Options{Self: s.pid, Logger: s.log, DeleteTAP: DeleteTAP})
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	if len(rep.DeadServers) == 0 && len(rep.Errors) == 0 && len(rep.Skipped) == 0 {
		return nil
	}
	s.log.Info("reaped leftovers of dead servers", "report", rep.String())
	return &rep
}

// DeleteTAP is the reaper's hook for a dead server's TAP: only a tun/tap
// link of that name is deleted, and a missing one is fine.
func DeleteTAP(name string) error {
	_, err := tap.DeleteIfTAP(name)
	return err
}

// lockPath is the repository lock for a project root.
func (s *Server) lockPath(root string) (string, error) {
	if s.cfg.LockFile != "" {
		return s.cfg.LockFile, nil
	}
	return lock.Path(root, s.cfg.RuntimeDir)
}

// acquireLock takes the repository lock for root before QEMU starts.
func (s *Server) acquireLock(root string) (*lock.Lock, error) {
	path, err := s.lockPath(root)
	if err != nil {
		return nil, fmt.Errorf("find the repository lock for %s: %w", root, err)
	}
	l, err := lock.Acquire(path, lock.Record{Target: root})
	if err != nil {
		var held *lock.HeldError
		if errors.As(err, &held) {
			return nil, fmt.Errorf("cannot boot: %w", err)
		}
		return nil, fmt.Errorf("take the repository lock: %w", err)
	}
	if r := l.Reclaimed(); r != nil {
		s.log.Info("reclaimed a stale repository lock", "path", path, "stale_pid", r.Stale.PID, "why", r.Liveness.String())
	}
	return l, nil
}

// watch releases the lock, the TAP and the record when QEMU stops by
// itself (guest poweroff), not only when we stop it.
func (s *Server) watch(m *qemu.Machine, l *lock.Lock, dev *tap.Device) {
	<-m.Done()
	// The supervisor removes the files; Close waits until it has.
	_ = m.Close()
	s.released(m, l, dev)
}

// released is called once a machine is gone; it is idempotent.
func (s *Server) released(m *qemu.Machine, l *lock.Lock, dev *tap.Device) {
	s.deleteTAP(dev)
	s.releaseLock(l)
	s.writeRecord(func(r *registry.Record) bool {
		if r.QEMU == nil || r.QEMU.PID != m.PID() {
			return false
		}
		r.QEMU = nil
		r.Lock = ""
		return true
	})
}

func (s *Server) releaseLock(l *lock.Lock) {
	if err := l.Release(); err != nil {
		s.log.Warn("release repository lock", "path", l.Path(), "err", err)
	}
}

// InfoOutput is server_info's result.
type InfoOutput struct {
	Version     string        `json:"version"`
	Revision    string        `json:"revision,omitempty" jsonschema:"VCS revision the binary was built from"`
	PID         int           `json:"pid"`
	UptimeMS    int64         `json:"uptime_ms"`
	GoVersion   string        `json:"go_version"`
	QEMUVersion string        `json:"qemu_version"`
	Transport   string        `json:"transport"`
	RuntimeDir  string        `json:"runtime_dir"`
	LockFile    string        `json:"lock_file"`
	LockState   string        `json:"lock_state" jsonschema:"absent, free, held, unidentified or stale"`
	LockHolder  int           `json:"lock_holder,omitempty" jsonschema:"PID named by the lock record"`
	LockIsOurs  bool          `json:"lock_is_ours"`
	GuestPID    int           `json:"guest_pid,omitempty" jsonschema:"QEMU's PID while a guest runs"`
	TAP         string        `json:"tap,omitempty" jsonschema:"the guest's TAP device"`
	PCAP        *CaptureState `json:"pcap,omitempty" jsonschema:"the running or last capture"`
	Health      string        `json:"health" jsonschema:"ok, or degraded (see problems)"`
	Problems    []string      `json:"problems,omitempty"`
}

func (s *Server) serverInfo(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, InfoOutput, error) {
	s.mu.Lock()
	rec := s.rec
	m := s.machine
	s.mu.Unlock()
	out := InfoOutput{
		Version:     s.cfg.Version,
		Revision:    s.cfg.Revision,
		PID:         s.pid,
		UptimeMS:    time.Since(s.started).Milliseconds(),
		GoVersion:   runtime.Version(),
		QEMUVersion: s.qemuVersion(),
		Transport:   rec.Transport,
		RuntimeDir:  s.cfg.RuntimeDir,
	}
	if m != nil {
		if _, exited := m.Exited(); !exited {
			out.GuestPID = m.PID()
		}
	}
	out.TAP, out.PCAP = s.captureState()
	if path, err := s.lockPath(s.cfg.WorkDir); err != nil {
		out.Problems = append(out.Problems, "lock: "+err.Error())
	} else {
		out.LockFile = path
		st, err := lock.Inspect(path)
		if err != nil {
			out.Problems = append(out.Problems, "lock: "+err.Error())
		}
		out.LockState = string(st.State)
		out.LockHolder = st.Record.PID
		out.LockIsOurs = st.Record.PID == s.pid && st.State == lock.Held
	}
	if h := registry.Assess(rec); h.ExeMatch == registry.No {
		out.Problems = append(out.Problems, "stale code: the executable changed on disk since this server started ("+h.ExeDetail+"); restart the server to run the new build")
	}
	if inv, err := reaper.Scan(s.cfg.RuntimeDir, reaper.Options{Self: s.pid}); err != nil {
		out.Problems = append(out.Problems, "scan runtime dir: "+err.Error())
	} else if dead := inv.Dead(); len(dead) > 0 {
		pids := make([]string, len(dead))
		for i, o := range dead {
			pids[i] = fmt.Sprint(o.PID)
		}
		out.Problems = append(out.Problems, fmt.Sprintf("leftovers of %d dead server(s) (pid %s) in %s: reaped at the next boot, or run qemu-mcp doctor --cleanup",
			len(dead), strings.Join(pids, ", "), s.cfg.RuntimeDir))
	}
	out.Health = "ok"
	if len(out.Problems) > 0 {
		out.Health = "degraded"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "qemu-mcp %s, pid %d, up %s, %s, %s\n", out.Version, out.PID, (time.Duration(out.UptimeMS) * time.Millisecond).Round(time.Second), out.GoVersion, out.QEMUVersion)
	fmt.Fprintf(&b, "runtime dir %s; lock %s (%s", out.RuntimeDir, out.LockFile, out.LockState)
	if out.LockHolder != 0 {
		fmt.Fprintf(&b, ", pid %d", out.LockHolder)
	}
	fmt.Fprintf(&b, ")\nhealth: %s\n", out.Health)
	for _, p := range out.Problems {
		fmt.Fprintf(&b, "- %s\n", p)
	}
	return textResult(b.String()), out, nil
}

// qemuVersion asks the emulator for its version line. The server asks
// once (see New): the binary does not change under a running server in a
// way that matters more than the cost of asking on every call.
func qemuVersion(bin string) string {
	if bin == "" {
		bin = qemu.DefaultBinary
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
}
