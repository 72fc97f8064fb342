package instance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/qcow2test"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testfs"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

const tinyPrompt = `tiny> $`

func tinySpec(t *testing.T, name, root string, opts ...qemu.Option) Spec {
	t.Helper()
	opts = append([]qemu.Option{qemu.WithBinary(testguest.QEMU(t)), qemu.WithKernel(testguest.Tiny(t))}, opts...)
	return Spec{Name: name, Root: root, QEMU: qemu.NewConfig(opts...)}
}

// rawDisk makes a 1 MiB raw disk image in dir.
func rawDisk(t *testing.T, dir string) string {
	t.Helper()
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return img
}

// The snapshot calls of the tests, in one place: the store is the
// manager's (Manager.Snapshots).
func snapshots(m *Manager) snapshot.Store { return m.Snapshots().Store() }

func saveSnapshot(ctx context.Context, i *Instance, name string) (snapshot.Meta, error) {
	return i.SaveSnapshot(ctx, name)
}

func restoreSnapshot(ctx context.Context, i *Instance, meta snapshot.Meta) (Restored, error) {
	return (&restoring{i: i, store: i.mgr.Snapshots().Store(), meta: meta}).restore(ctx)
}

func checkSnapshot(_ context.Context, i *Instance, meta snapshot.Meta) error {
	return (&restoring{i: i, meta: meta}).checkMachine()
}

func checkLoad(_ context.Context, i *Instance, meta snapshot.Meta) error {
	return (&restoring{i: i, meta: meta}).checkParts()
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// expect waits for re on i's console from *since on, and moves since past
// the match.
func expect(t *testing.T, ctx context.Context, i *Instance, since *int64, re string) serial.Result {
	t.Helper()
	res, ev, err := i.Wait(ctx, *since, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile(re)}, Timeout: 10 * time.Second})
	if err != nil || !res.Matched {
		t.Fatalf("guest %q: waiting for %q: %v (event %v); got %q", i.Name(), re, err, ev, res.Output)
	}
	*since = res.Cursor
	return res
}

// startTest is what a test of guests starts from: its context, a manager,
// and a project root.
func startTest(t *testing.T, lockFile string, opts ...func(*Config)) (context.Context, *Manager, string) {
	t.Helper()
	return testContext(t), newManager(t, lockFile, opts...), t.TempDir()
}

// bootAtPrompt boots spec and waits for the tiny kernel's prompt; since
// is the console's cursor past it.
func bootAtPrompt(t *testing.T, ctx context.Context, m *Manager, spec Spec) (i *Instance, since int64) {
	t.Helper()
	i, _, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ctx, i, &since, tinyPrompt)
	return i, since
}

// save saves i's guest as the snapshot name, which the test needs.
func save(t *testing.T, ctx context.Context, i *Instance, name string) snapshot.Meta {
	t.Helper()
	meta, err := saveSnapshot(ctx, i, name)
	if err != nil {
		t.Fatal(err)
	}
	return meta
}

