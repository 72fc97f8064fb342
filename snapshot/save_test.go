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
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
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
	m    *qemu.Machine
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
	old, err := st.Save(ctx, g.m.Monitor(), root, mach, "a", "test", nil)
	if err != nil {
		fail(err)
	}
	fmt.Printf("old %s\n", old.Tag)
	armed = true
	if _, err := st.Save(ctx, g.m.Monitor(), root, mach, "a", "test", nil); err != nil {
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

// shortDir is a private directory for sockets, whose paths a unix socket
// bounds.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "snap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
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
	if got := files(t, filepath.Dir(m.Path)); !slices.Equal(got, want) {
		t.Errorf("store directory: %v, want %v", got, want)
	}
	if got := tags(t, disk); !slices.Equal(got, []string{tag}) {
		t.Errorf("the drive's tags: %v, want [%s]", got, tag)
	}
	return m
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
	dir := shortDir(t)
	disk := newDisk(t, dir)
	g, err := startTiny(ctx, bin, dir, disk)
	if err != nil {
		t.Fatal(err)
	}
	defer g.m.Close()
	mon := g.m.Monitor()
	mach, err := Describe(g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var hook func(step, id string)
	st := Store{Dir: filepath.Join(dir, "store"), Logger: slog.New(stepHook{f: func(s, id string) {
		if hook != nil {
			hook(s, id)
		}
	}})}
	var steps []string
	hook = func(s, _ string) { steps = append(steps, s) }
	first, err := st.Save(ctx, mon, "/proj", mach, "a", "7.2.0", map[string]string{"drive0": disk})
	if err != nil {
		t.Fatal(err)
	}
	// The first save has nothing to replace.
	if want := []string{"intent", "image", "saved", "synced", "committed", "done"}; !slices.Equal(steps, want) {
		t.Errorf("steps of a first save: %v, want %v", steps, want)
	}
	if first.QEMU != "7.2.0" || !slices.Equal(first.Drives, []string{disk}) || first.Mtime == 0 || first.Size == 0 || first.ImageSize == 0 {
		t.Errorf("record: %+v", first)
	}
	assertWhole(t, st, "/proj", disk, first.Tag)
	if running, err := mon.Running(ctx); err != nil || !running {
		t.Errorf("the guest after the save: running %v, %v", running, err)
	}

	steps = nil
	second, err := st.Save(ctx, mon, "/proj", mach, "a", "7.2.0", map[string]string{"drive0": disk})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(steps, saveSteps) {
		t.Errorf("steps of a save that replaces: %v, want %v", steps, saveSteps)
	}
	if second.Tag == first.Tag || second.Image == first.Image {
		t.Fatalf("the second save reused the first's parts: %+v", second)
	}
	assertWhole(t, st, "/proj", disk, second.Tag)

	// A save that fails after writing the drive's tag: the record cannot
	// be written (its temporary file is taken).
	var blocker string
	hook = func(s, id string) {
		if s == "synced" {
			blocker = filepath.Join(filepath.Dir(second.Path), recordTempName("a", id))
			writeFile(t, blocker, "")
		}
	}
	_, err = st.Save(ctx, mon, "/proj", mach, "a", "7.2.0", nil)
	if err == nil || !strings.Contains(err.Error(), `save snapshot "a": record: `) || !strings.HasSuffix(err.Error(), `; the snapshot "a" saved before is unchanged`) {
		t.Fatalf("a save whose record cannot be written: %v", err)
	}
	assertWhole(t, st, "/proj", disk, second.Tag, filepath.Base(blocker))
	os.Remove(blocker)

	// A cancelled save: undone, and the guest runs on.
	sctx, scancel := context.WithCancel(ctx)
	hook = func(s, _ string) {
		if s == "image" {
			scancel()
		}
	}
	if _, err := st.Save(sctx, mon, "/proj", mach, "a", "7.2.0", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled save: %v", err)
	}
	hook = nil
	assertWhole(t, st, "/proj", disk, second.Tag)
	if running, err := mon.Running(ctx); err != nil || !running {
		t.Errorf("the guest after a cancelled save: running %v, %v", running, err)
	}
	raw, err := mon.Execute(ctx, "query-named-block-nodes", nil)
	if err != nil || strings.Contains(string(raw), saveNode) || strings.Contains(string(raw), saveFileNode) {
		t.Errorf("the save's nodes after it was cancelled: %v %s", err, raw)
	}
	if rep, err := st.Leftovers(); err != nil || len(rep.Removed)+len(rep.Left)+len(rep.Errors)+len(rep.Broken) > 0 {
		t.Errorf("leftovers of saves that failed: %+v %v", rep, err)
	}

	if _, err := st.Save(ctx, mon, "/proj", mach, "bad name", "7.2.0", nil); err == nil || !strings.Contains(err.Error(), "1 to 64 letters") {
		t.Errorf("a bad name: %v", err)
	}
	assertWhole(t, st, "/proj", disk, second.Tag)

	// A guest that was paused stays paused.
	if _, err := mon.Execute(ctx, "stop", nil); err != nil {
		t.Fatal(err)
	}
	third, err := st.Save(ctx, mon, "/proj", mach, "a", "7.2.0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if running, err := mon.Running(ctx); err != nil || running {
		t.Errorf("a paused guest after the save: running %v, %v", running, err)
	}
	assertWhole(t, st, "/proj", disk, third.Tag)
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
			dir := shortDir(t)
			disk := newDisk(t, dir)
			st := Store{Dir: filepath.Join(dir, "store")}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{step, st.Dir, "/proj", disk, bin, dir}, "|"))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// A child that hangs is killed (the process this test
			// started), and the test says so.
			var hung atomic.Bool
			guard := time.AfterFunc(60*time.Second, func() {
				hung.Store(true)
				cmd.Process.Kill()
			})
			defer guard.Stop()
			var qemuID proc.Identity
			var oldTag string
			var mu sync.Mutex
			read := make(chan struct{})
			go func() {
				defer close(read)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					f := strings.Fields(sc.Text())
					mu.Lock()
					switch {
					case len(f) == 3 && f[0] == "qemu":
						qemuID.PID, _ = strconv.Atoi(f[1])
						qemuID.StartTime, _ = strconv.ParseUint(f[2], 10, 64)
					case len(f) == 2 && f[0] == "old":
						oldTag = f[1]
					}
					mu.Unlock()
				}
				io.Copy(io.Discard, out)
			}()
			<-read
			err = cmd.Wait()
			var ee *exec.ExitError
			if hung.Load() {
				t.Fatalf("the saving server hung before step %q: %s", step, stderr.String())
			}
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the saving server was not killed at %q: %v\n%s", step, err, stderr.String())
			}
			mu.Lock()
			defer mu.Unlock()
			if qemuID.PID == 0 || oldTag == "" {
				t.Fatalf("the child did not report its QEMU and first save: %q", stderr.String())
			}
			// QEMU dies with its server (its parent-death signal). Its
			// files close when its last thread has exited: a zombie
			// leader may still wait for a thread in a write.
			deadline := time.Now().Add(10 * time.Second)
			for {
				live, _, err := proc.Check(qemuID)
				if err == nil && (live == proc.Gone || live == proc.Reused || live == proc.Zombie && threads(qemuID.PID) <= 1) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("QEMU %d outlived its killed server", qemuID.PID)
				}
				time.Sleep(20 * time.Millisecond)
			}

			// The next server reaps what the save left.
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
			// The drive QEMU was writing is consistent (clusters a
			// killed save allocated may leak: harmless).
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
		})
	}
}
