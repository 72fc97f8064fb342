package tools

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
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

var updateAdvice = flag.Bool("update-advice", false, "rewrite testdata/advice.json from advise")

// adviceCases are the domain errors the adapter advises on, each as a
// call would return it: wrapped, with context before and after.
func adviceCases() map[string]error {
	held := func(pid, uid int) error {
		return &lock.HeldError{Path: "/run/q.lock", Holder: lock.Record{PID: pid, Target: "/src/os"}, Comm: "qemu-mcp", UID: uid}
	}
	c := map[string]error{
		"not found":                 &instance.NotFoundError{Name: "a"},
		"not found, others":         &instance.NotFoundError{Name: "a", Known: []string{"b", "c"}},
		"busy":                      &instance.BusyError{Name: "a", State: instance.Running, PID: 42, Up: time.Second},
		"too many":                  &instance.TooManyError{Live: []string{"a", "b"}, Max: 2},
		"exited":                    &instance.NotRunningError{Name: "a", State: instance.Running, Exit: "exited with status 0"},
		"booting":                   &instance.NotRunningError{Name: "a", State: instance.Booting},
		"stopping":                  &instance.NotRunningError{Name: "a", State: instance.Stopping},
		"no start":                  &instance.NotRunningError{Name: "a", State: instance.Stopped, NoStart: true},
		"stopped":                   &instance.NotRunningError{Name: "a", State: instance.Stopped},
		"stopped while waiting":     &instance.StoppedError{Name: "a"},
		"stopped while waiting for": &instance.StoppedError{Name: "a", For: "its prompt"},
		"no capture":                &instance.NoCaptureError{Name: "a"},
		"no tap":                    fmt.Errorf("guest %q has %w", "a", instance.ErrNoTAP),
		"capture running":           &instance.CaptureRunningError{Name: "a", Path: "/c/a.pcap"},
		"guest lost":                fmt.Errorf("restore: %w; %w", errors.New("QEMU did not start"), instance.ErrGuestLost),
		"no display":                &instance.NoDisplayError{Desc: "no console"},
		"project":                   &hostpath.ProjectError{Root: "/nowhere", Err: os.ErrNotExist},
		"relative":                  &hostpath.RelativeError{What: "kernel", Path: "k.bin", Err: os.ErrNotExist, Project: "/src/os"},
		"read-only":                 &hostpath.ReadOnlyError{What: "drives[0]", Path: "/srv/disk.img", Real: "/srv/disk.img", Dir: "/srv", Rule: "allow-path"},
		"refused option":            &boundary.RefusedError{Kind: boundary.KindOption, Subject: "-chardev", Rule: "host-resources", Reason: "it reaches the host"},
		"refused qmp":               &boundary.RefusedError{Kind: "qmp", Subject: "migrate", Rule: "host-resources", Reason: "it reaches the host"},
		"managed option":            &qemu.ManagedError{Arg: "-serial", Why: "the server owns the console"},
		"lock held by self":         held(os.Getpid(), os.Geteuid()),
		"lock held by another":      held(1, os.Geteuid()+1),
		"lock held":                 held(1, os.Geteuid()),
		"snapshot not found":        &snapshot.NotFoundError{Name: "s", Root: "/src/os"},
		"snapshot ambiguous":        &snapshot.AmbiguousError{Name: "s", Root: "/src/os", N: 2},
		"snapshot machine":          &snapshot.MachineError{Name: "s", Diffs: []string{"memory: saved 256M, now 128M"}},
		"snapshot machine, guest":   &snapshot.MachineError{Name: "s", Guest: "a", Diffs: []string{"memory: saved 256M, now 128M"}},
		"drive format":              &snapshot.DriveFormatError{Device: "drive0", Path: "/d.img", Format: "raw"},
		"low space":                 &snapshot.LowSpaceError{Dir: "/state", Free: 1 << 20},
		"no breakpoint":             &debugger.NoBreakpointError{Where: "main"},
		"no watchpoint":             &debugger.NoBreakpointError{Where: "x", Watch: true},
		"watch refused":             &debugger.WatchRefusedError{N: 4, Where: "x", Err: errors.New("E22")},
		"no physical":               fmt.Errorf("read 0x80000000: %w", debugger.ErrNoPhysical),
		"not a replay":              fmt.Errorf("reverse step: %w", debugger.ErrNotReplay),
		"at end":                    &debugger.AtEndError{At: 10, End: 10},
		"replaying":                 &instance.ReplayingError{What: "load a snapshot into", Name: "a", Recording: "run"},
		"no builtin kernel":         instance.ErrNoBuiltinKernel,
		"no builtin symbols":        instance.ErrNoBuiltinSymbols,
		"replay command":            &instance.ReplayCommandError{Name: "a", Recording: "run", Command: "stop"},
		"no echo":                   &instance.NoEchoError{Within: 2 * time.Second, From: 4, Chunk: []byte("efgh")},
		"recording not found":       &recording.NotFoundError{Name: "run", Root: "/src/os"},
		"recording in use":          &instance.RecordingInUseError{Name: "run", Guest: "a", Replayed: true},
		"recording machine":         &recording.MachineError{Name: "run", Diffs: []string{"smp: saved 1, now 2"}},
		"layout":                    &qemu.LayoutError{Chars: []string{"é"}},
		"plain":                     errors.New("something else"),
	}
	for name, e := range c {
		c[name] = fmt.Errorf("boot of %q: %w (while it started)", "a", e)
	}
	c["same twice"] = errors.Join(&snapshot.MachineError{Name: "s", Guest: "a", Diffs: []string{"memory: saved 256M, now 128M"}},
		&snapshot.MachineError{Name: "s", Guest: "a", Diffs: []string{"smp: saved 1, now 2"}})
	c["two"] = fmt.Errorf("both: %w", errors.Join(&instance.BusyError{Name: "a", State: instance.Running}, &snapshot.NotFoundError{Name: "s", Root: "/r"}))
	return c
}

// advise gives each domain error the advice it gave before the errors
// chose it themselves, byte for byte (testdata/advice.json was written by
// the type switch it replaced).
func TestAdviseText(t *testing.T) {
	got := map[string]string{}
	for name, err := range adviceCases() {
		// The server's own pid differs from run to run.
		got[name] = strings.ReplaceAll(advise(err).Error(), strconv.Itoa(os.Getpid()), "PID")
	}
	if *updateAdvice {
		b, _ := json.MarshalIndent(got, "", "  ")
		if err := os.WriteFile("testdata/advice.json", append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile("testdata/advice.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]string
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s:\n got %s\nwant %s", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d cases, %d in the golden file", len(got), len(want))
	}
}
