// Package registrytest helps tests build runtime directories with real
// processes, FIFOs and sockets. Every process it starts is killed (exactly
// that process, by its *os.Process) and waited for in t.Cleanup.
package registrytest

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"golang.org/x/sys/unix"
)

// Proc is a helper process started by a test.
type Proc struct {
	Cmd *exec.Cmd
	ID  proc.Identity
	Exe string

	waited chan struct{}
	state  *os.ProcessState
}

// StartSleep starts `sleep <seconds>` and arranges for it to be killed and
// waited for when the test ends.
func StartSleep(t testing.TB, seconds int) *Proc {
	t.Helper()
	cmd := exec.Command("sleep", strconv.Itoa(seconds))
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	p := &Proc{Cmd: cmd, waited: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-p.waited:
			return
		default:
		}
		cmd.Process.Kill()
		p.Wait(t)
	})
	info, err := proc.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p.ID = proc.Identity{PID: info.PID, StartTime: info.StartTime}
	if p.Exe, err = proc.Exe(p.ID.PID); err != nil {
		t.Fatal(err)
	}
	return p
}

// Wait waits (at most 10 s) for the process and returns how it ended.
func (p *Proc) Wait(t testing.TB) *os.ProcessState {
	t.Helper()
	select {
	case <-p.waited:
		return p.state
	default:
	}
	done := make(chan struct{})
	go func() {
		p.state, _ = p.Cmd.Process.Wait()
		close(done)
	}()
	select {
	case <-done:
		close(p.waited)
	case <-time.After(10 * time.Second):
		t.Fatalf("process %d did not end", p.ID.PID)
	}
	return p.state
}

// KilledBy tells whether the process ended by signal sig (it waits for it).
func (p *Proc) KilledBy(t testing.TB, sig syscall.Signal) bool {
	t.Helper()
	st := p.Wait(t)
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// DeadProcess starts `true`, notes its identity and waits for it: the result
// names a process that existed and is gone.
func DeadProcess(t testing.TB) proc.Identity {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start true: %v", err)
	}
	info, err := proc.Stat(cmd.Process.Pid)
	if err != nil {
		cmd.Wait()
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	id := proc.Identity{PID: info.PID, StartTime: info.StartTime}
	if live, _, _ := proc.Check(id); live == proc.Alive {
		t.Fatalf("process %d still alive after wait", id.PID)
	}
	return id
}

// RecordOf builds the record a server running as p would have written.
func RecordOf(t testing.TB, p *Proc, transport string) registry.Record {
	t.Helper()
	info, err := proc.Stat(p.ID.PID)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(p.ID.PID)+"/exe", &st); err != nil {
		t.Fatal(err)
	}
	rec := registry.Record{
		PID:         p.ID.PID,
		StartTime:   p.ID.StartTime,
		Executable:  p.Exe,
		ExeIdentity: &registry.ExeIdentity{Dev: st.Dev, Inode: st.Ino, Size: st.Size, MtimeNS: st.Mtim.Nano()},
		Cwd:         "/",
		PPID:        info.PPID,
		Transport:   transport,
		Version:     "test",
		Started:     proc.StartedAt(p.ID.StartTime).UTC(),
	}
	if pinfo, err := proc.Stat(info.PPID); err == nil {
		rec.ParentStartTime = pinfo.StartTime
	}
	return rec
}

// DeadRecord builds the record of a server that ran as id and is gone.
func DeadRecord(id proc.Identity, transport string) registry.Record {
	return registry.Record{
		PID:        id.PID,
		StartTime:  id.StartTime,
		Executable: "/usr/bin/true",
		Cwd:        "/",
		PPID:       os.Getpid(),
		Transport:  transport,
		Version:    "test",
		Started:    proc.StartedAt(id.StartTime).UTC(),
	}
}

// Mkfifo makes a FIFO at path.
func Mkfifo(t testing.TB, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo %s: %v", path, err)
	}
}

// Mksock binds a real unix socket at path and closes it, leaving the socket
// file behind as a killed server would.
func Mksock(t testing.TB, path string) {
	t.Helper()
	if err := MakeSocket(path); err != nil {
		t.Fatalf("bind %s: %v", path, err)
	}
}

// MakeSocket binds a unix socket at path and closes it without unlinking.
func MakeSocket(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: path})
}

// Mkfile writes a regular file.
func Mkfile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Exists tells whether something (not following symlinks) is at path.
func Exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
