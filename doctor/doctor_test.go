package doctor_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/doctor"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/registrytest"
)

func files(t *testing.T, dir string, pid int, rec *registry.Record) []string {
	t.Helper()
	var paths []string
	o := names.Owner{PID: pid}
	if rec != nil {
		o = rec.Owner()
	}
	for _, k := range []names.Kind{names.SerialIn, names.SerialOut} {
		p := filepath.Join(dir, names.Name(k, o, "default"))
		registrytest.Mkfifo(t, p)
		paths = append(paths, p)
	}
	p := filepath.Join(dir, names.Name(names.QMPSocket, o, "default"))
	registrytest.Mksock(t, p)
	paths = append(paths, p)
	if rec != nil {
		if err := registry.Write(dir, *rec); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, registry.Path(dir, o))
	}
	return paths
}

type scene struct {
	dir                    string
	live, qemu, orphan     *registrytest.Proc
	dead, deadParent, bare proc.Identity
	livePaths, deadPaths   []string
	orphanPaths, barePaths []string
	squatter               *registrytest.Proc
	squatterPaths          []string
	garbage                string
}

func newScene(t *testing.T) *scene {
	t.Helper()
	s := &scene{dir: filepath.Join(t.TempDir(), "rt")}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A live http server.
	s.live = registrytest.StartSleep(t, 30)
	rec := registrytest.RecordOf(t, s.live, "http")
	rec.Address = "127.0.0.1:7000"
	rec.Version = "1.0.0"
	s.livePaths = files(t, s.dir, s.live.ID.PID, &rec)

	// A dead stdio server whose QEMU still runs, with a TAP and a lock.
	s.dead = registrytest.DeadProcess(t)
	s.qemu = registrytest.StartSleep(t, 60)
	child, err := registry.NewChild(s.qemu.ID.PID)
	if err != nil {
		t.Fatal(err)
	}
	drec := registrytest.DeadRecord(s.dead, "stdio")
	drec.QEMU = &child
	drec.TAP = "qmcp" + strconv.Itoa(s.dead.PID)
	drec.Lock = "/repo/.git/qemu-mcp.lock"
	s.deadPaths = files(t, s.dir, s.dead.PID, &drec)

	// A live stdio server whose client (recorded parent) is gone.
	s.orphan = registrytest.StartSleep(t, 30)
	s.deadParent = registrytest.DeadProcess(t)
	orec := registrytest.RecordOf(t, s.orphan, "stdio")
	orec.PPID, orec.ParentStartTime = s.deadParent.PID, s.deadParent.StartTime
	s.orphanPaths = files(t, s.dir, s.orphan.ID.PID, &orec)

	// Leftovers without a record, and a garbage record.
	s.bare = registrytest.DeadProcess(t)
	s.barePaths = files(t, s.dir, s.bare.PID, nil)
	s.garbage = filepath.Join(s.dir, "server-"+strconv.Itoa(s.bare.PID)+".json")
	registrytest.Mkfile(t, s.garbage, "{oops")
	registrytest.Mkfile(t, filepath.Join(s.dir, "notes.txt"), "mine")
	// Entries without a record whose PID a live process has: undecidable.
	s.squatter = registrytest.StartSleep(t, 30)
	s.squatterPaths = files(t, s.dir, s.squatter.ID.PID, nil)
	if err := os.Mkdir(filepath.Join(s.dir, "captures"), 0o700); err != nil {
		t.Fatal(err)
	}
	return s
}

func run(t *testing.T, dir string, opts doctor.Options) string {
	t.Helper()
	var buf bytes.Buffer
	if err := doctor.Run(dir, &buf, opts); err != nil {
		t.Fatal(err)
	}
	t.Logf("doctor output:\n%s", buf.String())
	return buf.String()
}

func mustContain(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func exist(t *testing.T, want bool, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if registrytest.Exists(p) != want {
			t.Errorf("%s exists: %v, want %v", p, !want, want)
		}
	}
}