// stop stops i's guest, which the test needs.
func stop(t *testing.T, ctx context.Context, i *Instance) {
	t.Helper()
	if _, err := i.Stop(ctx, qemu.Quit, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// unwound checks that m's guests left nothing behind: nothing in its
// runtime directory, no instance in its record and, with a lockFile, no
// repository lock. when says when, for the messages.
func unwound(t *testing.T, m *Manager, lockFile, when string) {
	t.Helper()
	if left := runtimeLeft(t, m); len(left) > 0 {
		t.Errorf("left in the runtime directory %s: %v", when, left)
	}
	if len(m.Record().Instances) != 0 {
		t.Errorf("the record %s: %+v", when, m.Record().Instances)
	}
	if lockFile == "" {
		return
	}
	if st, _ := lock.Inspect(lockFile); st.State != lock.Absent {
		t.Errorf("the repository lock %s: %v", when, st)
	}
}

func typeLine(t *testing.T, ctx context.Context, i *Instance, line string) {
	t.Helper()
	if _, err := i.Console().Write(ctx, []byte(line+"\r")); err != nil {
		t.Fatalf("type %q: %v", line, err)
	}
}

// An instance boots the tiny kernel and answers on its console; while it
// runs it holds the repository lock, its writable drive and its record,
// and a second boot of the name or of the drive is refused; stopped, it
// leaves nothing behind but its transcript, and the drive is free again.
// A guest that powers itself off unwinds by itself, and its name boots
// again as soon as its exit is seen.
func TestBootEchoStop(t *testing.T) {
	t.Parallel()
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	ctx, m, root := startTest(t, lockFile)
	img := rawDisk(t, root)
	drive := qemu.WithDrive(qemu.Drive{Path: img})

	i, _, err := m.Boot(ctx, tinySpec(t, "a", root, drive))
	if err != nil {
		t.Fatal(err)
	}
	if i.State() != Running || i.Boot() != 1 {
		t.Errorf("after the boot: %s, boot %d", i.State(), i.Boot())
	}
	var since int64
	expect(t, ctx, i, &since, tinyPrompt)
	typeLine(t, ctx, i, "echo hello from a")
	expect(t, ctx, i, &since, `hello from a\r\n`+tinyPrompt)

	rec := m.Record()
	if len(rec.Instances) != 1 || rec.Instances[0].Name != "a" || rec.Instances[0].QEMU == nil || rec.Instances[0].QEMU.PID != i.Process().PID() || rec.Instances[0].Lock != lockFile {
		t.Errorf("the record while a runs: %+v", rec.Instances)
	}
	if len(runtimeLeft(t, m)) == 0 {
		t.Errorf("nothing in the runtime directory while a runs")
	}
	if st, _ := lock.Inspect(lockFile); !st.Refuses() || !slices.Equal(st.Record.Instances, []string{"a"}) {
		t.Errorf("the repository lock while a runs: %v", st)
	}
	if _, _, err := m.Boot(ctx, tinySpec(t, "a", root)); err == nil || !strings.Contains(err.Error(), `guest "a" is already running (qemu pid`) {
		t.Errorf("a second boot of a: %v", err)
	}
	if _, _, err := m.Boot(ctx, tinySpec(t, "b", root, drive)); err == nil || !strings.Contains(err.Error(), `is in use (writable) by the running instance "a"`) {
		t.Errorf("b on a's writable drive: %v", err)
	}
	if got, _ := m.Get("b"); got == nil || got.State() != Stopped {
		t.Errorf("the refused b: %v", got)
	}
	// b held the lock for an instant: the lock's record names a alone.
	if st, _ := lock.Inspect(lockFile); !slices.Equal(st.Record.Instances, []string{"a"}) {
		t.Errorf("the repository lock after b was refused: %v", st.Record.Instances)
	}

	end, err := i.Stop(ctx, qemu.Quit, 5*time.Second)
	if err != nil || end.How != "quit" {
		t.Errorf("stop: %+v %v", end, err)
	}
	if i.State() != Stopped {
		t.Errorf("after the stop: %s", i.State())
	}
	if _, err := i.Running(); err == nil || !strings.Contains(err.Error(), `guest "a"`) {
		t.Errorf("Running after the stop: %v", err)
	}
	unwound(t, m, lockFile, "after the stop")
	if b, err := os.ReadFile(i.Transcript()); err != nil || !strings.Contains(string(b), "hello from a") {
		t.Errorf("transcript %s: %v %q", i.Transcript(), err, b)
	}

	// The drive is free: b boots on it, and powers itself off; its
	// instance unwinds by itself.
	b, _, err := m.Boot(ctx, tinySpec(t, "b", root, drive))
	if err != nil {
		t.Fatalf("b after a stopped: %v", err)
	}
	since = 0
	expect(t, ctx, b, &since, tinyPrompt)
	typeLine(t, ctx, b, "poweroff")
	res, ev, err := b.Wait(ctx, since, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 10 * time.Second})
	if err != nil || !res.Stopped && !res.Finished || ev == nil {
		t.Errorf("a wait across the poweroff: %+v, %+v, %v", res, ev, err)
	}
	// Booted again as soon as its exit was seen: the name and the drive
	// are free, not busy, once the old instance has unwound.
	again, _, err := m.Boot(ctx, tinySpec(t, "b", root, drive))
	if err != nil || again.Boot() != b.Boot()+1 {
		t.Fatalf("b booted again right after its poweroff: %v", err)
	}
	select {
	case <-b.Done():
	default:
		t.Fatal("b's second boot ran before its first had unwound")
	}
	if in := b.Info(); in.State != Stopped || in.Exit == nil || in.Exit.Code != 0 {
		t.Errorf("b after its poweroff: %+v", in)
	}
	if _, err := b.Running(); !errors.Is(err, ErrExited) {
		t.Errorf("Running after the poweroff: %v", err)
	}
	stop(t, ctx, again)
	unwound(t, m, lockFile, "after the poweroff")
}

// A guest's cleanup stack holds the boot's steps in the order they were
// made, so that the teardown (newest first) detaches the debugger before
// QEMU stops, stops QEMU before its console goes, and releases the drives
// and the repository lock only once QEMU is gone.
func TestCleanupStackOrder(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "")
	img := rawDisk(t, root)
	spec := tinySpec(t, "a", root, qemu.WithDrive(qemu.Drive{Path: img}))
	spec.Debug = &DebugSpec{}
	i, _, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	i.undo.mu.Lock()
	var steps []string
	for _, c := range i.undo.items {
		steps = append(steps, c.what)
	}
	i.undo.mu.Unlock()
	want := []string{"repository lock", "drive claims", "console", "qemu", "debugger"}
	at := -1
	for _, w := range want {
		k := slices.Index(steps, w)
		if k <= at {
			t.Fatalf("cleanup stack %q: want %q in this order", steps, want)
		}
		at = k
	}
	stop(t, ctx, i)
	i.mu.Lock()
	left := i.undo.len()
	i.mu.Unlock()
	if left != 0 {
		t.Errorf("%d cleanups left after the stop", left)
	}
}

