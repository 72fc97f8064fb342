// Package testusers makes throwaway unprivileged local users for tests that
// show what another user of a shared machine can and cannot do to a
// server's guests, lock and sockets. Users are made with useradd and
// deleted with userdel when the test ends, whether it passed or failed;
// users left by a test binary that was killed are deleted by the next one.
// The tests run as root (as CI does); elsewhere they skip and say so.
package testusers

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// prefix starts every user name made here: "qmt<pid>-<start>a", ... The
// test process's PID and start time make names unique to it, and tell a
// later run whether the process that made a user is gone.
const prefix = "qmt"

// User is a local user made for one test.
type User struct {
	Name     string
	UID, GID int
}

// Need skips the test unless users can be made here.
func Need(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("tests with other local users need root to create them (useradd): run them as root, as CI does")
	}
	for _, tool := range []string{"useradd", "userdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install passwd (scripts/deps)", tool)
		}
	}
}

// New makes n users without a home directory, login shell or supplementary
// groups, each with a group of its own, and deletes them when the test
// ends. Delete anything that runs as one of them before (cleanups run last
// registered first, so register such cleanups after New).
func New(t testing.TB, n int) []User {
	t.Helper()
	Need(t)
	reapDead(t)
	self, err := proc.Self()
	if err != nil {
		t.Fatal(err)
	}
	var users []User
	for i := range n {
		name := fmt.Sprintf("%s%d-%d%c", prefix, self.PID, self.StartTime, 'a'+i)
		if out, err := exec.Command("useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { del(t, name) })
		u, err := lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	return users
}

func del(t testing.TB, name string) {
	// -f: a process the test failed to stop must not keep the user alive.
	if out, err := exec.Command("userdel", "-f", name).CombinedOutput(); err != nil {
		t.Errorf("userdel %s: %v: %s", name, err, out)
	}
	// USERGROUPS_ENAB removes the user's group with it; make sure.
	if exec.Command("getent", "group", name).Run() == nil {
		exec.Command("groupdel", name).Run()
	}
}

// lookup reads a user's ids from the passwd database.
func lookup(name string) (User, error) {
	out, err := exec.Command("getent", "passwd", name).Output()
	if err != nil {
		return User{}, fmt.Errorf("getent passwd %s: %w", name, err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), ":")
	if len(f) < 4 {
		return User{}, fmt.Errorf("getent passwd %s: %q", name, out)
	}
	uid, err1 := strconv.Atoi(f[2])
	gid, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		return User{}, fmt.Errorf("getent passwd %s: %q", name, out)
	}
	return User{Name: name, UID: uid, GID: gid}, nil
}

// reapDead deletes users made by test processes that are gone (killed
// before their cleanups ran). A user whose maker runs is left alone.
func reapDead(t testing.TB) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), ":")
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || len(rest) < 4 {
			continue
		}
		pidS, startS, ok := strings.Cut(rest[:len(rest)-1], "-")
		pid, err1 := strconv.Atoi(pidS)
		start, err2 := strconv.ParseUint(startS, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		if live, _, err := proc.Check(proc.Identity{PID: pid, StartTime: start}); err == nil && live != proc.Alive {
			t.Logf("deleting user %s left by a test process that is gone", name)
			del(t, name)
		}
	}
}

// Attr runs a child as u: its uid and group, no supplementary groups, and
// (as for any process that leaves uid 0) no capabilities.
func (u User) Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: []uint32{}}}
}

// Command is exec.Command run as u.
func (u User) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = u.Attr()
	return cmd
}

// Dir makes a directory of u's own (mode 0700) in parent, a Shared
// directory.
func (u User) Dir(t testing.TB, parent string) string {
	t.Helper()
	d, err := os.MkdirTemp(parent, u.Name+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	return d
}

// Chown gives u the tree at path.
func (u User) Chown(t testing.TB, path string) {
	t.Helper()
	err := filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, u.UID, u.GID)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Shared is a directory of the test's that every user may enter but only
// root may write (mode 0755), removed when the test ends.
func Shared(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "qmcpusers")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// Binary copies the running test binary into dir (a Shared one) so that
// other users may run it: go test leaves its binary in a directory only
// root may enter.
func Binary(t testing.TB, dir string) string {
	t.Helper()
	dst := filepath.Join(dir, filepath.Base(os.Args[0]))
	CopyExecutable(t, os.Args[0], dst)
	return dst
}

// CopyExecutable copies the file from to to, mode 0755.
func CopyExecutable(t testing.TB, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