func alive(id proc.Identity) bool {
	live, _, _ := proc.Check(id)
	return live == proc.Alive
}

func TestDoctorListingCleanupAndKillCommand(t *testing.T) {
	s := newScene(t)
	lock := func() (string, error) { return "held by pid 4242 (qemu-mcp, started 2026-01-01)", nil }
	pid := func(p int) string { return strconv.Itoa(p) }

	out := run(t, s.dir, doctor.Options{Lock: lock})
	mustContain(t, out,
		"runtime dir: "+s.dir,
		"lock: held by pid 4242",
		"servers: 4 record(s)",
		"pid "+pid(s.live.ID.PID)+": alive, http 127.0.0.1:7000, version 1.0.0",
		"executable: "+s.live.Exe+" (current binary: yes; process runs the recorded image: yes)",
		"parent: "+pid(os.Getpid())+" at start (alive: yes), now "+pid(os.Getpid()),
		"pid "+pid(s.dead.PID)+": dead (gone), stdio",
		"qemu: pid "+pid(s.qemu.ID.PID)+" alive ("+s.qemu.Exe+", executable matches: yes)",
		"tap: qmcp"+pid(s.dead.PID),
		"lock: /repo/.git/qemu-mcp.lock",
		"stale: 4 leftover entries",
		"pid "+pid(s.bare.PID)+": unusable record: registry: "+s.garbage+": parse record",
		"pid "+pid(s.orphan.ID.PID)+": alive, stdio",
		"orphaned: stdio server whose client (pid "+pid(s.deadParent.PID)+") is gone",
		"leftovers of dead servers: 2 server(s)",
		"no record, and no process has pid "+pid(s.bare.PID),
		s.deadPaths[0]+" (fifo)",
		s.deadPaths[2]+" (socket)",
		"remove them with: qemu-mcp doctor --cleanup",
		"unknown entries (never touched): notes.txt",
		"entries without a record whose pid is in use (left alone):",
		"pid "+pid(s.squatter.ID.PID)+": serial-"+pid(s.squatter.ID.PID)+".in serial-"+pid(s.squatter.ID.PID)+".out qmp-"+pid(s.squatter.ID.PID)+".sock",
		"pid "+pid(s.orphan.ID.PID)+": terminate it with: kill -TERM "+pid(s.orphan.ID.PID)+"\n",
	)
	if strings.Contains(out, "kill -TERM "+pid(s.live.ID.PID)) {
		t.Error("offered to kill a live server that is not orphaned")
	}
	// Listing changes nothing.
	exist(t, true, s.livePaths...)
	exist(t, true, s.deadPaths...)
	exist(t, true, s.barePaths...)
	if !alive(s.qemu.ID) || !alive(s.orphan.ID) || !alive(s.live.ID) {
		t.Fatal("listing killed something")
	}

	var taps []string
	out = run(t, s.dir, doctor.Options{Cleanup: true, DeleteTAP: func(n string) error { taps = append(taps, n); return nil }})
	mustContain(t, out,
		"cleanup:",
		"killed QEMU pid "+pid(s.qemu.ID.PID)+" ("+s.qemu.Exe+") of dead server "+pid(s.dead.PID),
		"deleted TAP qmcp"+pid(s.dead.PID),
		"removed "+s.deadPaths[0],
		"removed "+s.deadPaths[3],
		"removed "+s.garbage,
		"removed "+s.barePaths[2],
		"reaper: 2 dead server(s): removed 8 file(s)",
		"kill -TERM "+pid(s.orphan.ID.PID),
	)
	if !s.qemu.KilledBy(t, syscall.SIGKILL) {
		t.Error("QEMU not killed by SIGKILL")
	}
	exist(t, false, s.deadPaths...)
	exist(t, false, s.barePaths...)
	exist(t, false, s.garbage)
	exist(t, true, s.livePaths...)
	exist(t, true, s.orphanPaths...)
	exist(t, true, s.squatterPaths...)
	exist(t, true, filepath.Join(s.dir, "notes.txt"), filepath.Join(s.dir, "captures"))
	if len(taps) != 1 || !alive(s.orphan.ID) || !alive(s.live.ID) {
		t.Fatalf("taps %v, orphan alive %v, live alive %v", taps, alive(s.orphan.ID), alive(s.live.ID))
	}

	out = run(t, s.dir, doctor.Options{Cleanup: true})
	mustContain(t, out, "servers: 2 record(s)", "leftovers of dead servers: 0 server(s)", "reaper: nothing to reap")
}