// Two guests of one machine save the same name at once: one after the
// other, the last one's snapshot is the name's, and no image is left that
// no record names.
func TestConcurrentSavesOfAName(t *testing.T) {
	t.Parallel()
	testguest.QEMUImg(t)
	ctx, m, root := startTest(t, "")
	var guests []*Instance
	for _, n := range []string{"a", "b"} {
		i, _ := bootAtPrompt(t, ctx, m, tinySpec(t, n, root))
		guests = append(guests, i)
	}
	var mu sync.Mutex
	var last snapshot.Meta
	for range 2 {
		var wg sync.WaitGroup
		for _, i := range guests {
			wg.Go(func() {
				meta, err := saveSnapshot(ctx, i, "s")
				if err != nil {
					t.Errorf("save from %s: %v", i.Name(), err)
					return
				}
				mu.Lock()
				if meta.Created.After(last.Created) {
					last = meta
				}
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	list, err := snapshots(m).List(root)
	if err != nil || len(list) != 1 || list[0].ID != last.ID {
		t.Fatalf("after the saves: %+v %v; the last save was %s", list, err, last.ID)
	}
	images, _ := filepath.Glob(filepath.Join(filepath.Dir(list[0].Path), "*.qcow2"))
	if len(images) != 1 || images[0] != list[0].Path {
		t.Errorf("images in the store: %v, want %s alone", images, list[0].Path)
	}
}

// A boot from a snapshot whose machine state is damaged inside its image
// (every part there, so the checks pass) fails once QEMU runs, and unwinds
// all the same: the staged copy, QEMU, the console, the lock and the
// record are gone.
func TestBootFromDamagedSnapshot(t *testing.T) {
	t.Parallel()
	testguest.QEMUImg(t)
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	ctx, m, root := startTest(t, lockFile)
	a, _ := bootAtPrompt(t, ctx, m, tinySpec(t, "a", root))
	meta := save(t, ctx, a, "bad")
	stop(t, ctx, a)
	qcow2test.DamageState(t, meta.Path)
	if err := snapshot.Verify(meta); err != nil {
		t.Fatalf("the damage shows before the load: %v", err)
	}
	spec := tinySpec(t, "b", root)
	spec.Snapshot = &SnapshotSpec{Name: meta.Name}
	if _, _, err := m.Boot(ctx, spec); err == nil || !strings.HasPrefix(err.Error(), "boot: ") {
		t.Fatalf("boot from the damaged snapshot: %v", err)
	} else {
		t.Logf("boot: %v", err)
	}
	b, _ := m.Get("b")
	if b == nil || b.State() != Stopped {
		t.Fatalf("b after its failed boot: %v", b)
	}
	unwound(t, m, lockFile, "after a failed boot from a snapshot")
}

// A restore whose new QEMU could not start (the binary or a drive went
// away under the server) is refused while the running guest can stay: it
// runs on as it was. If the new QEMU fails all the same, the instance
// stops, says so, and leaves nothing behind.
func TestRestoreFailsToStart(t *testing.T) {
	t.Parallel()
	testguest.QEMUImg(t)
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	ctx, m, root := startTest(t, lockFile)
	bin := filepath.Join(t.TempDir(), "qemu-system-riscv64")
	if err := os.Symlink(testguest.QEMU(t), bin); err != nil {
		t.Fatal(err)
	}
	img := rawDisk(t, root)
	spec := tinySpec(t, "a", root, qemu.WithDrive(qemu.Drive{Path: img, ReadOnly: true}))
	spec.QEMU.Binary = bin
	i, since := bootAtPrompt(t, ctx, m, spec)
	meta := save(t, ctx, i, "s")
	pid := i.Process().PID()
	for _, gone := range []string{bin, img} {
		os.Rename(gone, gone+".away")
		_, err := restoreSnapshot(ctx, i, meta)
		if err == nil || !strings.Contains(err.Error(), `restore snapshot "s": `) || !strings.Contains(err.Error(), gone) || !strings.HasSuffix(err.Error(), "the guest was left as it was") {
			t.Errorf("a restore without %s: %v", gone, err)
		}
		if i.State() != Running || i.Process().PID() != pid {
			t.Fatalf("the guest after a refused restore: %s, pid %d (was %d)", i.State(), i.Process().PID(), pid)
		}
		os.Rename(gone+".away", gone)
	}
	typeLine(t, ctx, i, "echo still here")
	expect(t, ctx, i, &since, "still here\r\n"+tinyPrompt)

	// The new QEMU fails to start after all: here it cannot take its
	// gdbstub's socket path, which the test holds as a directory.
	os.Mkdir(i.vm.runtime(true).GDBSocket, 0o700)
	_, err := restoreSnapshot(ctx, i, meta)
	os.Remove(i.vm.runtime(true).GDBSocket)
	if err == nil || !strings.Contains(err.Error(), `restore snapshot "s"`) || !strings.Contains(err.Error(), "the guest is stopped") {
		t.Fatalf("a restore whose QEMU cannot start: %v", err)
	}
	t.Logf("restore: %v", err)
	select {
	case <-i.Done():
	case <-ctx.Done():
		t.Fatal("the instance did not unwind")
	}
	if end, _ := i.result(); i.State() != Stopped || end.How != "restore failed" {
		t.Errorf("after the failed restore: %s, %+v", i.State(), end)
	}
	unwound(t, m, lockFile, "after a failed restore")
	if err := snapshot.Verify(meta); err != nil {
		t.Errorf("the snapshot after a failed restore: %v", err)
	}
}

// A restore or a boot from a snapshot whose copy does not fit where QEMU
// loads it from (a full runtime directory) is refused with what to free,
// and a running guest is left as it was.
func TestSnapshotWithFullRuntimeDir(t *testing.T) {
	t.Parallel()
	testguest.QEMUImg(t)
	ctx := testContext(t)
	run := testfs.Tmpfs(t, 32<<20)
	os.Chmod(run, 0o700)
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	m := newManager(t, lockFile, func(c *Config) { c.RuntimeDir, c.Captures = run, t.TempDir() })
	root := t.TempDir()
	i, since := bootAtPrompt(t, ctx, m, tinySpec(t, "a", root))
	meta := save(t, ctx, i, "s")
	free := testfs.Fill(t, run, meta.ImageSize/2)
	pid := i.Process().PID()
	_, err := restoreSnapshot(ctx, i, meta)
	t.Logf("restore: %v", err)
	if err == nil || !strings.Contains(err.Error(), `stage snapshot "s"`) || !strings.HasSuffix(err.Error(), "the guest was left as it was") {
		t.Errorf("a restore into a full runtime directory: %v", err)
	}
	if i.State() != Running || i.Process().PID() != pid {
		t.Fatalf("the guest after the refused restore: %s", i.State())
	}
	typeLine(t, ctx, i, "echo still here")
	expect(t, ctx, i, &since, "still here\r\n"+tinyPrompt)
	spec := tinySpec(t, "b", root)
	spec.Snapshot = &SnapshotSpec{Name: meta.Name}
	if _, _, err := m.Boot(ctx, spec); err == nil || !strings.Contains(err.Error(), `stage snapshot "s"`) {
		t.Errorf("a boot from the snapshot into a full runtime directory: %v", err)
	}
	free()
	stop(t, ctx, i)
	unwound(t, m, lockFile, "after the refused restore and boot")
}

// A stop that comes while an instance boots ends the boot at once, and
// what the boot had made is undone; a restart stops the running guest and
// boots the name again.
func TestStopWhileBootingAndRestart(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "")
	type booted struct {
		i   *Instance
		err error
	}
	done := make(chan booted, 1)
	spec := tinySpec(t, "a", root)
	go func() {
		i, _, err := m.Boot(ctx, spec)
		done <- booted{i, err}
	}()
	var i *Instance
	for i == nil {
		select {
		case b := <-done:
			done <- b // it booted before the stop: the stop stops it
			if b.err != nil {
				t.Fatalf("boot: %v", b.err)
			}
		case <-time.After(time.Millisecond):
		}
		i, _ = m.Get("a")
	}
	end, err := i.Stop(ctx, qemu.Quit, 5*time.Second)
	if err != nil {
		t.Errorf("stop while booting: %v", err)
	}
	b := <-done
	t.Logf("stopped while booting: boot returned %v; ending %+v", b.err, end)
	if b.err != nil && !errors.Is(b.err, ErrStopped) {
		t.Errorf("the boot a stop ended: %v, want ErrStopped", b.err)
	}
	if i.State() != Stopped {
		t.Errorf("after the stop: %s", i.State())
	}
	unwound(t, m, "", "after a stop while booting")

	first, _, err := m.Boot(ctx, tinySpec(t, "a", root))
	if err != nil {
		t.Fatal(err)
	}
	pid := first.Process().PID()
	spec = tinySpec(t, "a", root)
	spec.Restart = true
	second, _, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if first.State() != Stopped || second.Process().PID() == pid || second.Boot() != first.Boot()+1 {
		t.Errorf("restart: first %s, pids %d -> %d, boots %d -> %d", first.State(), pid, second.Process().PID(), first.Boot(), second.Boot())
	}
	var since int64
	expect(t, ctx, second, &since, tinyPrompt)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if second.State() != Stopped {
		t.Errorf("after the manager closed: %s", second.State())
	}
	if _, _, err := m.Boot(ctx, tinySpec(t, "c", root)); !errors.Is(err, ErrClosed) {
		t.Errorf("a boot after close: %v", err)
	}
	unwound(t, m, "", "after close")
}

// A console wait ends early when the guest resets, with the event that
// ended it, and the instance keeps the event for its status; the wait
// after it waits on.
func TestWaitEndsOnReset(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "")
	i, since := bootAtPrompt(t, ctx, m, tinySpec(t, "a", root))
	go func() {
		time.Sleep(200 * time.Millisecond)
		if _, err := i.Process().Monitor().Execute(ctx, "system_reset", nil); err != nil {
			t.Errorf("system_reset: %v", err)
		}
	}()
	t0 := time.Now()
	res, ev, err := i.Wait(ctx, since, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 20 * time.Second})
	if err != nil || res.Matched || ev == nil || ev.Event != "RESET" || time.Since(t0) > 10*time.Second {
		t.Fatalf("a wait across a reset: %+v, %+v, %v after %s", res, ev, err, time.Since(t0))
	}
	if evs, total := i.Events(10); total == 0 || evs[len(evs)-1].Event != "RESET" {
		t.Errorf("the instance's events: %+v (%d)", evs, total)
	}
	// The guest boots again; a wait for its prompt is not ended by the
	// reset that came before it.
	expect(t, ctx, i, &since, `qemu-mcp tiny kernel[^\n]*\n(.*\n)*`+tinyPrompt)
}

// A server runs at most MaxInstances guests: one more is refused with the
// ones that run, and boots once one stopped. A stop ends a console wait in
// progress at once, and concurrent stops report the same end.
func TestLimitsAndStops(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "", func(c *Config) { c.MaxInstances = 1 })
	a, _, err := m.Boot(ctx, tinySpec(t, "a", root))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Boot(ctx, tinySpec(t, "b", root)); err == nil || !strings.Contains(err.Error(), "1 guests already run (a), the most this server allows") {
		t.Errorf("a second guest beyond the limit: %v", err)
	}
	var since int64
	expect(t, ctx, a, &since, tinyPrompt)
	type waited struct {
		err  error
		took time.Duration
	}
	wch := make(chan waited, 1)
	go func() {
		t0 := time.Now()
		_, _, err := a.Wait(ctx, since, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 30 * time.Second})
		wch <- waited{err, time.Since(t0)}
	}()
	time.Sleep(100 * time.Millisecond) // the wait is under way
	ends := make(chan qemu.Ending, 2)
	for range 2 {
		go func() {
			end, err := a.Stop(ctx, qemu.Quit, 5*time.Second)
			if err != nil {
				t.Errorf("stop: %v", err)
			}
			ends <- end
		}()
	}
	w := <-wch
	if !errors.Is(w.err, ErrStopped) || w.took > 10*time.Second {
		t.Errorf("a wait the stop ended: %v after %s", w.err, w.took)
	}
	if e1, e2 := <-ends, <-ends; e1.How != e2.How || e1.How != "quit" {
		t.Errorf("two stops at once: %+v and %+v", e1, e2)
	}
	b, _, err := m.Boot(ctx, tinySpec(t, "b", root))
	if err != nil {
		t.Fatalf("b once a stopped: %v", err)
	}
	since = 0
	expect(t, ctx, b, &since, tinyPrompt)
}

