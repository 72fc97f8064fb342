package instance

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// newManager is a server's manager in a private runtime directory of its
// own (short enough for unix sockets). lockFile, if set, is the
// repository lock every root maps to.
func newManager(t *testing.T, lockFile string, opts ...func(*Config)) *Manager {
	t.Helper()
	dir := testguest.SocketDir(t, "qmcp")
	rec, err := registry.Self("stdio", "", "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{RuntimeDir: dir, Record: rec, LockFile: lockFile, Logger: slog.New(slog.DiscardHandler),
		Snapshots: filepath.Join(t.TempDir(), "snapshots")}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("close the manager: %v", err)
		}
	})
	return m
}

// runtimeLeft lists what is in a manager's runtime directory besides the
// kept files' directory and a repository lock's guard (which package lock
// never removes, by design): after the last instance stopped, nothing.
func runtimeLeft(t *testing.T, m *Manager) []string {
	t.Helper()
	ents, err := os.ReadDir(m.cfg.RuntimeDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Name() != filepath.Base(m.cfg.Captures) && !strings.HasSuffix(e.Name(), ".lock.guard") {
			out = append(out, e.Name())
		}
	}
	return out
}

// A writable image backs one running guest at a time: a second claim of it
// (by another path to the same file too) is refused and says by whom, a
// read-only one beside a writable one too, read-only ones share, and a
// release frees it. The restart's precheck refuses the same way, before
// the running guest would be stopped.
func TestDriveClaims(t *testing.T) {
	m := newManager(t, "")
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.qcow2")
	os.WriteFile(img, nil, 0o600)
	link := filepath.Join(dir, "link.qcow2")
	if err := os.Symlink(img, link); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.img")
	os.WriteFile(other, nil, 0o600)

	releaseA, err := m.claimDrives("a", []qemu.Drive{{Path: img}, {Path: other, ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		drives []qemu.Drive
		want   string
	}{
		{"writable twice", []qemu.Drive{{Path: img}}, `drive ` + img + ` is in use (writable) by the running instance "a"`},
		{"by a symlink", []qemu.Drive{{Path: link}}, `is in use (writable) by the running instance "a"`},
		{"read-only beside writable", []qemu.Drive{{Path: img, ReadOnly: true}}, `is in use (writable)`},
		{"writable beside read-only", []qemu.Drive{{Path: other}}, `drive ` + other + ` is in use (read-only) by the running instance "a"`},
	} {
		if _, err := m.claimDrives("b", tc.drives); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.want)
		}
		if err := m.precheck(Spec{Name: "b", Root: dir, QEMU: qemu.Config{Drives: tc.drives}}, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: precheck %v", tc.name, err)
		}
	}
	// An instance's own claims never conflict (a restart of "a").
	if err := m.precheck(Spec{Name: "a", Root: dir, QEMU: qemu.Config{Drives: []qemu.Drive{{Path: img}}}}, nil); err != nil {
		t.Errorf("precheck of a's own drive: %v", err)
	}
	releaseB, err := m.claimDrives("b", []qemu.Drive{{Path: other, ReadOnly: true}})
	if err != nil {
		t.Fatalf("two read-only claims: %v", err)
	}
	if err := releaseA(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.claimDrives("c", []qemu.Drive{{Path: img}}); err != nil {
		t.Errorf("after a's release: %v", err)
	}
	if _, err := m.claimDrives("d", []qemu.Drive{{Path: other}}); err == nil || !strings.Contains(err.Error(), `by the running instance "b"`) {
		t.Errorf("b still reads other: %v", err)
	}
	releaseB()
	m.mu.Lock()
	left := len(m.drives)
	m.mu.Unlock()
	if left != 1 { // c's
		t.Errorf("%d drives claimed after releases, want c's alone", left)
	}
}

// The repository lock is taken by a root's first instance and released by
// its last: the lock file's record names the instances that hold it, and
// another server's boot is refused while any of them runs.
func TestRepositoryLockCounts(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	m := newManager(t, lockFile)
	other := newManager(t, lockFile)
	root := t.TempDir()

	instances := func() []string {
		t.Helper()
		st, err := lock.Inspect(lockFile)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == lock.Absent || st.State == lock.Free {
			return nil
		}
		return st.Record.Instances
	}
	pathA, releaseA, err := m.locks.acquire(root, "a")
	if err != nil {
		t.Fatal(err)
	}
	pathB, releaseB, err := m.locks.acquire(root, "b")
	if err != nil {
		t.Fatal(err)
	}
	if pathA != lockFile || pathB != lockFile {
		t.Fatalf("lock paths %s %s, want %s", pathA, pathB, lockFile)
	}
	if users, held := m.locks.holds(lockFile); !held || !slices.Equal(users, []string{"a", "b"}) {
		t.Errorf("holders %v %v", users, held)
	}
	if got := instances(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the lock file names %v", got)
	}
	_, _, err = other.locks.acquire(root, "x")
	var held *lock.HeldError
	if !errors.As(err, &held) || !strings.HasPrefix(err.Error(), "cannot boot: ") || !strings.Contains(err.Error(), "a, b") {
		t.Errorf("another server's boot while a and b run: %v", err)
	}
	if err := other.precheck(Spec{Name: "x", Root: root}, nil); err == nil || !strings.HasPrefix(err.Error(), "cannot boot: ") {
		t.Errorf("another server's precheck: %v", err)
	}

	if err := releaseA(); err != nil {
		t.Fatal(err)
	}
	if users, held := m.locks.holds(lockFile); !held || !slices.Equal(users, []string{"b"}) {
		t.Errorf("after a stopped: holders %v %v", users, held)
	}
	if got := instances(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after a stopped, the lock file names %v", got)
	}
	if _, _, err := other.locks.acquire(root, "x"); err == nil {
		t.Errorf("another server took the lock while b runs")
	}
	if err := releaseA(); err != nil { // a second release of a changes nothing
		t.Fatal(err)
	}
	if _, held := m.locks.holds(lockFile); !held {
		t.Errorf("a's second release let b's lock go")
	}
	if err := releaseB(); err != nil {
		t.Fatal(err)
	}
	if _, held := m.locks.holds(lockFile); held {
		t.Errorf("still held after the last instance stopped")
	}
	if st, _ := lock.Inspect(lockFile); st.Refuses() {
		t.Errorf("the lock after the last release: %v", st)
	}
	_, releaseX, err := other.locks.acquire(root, "x")
	if err != nil {
		t.Fatalf("another server after the last release: %v", err)
	}
	releaseX()
}

// The cleanup stack unwinds once, newest first, however many stop it at
// once; each failed step is reported by name and the rest still run.
func TestTeardownOrder(t *testing.T) {
	m := newManager(t, "")
	i := newInstance(m, Spec{Name: "a"}, 1)
	var mu sync.Mutex
	var ran []string
	for _, step := range []string{"lock", "drives", "console", "qemu", "debugger"} {
		i.push(step, func() error {
			mu.Lock()
			ran = append(ran, step)
			mu.Unlock()
			if step == "console" {
				return errors.New("close failed")
			}
			return nil
		})
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { i.teardown(&qemu.Ending{How: "exited"}) })
	}
	wg.Wait()
	if want := []string{"debugger", "qemu", "console", "drives", "lock"}; !slices.Equal(ran, want) {
		t.Errorf("cleanups ran %v, want %v", ran, want)
	}
	select {
	case <-i.Done():
	default:
		t.Fatal("Done is open after the teardown")
	}
	end, err := i.result()
	if i.State() != Stopped || end.How != "exited" || err == nil || err.Error() != "console: close failed" {
		t.Errorf("after the teardown: %s, %+v, %v", i.State(), end, err)
	}
	// A stop afterwards reports the same end, and runs nothing again.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if end, err := i.Stop(ctx, qemu.Quit, time.Second); end.How != "exited" || err == nil {
		t.Errorf("stop of a stopped instance: %+v %v", end, err)
	}
	if len(ran) != 5 {
		t.Errorf("cleanups ran again: %v", ran)
	}
}

