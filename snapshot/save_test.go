package snapshot

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/storetest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// saveSteps are the steps a save logs (see Store.Save), in order: a kill
// is swept over them.
var saveSteps = []string{"intent", "image", "saved", "synced", "committed", "old image removed", "old tag removed", "done"}

// childEnv makes the test binary a server that saves and is killed (see
// saveChild).
const childEnv = "QEMU_MCP_SNAPSHOT_SAVE_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		saveChild(spec)
		os.Exit(3) // saveChild never returns
	}
	os.Exit(m.Run())
}

// stepHook is a slog handler that calls f at each step a save logs.
type stepHook struct {
	f func(step, id string)
}

func (h stepHook) Enabled(context.Context, slog.Level) bool { return true }
func (h stepHook) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h stepHook) WithGroup(string) slog.Handler            { return h }
func (h stepHook) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "snapshot save" {
		return nil
	}
	var step, id string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "step":
			step = a.Value.String()
		case "id":
			id = a.Value.String()
		}
		return true
	})
	if h.f != nil {
		h.f(step, id)
	}
	return nil
}

// tinyGuest is the built-in kernel with a writable qcow2 drive, started
// the way the server starts QEMU.
type tinyGuest struct {
	m    *qemu.Process
	disk string
	cfg  qemu.Config
}

func startTiny(ctx context.Context, bin, dir, disk string) (*tinyGuest, error) {
	tiny := filepath.Join(testguest.Repo(), "testdata", "images", "tiny.bin")
	cfg := qemu.NewConfig(qemu.WithBinary(bin), qemu.WithKernel(tiny),
		qemu.WithDrive(qemu.Drive{Path: disk, Format: "qcow2"}))
	m, err := qemu.Start(ctx, qemu.Runtime{
		SerialBase: filepath.Join(dir, "serial"),
		QMPSocket:  filepath.Join(dir, "qmp.sock"),
		Logger:     slog.New(slog.DiscardHandler),
	}, cfg)
	if err != nil {
		return nil, err
	}
	res, err := m.Console().Buffer().Wait(ctx, 0, regexp.MustCompile(`tiny> $`), 10*time.Second)
	if err == nil && !res.Matched {
		err = fmt.Errorf("no prompt: %q", res.Output)
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return &tinyGuest{m: m, disk: disk, cfg: cfg}, nil
}

// saveChild is a server of its own: it boots the tiny kernel, saves
// snapshot "a" whole, then saves it again and kills itself with SIGKILL
// at one step of that save (QEMU dies with it, as with the real server).
// It reports QEMU's identity and the first save's tag on stdout.
func saveChild(spec string) {
	// step|store|root|disk|qemu|dir
	f := strings.Split(spec, "|")
	step, storeDir, root, disk, bin, dir := f[0], f[1], f[2], f[3], f[4], f[5]
	ctx := context.Background()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	g, err := startTiny(ctx, bin, dir, disk)
	if err != nil {
		fail(err)
	}
	id := g.m.Identity()
	fmt.Printf("qemu %d %d\n", id.PID, id.StartTime)
	// "STEP+DELAY" kills DELAY after STEP, while the save goes on (in
	// QEMU's save job, or wherever it got to).
	step, delayArg, delayed := strings.Cut(step, "+")
	delay, _ := time.ParseDuration(delayArg)
	kill := func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) } // this process
	var armed bool
	st := Store{Dir: storeDir, Logger: slog.New(stepHook{f: func(s, _ string) {
		if !armed || s != step {
			return
		}
		if delayed {
			time.AfterFunc(delay, kill)
			return
		}
		kill()
		select {}
	}})}
	mach, err := Describe(g.cfg)
	if err != nil {
		fail(err)
	}
	old, err := st.Save(ctx, g.m.Monitor(), root, mach, "a", "test", nil, nil)
	if err != nil {
		fail(err)
	}
	fmt.Printf("old %s\n", old.Tag)
	armed = true
	if _, err := st.Save(ctx, g.m.Monitor(), root, mach, "a", "test", nil, nil); err != nil {
		fail(err)
	}
	if delayed {
		select {} // the kill comes
	}
	fail(errors.New("the save ended without reaching step " + step))
}