// A restart that would be refused (a drive another guest writes, a
// snapshot whose image is gone) is refused before the running guest is
// stopped: it runs on as it was.
func TestRestartRefusedLeavesGuest(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "")
	img := rawDisk(t, root)
	a, _, err := m.Boot(ctx, tinySpec(t, "a", root))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Boot(ctx, tinySpec(t, "b", root, qemu.WithDrive(qemu.Drive{Path: img}))); err != nil {
		t.Fatal(err)
	}
	pid := a.Process().PID()
	spec := tinySpec(t, "a", root, qemu.WithDrive(qemu.Drive{Path: img}))
	spec.Restart = true
	if _, _, err := m.Boot(ctx, spec); err == nil || !strings.Contains(err.Error(), `in use (writable) by the running instance "b"`) {
		t.Errorf("restart onto b's drive: %v", err)
	}
	spec = tinySpec(t, "a", root)
	spec.Restart = true
	spec.Snapshot = &SnapshotSpec{Name: "gone", meta: snapshot.Meta{Name: "gone", Path: filepath.Join(root, "gone.qcow2")}}
	if _, _, err := m.Boot(ctx, spec); err == nil || !strings.Contains(err.Error(), `stage snapshot "gone"`) {
		t.Errorf("restart from a snapshot whose image is gone: %v", err)
	}
	if got, _ := m.Get("a"); got != a || a.State() != Running || a.Process().PID() != pid {
		t.Fatalf("a after refused restarts: %v %s", got, a.State())
	}
	var since int64
	expect(t, ctx, a, &since, tinyPrompt)
	typeLine(t, ctx, a, "echo a runs on")
	expect(t, ctx, a, &since, "a runs on\r\n"+tinyPrompt)
}