// A boot that fails half-way (here QEMU cannot be started) unwinds every
// step it made: the repository lock and the drives are free, the console's
// FIFOs and the record are gone, and the instance is stopped. A boot
// refused before it starts (a snapshot that is not whole) leaves as
// little.
func TestFailedBootUnwinds(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	m := newManager(t, lockFile)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, nil, 0o600)
	kernel := filepath.Join(dir, "Image")
	os.WriteFile(kernel, []byte("not a kernel"), 0o600)
	f, err := os.Open(kernel)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	spec := Spec{Name: "a", Root: dir, QEMU: qemu.NewConfig(qemu.WithBinary(filepath.Join(dir, "no-such-qemu")),
		qemu.WithKernel(kernel), qemu.WithDrive(qemu.Drive{Path: img}))}
	spec.QEMU.Files = map[string]*os.File{kernel: f}
	i, _, err := m.Boot(ctx, spec)
	if err == nil || i != nil || !strings.HasPrefix(err.Error(), "boot: ") || !strings.Contains(err.Error(), "no-such-qemu") {
		t.Fatalf("boot with a missing QEMU: %v %v", i, err)
	}
	assertNothingHeld := func(what string) {
		t.Helper()
		if _, held := m.locks.holds(lockFile); held {
			t.Errorf("%s: the repository lock is still held", what)
		}
		if st, _ := lock.Inspect(lockFile); st.State != lock.Absent {
			t.Errorf("%s: the lock file: %v", what, st)
		}
		if _, err := m.claimDrives("probe", []qemu.Drive{{Path: img}}); err != nil {
			t.Errorf("%s: the drive is still claimed: %v", what, err)
		} else {
			m.mu.Lock()
			delete(m.drives, img)
			m.mu.Unlock()
		}
		if left := runtimeLeft(t, m); len(left) > 0 {
			t.Errorf("%s: the runtime directory holds %v", what, left)
		}
		if len(m.Record().Instances) != 0 {
			t.Errorf("%s: the record names %+v", what, m.Record().Instances)
		}
	}
	assertNothingHeld("after a failed start")
	got, err := m.Get("a")
	if err != nil || got.State() != Stopped {
		t.Fatalf("the failed instance: %v %v", got, err)
	}
	if _, err := got.Running(); err == nil || !strings.Contains(err.Error(), `guest "a" did not start`) {
		t.Errorf("Running of a failed boot: %v", err)
	}
	// The descriptors the boot was given are closed with it.
	if _, err := f.Stat(); err == nil {
		t.Errorf("the boot left the kernel's descriptor open")
	}

	// A snapshot that is not whole: refused with what is missing.
	meta := snapshot.Meta{Name: "s", Tag: "qemu-mcp-s", Path: filepath.Join(dir, "s.qcow2")}
	spec = Spec{Name: "a", Root: dir, QEMU: qemu.NewConfig(qemu.WithBinary(filepath.Join(dir, "no-such-qemu")), qemu.WithDrive(qemu.Drive{Path: img})),
		Snapshot: &SnapshotSpec{Name: meta.Name, meta: meta}}
	if _, _, err := m.Boot(ctx, spec); err == nil || !strings.Contains(err.Error(), `snapshot "s" is incomplete: its image `+meta.Path+" is missing") {
		t.Errorf("boot from an incomplete snapshot: %v", err)
	}
	assertNothingHeld("after a refused snapshot")
	if n := m.boots["a"]; n != 2 {
		t.Errorf("boot number %d after two attempts", n)
	}
}

