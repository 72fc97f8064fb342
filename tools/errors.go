package tools

import (
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// advise turns the advice of the domain's errors (package advice) into
// the instructions an agent reads: what to call next, in the names of this
// server's tools and arguments. The domain packages know nothing of them;
// this is the one place that does. Each piece of advice goes where the
// error it is about is in the message (after its text, before it, or in
// its place), so an error wrapped in others keeps its context on both
// sides.
func advise(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	said := map[string]bool{}
	for _, f := range advice.In(err) {
		say, ok := says[f.Advice.Action]
		if !ok {
			continue
		}
		how, text := say(f.Advice)
		if how != instead && said[text] {
			// Several errors of one kind (a snapshot on several
			// machines): the same words once.
			continue
		}
		said[text] = true
		own := f.Err.Error()
		i := strings.Index(msg, own)
		switch {
		case how == after && i >= 0:
			msg = msg[:i+len(own)] + text + msg[i+len(own):]
		case how == after:
			msg += text
		case how == before && i >= 0:
			msg = msg[:i] + text + msg[i:]
		case how == instead && i >= 0:
			msg = msg[:i] + text + msg[i+len(own):]
		case how == instead:
			msg += "; " + text
		}
	}
	if msg == err.Error() {
		return err
	}
	return &advised{err: err, msg: msg}
}

// placement is where advice goes: after the error's own text, before it,
// or instead of it.
type placement int

const (
	after placement = iota
	before
	instead
)

// says is what the adapter says for each action the domain advises.
var says = map[advice.Action]func(a advice.Advice) (placement, string){
	advice.BootFirst: func(a advice.Advice) (placement, string) {
		if a.Name == "" {
			return after, ": call qemu_boot first"
		}
		return after, fmt.Sprintf(": call qemu_boot with instance %q first", a.Name)
	},
	advice.ShutdownOrRestart: text(after, ": call qemu_shutdown for it first, boot another instance name, or pass restart: true"),
	advice.TooMany: func(a advice.Advice) (placement, string) {
		return after, fmt.Sprintf(" (--max-instances %d): stop one with qemu_shutdown and its instance, or reuse a name with restart: true", a.N)
	},
	advice.BootAgainOutputKept: text(after, "; call qemu_boot to start it again, serial_read still returns its output"),
	advice.WaitForBoot:         text(after, ": wait for its qemu_boot to return"),
	advice.BootAfterStop:       text(after, ": call qemu_boot to start it again once qemu_shutdown returns"),
	advice.BootAgain:           text(after, ": call qemu_boot again"),
	advice.BootToStart:         text(after, ": call qemu_boot to start it again"),
	advice.StoppedOutputKept:   text(after, " (qemu_shutdown); its output stays readable with serial_read"),
	advice.Stopped:             text(after, " (qemu_shutdown)"),
	advice.StartCapture:        text(after, ": boot it with pcap: true or call qemu_pcap_start, or give path"),
	advice.BootWithTAP:         text(after, `: boot it with network: "tap" (captures see the guest's own TAP from the host side)`),
	advice.StopCapture:         text(after, ": call qemu_pcap_stop first"),
	advice.BootLost:            text(after, ": boot it again with qemu_boot"),
	advice.BootWithDisplay:     text(after, ": boot with gpu: true"),
	advice.ProjectArgument:     renamed("project_root"),
	advice.RelativeToProject: func(a advice.Advice) (placement, string) {
		return instead, fmt.Sprintf("%s (relative paths are relative to project_root %s)", a.Keep, a.Name)
	},
	advice.AttachReadOnly:   text(after, "; attach it with readonly: true, or copy it into the project"),
	advice.ExtraArgument:    renamed("extra_args"),
	advice.InExtraArguments: text(before, "extra_args: "),
	advice.StopOwnGuest:     keepThen("; shut down the QEMU it runs (qemu_shutdown) before booting again"),
	advice.AskOwner: func(a advice.Advice) (placement, string) {
		return instead, a.Keep + fmt.Sprintf("; it is not yours to stop: ask %s to shut their guests down (qemu_shutdown), or root to stop process %d", a.Name, a.N)
	},
	advice.StopHolder: func(a advice.Advice) (placement, string) {
		return instead, a.Keep + fmt.Sprintf("; stop it with qemu_shutdown in the session that owns it (or boot your guest as another instance of that server), or run: kill -TERM %d", a.N)
	},
	advice.ListSnapshots:       text(after, ": qemu_snapshot_list shows the project's snapshots"),
	advice.GiveMachine:         text(after, ": give the machine arguments (kernel, memory ...) of the one to boot"),
	advice.BootSnapshotMachine: text(after, "; leave the machine arguments out to boot the snapshot's own"),
	advice.BootFromSnapshot: func(a advice.Advice) (placement, string) {
		return after, fmt.Sprintf("; boot with that configuration (qemu_boot snapshot: %q)", a.Name)
	},
	advice.ReadOnlyOrQcow2:  text(after, ": attach it with readonly: true, or convert it to qcow2 (qemu-img convert -O qcow2) and attach that"),
	advice.DeleteSnapshots:  text(after, ", or qemu_snapshot_delete older snapshots"),
	advice.SetWatchpoint:    text(after, ": debug_watch sets one"),
	advice.SetBreakpoint:    text(after, ": debug_break sets one"),
	advice.RemoveWatchpoint: text(after, "; remove one with debug_watch remove: true"),
	advice.ReadVirtual:      text(after, ": read the virtual address, or use qmp_command pmemsave"),
	advice.RecordThenReplay: text(after, ": boot one with qemu_boot record: NAME, then replay it with qemu_boot replay: NAME"),
	advice.StepBack:         text(after, "; debug_step reverse: true goes back"),
	advice.MoveReplay:       text(after, " (debug_continue icount: N goes to any point of it)"),
	advice.PassKernel:       text(after, ": pass kernel"),
	advice.PassSymbols:      text(after, ": pass symbols"),
	advice.QueriesOnly: func(a advice.Advice) (placement, string) {
		return instead, fmt.Sprintf("guest %q replays recording %q: qmp_command runs only query-* commands on it (the debug_* tools move the replay)", a.Name, a.Other)
	},
	advice.TypeSlowly:       text(after, "; give char_delay_ms for input it does not echo"),
	advice.ListRecordings:   text(after, ": qemu_recordings lists the project's recordings"),
	advice.ShutdownFirst:    text(after, ": shut it down first"),
	advice.ReplayOwnMachine: keepThen("; leave the machine arguments out to replay it on its own (its kernel and files must be as they were)"),
	advice.KeysOrConsole:    text(after, " (use qemu_send_key for special keys, or serial_send for text on the console)"),
	advice.PersistentTAP: func(a advice.Advice) (placement, string) {
		return after, fmt.Sprintf("; or, for a TAP without privileges, have root make you a persistent one once and boot with network: \"tap\", tap: \"qmtap0\"; as root: "+
			"ip tuntap add dev qmtap0 mode tap user %s && ip link set qmtap0 up && ip addr add 10.0.2.2/24 dev qmtap0 (or, to join a bridge instead of the address: ip link set qmtap0 master BRIDGE)", a.Name)
	},
}

// renamed is advice that names the argument by the tool's name for it,
// name, followed by what the error keeps of its message.
func renamed(name string) func(advice.Advice) (placement, string) {
	return func(a advice.Advice) (placement, string) { return instead, name + a.Keep }
}

// keepThen is advice that keeps what the error keeps of its message and
// adds s.
func keepThen(s string) func(advice.Advice) (placement, string) {
	return func(a advice.Advice) (placement, string) { return instead, a.Keep + s }
}

// text is advice that is the same words whatever the error holds.
func text(how placement, s string) func(advice.Advice) (placement, string) {
	return func(advice.Advice) (placement, string) { return how, s }
}

// adviseStop completes a replay's stop note with the call that goes on
// from there.
func adviseStop(st *debugger.StopInfo) {
	switch st.Next {
	case debugger.NextBack:
		st.Note += ": debug_continue reverse: true goes back"
	case debugger.NextForward:
		st.Note += "; debug_continue goes on"
	}
	st.Next = debugger.NextNone
}

// endedText is how a recording ended, as the agent reads it.
func endedText(ended string) string {
	if ended == instance.RecordingStopped {
		return "stopped (qemu_shutdown)"
	}
	return ended
}

// advised is a domain error with the advice for the agent in its text.
type advised struct {
	err error
	msg string
}

func (a *advised) Error() string { return a.msg }
func (a *advised) Unwrap() error { return a.err }
