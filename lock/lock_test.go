package lock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

func lockPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), FileName)
}

func TestAcquireReleaseFree(t *testing.T) {
	path := lockPath(t)
	l, err := Acquire(path, Record{Target: "/proj"})
	if err != nil {
		t.Fatal(err)
	}
	rec := readRecordFile(t, path)
	self, _ := proc.Self()
	if rec.PID != self.PID || rec.StartTime != self.StartTime || rec.Target != "/proj" || rec.Exe == "" || rec.Started.IsZero() {
		t.Errorf("record %+v does not name this process", rec)
	}
	if got := l.Record(); got.PID != rec.PID || got.Target != rec.Target || l.Path() != path || l.Reclaimed() != nil {
		t.Errorf("Lock reports %+v at %s, reclaimed %v", got, l.Path(), l.Reclaimed())
	}
	if st, err := Inspect(path); err != nil || st.State != Held || st.Liveness != proc.Alive {
		t.Errorf("Inspect while held = %v, %v", st, err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	wantFreed(t, path, "Release")
}

// wantFreed checks that the lock file at path is gone after by, and that
// the lock is free again: another acquisition works.
func wantFreed(t *testing.T, path, by string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock file still there after %s: %v", by, err)
	}
	l, err := Acquire(path, Record{})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// The same process asking twice (a second qemu_boot) is refused too: a flock
// belongs to an open file, not to a process.
func TestAcquireTwiceInOneProcess(t *testing.T) {
	path := lockPath(t)
	l, err := Acquire(path, Record{Target: "/proj"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	_, err = Acquire(path, Record{Target: "/proj"})
	held := mustHeld(t, err, os.Getpid())
	t.Log(held)
	if !strings.Contains(held.Error(), "itself") {
		t.Errorf("message does not say the holder is this server: %v", held)
	}
}

func TestHeldByLiveHelper(t *testing.T) {
	path := lockPath(t)
	h := startHelper(t, "acquire", []string{helperPathEnv + "=" + path})
	pid, _ := strconv.Atoi(h.expect("locked"))
	if pid != h.pid {
		t.Fatalf("helper says pid %d, started %d", pid, h.pid)
	}
	before := inode(t, path)
	_, err := Acquire(path, Record{Target: "/other"})
	held := mustHeld(t, err, h.pid)
	msg := held.Error()
	t.Log(msg)
	for _, want := range []string{path, strconv.Itoa(h.pid), "helper", "kill -TERM " + strconv.Itoa(h.pid), "session that owns it", "since"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if held.Comm == "" || held.Exe == "" {
		t.Errorf("HeldError does not say what the holder is: comm %q exe %q", held.Comm, held.Exe)
	}
	if inode(t, path) != before || readRecordFile(t, path).PID != h.pid {
		t.Error("a refused Acquire changed the lock file")
	}
	// When the holder releases, the lock is free.
	h.stop()
	wantFreed(t, path, "the helper's Release")
}

// A holder killed with SIGKILL leaves its record; the kernel drops its
// flock, so the next Acquire simply takes the lock.
func TestKilledHolderLeavesFreeLock(t *testing.T) {
	path := lockPath(t)
	h := startHelper(t, "acquire", []string{helperPathEnv + "=" + path})
	h.expect("locked")
	h.cmd.Process.Kill()
	h.stop()
	if rec := readRecordFile(t, path); rec.PID != h.pid {
		t.Fatalf("record names %d, want the killed helper %d", rec.PID, h.pid)
	}
	st, err := Inspect(path)
	if err != nil || st.State != Free || st.Liveness != proc.Gone {
		t.Fatalf("Inspect = %v (%v), %v; want free with a gone holder", st.State, st.Liveness, err)
	}
	l, err := Acquire(path, Record{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if l.Reclaimed() != nil {
		t.Error("a free lock was reported as reclaimed")
	}
}

// Records a script or another process holds the flock under, which must be
// respected: they name a live process.
func TestHeldRecordsRespected(t *testing.T) {
	for _, tc := range []struct {
		name, record string
	}{
		{"wrapper single line without start time", "pid=@PID@ target=/x started=2026-02-23T10:00:00+01:00"},
		{"wrapper single line, trailing newline", "pid=@PID@ target=/x started=1771837200\n"},
		{"full record", "pid=@PID@\ntarget=/a path/with spaces\nstarted=2026-02-23T10:00:00Z\nstart_time=@START@\nexe=/bin/sh\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := lockPath(t)
			h := startHelper(t, "hold", []string{helperPathEnv + "=" + path, helperRecEnv + "=" + tc.record})
			h.expect("locked")
			_, err := Acquire(path, Record{})
			held := mustHeld(t, err, h.pid)
			if held.Since.IsZero() || held.Holder.Target == "" {
				t.Errorf("HeldError lacks since/target: %+v", held)
			}
			st, err := Inspect(path)
			if err != nil || st.State != Held || st.Held == nil || st.Held.Holder.PID != h.pid {
				t.Errorf("Inspect = %+v, %v", st, err)
			}
		})
	}
}

// A held flock with no readable record: someone holds it and we cannot tell
// who, so it is refused with a message that says so.
func TestHeldUnidentified(t *testing.T) {
	for _, record := range []string{"", "garbage \x01\x02 with no pid", "pid=notanumber target=/x"} {
		t.Run(strconv.Quote(record), func(t *testing.T) {
			path := lockPath(t)
			h := startHelper(t, "hold", []string{helperPathEnv + "=" + path, helperRecEnv + "=" + record})
			h.expect("locked")
			start := time.Now()
			_, err := Acquire(path, Record{})
			held := mustHeld(t, err, 0)
			t.Log(err)
			if held.Unidentified == "" || !strings.Contains(err.Error(), "cannot be identified") || !strings.Contains(err.Error(), "fuser") {
				t.Errorf("unclear message: %v", err)
			}
			if time.Since(start) > 3*time.Second {
				t.Errorf("Acquire took %v", time.Since(start))
			}
			if st, err := Inspect(path); err != nil || st.State != Unidentified {
				t.Errorf("Inspect = %v, %v", st.State, err)
			}
		})
	}
}

// Stale locks: the flock is held (by a process that is not, or no longer,
// the recorded holder), but the record names a dead, zombie or reused PID.
func TestReclaimStale(t *testing.T) {
	dead := deadIdentity(t)
	zombie := startHelper(t, "exit", nil) // not waited for until cleanup
	var zombieStart uint64
	for deadline := time.Now().Add(waitFor); ; time.Sleep(5 * time.Millisecond) {
		info, err := proc.Stat(zombie.pid)
		if err == nil && info.State == proc.StateZombie {
			zombieStart = info.StartTime
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper %d never became a zombie: %+v %v", zombie.pid, info, err)
		}
	}
	for _, tc := range []struct {
		name, record string
		why          proc.Liveness
	}{
		{"dead pid, held by an unrelated process", fmt.Sprintf("pid=%d\ntarget=/old\nstart_time=%d\n", dead.PID, dead.StartTime), proc.Gone},
		{"dead pid, wrapper format", fmt.Sprintf("pid=%d target=/old started=2026-01-01T00:00:00Z", dead.PID), proc.Gone},
		{"zombie pid", fmt.Sprintf("pid=%d\nstart_time=%d\n", zombie.pid, zombieStart), proc.Zombie},
		{"reused pid: the holder itself with a wrong start time", "pid=@PID@\nstart_time=@WRONGSTART@\n", proc.Reused},
		{"reused pid: the test's parent with a wrong start time", fmt.Sprintf("pid=%d\nstart_time=1\n", os.Getppid()), proc.Reused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := lockPath(t)
			h := startHelper(t, "hold", []string{helperPathEnv + "=" + path, helperRecEnv + "=" + tc.record})
			h.expect("locked")
			old := inode(t, path)
			st, err := Inspect(path)
			if err != nil || st.State != Stale || st.Liveness != tc.why {
				t.Fatalf("Inspect before = %v (%v), %v; want stale (%v)", st.State, st.Liveness, err, tc.why)
			}
			l, err := Acquire(path, Record{Target: "/new"})
			if err != nil {
				t.Fatalf("stale lock not reclaimed: %v", err)
			}
			defer l.Release()
			if inode(t, path) == old {
				t.Error("reclaimed lock still has the stale inode")
			}
			if rec := readRecordFile(t, path); rec.PID != os.Getpid() || rec.Target != "/new" {
				t.Errorf("record after reclaim: %+v", rec)
			}
			r := l.Reclaimed()
			if r == nil || r.Liveness != tc.why {
				t.Errorf("Reclaimed = %+v, want liveness %v", r, tc.why)
			}
			if st, err := Inspect(path); err != nil || st.State != Held || st.Record.PID != os.Getpid() {
				t.Errorf("Inspect after = %v, %v", st, err)
			}
			// The reclaimed lock is a real lock: another process is refused.
			other := startHelper(t, "acquire", []string{helperPathEnv + "=" + path})
			if got := other.expect("held"); got != strconv.Itoa(os.Getpid()) {
				t.Errorf("second acquirer says held by %s, want %d", got, os.Getpid())
			}
			if _, err := os.Lstat(path + newSuffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("reclaim left %s behind", path+newSuffix)
			}
		})
	}
}

// A lock file nobody holds is taken whatever it says.
func TestFreeWithOldOrGarbageRecord(t *testing.T) {
	for _, content := range []string{
		"",
		"\x00\xff\xfe garbage",
		fmt.Sprintf("pid=%d\ntarget=/x\n", os.Getpid()), // even one naming a live process: the flock is what counts
		strings.Repeat("pid=1 ", 20000),
	} {
		path := lockPath(t)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		before := inode(t, path)
		l, err := Acquire(path, Record{Target: "/t"})
		if err != nil {
			t.Fatalf("free lock with %.20q: %v", content, err)
		}
		if inode(t, path) != before {
			t.Error("a free lock file was replaced instead of locked in place")
		}
		if rec := readRecordFile(t, path); rec.PID != os.Getpid() || rec.Target != "/t" {
			t.Errorf("record %+v", rec)
		}
		l.Release()
	}
}

func TestSymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "precious")
	if err := os.WriteFile(target, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	_, err := Acquire(path, Record{})
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Acquire on a symlink: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep me" {
		t.Errorf("symlink target changed to %q", b)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink itself changed: %v %v", fi, err)
	}
	if _, err := Inspect(path); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Inspect on a symlink: %v", err)
	}
	// A dangling one must not create its target either.
	dangling := filepath.Join(dir, "dangling.lock")
	os.Symlink(filepath.Join(dir, "created"), dangling)
	if _, err := Acquire(dangling, Record{}); err == nil {
		t.Error("Acquire followed a dangling symlink")
	}
	if _, err := os.Lstat(filepath.Join(dir, "created")); !errors.Is(err, os.ErrNotExist) {
		t.Error("Acquire created the target of a dangling symlink")
	}
}

func TestNotARegularFile(t *testing.T) {
	path := lockPath(t)
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(path, Record{}); err == nil {
		t.Error("Acquire on a directory succeeded")
	}
}

// Release must not remove a file that is no longer ours.
func TestReleaseLeavesReplacement(t *testing.T) {
	path := lockPath(t)
	l, err := Acquire(path, Record{})
	if err != nil {
		t.Fatal(err)
	}
	other := path + ".other"
	os.WriteFile(other, []byte("pid=1\n"), 0o644)
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "pid=1\n" {
		t.Errorf("Release removed or changed a file that was not its own: %q %v", b, err)
	}
}

func TestInspectChangesNothing(t *testing.T) {
	path := lockPath(t)
	st, err := Inspect(path)
	if err != nil || st.State != Absent {
		t.Fatalf("Inspect of a missing file = %v, %v", st, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 0 {
		t.Errorf("Inspect created files: %v", entries)
	}
	os.WriteFile(path, []byte("pid=1 target=/x"), 0o644)
	before := inode(t, path)
	st, err = Inspect(path)
	if err != nil || st.State != Free || st.Record.PID != 1 || st.Record.Target != "/x" {
		t.Errorf("Inspect of a free file = %+v, %v", st, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "pid=1 target=/x" || inode(t, path) != before {
		t.Errorf("Inspect changed the file: %q", b)
	}
	if s := st.String(); !strings.Contains(s, "free") {
		t.Errorf("String() = %q", s)
	}
}
