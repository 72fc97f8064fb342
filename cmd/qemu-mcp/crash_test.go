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
	"github.com/qemu-mcp/qemu-mcp/internal/testguest"
)

// stepWriter is a server's stderr: it logs each line and reports the
// steps of snapshot saves ("snapshot save" step=...) as they happen.
type stepWriter struct {
	t     *testing.T
	mu    sync.Mutex
	part  []byte
	steps chan string
}

var stepRE = regexp.MustCompile(`msg="snapshot save" .*step=("[^"]*"|\S+)`)

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
		if m := stepRE.FindStringSubmatch(line); m != nil {
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

func killSweep(t *testing.T, lin testguest.Linux, withDrive bool) {
	dir := runtimeDir(t)
	project := t.TempDir()
	disk := filepath.Join(project, "disk.qcow2")
	if withDrive {
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
	}
	store := filepath.Join(dir+".state", "snapshots")
	start := func() (*server, chan string) {
		cmd := serverCmd(dir, "-allow-path", lin.Dir)
		cmd.Dir = project
		w := &stepWriter{t: t, steps: make(chan string, 64)}
		cmd.Stderr = w
		return startServerCmd(t, cmd, cmd.Env), w.steps
	}
	call := func(s *server, name string, args map[string]any, out any) {
		t.Helper()
		if res := s.call(t, name, args, out); res.IsError {
			t.Fatalf("%s: %s", name, resultText(res))
		}
	}
	type wait struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	// setState writes the state a save keeps: in RAM, and on the disk.
	setState := func(s *server, v string) {
		cmd := "echo " + v + " > /tmp/state"
		if withDrive {
			cmd += "; echo " + v + " > /dev/vda; sync"
		}
		var w wait
		call(s, "serial_send", map[string]any{"data": cmd, "wait_for": testguest.LinuxPrompt, "timeout": 20}, &w)
		if !w.Matched {
			t.Fatalf("set state %s: %+v", v, w)
		}
	}
	// state boots the snapshot in a new server and reads its state back.
	var qemu proc.Identity
	boot := func(s *server, args map[string]any) {
		var b struct {
			PID     int  `json:"pid"`
			Matched bool `json:"matched"`
		}
		call(s, "qemu_boot", args, &b)
		info, err := proc.Stat(b.PID)
		if err != nil {
			t.Fatal(err)
		}
		qemu = proc.Identity{PID: info.PID, StartTime: info.StartTime}
	}

	s, steps := start()
	args := map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": testguest.LinuxAppend, "memory": "256M",
		"wait_for": testguest.LinuxPrompt, "timeout": 60}
	if withDrive {
		args["drives"] = []map[string]any{{"path": "disk.qcow2", "format": "qcow2"}}
	}
	boot(s, args)
	committed := "s00"
	setState(s, committed)
	call(s, "qemu_snapshot_save", map[string]any{"name": "a"}, nil)
	points := killPoints(t)
	var newState, oldState int
	for k, p := range points {
		attempt := fmt.Sprintf("s%02d", k+1)
		setState(s, attempt)
		// Drain the steps of earlier saves.
		for len(steps) > 0 {
			<-steps
		}
		saveDone := make(chan struct{})
		go func() {
			defer close(saveDone)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "qemu_snapshot_save", Arguments: map[string]any{"name": "a"}})
		}()
		how := "after the save returned"
	wait:
		for {
			select {
			case st := <-steps:
				if st == p.after {
					time.Sleep(p.delay)
					how = "at " + p.String()
					break wait
				}
			case <-saveDone:
				break wait
			}
		}
		s.cmd.Process.Kill()
		<-s.done
		<-saveDone
		// Its QEMU dies with it (parent-death signal) within moments.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if live, _, _ := proc.Check(qemu); live != proc.Alive {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kill %d (%s): qemu %d outlived its server", k, how, qemu.PID)
			}
		}

		// A new server: its start reaps what the killed save left.
		s, steps = start()
		var list struct {
			Snapshots []struct {
				Name       string `json:"name"`
				Matches    *bool  `json:"matches"`
				Incomplete string `json:"incomplete"`
			} `json:"snapshots"`
		}
		call(s, "qemu_snapshot_list", nil, &list)
		if len(list.Snapshots) != 1 || list.Snapshots[0].Name != "a" || list.Snapshots[0].Incomplete != "" {
			t.Fatalf("kill %d (%s): list %+v", k, how, list)
		}
		files := storeFiles(t, store)
		rec := recordOf(t, store)
		want := []string{"a.json", rec.image}
		slices.Sort(want)
		if !slices.Equal(files, want) {
			t.Fatalf("kill %d (%s): the store holds %v, want %v", k, how, files, want)
		}
		if withDrive {
			if tags := testguest.SnapshotTags(t, disk); !slices.Equal(tags, []string{rec.tag}) {
				t.Fatalf("kill %d (%s): the drive holds %v, want only the record's %s", k, how, tags, rec.tag)
			}
		}
		boot(s, map[string]any{"snapshot": "a"})
		call(s, "qemu_snapshot_list", nil, &list)
		if len(list.Snapshots) != 1 || list.Snapshots[0].Matches == nil || !*list.Snapshots[0].Matches {
			t.Fatalf("kill %d (%s): list with the guest running: %+v", k, how, list)
		}
		read := "cat /tmp/state"
		if withDrive {
			read += "; head -c 3 /dev/vda; echo"
		}
		var w wait
		call(s, "serial_send", map[string]any{"data": read + "; sleep 1; echo slept", "wait_for": `slept\r\n` + testguest.LinuxPrompt, "timeout": 20}, &w)
		if !w.Matched {
			t.Fatalf("kill %d (%s): the restored guest does not answer, or its sleep 1 does not return: %+v", k, how, w)
		}
		got := regexp.MustCompile(`s\d\d`).FindAllString(w.Output, -1)
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
