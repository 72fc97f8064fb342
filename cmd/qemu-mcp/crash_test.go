package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// stepWriter is a server's stderr: it logs each line and reports the
// steps of snapshot saves ("snapshot save" step=...), or of loads with
// load set, as they happen.
type stepWriter struct {
	t     *testing.T
	load  bool
	mu    sync.Mutex
	part  []byte
	steps chan string
}

var (
	stepRE     = regexp.MustCompile(`msg="snapshot save" .*step=("[^"]*"|\S+)`)
	loadStepRE = regexp.MustCompile(`msg="snapshot load" .*step=("[^"]*"|\S+)`)
)

func (w *stepWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		line := string(w.part[:i])
		w.part = w.part[i+1:]
		re := stepRE
		if w.load {
			re = loadStepRE
		}
		if m := re.FindStringSubmatch(line); m != nil {
			select {
			case w.steps <- strings.Trim(m[1], `"`):
			default:
			}
		}
		w.t.Log(line)
	}
	return len(p), nil
}

// killPoint is where a sweep kills the server: once a save logged step
// after, and delay later.
type killPoint struct {
	after string
	delay time.Duration
}

func (k killPoint) String() string {
	if k.delay > 0 {
		return fmt.Sprintf("%s+%v", k.after, k.delay)
	}
	return k.after
}

// The points every run kills at: each step of the transaction, and inside
// QEMU's save job. QEMU_MCP_KILL_POINTS=N runs N points instead, the
// steps in turn with random delays.
var killSteps = []killPoint{{"intent", 0}, {"image", 0}, {"image", 40 * time.Millisecond}, {"image", 120 * time.Millisecond},
	{"saved", 0}, {"synced", 0}, {"committed", 0}, {"old image removed", 0}, {"old tag removed", 0}, {"done", 0}}

func killPoints(t *testing.T) []killPoint {
	n, _ := strconv.Atoi(os.Getenv("QEMU_MCP_KILL_POINTS"))
	if n <= 0 {
		return killSteps
	}
	out := make([]killPoint, n)
	for i := range out {
		out[i] = killSteps[i%len(killSteps)]
		if i >= len(killSteps) {
			out[i].delay = time.Duration(rand.IntN(200)) * time.Millisecond
		}
	}
	return out
}

// SIGKILL of the real server at many points of a re-save of a Linux
// guest, with and without a qcow2 drive. After each kill a new server
// starts: nothing partial is left, no drive holds a tag no record names,
// the list says the snapshot is whole, and the snapshot boots into a live
// guest (sleep 1 returns) whose state, in RAM and on the disk alike, is
// one of the two saves.
func TestSnapshotKillSweep(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	testguest.QEMUImg(t)
	for _, withDrive := range []bool{false, true} {
		t.Run(fmt.Sprintf("drive=%v", withDrive), func(t *testing.T) {
			killSweep(t, lin, withDrive)
		})
	}
}

// sweep is what a kill sweep works with: real servers, one after
// another, in one runtime directory and project, on the Linux guest.
type sweep struct {
	t         *testing.T
	lin       testguest.Linux
	dir       string // the servers' runtime directory
	project   string
	disk      string // the project's qcow2 drive, if withDrive
	store     string // the snapshot store
	withDrive bool
	load      bool          // kill at the steps of loads, not saves
	qemu      proc.Identity // the last boot's QEMU
}

func newSweep(t *testing.T, lin testguest.Linux, withDrive, load bool) *sweep {
	w := &sweep{t: t, lin: lin, dir: runtimeDir(t), project: t.TempDir(), withDrive: withDrive, load: load}
	w.store = filepath.Join(w.dir+".state", "snapshots")
	w.disk = filepath.Join(w.project, "disk.qcow2")
	if withDrive {
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", w.disk, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
	}
	return w
}

// start starts a server; the channel reports its steps.
func (w *sweep) start() (*server, chan string) {
	cmd := serverCmd(w.dir, "-allow-path", w.lin.Dir)
	cmd.Dir = w.project
	sw := &stepWriter{t: w.t, load: w.load, steps: make(chan string, 64)}
	cmd.Stderr = sw
	return startServerCmd(w.t, cmd, cmd.Env), sw.steps
}

func (w *sweep) call(s *server, name string, args map[string]any, out any) {
	w.t.Helper()
	if res := s.call(w.t, name, args, out); res.IsError {
		w.t.Fatalf("%s: %s", name, mcptest.Text(res))
	}
}

type sweepWait struct {
	Matched bool   `json:"matched"`
	Output  string `json:"output"`
}

// setState writes the state a save keeps: in RAM, and on the disk.
func (w *sweep) setState(s *server, v string) {
	w.t.Helper()
	cmd := "echo " + v + " > /tmp/state"
	if w.withDrive {
		cmd += "; echo " + v + " > /dev/vda; sync"
	}
	var r sweepWait
	w.call(s, "serial_send", map[string]any{"data": cmd, "wait_for": testguest.LinuxPrompt, "timeout": 20}, &r)
	if !r.Matched {
		w.t.Fatalf("set state %s: %+v", v, r)
	}
}