// Instance names are checked before anything is made, and a name nobody
// booted is told apart from a stopped one.
func TestGetAndNames(t *testing.T) {
	m := newManager(t, "")
	if _, err := m.Get("nobody"); err == nil || !strings.Contains(err.Error(), `no guest named "nobody"`) {
		t.Errorf("get an unknown name: %v", err)
	}
	ctx := context.Background()
	for _, bad := range []string{"", "../x", strings.Repeat("n", 200)} {
		if _, _, err := m.Boot(ctx, Spec{Name: bad}); err == nil {
			t.Errorf("boot %q was accepted", bad)
		}
	}
	if _, _, err := m.Boot(ctx, Spec{Name: "a", Capture: &CaptureSpec{}}); err == nil || !strings.Contains(err.Error(), "a capture at boot needs a TAP") {
		t.Errorf("a capture without a TAP: %v", err)
	}
	if len(m.List()) != 0 {
		t.Errorf("refused boots are listed: %v", m.List())
	}
}

// What the server keeps is held to its cap: the oldest files go first,
// but never the transcript of a guest that runs, nor a file of another
// server that still runs, nor a snapshot (which counts towards the cap).
func TestKeptCap(t *testing.T) {
	snaps := t.TempDir()
	store := snapshot.Store{Dir: snaps}
	// A complete snapshot: a record and its image.
	sdir := filepath.Join(snaps, "proj-00000000", "m1")
	os.MkdirAll(sdir, 0o700)
	os.WriteFile(filepath.Join(sdir, "s.json"), []byte(`{"name":"s","image":"s.1-2-3.qcow2","id":"1-2-3","tag":"qemu-mcp-s.1-2-3"}`), 0o600)
	os.WriteFile(filepath.Join(sdir, "s.1-2-3.qcow2"), make([]byte, 8192), 0o600)
	if store.Total() == 0 {
		t.Fatal("the snapshot does not count")
	}
	const size = 8192
	m := newManager(t, "", func(c *Config) { c.KeepCap = store.Total() + 2*size; c.Snapshots = snaps })

	// Another server that runs: a process of this test.
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }() // the process this test started
	info, err := proc.Stat(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	live := names.Owner{PID: other.Process.Pid, StartTime: info.StartTime}
	dead := names.Owner{PID: names.MaxPID, StartTime: 1}
	now := time.Now()
	put := func(name string, age time.Duration) string {
		p := filepath.Join(m.cfg.Captures, name)
		os.WriteFile(p, make([]byte, size), 0o600)
		os.Chtimes(p, now.Add(-age), now.Add(-age))
		return p
	}
	liveOld := put(names.Transcript(live, "x", 1), 4*time.Hour)
	deadOld := put(names.Transcript(dead, "x", 1), 3*time.Hour)
	ownOld := put(names.Transcript(m.owner, "gone", 1), 2*time.Hour)
	ownNew := put(names.Transcript(m.owner, "gone", 2), time.Hour)

	removed := m.enforceCap()
	var got []string
	for _, f := range removed {
		got = append(got, f.Path)
	}
	if want := []string{deadOld, ownOld}; !slices.Equal(got, want) {
		t.Errorf("removed %v, want %v", got, want)
	}
	for _, p := range []string{liveOld, ownNew, filepath.Join(sdir, "s.1-2-3.qcow2")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// A new server removes what saves killed with an earlier one left in the
// snapshot store, before its first boot.
func TestNewReapsKilledSaves(t *testing.T) {
	snaps := t.TempDir()
	dir := filepath.Join(snaps, "proj-00000000", "m1")
	os.MkdirAll(dir, 0o700)
	dead := names.Owner{PID: names.MaxPID, StartTime: 1}
	id := dead.Tag() + "-1"
	image := filepath.Join(dir, "a."+id+".qcow2")
	os.WriteFile(image, []byte("partial"), 0o600)
	intent := filepath.Join(dir, ".a."+id+".intent")
	os.WriteFile(intent, []byte(`{"name":"a","id":"`+id+`","image":"a.`+id+`.qcow2","tag":"qemu-mcp-a.`+id+`"}`), 0o600)
	newManager(t, "", func(c *Config) { c.Snapshots = snaps })
	for _, p := range []string{image, intent} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after a new server started: %v", filepath.Base(p), err)
		}
	}
}

