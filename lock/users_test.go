package lock

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
)

// looseFiles leaves a lock file and guard in dir as earlier versions made
// them (0644), with record rec in the lock file, and has user b hold both
// flocks through read-only descriptors, as any user who can read them can.
func looseFiles(t *testing.T, b testusers.User, bin, dir, rec string) string {
	t.Helper()
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+guardSuffix, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := startHelperAs(t, runAs{bin: bin, attr: b.Attr()}, "holdro", []string{helperPathEnv + "=" + path + guardSuffix + ":" + path})
	h.expect("locked")
	return path
}

// Another user holding 0644 lock files left by an earlier version (opened
// before our acquirer started) delays it by well under a second: the files
// are replaced by private ones under the other user's flocks, which keep
// working on the old inodes and block nothing.
func TestOtherUserHoldingLooseFiles(t *testing.T) {
	users := testusers.New(t, 1)
	shared := testusers.Shared(t)
	bin := testusers.Binary(t, shared)
	dead := deadIdentity(t)
	block := startHelper(t, "block", nil)
	block.expect("ready")
	for name, rec := range map[string]string{
		"stale record":   fmt.Sprintf("pid=%d\ntarget=/old\nstart_time=%d\n", dead.PID, dead.StartTime),
		"no record":      "",
		"garbage":        "\x00garbage",
		"live non-owner": fmt.Sprintf("pid=%d\ntarget=/old\n", block.pid), // alive, but not the flock's holder
	} {
		t.Run(name, func(t *testing.T) {
			dir, err := os.MkdirTemp(shared, "repo")
			if err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o755)
			path := looseFiles(t, users[0], bin, dir, rec)
			wantReplaced := replacedPrivate(t, path)

			start := time.Now()
			st, err := Inspect(path)
			if err != nil || st.State != Foreign || !strings.Contains(st.HeldBy, users[0].Name) || st.Refuses() {
				t.Errorf("Inspect = %v, %v; want foreign, naming %s", st, err, users[0].Name)
			}
			if el := time.Since(start); el > 300*time.Millisecond {
				t.Errorf("Inspect took %v: it waited for the other user's guard", el)
			}

			start = time.Now()
			l, err := Acquire(path, Record{Target: "/mine"})
			el := time.Since(start)
			if err != nil {
				t.Fatalf("Acquire with another user holding the old files: %v", err)
			}
			defer l.Release()
			t.Logf("acquired in %v", el)
			if el > time.Second {
				t.Errorf("Acquire took %v with another user holding the old files", el)
			}
			if r := l.Reclaimed(); r == nil || !strings.Contains(r.HeldBy, users[0].Name) {
				t.Errorf("Reclaimed = %+v, want the other user named", r)
			}
			wantReplaced()
			if st, err := Inspect(path); err != nil || st.State != Held || st.Record.Target != "/mine" {
				t.Errorf("Inspect after: %v, %v", st, err)
			}
		})
	}
}

// Servers of one user racing to replace loose files that another user
// holds: still exactly one winner, every time.
func TestRaceReplacingLooseFiles(t *testing.T) {
	users := testusers.New(t, 1)
	shared := testusers.Shared(t)
	bin := testusers.Binary(t, shared)
	dead := deadIdentity(t)
	for round, held := range []bool{true, true, true, false, false} {
		t.Run(fmt.Sprintf("round%d-held=%v", round, held), func(t *testing.T) {
			dir, err := os.MkdirTemp(shared, "repo")
			if err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o755)
			rec := fmt.Sprintf("pid=%d\ntarget=/old\nstart_time=%d\n", dead.PID, dead.StartTime)
			var path string
			if held {
				path = looseFiles(t, users[0], bin, dir, rec)
			} else {
				path = filepath.Join(dir, FileName)
				os.WriteFile(path, []byte(rec), 0o644)
				os.WriteFile(path+guardSuffix, nil, 0o644)
			}
			winner, cs := race(t, path, 20)
			if got := readRecordFile(t, path); got.PID != winner.pid {
				t.Errorf("lock file names %d, winner is %d", got.PID, winner.pid)
			}
			for _, p := range []string{path, path + guardSuffix} {
				if m := mode(t, p); m != 0o600 {
					t.Errorf("%s: mode %v", filepath.Base(p), m)
				}
			}
			for _, c := range cs {
				c.stop()
			}
		})
	}
}

// A lock that another user holds (in a repository shared with a group) is
// reported with that user, and without advice to signal a process that is
// not ours; when /proc hides their processes (hidepid), the report says so.
func TestHeldByOtherUser(t *testing.T) {
	users := testusers.New(t, 2)
	a, b := users[0], users[1]
	shared := testusers.Shared(t)
	bin := testusers.Binary(t, shared)
	// A git dir shared with b's group, of which a is a member.
	dir := filepath.Join(shared, "git")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "config"), []byte("[core]\n\tsharedRepository = group\n"), 0o644)
	os.Chown(dir, 0, b.GID)
	if err := os.Chmod(dir, os.ModeSetgid|0o775); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	holder := startHelperAs(t, runAs{bin: bin, attr: b.Attr()}, "describe", []string{helperPathEnv + "=" + path})
	holder.expect("locked")
	if m := mode(t, path); m != 0o660 {
		t.Errorf("lock of a group-shared repository: mode %v, want 0660", m)
	}
	asA := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(a.UID), Gid: uint32(a.GID), Groups: []uint32{uint32(b.GID)}}}

	c := startHelperAs(t, runAs{bin: bin, attr: asA}, "describe", []string{helperPathEnv + "=" + path})
	if got := c.expect("held"); got != fmt.Sprintf("%d false", b.UID) {
		t.Errorf("held by %q, want uid %d, visible", got, b.UID)
	}
	msg := c.expect("msg")
	if !strings.Contains(msg, b.Name) || !strings.Contains(msg, "not yours to stop") || strings.Contains(msg, "kill -TERM") {
		t.Errorf("message: %s", msg)
	}

	// The same with /proc mounted hidepid=2 for a (a mount namespace of
	// its own): b's process is invisible to a.
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not found (util-linux)")
	}
	wrap := []string{"unshare", "-m", "sh", "-c", `mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=` + fmt.Sprint(a.UID) +
		` --regid=` + fmt.Sprint(a.GID) + ` --groups=` + fmt.Sprint(b.GID) + ` -- "$@"`, "sh"}
	c = startHelperAs(t, runAs{bin: bin, wrap: wrap}, "describe", []string{helperPathEnv + "=" + path})
	if got := c.expect("held"); got != fmt.Sprintf("%d true", b.UID) {
		t.Errorf("held by %q, want uid %d, hidden", got, b.UID)
	}
	msg = c.expect("msg")
	if !strings.Contains(msg, b.Name) || !strings.Contains(msg, "cannot see") || strings.Contains(msg, "kill -TERM") {
		t.Errorf("message with hidepid: %s", msg)
	}

	// Once b is done, a member of the group takes the lock.
	holder.stop()
	c = startHelperAs(t, runAs{bin: bin, attr: asA}, "describe", []string{helperPathEnv + "=" + path})
	c.expect("locked")
}
