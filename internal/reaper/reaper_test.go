package reaper_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/registrytest"
)

// serverFiles creates the FIFOs, the socket and (if rec is not nil) the
// record of server pid in dir, and returns their paths. With a record, the
// names carry its start time and the instance "default"; without, they are
// the PID-only names of older versions.
func serverFiles(t *testing.T, dir string, pid int, rec *registry.Record) []string {
	t.Helper()
	o := names.Owner{PID: pid}
	if rec != nil {
		o = rec.Owner()
	}
	in := filepath.Join(dir, names.Name(names.SerialIn, o, "default"))
	out := filepath.Join(dir, names.Name(names.SerialOut, o, "default"))
	sock := filepath.Join(dir, names.Name(names.QMPSocket, o, "default"))
	registrytest.Mkfifo(t, in)
	registrytest.Mkfifo(t, out)
	registrytest.Mksock(t, sock)
	paths := []string{in, out, sock}
	if rec != nil {
		if err := registry.Write(dir, *rec); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, registry.Path(dir, o))
	}
	return paths
}

func runtimeDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func reap(t *testing.T, dir string, opts reaper.Options) reaper.Report {
	t.Helper()
	rep, err := reaper.Reap(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep.String())
	return rep
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if registrytest.Exists(p) {
			t.Errorf("%s still exists", p)
		}
	}
}