// boot boots the Linux guest, or with args a snapshot, and notes its QEMU.
func (w *sweep) boot(s *server, args map[string]any) {
	w.t.Helper()
	if args == nil {
		args = map[string]any{"kernel": w.lin.Kernel, "initrd": w.lin.Initrd, "append": testguest.LinuxAppend, "memory": "256M",
			"wait_for": testguest.LinuxPrompt, "timeout": 60}
		if w.withDrive {
			args["drives"] = []map[string]any{{"path": "disk.qcow2", "format": "qcow2"}}
		}
	}
	var b struct {
		PID int `json:"pid"`
	}
	w.call(s, "qemu_boot", args, &b)
	info, err := proc.Stat(b.PID)
	if err != nil {
		w.t.Fatal(err)
	}
	w.qemu = proc.Identity{PID: info.PID, StartTime: info.StartTime}
}

// killDuring calls tool on s and SIGKILLs s at p (or after the call
// returned), then waits for its QEMU to die with it; it says when the
// kill came.
func (w *sweep) killDuring(s *server, steps chan string, k int, tool string, p killPoint) string {
	w.t.Helper()
	// Drain the steps of earlier calls.
	for len(steps) > 0 {
		<-steps
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"name": "a"}})
	}()
	how := "after the call returned"
wait:
	for {
		select {
		case st := <-steps:
			if st == p.after {
				time.Sleep(p.delay)
				how = "at " + p.String()
				break wait
			}
		case <-done:
			break wait
		}
	}
	s.cmd.Process.Kill()
	<-s.done
	<-done
	// Its QEMU dies with it (parent-death signal) within moments.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if exited(w.qemu) {
			break
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("kill %d (%s): qemu %d outlived its server", k, how, w.qemu.PID)
		}
	}
	return how
}

// exited says whether the process id is gone with all its threads. A
// thread group's leader shows as a zombie while its other threads still
// exit, and they hold its files: a QEMU's image locks go with the last
// thread, and a boot on the image before that fails to get its lock.
func exited(id proc.Identity) bool {
	switch live, _, _ := proc.Check(id); live {
	case proc.Alive:
		return false
	case proc.Zombie:
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", id.PID))
		return err != nil || len(tasks) <= 1
	}
	return true
}

// whole checks, in a new server, that the snapshot "a" is whole: listed
// so, its record and image alone in the store, its tag the drive's only
// one. It returns the record's parts.
func (w *sweep) whole(s *server, k int, how string) recordParts {
	w.t.Helper()
	var list struct {
		Snapshots []struct {
			Name       string `json:"name"`
			Incomplete string `json:"incomplete"`
		} `json:"snapshots"`
	}
	w.call(s, "qemu_snapshot_list", nil, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Name != "a" || list.Snapshots[0].Incomplete != "" {
		w.t.Fatalf("kill %d (%s): list %+v", k, how, list)
	}
	rec := recordOf(w.t, w.store)
	want := []string{"a.json", rec.image}
	slices.Sort(want)
	if files := storeFiles(w.t, w.store); !slices.Equal(files, want) {
		w.t.Fatalf("kill %d (%s): the store holds %v, want %v", k, how, files, want)
	}
	if w.withDrive {
		if tags := testguest.SnapshotTags(w.t, w.disk); !slices.Equal(tags, []string{rec.tag}) {
			w.t.Fatalf("kill %d (%s): the drive holds %v, want only the record's %s", k, how, tags, rec.tag)
		}
	}
	return rec
}

// readState reads the state back from a guest booted from the snapshot,
// after checking that it runs (sleep 1 returns): one value per place.
func (w *sweep) readState(s *server, k int, how string) []string {
	w.t.Helper()
	read := "cat /tmp/state"
	if w.withDrive {
		read += "; head -c 3 /dev/vda; echo"
	}
	var r sweepWait
	w.call(s, "serial_send", map[string]any{"data": read + "; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 20}, &r)
	if !r.Matched {
		w.t.Fatalf("kill %d (%s): the restored guest does not answer, or its sleep 1 does not return: %+v", k, how, r)
	}
	return regexp.MustCompile(`s\d\d`).FindAllString(r.Output, -1)
}

func killSweep(t *testing.T, lin testguest.Linux, withDrive bool) {
	w := newSweep(t, lin, withDrive, false)
	s, steps := w.start()
	w.boot(s, nil)
	committed := "s00"
	w.setState(s, committed)
	w.call(s, "qemu_snapshot_save", map[string]any{"name": "a"}, nil)
	points := killPoints(t)
	var newState, oldState int
	for k, p := range points {
		attempt := fmt.Sprintf("s%02d", k+1)
		w.setState(s, attempt)
		how := w.killDuring(s, steps, k, "qemu_snapshot_save", p)
		// A new server: its start reaps what the killed save left.
		s, steps = w.start()
		w.whole(s, k, how)
		w.boot(s, map[string]any{"snapshot": "a"})
		var list struct {
			Snapshots []struct {
				Matches *bool `json:"matches"`
			} `json:"snapshots"`
		}
		w.call(s, "qemu_snapshot_list", nil, &list)
		if len(list.Snapshots) != 1 || list.Snapshots[0].Matches == nil || !*list.Snapshots[0].Matches {
			t.Fatalf("kill %d (%s): list with the guest running: %+v", k, how, list)
		}
		got := w.readState(s, k, how)
		if len(got) == 0 || (withDrive && (len(got) != 2 || got[0] != got[1])) || (got[0] != committed && got[0] != attempt) {
			t.Fatalf("kill %d (%s): state %v, want %s or %s (RAM and disk alike)", k, how, got, committed, attempt)
		}
		if got[0] == attempt {
			newState++
		} else {
			oldState++
		}
		t.Logf("kill %d %s: survived, the snapshot holds the %s save", k, how, map[bool]string{true: "new", false: "old"}[got[0] == attempt])
		committed = got[0]
	}
	t.Logf("drive=%v: %d kills tried, %d survived (%d kept the old save, %d the new one)", withDrive, len(points), newState+oldState, oldState, newState)
	s.cs.Close()
	<-s.done
}

// storeFiles lists every file of the snapshot store, by base name.
func storeFiles(t *testing.T, store string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(store, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, d.Name())
		}
		return nil
	})
	slices.Sort(out)
	return out
}

