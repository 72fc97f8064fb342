package tools

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
)

// A replay's stop notes end with the call that goes on from there.
func TestAdviseStop(t *testing.T) {
	for then, want := range map[debugger.Next]string{
		debugger.NextNone:    "n",
		debugger.NextBack:    "n: debug_continue reverse: true goes back",
		debugger.NextForward: "n; debug_continue goes on",
	} {
		st := debugger.StopInfo{Note: "n", Next: then}
		if adviseStop(&st); st.Note != want || st.Next != debugger.NextNone {
			t.Errorf("adviseStop(%d) = %q, want %q", then, st.Note, want)
		}
	}
	if got := endedText(recording.EndedStopped); got != "stopped (qemu_shutdown)" {
		t.Errorf("endedText(EndedStopped) = %q", got)
	}
}

// The domain's errors read as they did when the domain named the tools:
// the advice comes right after the error it is about, inside whatever
// wraps it, and the error still matches its sentinel.
func TestAdviseDomainErrors(t *testing.T) {
	held := &lock.HeldError{Path: "/r/.git/.qemu.lock", Holder: lock.Record{PID: os.Getpid() + 100000}, UID: os.Geteuid(), Comm: "qemu-mcp", Exe: "/bin/qemu-mcp"}
	for _, c := range []struct {
		err  error
		want string
		is   error
	}{
		{&instance.NotFoundError{Name: "a"}, `no guest named "a" has been booted: call qemu_boot first`, instance.ErrNotFound},
		{fmt.Errorf("screenshot: %w", &instance.NotFoundError{Name: "b", Known: []string{"a"}}),
			`screenshot: no guest named "b" has been booted (instances: a): call qemu_boot with instance "b" first`, instance.ErrNotFound},
		{&instance.BusyError{Name: "a", State: instance.Running, PID: 7, Up: 3 * time.Second},
			`guest "a" is already running (qemu pid 7, up 3s): call qemu_shutdown for it first, boot another instance name, or pass restart: true`, instance.ErrBusy},
		{&instance.TooManyError{Live: []string{"a", "b"}, Max: 2},
			"2 guests already run (a, b), the most this server allows (--max-instances 2): stop one with qemu_shutdown and its instance, or reuse a name with restart: true", instance.ErrTooMany},
		{&instance.NotRunningError{Name: "a", State: instance.Stopping}, `guest "a" is stopping: call qemu_boot to start it again once qemu_shutdown returns`, instance.ErrNotRunning},
		{fmt.Errorf("save snapshot: %w", &instance.NotRunningError{Name: "a", State: instance.Running, Exit: "exited with status 0"}),
			`save snapshot: the guest has exited: guest "a" exited with status 0; call qemu_boot to start it again, serial_read still returns its output`, instance.ErrExited},
		{&instance.StoppedError{Name: "a"}, `guest "a": the guest was stopped while this call waited (qemu_shutdown); its output stays readable with serial_read`, instance.ErrStopped},
		{fmt.Errorf("guest %q has %w", "a", instance.ErrNoTAP),
			`guest "a" has no TAP to capture on: boot it with network: "tap" (captures see the guest's own TAP from the host side)`, instance.ErrNoTAP},
		{fmt.Errorf("restore snapshot %q: qemu died; %w", "s", instance.ErrGuestLost),
			`restore snapshot "s": qemu died; the guest is stopped: boot it again with qemu_boot`, instance.ErrGuestLost},
		{&boundary.RefusedError{Kind: boundary.KindOption, Subject: "-gdb", Rule: "host-chardev", Reason: "r"},
			`extra_args -gdb refused by rule "host-chardev": r; start qemu-mcp with --allow-host-access to allow it`, boundary.ErrRefused},
		{fmt.Errorf("boot: %w", &qemu.ManagedError{Arg: "-serial", Why: "the server manages the console"}),
			"boot: extra_args: -serial is not allowed: the server manages the console", nil},
		{&hostpath.ProjectError{Root: "/", Err: errors.New("r"), Refused: true}, "project_root / is refused: r", nil},
		{fmt.Errorf("boot: %w; nothing was started", held),
			"boot: " + held.Holding() + fmt.Sprintf("; stop it with qemu_shutdown in the session that owns it (or boot your guest as another instance of that server), or run: kill -TERM %d; nothing was started", held.Holder.PID), nil},
		{fmt.Errorf("reverse step: %w", debugger.ErrNotReplay),
			"reverse step: going back needs a recording: boot one with qemu_boot record: NAME, then replay it with qemu_boot replay: NAME", debugger.ErrNotReplay},
		{&debugger.AtEndError{At: 90, End: 100},
			"the replay is at the end of its recording: at instruction 90, 10 before its end (100); debug_step reverse: true goes back", debugger.ErrAtEnd},
		{&instance.ReplayingError{What: "save a snapshot of", Name: "a", Recording: "r"},
			`cannot save a snapshot of guest "a": it replays recording "r" (debug_continue icount: N goes to any point of it)`, instance.ErrReplay},
		{&instance.ReplayCommandError{Name: "a", Recording: "r", Command: "stop"},
			`guest "a" replays recording "r": qmp_command runs only query-* commands on it (the debug_* tools move the replay)`, instance.ErrReplay},
		{&instance.RecordingInUseError{Name: "r", Guest: "a", Replayed: true},
			`recording "r" is being replayed by guest "a": shut it down first`, instance.ErrRecordingInUse},
		{instance.ErrNoBuiltinKernel, "no kernel given and this binary has no built-in kernel: pass kernel", instance.ErrNoBuiltinKernel},
		{fmt.Errorf("send: %w", &instance.NoEchoError{Within: 2 * time.Second, From: 4, Chunk: []byte("abcd")}),
			`send: the guest did not echo what was typed within 2s of bytes 4..8 ("abcd"): a recording guest is given input only as fast as it takes it, which its echo shows; give char_delay_ms for input it does not echo`, instance.ErrNoEcho},
		{&recording.NotFoundError{Name: "r", Root: "/p"},
			`no such recording "r" in project /p: qemu_recordings lists the project's recordings`, recording.ErrNotFound},
		{&recording.MachineError{Name: "r", Diffs: []string{"memory: recorded 128M, now 256M"}},
			`recording "r" was made on another machine than these arguments give: memory: recorded 128M, now 256M; leave the machine arguments out to replay it on its own (its kernel and files must be as they were)`, nil},
	} {
		got := advise(c.err)
		if got.Error() != c.want {
			t.Errorf("advise(%q)\n = %q\nwant %q", c.err, got, c.want)
		}
		if c.is != nil && !errors.Is(got, c.is) {
			t.Errorf("advise(%q) does not match %v", c.err, c.is)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("advise(%q) lost the error it advises on", c.err)
		}
	}
	plain := errors.New("something else")
	if got := advise(plain); got != plain {
		t.Errorf("advise(plain) = %v, want it unchanged", got)
	}
}