// threads counts a process's threads (0 once it is gone).
func threads(pid int) int {
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	return len(ents)
}

func newDisk(t *testing.T, dir string) string {
	t.Helper()
	disk := filepath.Join(dir, "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", disk, "1M")
	return disk
}

// assertWhole checks that the store holds exactly one snapshot "a", whole,
// tagged tag, with nothing else in its directory, and that the drive
// holds that tag alone.
func assertWhole(t *testing.T, st Store, root, disk, tag string, extra ...string) Meta {
	t.Helper()
	list, err := st.List(root)
	if err != nil || len(list) != 1 || list[0].Name != "a" {
		t.Fatalf("list: %+v %v", list, err)
	}
	m := list[0]
	if m.Tag != tag {
		t.Errorf("snapshot a is tagged %s, want %s", m.Tag, tag)
	}
	if err := Verify(m); err != nil {
		t.Errorf("snapshot a is not whole: %v", err)
	}
	want := append([]string{"a.json", m.Image}, extra...)
	slices.Sort(want)
	if got := storetest.Files(t, filepath.Dir(m.Path)); !slices.Equal(got, want) {
		t.Errorf("store directory: %v, want %v", got, want)
	}
	if got := tags(t, disk); !slices.Equal(got, []string{tag}) {
		t.Errorf("the drive's tags: %v, want [%s]", got, tag)
	}
	return m
}

// saveScene is a tiny guest with a writable qcow2 drive, and a store
// whose saves call hook at each step.
type saveScene struct {
	ctx  context.Context
	mon  *qmp.Monitor
	st   Store
	mach Machine
	disk string
	hook func(step, id string)
}

