package tools

import (
	"errors"
	"fmt"
	"os/user"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
	"github.com/qemu-mcp/qemu-mcp/tap"
)

// advise turns the domain's typed errors into the instructions an agent
// reads: what to call next, in the names of this server's tools and
// arguments. The domain packages know nothing of them; this is the one
// place that does. Each piece of advice goes right after the text of the
// error it is about, so an error wrapped in others keeps its context on
// both sides.
func advise(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	after := func(e error, tip string) {
		t := e.Error()
		if i := strings.Index(msg, t); i >= 0 {
			msg = msg[:i+len(t)] + tip + msg[i+len(t):]
			return
		}
		msg += tip
	}
	// before puts text right before e's own.
	before := func(e error, text string) {
		if t := e.Error(); strings.Contains(msg, t) {
			msg = strings.Replace(msg, t, text+t, 1)
		}
	}
	// replace puts text where e's own was, or at the end.
	replace := func(e error, text string) {
		if t := e.Error(); strings.Contains(msg, t) {
			msg = strings.Replace(msg, t, text, 1)
			return
		}
		msg += "; " + text
	}
	if e := (*instance.NotFoundError)(nil); errors.As(err, &e) {
		if len(e.Known) == 0 {
			after(e, ": call qemu_boot first")
		} else {
			after(e, fmt.Sprintf(": call qemu_boot with instance %q first", e.Name))
		}
	}
	if e := (*instance.BusyError)(nil); errors.As(err, &e) {
		after(e, ": call qemu_shutdown for it first, boot another instance name, or pass restart: true")
	}
	if e := (*instance.TooManyError)(nil); errors.As(err, &e) {
		after(e, fmt.Sprintf(" (--max-instances %d): stop one with qemu_shutdown and its instance, or reuse a name with restart: true", e.Max))
	}
	if e := (*instance.NotRunningError)(nil); errors.As(err, &e) {
		switch {
		case e.Exit != "":
			after(e, "; call qemu_boot to start it again, serial_read still returns its output")
		case e.State == instance.Booting:
			after(e, ": wait for its qemu_boot to return")
		case e.State == instance.Stopping:
			after(e, ": call qemu_boot to start it again once qemu_shutdown returns")
		case e.NoStart:
			after(e, ": call qemu_boot again")
		default:
			after(e, ": call qemu_boot to start it again")
		}
	}
	if e := (*instance.StoppedError)(nil); errors.As(err, &e) {
		if e.For == "" {
			after(e, " (qemu_shutdown); its output stays readable with serial_read")
		} else {
			after(e, " (qemu_shutdown)")
		}
	}
	if e := (*instance.NoCaptureError)(nil); errors.As(err, &e) {
		after(e, ": boot it with pcap: true or call qemu_pcap_start, or give path")
	}
	if errors.Is(err, instance.ErrNoTAP) {
		after(instance.ErrNoTAP, `: boot it with network: "tap" (captures see the guest's own TAP from the host side)`)
	}
	if e := (*instance.CaptureRunningError)(nil); errors.As(err, &e) {
		after(e, ": call qemu_pcap_stop first")
	}
	if errors.Is(err, instance.ErrGuestLost) {
		after(instance.ErrGuestLost, ": boot it again with qemu_boot")
	}
	if e := (*instance.NoDisplayError)(nil); errors.As(err, &e) {
		after(e, ": boot with gpu: true")
	}
	// The project root is the argument project_root.
	if e := (*hostpath.ProjectError)(nil); errors.As(err, &e) {
		replace(e, "project_root"+strings.TrimPrefix(e.Error(), "project root"))
	}
	if e := (*hostpath.RelativeError)(nil); errors.As(err, &e) {
		replace(e, fmt.Sprintf("%s %s: %v (relative paths are relative to project_root %s)", e.What, e.Path, e.Err, e.Project))
	}
	if e := (*hostpath.ReadOnlyError)(nil); errors.As(err, &e) {
		after(e, "; attach it with readonly: true, or copy it into the project")
	}
	// The QEMU options a boot may add are its argument extra_args.
	if e := (*boundary.RefusedError)(nil); errors.As(err, &e) && e.Kind == boundary.KindOption {
		replace(e, "extra_args"+strings.TrimPrefix(e.Error(), boundary.KindOption))
	}
	if e := (*qemu.ManagedError)(nil); errors.As(err, &e) {
		before(e, "extra_args: ")
	}
	if e := (*lock.HeldError)(nil); errors.As(err, &e) && e.Holding() != "" {
		pid := e.Holder.PID
		switch {
		case e.Self():
			replace(e, e.Holding()+"; shut down the QEMU it runs (qemu_shutdown) before booting again")
		case e.Other():
			replace(e, e.Holding()+fmt.Sprintf("; it is not yours to stop: ask %s to shut their guests down (qemu_shutdown), or root to stop process %d", e.Owner(), pid))
		default:
			replace(e, e.Holding()+fmt.Sprintf("; stop it with qemu_shutdown in the session that owns it (or boot your guest as another instance of that server), or run: kill -TERM %d", pid))
		}
	}
	if e := (*snapshot.NotFoundError)(nil); errors.As(err, &e) {
		after(e, ": qemu_snapshot_list shows the project's snapshots")
	}
	if e := (*snapshot.AmbiguousError)(nil); errors.As(err, &e) {
		after(e, ": give the machine arguments (kernel, memory ...) of the one to boot")
	}
	if e := (*snapshot.MachineError)(nil); errors.As(err, &e) {
		if e.Guest == "" {
			after(e, "; leave the machine arguments out to boot the snapshot's own")
		} else {
			after(e, fmt.Sprintf("; boot with that configuration (qemu_boot snapshot: %q)", e.Name))
		}
	}
	if e := (*snapshot.DriveFormatError)(nil); errors.As(err, &e) {
		after(e, ": attach it with readonly: true, or convert it to qcow2 (qemu-img convert -O qcow2) and attach that")
	}
	if e := (*snapshot.LowSpaceError)(nil); errors.As(err, &e) {
		after(e, ", or qemu_snapshot_delete older snapshots")
	}
	if e := (*debugger.NoBreakpointError)(nil); errors.As(err, &e) {
		if e.Watch {
			after(e, ": debug_watch sets one")
		} else {
			after(e, ": debug_break sets one")
		}
	}
	if e := (*debugger.WatchRefusedError)(nil); errors.As(err, &e) {
		after(e, "; remove one with debug_watch remove: true")
	}
	if errors.Is(err, debugger.ErrNoPhysical) {
		after(debugger.ErrNoPhysical, ": read the virtual address, or use qmp_command pmemsave")
	}
	if errors.Is(err, debugger.ErrNotReplay) {
		after(debugger.ErrNotReplay, ": boot one with qemu_boot record: NAME, then replay it with qemu_boot replay: NAME")
	}
	if e := (*debugger.AtEndError)(nil); errors.As(err, &e) {
		after(e, "; debug_step reverse: true goes back")
	}
	if e := (*instance.ReplayingError)(nil); errors.As(err, &e) {
		after(e, " (debug_continue icount: N goes to any point of it)")
	}
	if errors.Is(err, instance.ErrNoBuiltinKernel) {
		after(instance.ErrNoBuiltinKernel, ": pass kernel")
	}
	if errors.Is(err, instance.ErrNoBuiltinSymbols) {
		after(instance.ErrNoBuiltinSymbols, ": pass symbols")
	}
	if e := (*instance.ReplayCommandError)(nil); errors.As(err, &e) {
		replace(e, fmt.Sprintf("guest %q replays recording %q: qmp_command runs only query-* commands on it (the debug_* tools move the replay)", e.Name, e.Recording))
	}
	if e := (*instance.NoEchoError)(nil); errors.As(err, &e) {
		after(e, "; give char_delay_ms for input it does not echo")
	}
	if e := (*recording.NotFoundError)(nil); errors.As(err, &e) {
		after(e, ": qemu_recordings lists the project's recordings")
	}
	if e := (*instance.RecordingInUseError)(nil); errors.As(err, &e) {
		after(e, ": shut it down first")
	}
	if e := (*recording.MachineError)(nil); errors.As(err, &e) {
		replace(e, fmt.Sprintf("recording %q was made on another machine than these arguments give: %s; leave the machine arguments out to replay it on its own (its kernel and files must be as they were)",
			e.Name, strings.Join(e.Diffs, "; ")))
	}
	if e := (*qemu.LayoutError)(nil); errors.As(err, &e) {
		after(e, " (use qemu_send_key for special keys, or serial_send for text on the console)")
	}
	if msg == err.Error() {
		return err
	}
	return &advised{err: err, msg: msg}
}