// Calls that type on a console run one after another: the next waits for
// the one before, up to its own timeout, and is then told who holds the
// console and since when; a stop ends the wait at once.
func TestConsoleTurns(t *testing.T) {
	m := newManager(t, "")
	i := newInstance(m, Spec{Name: "a"}, 1)
	ctx := context.Background()
	release, err := i.AcquireConsole(ctx, "guest_exec", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = i.AcquireConsole(ctx, "serial_send", 50*time.Millisecond)
	if !errors.Is(err, ErrConsoleBusy) || !strings.Contains(err.Error(), "guest_exec has used it for") {
		t.Errorf("a second call while the first holds the console: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := i.AcquireConsole(ctx, "serial_send", 10*time.Second)
		if err == nil {
			r()
		}
		got <- err
	}()
	release()
	if err := <-got; err != nil {
		t.Errorf("the next call once the first let go: %v", err)
	}
	release, _ = i.AcquireConsole(ctx, "guest_exec", time.Second)
	defer release()
	go func() {
		_, err := i.AcquireConsole(ctx, "serial_send", 10*time.Second)
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	i.cancel(ErrStopped)
	select {
	case err := <-got:
		if !errors.Is(err, ErrStopped) {
			t.Errorf("a wait for the console that a stop ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stop did not end the wait for the console")
	}
}

// Each architecture's QEMU is probed with its own built-in kernel: a
// server with aarch64's only says what is known of aarch64's QEMU, and
// that it does not probe riscv64's.
func TestHealthArchCaps(t *testing.T) {
	kernel, _, q := testguest.ArchTiny(t, arm64.Arch)
	k, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, "", func(c *Config) {
		c.CacheDir = t.TempDir()
		c.Platforms = map[string]Platform{"aarch64": {QEMU: q, Kernel: k}}
	})
	h := m.Health(t.TempDir())
	i := slices.IndexFunc(h.Arches, func(a ArchHealth) bool { return a.Name == "aarch64" })
	if i < 0 || h.Arches[i].Caps == nil || h.Arches[i].Caps.State != string(caps.NotProbed) || h.Arches[i].Caps.Binary != q {
		t.Errorf("aarch64's QEMU before a boot: %+v", h.Arches)
	}
	if h.Arches[0].Caps != nil || h.QEMU.State != ProbeFailed {
		t.Errorf("riscv64's QEMU without its kernel: %+v, %+v", h.Arches[0].Caps, h.QEMU)
	}
}

// Health reads the repository lock, the server's executable and the
// runtime directory without a guest; with one, the lock is the server's.
func TestHealth(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	m := newManager(t, lockFile)
	h := m.Health(t.TempDir())
	if h.LockFile != lockFile || h.LockState != lock.Absent || h.LockIsOurs || h.LockErr != nil {
		t.Errorf("the lock before a boot: %+v", h)
	}
	if h.ExeChanged != "" || len(h.DeadServers) != 0 || h.ScanErr != nil || h.QEMUVersion == "" {
		t.Errorf("the server without a guest: %+v", h)
	}
	if h.QEMU.State != ProbeFailed || h.QEMU.Binary == "" {
		t.Errorf("the QEMU of a server that probes none: %+v", h.QEMU)
	}
	for _, a := range h.Arches {
		if a.Caps != nil {
			t.Errorf("%s's QEMU of a server that probes none: %+v", a.Name, a.Caps)
		}
	}
	ctx := testContext(t)
	root := t.TempDir()
	if _, _, err := m.Boot(ctx, tinySpec(t, "a", root)); err != nil {
		t.Fatal(err)
	}
	if h := m.Health(root); h.LockState != lock.Held || !h.LockIsOurs || h.LockHolder != os.Getpid() {
		t.Errorf("the lock while a runs: %+v", h)
	}
}