// A save commits as a whole: a second save of the name replaces the first
// (its image and its tag in the drive go), a save that fails after it
// wrote the drive's tag undoes it and leaves the older snapshot as it
// was, and a cancelled save leaves the guest running with nothing of the
// save attached.
func TestSaveTransaction(t *testing.T) {
	bin := testguest.QEMU(t)
	needQEMUImg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := testguest.SocketDir(t, "qmcp")
	disk := newDisk(t, dir)
	g, err := startTiny(ctx, bin, dir, disk)
	if err != nil {
		t.Fatal(err)
	}
	defer g.m.Close()
	sc := &saveScene{ctx: ctx, mon: g.m.Monitor(), disk: disk}
	if sc.mach, err = Describe(g.cfg); err != nil {
		t.Fatal(err)
	}
	sc.st = Store{Dir: filepath.Join(dir, "store"), Logger: slog.New(stepHook{f: func(s, id string) {
		if sc.hook != nil {
			sc.hook(s, id)
		}
	}})}
	second := checkSaveReplaces(t, sc)
	checkFailedSaves(t, sc, second)

	// A guest that was paused stays paused.
	if _, err := sc.mon.Execute(ctx, "stop", nil); err != nil {
		t.Fatal(err)
	}
	third, err := sc.st.Save(ctx, sc.mon, "/proj", sc.mach, "a", "7.2.0", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if running, err := sc.mon.Running(ctx); err != nil || running {
		t.Errorf("a paused guest after the save: running %v, %v", running, err)
	}
	assertWhole(t, sc.st, "/proj", disk, third.Tag)
}

// checkSaveReplaces saves "a" twice, each time whole, the second replacing
// the first; it returns the second.
func checkSaveReplaces(t *testing.T, sc *saveScene) Meta {
	t.Helper()
	var steps []string
	sc.hook = func(s, _ string) { steps = append(steps, s) }
	first, err := sc.st.Save(sc.ctx, sc.mon, "/proj", sc.mach, "a", "7.2.0", map[string]string{"drive0": sc.disk}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first save has nothing to replace.
	if want := []string{"intent", "image", "saved", "synced", "committed", "done"}; !slices.Equal(steps, want) {
		t.Errorf("steps of a first save: %v, want %v", steps, want)
	}
	if first.QEMU != "7.2.0" || !slices.Equal(first.Drives, []string{sc.disk}) || first.Mtime == 0 || first.Size == 0 || first.ImageSize == 0 {
		t.Errorf("record: %+v", first)
	}
	assertWhole(t, sc.st, "/proj", sc.disk, first.Tag)
	if running, err := sc.mon.Running(sc.ctx); err != nil || !running {
		t.Errorf("the guest after the save: running %v, %v", running, err)
	}

	steps = nil
	second, err := sc.st.Save(sc.ctx, sc.mon, "/proj", sc.mach, "a", "7.2.0", map[string]string{"drive0": sc.disk}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(steps, saveSteps) {
		t.Errorf("steps of a save that replaces: %v, want %v", steps, saveSteps)
	}
	if second.Tag == first.Tag || second.Image == first.Image {
		t.Fatalf("the second save reused the first's parts: %+v", second)
	}
	assertWhole(t, sc.st, "/proj", sc.disk, second.Tag)
	return second
}

// checkFailedSaves has saves fail, after the drive's tag, by a cancel, by
// a bad name: each leaves the snapshot saved before, current, whole.
func checkFailedSaves(t *testing.T, sc *saveScene, current Meta) {
	t.Helper()
	// A save that fails after writing the drive's tag: the record cannot
	// be written (its temporary file is taken).
	var blocker string
	sc.hook = func(s, id string) {
		if s == "synced" {
			blocker = filepath.Join(filepath.Dir(current.Path), store.RecordTemp("a", id))
			writeFile(t, blocker, "")
		}
	}
	_, err := sc.st.Save(sc.ctx, sc.mon, "/proj", sc.mach, "a", "7.2.0", nil, nil)
	if err == nil || !strings.Contains(err.Error(), `save snapshot "a": record: `) || !strings.HasSuffix(err.Error(), `; the snapshot "a" saved before is unchanged`) {
		t.Fatalf("a save whose record cannot be written: %v", err)
	}
	assertWhole(t, sc.st, "/proj", sc.disk, current.Tag, filepath.Base(blocker))
	os.Remove(blocker)

	// A cancelled save: undone, and the guest runs on.
	sctx, scancel := context.WithCancel(sc.ctx)
	sc.hook = func(s, _ string) {
		if s == "image" {
			scancel()
		}
	}
	if _, err := sc.st.Save(sctx, sc.mon, "/proj", sc.mach, "a", "7.2.0", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled save: %v", err)
	}
	sc.hook = nil
	assertWhole(t, sc.st, "/proj", sc.disk, current.Tag)
	if running, err := sc.mon.Running(sc.ctx); err != nil || !running {
		t.Errorf("the guest after a cancelled save: running %v, %v", running, err)
	}
	raw, err := sc.mon.Execute(sc.ctx, "query-named-block-nodes", nil)
	if err != nil || strings.Contains(string(raw), saveNode) || strings.Contains(string(raw), saveFileNode) {
		t.Errorf("the save's nodes after it was cancelled: %v %s", err, raw)
	}
	if rep, err := sc.st.Leftovers(); err != nil || len(rep.Removed)+len(rep.Left)+len(rep.Errors)+len(rep.Broken) > 0 {
		t.Errorf("leftovers of saves that failed: %+v %v", rep, err)
	}

	if _, err := sc.st.Save(sc.ctx, sc.mon, "/proj", sc.mach, "bad name", "7.2.0", nil, nil); err == nil || !strings.Contains(err.Error(), "1 to 64 letters") {
		t.Errorf("a bad name: %v", err)
	}
	assertWhole(t, sc.st, "/proj", sc.disk, current.Tag)
}

// A server killed at any step of a save that replaces a snapshot: once the
// next server reaps, the name holds the old snapshot whole (killed before
// the record switched) or the new one (after), never a mix and never
// neither, and nothing of the other save stays, in the store or in the
// drive.
func TestSaveKilledAtEachStep(t *testing.T) {
	bin := testguest.QEMU(t)
	needQEMUImg(t)
	// At each step, and at times after the image is attached, which
	// fall in QEMU's save job or later.
	kills := append(slices.Clone(saveSteps), "image+30ms", "image+150ms")
	for _, step := range kills {
		t.Run(strings.ReplaceAll(step, " ", "_"), func(t *testing.T) {
			t.Parallel() // two at a time (-parallel is GOMAXPROCS): each its own QEMU and store
			dir := testguest.SocketDir(t, "qmcp")
			disk := newDisk(t, dir)
			st := Store{Dir: filepath.Join(dir, "store")}
			qemuID, oldTag := runKilledSave(t, step, strings.Join([]string{step, st.Dir, "/proj", disk, bin, dir}, "|"))
			waitGone(t, qemuID)
			checkReapedAfterKill(t, st, disk, step, oldTag)
		})
	}
}

// runKilledSave runs saveChild with spec, which kills itself at step, and
// returns what it reported: its QEMU and the tag of the snapshot its
// killed save replaced.
func runKilledSave(t *testing.T, step, spec string) (qemuID proc.Identity, oldTag string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+spec)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A child that hangs is killed (the process this test started), and
	// the test says so.
	var hung atomic.Bool
	guard := time.AfterFunc(60*time.Second, func() {
		hung.Store(true)
		cmd.Process.Kill()
	})
	defer guard.Stop()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		switch f := strings.Fields(sc.Text()); {
		case len(f) == 3 && f[0] == "qemu":
			qemuID.PID, _ = strconv.Atoi(f[1])
			qemuID.StartTime, _ = strconv.ParseUint(f[2], 10, 64)
		case len(f) == 2 && f[0] == "old":
			oldTag = f[1]
		}
	}
	io.Copy(io.Discard, out)
	err = cmd.Wait()
	var ee *exec.ExitError
	if hung.Load() {
		t.Fatalf("the saving server hung before step %q: %s", step, stderr.String())
	}
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the saving server was not killed at %q: %v\n%s", step, err, stderr.String())
	}
	if qemuID.PID == 0 || oldTag == "" {
		t.Fatalf("the child did not report its QEMU and first save: %q", stderr.String())
	}
	return qemuID, oldTag
}