// An instance saves its guest into the store, refuses a snapshot of
// another machine with what differs, restores its own (the console goes
// on after a marker line, and the restored guest answers), and boots a
// new instance straight into it.
func TestSnapshotSaveRestore(t *testing.T) {
	t.Parallel()
	testguest.QEMUImg(t)
	ctx, m, root := startTest(t, "")
	i, since := bootAtPrompt(t, ctx, m, tinySpec(t, "a", root))
	// Half a line typed: it is in the guest's RAM, and in the snapshot.
	if _, err := i.Console().Write(ctx, []byte("echo sav")); err != nil {
		t.Fatal(err)
	}
	expect(t, ctx, i, &since, "echo sav$")
	meta := save(t, ctx, i, "s")
	if err := snapshot.Verify(meta); err != nil || meta.Name != "s" || meta.QEMU == "" {
		t.Fatalf("saved %+v: %v", meta, err)
	}
	if err := checkLoad(ctx, i, meta); err != nil {
		t.Errorf("check its own snapshot: %v", err)
	}
	other := meta
	other.Machine.Memory = "256M"
	if err := checkSnapshot(ctx, i, other); err == nil || !strings.Contains(err.Error(), "memory: saved 256M, now 128M") {
		t.Errorf("a snapshot of another machine: %v", err)
	}
	older := meta
	older.QEMU = "1.0.0"
	if err := checkSnapshot(ctx, i, older); err == nil || !strings.Contains(err.Error(), "saved by QEMU 1.0.0") {
		t.Errorf("a snapshot of another QEMU: %v", err)
	}

	typeLine(t, ctx, i, "x")
	expect(t, ctx, i, &since, "savx\r\n"+tinyPrompt)
	oldPID := i.Process().PID()
	res, err := restoreSnapshot(ctx, i, meta)
	if err != nil {
		t.Fatal(err)
	}
	if i.Process().PID() == oldPID || i.State() != Running {
		t.Errorf("after the restore: pid %d (was %d), %s", i.Process().PID(), oldPID, i.State())
	}
	out := expect(t, ctx, i, &since, `\[qemu-mcp: restored snapshot "s" \(saved [^)]+\)\]\r\n`)
	if out.Cursor != res.Cursor {
		t.Errorf("the restore's cursor %d, the marker ends at %d", res.Cursor, out.Cursor)
	}
	typeLine(t, ctx, i, "ed")
	expect(t, ctx, i, &since, "\r\nsaved\r\n"+tinyPrompt)

	// Snapshots that cannot load are refused before the guest is
	// touched, with what is wrong: one whose image is gone, one whose
	// record is damaged.
	broken := save(t, ctx, i, "broken")
	damaged := save(t, ctx, i, "damaged")
	os.Remove(broken.Path)
	os.WriteFile(filepath.Join(filepath.Dir(damaged.Path), "damaged.json"), []byte("{"), 0o600)
	found, err := snapshots(m).Find(root, "damaged")
	if err != nil || len(found) != 1 {
		t.Fatalf("find the damaged snapshot: %+v %v", found, err)
	}
	pid := i.Process().PID()
	for _, tc := range []struct {
		meta snapshot.Meta
		want string
	}{
		{broken, `snapshot "broken" is incomplete: its image ` + broken.Path + ` is missing`},
		{found[0], `snapshot "damaged" is incomplete: its record is unreadable`},
	} {
		if _, err := restoreSnapshot(ctx, i, tc.meta); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the guest was left as it was") {
			t.Errorf("restore %s: %v, want it to say %q", tc.meta.Name, err, tc.want)
		}
	}
	if i.Process().PID() != pid || i.State() != Running {
		t.Errorf("refused restores touched the guest: pid %d -> %d, %s", pid, i.Process().PID(), i.State())
	}
	typeLine(t, ctx, i, "echo still here")
	expect(t, ctx, i, &since, "still here\r\n"+tinyPrompt)

	// A new instance boots into it.
	spec := tinySpec(t, "b", root)
	spec.Snapshot = &SnapshotSpec{Name: meta.Name}
	b, _, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var bs int64
	expect(t, ctx, b, &bs, `\[qemu-mcp: booted from snapshot "s"`)
	typeLine(t, ctx, b, "!")
	expect(t, ctx, b, &bs, "sav!\r\n"+tinyPrompt)
	for _, x := range []*Instance{i, b} {
		if _, err := x.Stop(ctx, qemu.Quit, 5*time.Second); err != nil {
			t.Errorf("stop %s: %v", x.Name(), err)
		}
	}
	unwound(t, m, "", "after the restores")
}

// A command's waits begin after it was typed: a reset that comes before
// one of them began, but after the command was typed, still ends it at
// once and is reported, where a plain wait begun after it is not ended by
// it.
func TestWaitSinceEventBefore(t *testing.T) {
	t.Parallel()
	ctx, m, root := startTest(t, "")
	i, since := bootAtPrompt(t, ctx, m, tinySpec(t, "a", root))
	typed := time.Now().Truncate(time.Microsecond)
	if _, err := i.Process().Monitor().Execute(ctx, "system_reset", nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i.events.since(typed) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the reset was not recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	never := serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 500 * time.Millisecond}
	if _, ev, err := i.Wait(ctx, since, never); err != nil || ev != nil {
		t.Errorf("a wait begun after the reset: event %+v, %v", ev, err)
	}
	never.Timeout = 20 * time.Second
	t0 := time.Now()
	res, ev, err := i.waitSince(ctx, since, never, typed, false)
	if err != nil || res.Matched || ev == nil || ev.Event != "RESET" || time.Since(t0) > 5*time.Second {
		t.Fatalf("a command's wait after its reset: matched %v, timed out %v, event %+v, %v after %s", res.Matched, res.TimedOut, ev, err, time.Since(t0))
	}
}
