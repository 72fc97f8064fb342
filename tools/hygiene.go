package tools

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
)

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
	Instances   []string      `json:"instances,omitempty" jsonschema:"guests that are not stopped (see qemu_list)"`
	GuestPID    int           `json:"guest_pid,omitempty" jsonschema:"QEMU's PID of the default instance while it runs"`
	TAP         string        `json:"tap,omitempty" jsonschema:"the default instance's TAP device"`
	PCAP        *CaptureState `json:"pcap,omitempty" jsonschema:"the default instance's running or last capture"`
	QEMUCaps    QEMUCaps      `json:"qemu_capabilities" jsonschema:"what the QEMU binary was found to do with a guest's saved state, probed once per binary after its first boot"`
	Arches      []ArchInfo    `json:"architectures" jsonschema:"each guest architecture and its QEMU here"`
	Health      string        `json:"health" jsonschema:"ok, or degraded (see problems)"`
	Problems    []string      `json:"problems,omitempty"`
}

// ArchInfo is one architecture in server_info's result.
type ArchInfo = instance.ArchHealth

// archText is the architectures in one line.
func archText(as []ArchInfo) string {
	var parts []string
	for i, a := range as {
		switch {
		case i == 0 && a.Found:
			// Its QEMU's version and capabilities have lines of their
			// own (the first and qemu capabilities).
			kernel := ""
			if a.Builtin {
				kernel = ", built-in kernel"
			}
			parts = append(parts, a.Name+" (the QEMU above"+kernel+")")
		case !a.Found:
			parts = append(parts, a.Name+" (no "+a.Binary+")")
		case a.Builtin:
			parts = append(parts, a.Name+" ("+a.Version+", built-in kernel"+archCaps(a.Caps)+")")
		default:
			parts = append(parts, a.Name+" ("+a.Version+archCaps(a.Caps)+")")
		}
	}
	return "architectures: " + strings.Join(parts, "; ")
}

// archCaps is an architecture's QEMU's capabilities in a few words.
func archCaps(q *QEMUCaps) string {
	switch {
	case q == nil:
		return ""
	case q.Timer == nil:
		return ", capabilities " + q.State
	}
	return fmt.Sprintf(", timer kept %s, in-place load %s, replay checkpoint %s", q.Timer.Answer, q.InPlace.Answer, q.Replay.Answer)
}

// QEMUCaps is server_info's view of what the QEMU binary was found to do.
type QEMUCaps = instance.QEMUCaps

// capsText is the capabilities in one line.
func capsText(q QEMUCaps) string {
	switch {
	case q.State == instance.ProbeFailed:
		return "qemu capabilities: probe failed (" + q.Error + "): the server takes the safe paths"
	case q.Timer == nil:
		return "qemu capabilities: " + q.State
	}
	return fmt.Sprintf("qemu capabilities (probed %s): timer kept by a load %s, in-place load %s, replay checkpoint %s",
		q.ProbedAt, q.Timer.Answer, q.InPlace.Answer, q.Replay.Answer)
}

func (s *Server) serverInfo(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, InfoOutput, error) {
	mgr, err := s.manager()
	if err != nil {
		return nil, InfoOutput{}, err
	}
	rec := mgr.Record()
	h := mgr.Health("")
	out := InfoOutput{
		Version:     s.cfg.Version,
		Revision:    s.cfg.Revision,
		PID:         rec.PID,
		UptimeMS:    time.Since(s.started).Milliseconds(),
		GoVersion:   runtime.Version(),
		QEMUVersion: h.QEMUVersion,
		Transport:   rec.Transport,
		RuntimeDir:  h.RuntimeDir,
		LockFile:    h.LockFile,
		LockState:   string(h.LockState),
		LockHolder:  h.LockHolder,
		LockIsOurs:  h.LockIsOurs,
		QEMUCaps:    h.QEMU,
		Arches:      h.Arches,
		Problems:    s.problems(h),
		Health:      "ok",
	}
	if h.Degraded() {
		out.Health = "degraded"
	}
	for _, g := range h.Guests {
		out.Instances = append(out.Instances, g.Name)
	}
	if in, err := mgr.Get(instance.DefaultName); err == nil && in.State() != instance.Stopped {
		if m, err := in.Running(); err == nil {
			out.GuestPID = m.PID()
		}
		if dev := in.TAP(); dev != nil {
			out.TAP = dev.Name
		}
		out.PCAP = captureState(in)
	}
	return textResult(infoText(out)), out, nil
}