func TestDoctorTerminatesVerifiedOrphan(t *testing.T) {
	s := newScene(t)
	start := time.Now()
	out := run(t, s.dir, doctor.Options{TerminateOrphans: true})
	mustContain(t, out, "pid "+strconv.Itoa(s.orphan.ID.PID)+": sent SIGTERM; it exited")
	if !s.orphan.KilledBy(t, syscall.SIGTERM) {
		t.Fatal("orphan not terminated by SIGTERM")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if !alive(s.live.ID) || !alive(s.qemu.ID) {
		t.Fatal("something else was signalled")
	}
	exist(t, true, s.deadPaths...) // no Cleanup asked
}

// A live orphan whose record does not verifiably name it (other executable
// identity) gets no kill command and no signal.
func TestDoctorUnverifiedOrphanNotSignalled(t *testing.T) {
	dir := t.TempDir()
	sl := registrytest.StartSleep(t, 30)
	dead := registrytest.DeadProcess(t)
	rec := registrytest.RecordOf(t, sl, "stdio")
	rec.PPID, rec.ParentStartTime = dead.PID, dead.StartTime
	rec.ExeIdentity = &registry.ExeIdentity{Dev: 1, Inode: 1}
	if err := registry.Write(dir, rec); err != nil {
		t.Fatal(err)
	}
	out := run(t, dir, doctor.Options{TerminateOrphans: true})
	mustContain(t, out, "orphaned:", "could not be verified", "not signalled")
	if strings.Contains(out, "kill -TERM") {
		t.Error("offered a kill command for an unverified record")
	}
	time.Sleep(50 * time.Millisecond)
	if !alive(sl.ID) {
		t.Fatal("unverified orphan was signalled")
	}
}

func TestDoctorJSON(t *testing.T) {
	s := newScene(t)
	var buf bytes.Buffer
	err := doctor.Run(s.dir, &buf, doctor.Options{JSON: true, Lock: func() (string, error) { return "", errors.New("lock file unreadable") }})
	if err != nil {
		t.Fatal(err)
	}
	var res doctor.Result
	if err := json.Unmarshal(buf.Bytes(), &res); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if len(res.Servers) != 4 || len(res.Leftovers) != 2 || len(res.Orphans) != 1 || len(res.Undecided) != 1 || res.Cleanup != nil {
		t.Fatalf("result %+v", res)
	}
	if o := res.Orphans[0]; o.PID != s.orphan.ID.PID || o.Command != "kill -TERM "+strconv.Itoa(o.PID) || !o.Verified || o.Terminated {
		t.Errorf("orphan %+v", o)
	}
	if res.Lock == nil || res.Lock.Error != "lock file unreadable" {
		t.Errorf("lock %+v", res.Lock)
	}
	for _, key := range []string{`"alive": true`, `"exe_match": "yes"`, `"orphaned": true`, `"state": "gone"`} {
		if !strings.Contains(buf.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

func TestDoctorMissingDir(t *testing.T) {
	out := run(t, filepath.Join(t.TempDir(), "none"), doctor.Options{Cleanup: true})
	mustContain(t, out, "servers: 0 record(s)", "reaper: nothing to reap")
}