func assertKept(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if !registrytest.Exists(p) {
			t.Errorf("%s was removed", p)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func skippedReason(rep reaper.Report, path string) string {
	for _, s := range rep.Skipped {
		if s.Path == path {
			return s.Reason
		}
	}
	return ""
}

// A dead server with a record, FIFOs, socket and a half-written record:
// everything is removed, and its QEMU (a sleep) is killed within 2 s.
func TestReapDeadServerKillsItsQEMU(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	qemu := registrytest.StartSleep(t, 60)
	child, err := registry.NewChild(qemu.ID.PID)
	if err != nil {
		t.Fatal(err)
	}
	if child.Executable != qemu.Exe || child.StartTime != qemu.ID.StartTime {
		t.Fatalf("child %+v", child)
	}
	rec := registrytest.DeadRecord(dead, "stdio")
	rec.QEMU = &child
	paths := serverFiles(t, dir, dead.PID, &rec)
	tmp := filepath.Join(dir, names.TempName(rec.Owner(), "0123abcd"))
	registrytest.Mkfile(t, tmp, "{")
	paths = append(paths, tmp)

	var logs bytes.Buffer
	start := time.Now()
	rep := reap(t, dir, reaper.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !strings.Contains(logs.String(), "killed QEMU") || !strings.Contains(logs.String(), "reaped dead servers") {
		t.Errorf("logs:\n%s", logs.String())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Reap took %v", d)
	}
	assertGone(t, paths...)
	if !slices.Equal(sorted(rep.Removed), sorted(paths)) {
		t.Errorf("removed %v, want %v", rep.Removed, paths)
	}
	if len(rep.KilledQEMU) != 1 || rep.KilledQEMU[0] != (reaper.Killed{ServerPID: dead.PID, PID: qemu.ID.PID, StartTime: qemu.ID.StartTime, Executable: qemu.Exe}) {
		t.Errorf("killed %+v", rep.KilledQEMU)
	}
	if !slices.Equal(rep.DeadServers, []int{dead.PID}) || len(rep.Errors) != 0 || len(rep.Skipped) != 0 {
		t.Errorf("report %+v", rep)
	}
	// Reap waited for it: it is already not alive (a zombie of ours).
	if live, _, _ := proc.Check(qemu.ID); live == proc.Alive {
		t.Errorf("QEMU still alive after Reap")
	}
	if !qemu.KilledBy(t, syscall.SIGKILL) {
		t.Errorf("QEMU ended with %v, want SIGKILL", qemu.Wait(t))
	}
}

// A recorded QEMU whose PID now names a process with another start time is
// not signalled; the dead server's files still go.
func TestReapReusedQEMUPIDNotSignalled(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	victim := registrytest.StartSleep(t, 30)
	rec := registrytest.DeadRecord(dead, "stdio")
	rec.QEMU = &registry.Child{PID: victim.ID.PID, StartTime: victim.ID.StartTime + 1, Executable: victim.Exe}
	paths := serverFiles(t, dir, dead.PID, &rec)

	rep := reap(t, dir, reaper.Options{})
	time.Sleep(50 * time.Millisecond)
	if live, _, _ := proc.Check(victim.ID); live != proc.Alive {
		t.Fatalf("process with the reused PID is %v", live)
	}
	if len(rep.KilledQEMU) != 0 {
		t.Errorf("killed %+v", rep.KilledQEMU)
	}
	if r := skippedReason(rep, "qemu:"+strconv.Itoa(victim.ID.PID)); !strings.Contains(r, "not signalled") {
		t.Errorf("skip reason %q", r)
	}
	assertGone(t, paths...)
}

// Same PID and start time, but not the recorded executable: not signalled.
func TestReapQEMUOtherExecutableNotSignalled(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	victim := registrytest.StartSleep(t, 30)
	rec := registrytest.DeadRecord(dead, "stdio")
	rec.QEMU = &registry.Child{PID: victim.ID.PID, StartTime: victim.ID.StartTime, Executable: "/usr/bin/qemu-system-riscv64"}
	serverFiles(t, dir, dead.PID, &rec)
	rep := reap(t, dir, reaper.Options{})
	time.Sleep(50 * time.Millisecond)
	if live, _, _ := proc.Check(victim.ID); live != proc.Alive {
		t.Fatalf("victim is %v", live)
	}
	if r := skippedReason(rep, "qemu:"+strconv.Itoa(victim.ID.PID)); !strings.Contains(r, "not the recorded") {
		t.Errorf("skip reason %q (%+v)", r, rep)
	}
}

// A record in a file named after another PID is not trusted: the QEMU it
// names is not signalled.
func TestReapRecordNamingAnotherPIDNotTrusted(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	victim := registrytest.StartSleep(t, 30)
	rec := registrytest.DeadRecord(dead, "stdio")
	rec.PID = dead.PID + 100000 // written under the other name below
	rec.QEMU = &registry.Child{PID: victim.ID.PID, StartTime: victim.ID.StartTime, Executable: victim.Exe}
	b, _ := registry.Marshal(rec)
	p := registry.Path(dir, names.Owner{PID: dead.PID})
	registrytest.Mkfile(t, p, string(b))
	rep := reap(t, dir, reaper.Options{})
	time.Sleep(50 * time.Millisecond)
	if live, _, _ := proc.Check(victim.ID); live != proc.Alive {
		t.Fatalf("victim is %v", live)
	}
	// Without a usable record, the dead PID's files go by the no-record rule.
	assertGone(t, p)
	if len(rep.KilledQEMU) != 0 {
		t.Errorf("killed %+v", rep.KilledQEMU)
	}
}

// A live server's files are untouched, whatever they are.
func TestReapLeavesLiveServer(t *testing.T) {
	dir := runtimeDir(t)
	srv := registrytest.StartSleep(t, 30)
	qemu := registrytest.StartSleep(t, 30)
	rec := registrytest.RecordOf(t, srv, "stdio")
	rec.QEMU = &registry.Child{PID: qemu.ID.PID, StartTime: qemu.ID.StartTime, Executable: qemu.Exe}
	paths := serverFiles(t, dir, srv.ID.PID, &rec)
	rep := reap(t, dir, reaper.Options{})
	assertKept(t, paths...)
	if len(rep.Removed) != 0 || len(rep.DeadServers) != 0 || rep.Kept != len(paths) {
		t.Errorf("report %+v", rep)
	}
	if live, _, _ := proc.Check(qemu.ID); live != proc.Alive {
		t.Errorf("live server's QEMU is %v", live)
	}
}

// Files without a record: a dead PID's are removed, a live PID's are kept
// (a live process has it: it may be the owner).
func TestReapWithoutRecord(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	live := registrytest.StartSleep(t, 30)
	deadPaths := serverFiles(t, dir, dead.PID, nil)
	livePaths := serverFiles(t, dir, live.ID.PID, nil)
	garbage := registry.Path(dir, names.Owner{PID: dead.PID})
	registrytest.Mkfile(t, garbage, "not json")
	deadPaths = append(deadPaths, garbage)
	rep := reap(t, dir, reaper.Options{})
	assertGone(t, deadPaths...)
	assertKept(t, livePaths...)
	if !slices.Equal(sorted(rep.Removed), sorted(deadPaths)) || rep.Kept != len(livePaths) {
		t.Errorf("report %+v", rep)
	}
}

// A QEMU capability probe's directory (package qemu/caps) of a dead server
// goes with everything in it; a live server's stays.
func TestReapProbeDir(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	live := registrytest.StartSleep(t, 30)
	mk := func(o names.Owner) string {
		p := filepath.Join(dir, names.ProbePrefix+o.Tag()+"-42")
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		registrytest.Mkfifo(t, filepath.Join(p, "s1.in"))
		registrytest.Mkfile(t, filepath.Join(p, "snap.qcow2"), "qcow2")
		if err := os.Symlink("/etc", filepath.Join(p, "link")); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deadDir := mk(names.Owner{PID: dead.PID, StartTime: dead.StartTime})
	liveDir := mk(names.Owner{PID: live.ID.PID, StartTime: live.ID.StartTime})
	rep := reap(t, dir, reaper.Options{})
	assertGone(t, deadDir)
	assertKept(t, liveDir, "/etc/hostname")
	if !slices.Equal(rep.Removed, []string{deadDir}) {
		t.Errorf("report %+v", rep)
	}
}

// A record of a dead server of an older version (PID-only names) whose PID
// a newer process has: entries not older than that process may be a new
// server's and are left alone. Names that carry the start time say whose
// they are, so the same files with such names go.
func TestReapReusedServerPIDKeepsNewerFiles(t *testing.T) {
	dir := runtimeDir(t)
	holder := registrytest.StartSleep(t, 30)
	rec := registrytest.RecordOf(t, holder, "stdio")
	rec.StartTime++ // the recorded server was another process
	named := serverFiles(t, dir, holder.ID.PID, &rec)
	if rep := reap(t, dir, reaper.Options{}); len(rep.Removed) != len(named) {
		t.Errorf("report %+v", rep)
	}
	assertGone(t, named...)

	paths := serverFiles(t, dir, holder.ID.PID, nil)
	b, err := registry.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	legacyRecord := registry.Path(dir, names.Owner{PID: holder.ID.PID})
	registrytest.Mkfile(t, legacyRecord, string(b))
	paths = append(paths, legacyRecord)
	rep := reap(t, dir, reaper.Options{})
	assertKept(t, paths...)
	if len(rep.Removed) != 0 || len(rep.Skipped) != len(paths) {
		t.Errorf("report %+v", rep)
	}
	for _, s := range rep.Skipped {
		if !strings.Contains(s.Reason, "not older than the process") {
			t.Errorf("skip %+v", s)
		}
	}
}

// A symlink planted where a dead server's FIFO was is neither followed nor
// removed; its target is untouched. Wrong file types are left too.
func TestReapSymlinkAndWrongTypes(t *testing.T) {
	dir := runtimeDir(t)
	outside := t.TempDir()
	target := filepath.Join(outside, "precious")
	registrytest.Mkfile(t, target, "keep me")
	dead := registrytest.DeadProcess(t)
	link := filepath.Join(dir, names.Name(names.SerialIn, names.Owner{PID: dead.PID}, ""))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, names.Name(names.SerialOut, names.Owner{PID: dead.PID}, ""))
	registrytest.Mkfile(t, regular, "not a fifo")
	sockDir := filepath.Join(dir, names.Name(names.QMPSocket, names.Owner{PID: dead.PID}, ""))
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	fifoRecord := registry.Path(dir, names.Owner{PID: dead.PID})
	registrytest.Mkfifo(t, fifoRecord)

	done := make(chan reaper.Report)
	go func() {
		rep, err := reaper.Reap(dir, reaper.Options{})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	var rep reaper.Report
	select {
	case rep = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Reap blocked")
	}
	assertKept(t, link, regular, sockDir, fifoRecord)
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me" {
		t.Fatalf("target %q, %v", b, err)
	}
	if r := skippedReason(rep, link); !strings.Contains(r, "symlink") || !strings.Contains(r, "not followed") {
		t.Errorf("symlink skip reason %q", r)
	}
	for _, p := range []string{regular, sockDir, fifoRecord} {
		if r := skippedReason(rep, p); !strings.Contains(r, "not removed") {
			t.Errorf("%s skip reason %q", p, r)
		}
	}
	if len(rep.Removed) != 0 {
		t.Errorf("removed %v", rep.Removed)
	}
}

// Entries owned by another user are not touched.
func TestReapForeignOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	rec := registrytest.DeadRecord(dead, "stdio")
	paths := serverFiles(t, dir, dead.PID, &rec)
	for _, p := range paths {
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	rep := reap(t, dir, reaper.Options{})
	assertKept(t, paths...)
	for _, p := range paths {
		if r := skippedReason(rep, p); !strings.Contains(r, "uid 65534") {
			t.Errorf("%s skip reason %q", p, r)
		}
	}
}

// captures/, images/ and names that are not exactly ours are never touched.
func TestReapLeavesCapturesImagesUnknown(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	d := strconv.Itoa(dead.PID)
	captures := filepath.Join(dir, "captures")
	images := filepath.Join(dir, "images")
	for _, sub := range []string{captures, images} {
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	inCaptures := []string{filepath.Join(captures, "serial-"+d+".in"), filepath.Join(captures, "serial-"+d+".log"), filepath.Join(images, "abc.bin")}
	registrytest.Mkfifo(t, inCaptures[0])
	registrytest.Mkfile(t, inCaptures[1], "transcript")
	registrytest.Mkfile(t, inCaptures[2], "kernel")
	var unknown []string
	for _, name := range []string{"serial-0" + d + ".in", "serial-" + d + ".in.bak", "qmp-" + d + ".socket", "serial--" + d + ".in",
		"server-" + d + ".json~", "server-" + d + ".yaml", "serial-" + d, "notes.txt", ".server-" + d + ".json.XYZ.tmp"} {
		p := filepath.Join(dir, name)
		registrytest.Mkfifo(t, p)
		unknown = append(unknown, p)
	}
	inv, err := reaper.Scan(dir, reaper.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Unknown) != len(unknown) || len(inv.Owners) != 0 {
		t.Errorf("inventory %+v", inv)
	}
	rep := reap(t, dir, reaper.Options{})
	assertKept(t, append(unknown, inCaptures...)...)
	assertKept(t, captures, images)
	if len(rep.Removed) != 0 || rep.Unknown != len(unknown) {
		t.Errorf("report %+v", rep)
	}
}

// The caller's own entries are never touched, even with a record that looks
// stale; and Options.Self protects the PID it names.
func TestReapNeverTouchesSelf(t *testing.T) {
	dir := runtimeDir(t)
	rec, err := registry.Self("stdio", "", "test")
	if err != nil {
		t.Fatal(err)
	}
	own := serverFiles(t, dir, os.Getpid(), &rec)
	rep := reap(t, dir, reaper.Options{})
	assertKept(t, own...)
	if len(rep.Skipped) != 0 || len(rep.DeadServers) != 0 || rep.Kept != len(own) {
		t.Errorf("report %+v", rep)
	}

	// What an earlier process with this PID left (a container restarted
	// with a persistent runtime dir): names with another start time, and
	// the PID-only names of older versions, with or without a record. It
	// is reaped, and ours is kept.
	earlier := rec
	earlier.StartTime--
	old := serverFiles(t, dir, os.Getpid(), &earlier)
	legacy := serverFiles(t, dir, os.Getpid(), nil)
	rep = reap(t, dir, reaper.Options{})
	assertGone(t, append(old, legacy...)...)
	assertKept(t, own...)
	if len(rep.DeadServers) != 2 || rep.Kept != len(own) {
		t.Errorf("report %+v", rep)
	}

	dead := registrytest.DeadProcess(t)
	other := serverFiles(t, dir, dead.PID, nil)
	rep = reap(t, dir, reaper.Options{Self: names.Owner{PID: dead.PID}})
	assertKept(t, other...)
	if len(rep.Removed) != 0 {
		t.Errorf("report %+v", rep)
	}
	rep = reap(t, dir, reaper.Options{})
	assertGone(t, other...)
	assertKept(t, own...)
}

func TestReapTAP(t *testing.T) {
	dir := runtimeDir(t)
	var calls []string
	hookErr := error(nil)
	hook := func(name string) error { calls = append(calls, name); return hookErr }

	dead := registrytest.DeadProcess(t)
	rec := registrytest.DeadRecord(dead, "stdio")
	rec.TAP = "qmcp" + strconv.Itoa(dead.PID)
	paths := serverFiles(t, dir, dead.PID, &rec)
	rep := reap(t, dir, reaper.Options{DeleteTAP: hook})
	if !slices.Equal(calls, []string{rec.TAP}) || !slices.Equal(rep.DeletedTAPs, []string{rec.TAP}) {
		t.Errorf("calls %v, report %+v", calls, rep)
	}
	assertGone(t, paths...)

	// A TAP name that is not qmcp<pid> is never passed to the hook.
	calls = nil
	rec.TAP = "eth0"
	paths = serverFiles(t, dir, dead.PID, &rec)
	rep = reap(t, dir, reaper.Options{DeleteTAP: hook})
	if len(calls) != 0 || !strings.Contains(skippedReason(rep, "tap:eth0"), "not deleted") {
		t.Errorf("calls %v, report %+v", calls, rep)
	}
	assertGone(t, paths...)

	// A failing hook keeps the record (to retry) and reports the error.
	rec.TAP = "qmcp" + strconv.Itoa(dead.PID)
	hookErr = errors.New("netlink says no")
	paths = serverFiles(t, dir, dead.PID, &rec)
	rep = reap(t, dir, reaper.Options{DeleteTAP: hook})
	assertGone(t, paths[:3]...)
	assertKept(t, paths[3])
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], "netlink says no") {
		t.Errorf("report %+v", rep)
	}

	// No hook: skipped, and the rest goes.
	rep = reap(t, dir, reaper.Options{})
	assertGone(t, paths[3])
	if !strings.Contains(skippedReason(rep, "tap:"+rec.TAP), "no TAP deletion") {
		t.Errorf("report %+v", rep)
	}

	// The instances of a server: each TAP with the name that server gave
	// that instance is deleted; another name is not.
	calls, hookErr = nil, nil
	rec.TAP = ""
	rec.Instances = []registry.Instance{
		{Name: "a", TAP: names.TAP(rec.Owner(), "a")},
		{Name: "b", TAP: names.TAP(rec.Owner(), "b")},
		{Name: "c", TAP: names.TAP(rec.Owner(), "a")}, // a's name under c: not c's
	}
	paths = serverFiles(t, dir, dead.PID, &rec)
	rep = reap(t, dir, reaper.Options{DeleteTAP: hook})
	if want := []string{rec.Instances[0].TAP, rec.Instances[1].TAP}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if !strings.Contains(skippedReason(rep, "tap:"+rec.Instances[2].TAP), "not deleted") {
		t.Errorf("report %+v", rep)
	}
	assertGone(t, paths...)
}

func TestReapMissingDirAndSymlinkedDir(t *testing.T) {
	rep, err := reaper.Reap(filepath.Join(t.TempDir(), "missing"), reaper.Options{})
	if err != nil || len(rep.Removed) != 0 {
		t.Fatalf("missing dir: %+v, %v", rep, err)
	}
	dir := runtimeDir(t)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if _, err := reaper.Reap(link, reaper.Options{}); err == nil {
		t.Fatal("Reap followed a symlinked runtime dir")
	}
}

func TestReportJSONAndString(t *testing.T) {
	dir := runtimeDir(t)
	dead := registrytest.DeadProcess(t)
	rec := registrytest.DeadRecord(dead, "stdio")
	serverFiles(t, dir, dead.PID, &rec)
	rep := reap(t, dir, reaper.Options{})
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"dir", "dead_servers", "removed", "kept", "elapsed_ns"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %s: %s", k, b)
		}
	}
	if s := rep.String(); !strings.Contains(s, "1 dead server(s): removed 4 file(s)") {
		t.Errorf("String = %q", s)
	}
	empty := reap(t, dir, reaper.Options{})
	if s := empty.String(); !strings.Contains(s, "nothing to reap") {
		t.Errorf("String = %q", s)
	}
}