// waitGone waits for the QEMU of a killed server to die with it (its
// parent-death signal). Its files close when its last thread has exited:
// a zombie leader may still wait for a thread in a write.
func waitGone(t *testing.T, qemuID proc.Identity) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		live, _, err := proc.Check(qemuID)
		if err == nil && (live == proc.Gone || live == proc.Reused || live == proc.Zombie && threads(qemuID.PID) <= 1) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU %d outlived its killed server", qemuID.PID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkReapedAfterKill reaps what a save killed at step left, as the next
// server does: the name then holds one snapshot whole, the old one
// (oldTag) if the kill came before the record switched.
func checkReapedAfterKill(t *testing.T, st Store, disk, step, oldTag string) {
	t.Helper()
	rep, err := st.Reap()
	if err != nil || len(rep.Errors) > 0 || len(rep.Left) > 0 || len(rep.Broken) > 0 {
		t.Fatalf("reap after a kill at %q: %+v %v", step, rep, err)
	}
	list, _ := st.List("/proj")
	if len(list) != 1 {
		t.Fatalf("after a kill at %q: %d snapshots named a", step, len(list))
	}
	want := oldTag
	switch k := slices.Index(saveSteps, step); {
	case k < 0: // a delayed kill: either, whole
		want = list[0].Tag
	case k >= slices.Index(saveSteps, "committed"):
		want = list[0].Tag
		if want == oldTag {
			t.Errorf("killed at %q, after the record switched: the name still holds the old snapshot", step)
		}
	}
	assertWhole(t, st, "/proj", disk, want)
	// The drive QEMU was writing is consistent (clusters a killed save
	// allocated may leak: harmless).
	if out, err := exec.Command("qemu-img", "check", disk).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Errorf("qemu-img check of the drive after a kill at %q: %v\n%s", step, err, out)
		}
	}
	var what []string
	for _, l := range rep.Removed {
		what = append(what, l.What)
	}
	t.Logf("killed at %q: reaped %v", step, what)
	if rep, _ := st.Reap(); len(rep.Removed) > 0 {
		t.Errorf("a second reap removed %+v", rep.Removed)
	}
}