type recordParts struct{ image, tag string }

func recordOf(t *testing.T, store string) recordParts {
	t.Helper()
	var rec recordParts
	filepath.WalkDir(store, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "a.json" {
			b, _ := os.ReadFile(p)
			rec.image = regexp.MustCompile(`"image": "([^"]+)"`).FindStringSubmatch(string(b))[1]
			rec.tag = regexp.MustCompile(`"tag": "([^"]+)"`).FindStringSubmatch(string(b))[1]
		}
		return nil
	})
	return rec
}

// The points a load sweep kills at: each step of a restore, and inside
// QEMU's load (in place) or the new QEMU's start (a new QEMU).
var loadKillSteps = []killPoint{{"staged", 0}, {"stopped", 0}, {"stopped", 15 * time.Millisecond},
	{"stopped", 50 * time.Millisecond}, {"loaded", 0}, {"running", 0}}

// SIGKILL of the real server at each step of a qemu_snapshot_load of a
// Linux guest with a qcow2 drive: in place where QEMU loads that way (QEMU
// 11), in a new QEMU elsewhere. After each kill a new server starts: the
// snapshot is whole (listed whole, its record and image alone in the store,
// the image's bytes unchanged, its tag the drive's only one), the copy the
// load used is gone once the new server booted, and the snapshot boots
// into a live guest (sleep 1 returns) with the saved state in RAM and on
// the disk.
func TestSnapshotLoadKillSweep(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	testguest.QEMUImg(t)
	w := newSweep(t, lin, true, true)
	s, steps := w.start()
	w.boot(s, nil)
	w.setState(s, "s99")
	w.call(s, "qemu_snapshot_save", map[string]any{"name": "a"}, nil)
	rec := recordOf(t, w.store)
	image := filepath.Join(filepath.Dir(recordPath(t, w.store)), rec.image)
	sum := testguest.FileSum(t, image)
	for k, p := range loadKillSteps {
		w.setState(s, fmt.Sprintf("s%02d", k))
		how := w.killDuring(s, steps, k, "qemu_snapshot_load", p)
		// A QEMU killed with a qcow2 open may leak clusters (exit 3),
		// which costs space, not data; corruption (exit 2) is a failure.
		if out, err := exec.Command("qemu-img", "check", "-q", "-U", w.disk).CombinedOutput(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 2 {
				t.Fatalf("kill %d (%s): the drive is corrupt: %s", k, how, out)
			}
			t.Logf("kill %d (%s): qemu-img check of the drive: %v %s", k, how, err, out)
		}
		s, steps = w.start()
		if w.whole(s, k, how) != rec || testguest.FileSum(t, image) != sum {
			t.Fatalf("kill %d (%s): the snapshot's record or image changed", k, how)
		}
		w.boot(s, map[string]any{"snapshot": "a"})
		if left, _ := filepath.Glob(filepath.Join(w.dir, "snapload-*")); len(left) != 0 {
			t.Errorf("kill %d (%s): the killed load's copy is still there: %v", k, how, left)
		}
		if got := w.readState(s, k, how); !slices.Equal(got, []string{"s99", "s99"}) {
			t.Fatalf("kill %d (%s): the snapshot's guest holds %v, want the saved s99 in RAM and on the disk", k, how, got)
		}
		t.Logf("kill %d %s: the snapshot is whole", k, how)
	}
	t.Logf("%d kills during loads, the snapshot whole after each", len(loadKillSteps))
	s.cs.Close()
	<-s.done
}

// recordPath is the path of the record a.json in the store.
func recordPath(t *testing.T, store string) string {
	t.Helper()
	var p string
	filepath.WalkDir(store, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "a.json" {
			p = path
		}
		return nil
	})
	if p == "" {
		t.Fatal("no record a.json in the store")
	}
	return p
}
