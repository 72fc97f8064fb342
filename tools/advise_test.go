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