// adviseStop completes a replay's stop note with the call that goes on
// from there.
func adviseStop(st *debugger.StopInfo) {
	switch st.Then {
	case debugger.ThenBack:
		st.Note += ": debug_continue reverse: true goes back"
	case debugger.ThenOn:
		st.Note += "; debug_continue goes on"
	}
	st.Then = debugger.ThenNothing
}

// endedText is how a recording ended, as the agent reads it.
func endedText(ended string) string {
	if ended == recording.EndedStopped {
		return "stopped (qemu_shutdown)"
	}
	return ended
}

// tapAdvice completes a refused TAP boot's error with the ways an ordinary
// user has: the user network, or a persistent TAP root makes once (never
// file capabilities on the server: they would give every user who runs it
// the host's network).
func tapAdvice(err error, name string) error {
	if !errors.Is(err, tap.ErrNoPrivilege) || name != "" {
		return err
	}
	u := "$USER"
	if cu, uerr := user.Current(); uerr == nil {
		u = cu.Username
	}
	return fmt.Errorf("%w; or, for a TAP without privileges, have root make you a persistent one once and boot with network: \"tap\", tap: \"qmtap0\"; as root: "+
		"ip tuntap add dev qmtap0 mode tap user %s && ip link set qmtap0 up && ip addr add 10.0.2.2/24 dev qmtap0 (or, to join a bridge instead of the address: ip link set qmtap0 master BRIDGE)", err, u)
}

// advised is a domain error with the advice for the agent in its text.
type advised struct {
	err error
	msg string
}

func (a *advised) Error() string { return a.msg }
func (a *advised) Unwrap() error { return a.err }