// problems says what h found wrong, and what to do about each.
func (s *Server) problems(h instance.Health) []string {
	var out []string
	for _, g := range h.Guests {
		if g.Transcript != nil {
			out = append(out, fmt.Sprintf("guest %q: %s", g.Name, transcriptStopped(*g.Transcript)))
		}
		// A guest whose monitor cannot be used is one the tools cannot
		// drive: say why.
		if !g.Stalled.IsZero() {
			out = append(out, fmt.Sprintf("guest %q: QEMU has not taken a QMP command for %v (stopped or hung?): QMP calls fail until it does", g.Name, time.Since(g.Stalled).Round(time.Second)))
		} else if g.MonitorErr != nil {
			out = append(out, fmt.Sprintf("guest %q: its QMP monitor is closed (%v): qemu_boot it again with restart: true", g.Name, g.MonitorErr))
		}
	}
	if h.LockErr != nil {
		out = append(out, "lock: "+h.LockErr.Error())
	}
	if h.ExeChanged != "" {
		out = append(out, "stale code: the executable changed on disk since this server started ("+h.ExeChanged+"); restart the server to run the new build")
	}
	if h.ScanErr != nil {
		out = append(out, "scan runtime dir: "+h.ScanErr.Error())
	} else if len(h.DeadServers) > 0 {
		pids := make([]string, len(h.DeadServers))
		for i, pid := range h.DeadServers {
			pids[i] = fmt.Sprint(pid)
		}
		out = append(out, fmt.Sprintf("leftovers of %d dead server(s) (pid %s) in %s: reaped at the next boot, or run qemu-mcp doctor --cleanup",
			len(h.DeadServers), strings.Join(pids, ", "), h.RuntimeDir))
	}
	return out
}

// infoText is server_info's text content.
func infoText(out InfoOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "qemu-mcp %s, pid %d, up %s, %s, %s\n", out.Version, out.PID, (time.Duration(out.UptimeMS) * time.Millisecond).Round(time.Second), out.GoVersion, out.QEMUVersion)
	fmt.Fprintf(&b, "runtime dir %s; lock %s (%s", out.RuntimeDir, out.LockFile, out.LockState)
	if out.LockHolder != 0 {
		fmt.Fprintf(&b, ", pid %d", out.LockHolder)
	}
	fmt.Fprintf(&b, ")\n")
	if len(out.Instances) > 0 {
		fmt.Fprintf(&b, "guests: %s\n", strings.Join(out.Instances, ", "))
	}
	fmt.Fprintf(&b, "%s\n", archText(out.Arches))
	fmt.Fprintf(&b, "%s\n", capsText(out.QEMUCaps))
	fmt.Fprintf(&b, "health: %s\n", out.Health)
	for _, p := range out.Problems {
		fmt.Fprintf(&b, "- %s\n", p)
	}
	return b.String()
}

// ListInput is qemu_list's arguments (none).
type ListInput struct{}

// ListEntry is one guest in qemu_list's result.
type ListEntry struct {
	Instance    string `json:"instance"`
	State       string `json:"state" jsonschema:"booting, running, stopping or stopped"`
	PID         int    `json:"pid,omitempty" jsonschema:"QEMU's PID"`
	UptimeMS    int64  `json:"uptime_ms,omitempty" jsonschema:"milliseconds QEMU has run (until it stopped)"`
	ExitStatus  *int   `json:"exit_status,omitempty"`
	Kernel      string `json:"kernel,omitempty"`
	TAP         string `json:"tap,omitempty"`
	Capture     string `json:"capture,omitempty" jsonschema:"the running capture's file"`
	SerialBytes int64  `json:"serial_bytes" jsonschema:"bytes of serial output so far"`
}

// ListOutput is qemu_list's result.
type ListOutput struct {
	Instances    []ListEntry `json:"instances"`
	MaxInstances int         `json:"max_instances" jsonschema:"the most guests that run at once"`
}

func (s *Server) list(_ context.Context, _ *mcp.CallToolRequest, _ ListInput) (*mcp.CallToolResult, ListOutput, error) {
	mgr, err := s.manager()
	if err != nil {
		return nil, ListOutput{}, err
	}
	out := ListOutput{Instances: []ListEntry{}, MaxInstances: mgr.MaxInstances()}
	var b strings.Builder
	for _, in := range mgr.List() {
		i := in.Info()
		e := ListEntry{Instance: i.Name, State: string(i.State), PID: i.PID, UptimeMS: i.Uptime.Milliseconds(),
			Kernel: i.Kernel, TAP: i.TAP, Capture: i.Capture, SerialBytes: i.SerialBytes}
		if i.Exit != nil {
			code := i.Exit.Code
			e.ExitStatus = &code
		}
		out.Instances = append(out.Instances, e)
		fmt.Fprintf(&b, "%s: %s", e.Instance, e.State)
		if e.PID != 0 {
			fmt.Fprintf(&b, ", qemu pid %d, up %s", e.PID, i.Uptime.Round(time.Millisecond))
		}
		if e.TAP != "" {
			fmt.Fprintf(&b, ", tap %s", e.TAP)
		}
		fmt.Fprintf(&b, ", %d serial bytes\n", e.SerialBytes)
	}
	if len(out.Instances) == 0 {
		b.WriteString("no guests: boot one with qemu_boot\n")
	}
	return textResult(b.String()), out, nil
}

func (s *Server) registerInfo(ms *mcp.Server) {
	add(s, ms, tool("server_info", "Server info", querying,
		"Version and revision, pid, uptime, Go and QEMU versions, runtime dir, repository lock and holder, and health (degraded: the binary changed on disk, or dead servers left files)."), s.serverInfo)
	add(s, ms, tool("qemu_list", "List guests", querying,
		"List this server's guests (instances): name, state, QEMU pid, uptime, kernel, TAP, capture and bytes of serial output."), s.list)
}
