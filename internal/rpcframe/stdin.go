package rpcframe

import (
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/rawio"
)

// Stdin returns the server's standard input to read messages from: the
// client's pipe or socket, non-blocking, in the runtime's netpoller, and
// read with raw system calls (package rawio says why). A goroutine blocked
// in read(2) holds a scheduler P, which the runtime's sysmon retakes
// whenever the other Ps are busy and then polls every 20 us for a
// millisecond or more: on a two-core machine whose other core runs the
// guest's vCPU, that takes the time QEMU's I/O thread needs while the
// guest answers.
//
// A pipe (Go and Python clients, Codex) is opened anew through
// /proc/self/fd: a new open file description of the same pipe, so file
// descriptor 0 and whatever shares it keep their blocking mode. A socket
// (Node's child processes get socketpairs: Claude Code, Gemini CLI,
// Copilot CLI) cannot be reopened, so its description is made
// non-blocking, which only this process holds; Restore puts it back.
// Anything else (a terminal, a file, no /proc) is read as it is, through
// os.Stdin.
func Stdin() io.Reader {
	if r := reopenRaw(0, os.O_RDONLY); r != nil {
		return r
	}
	return os.Stdin
}

// Stdout is Stdin's counterpart for the server's standard output, written
// with raw system calls, or os.Stdout. A write to a client that has gone
// fails with EPIPE.
func Stdout() io.WriteCloser {
	if w := reopenRaw(1, os.O_WRONLY); w != nil {
		return w
	}
	return os.Stdout
}

// restores are the blocking modes Stdin and Stdout changed.
var (
	restoreMu sync.Mutex
	restores  []func()
)

// Restore makes the sockets Stdin and Stdout made non-blocking blocking
// again; the server calls it as it exits.
func Restore() {
	restoreMu.Lock()
	defer restoreMu.Unlock()
	for _, f := range restores {
		f()
	}
	restores = nil
}

// reopenRaw is reopen's file, read and written with package rawio, or nil.
func reopenRaw(fd, mode int) *rawFile {
	f := reopen(fd, mode)
	if f == nil {
		return nil
	}
	r, err := newRawFile(f)
	if err != nil {
		f.Close()
		return nil
	}
	return r
}

// reopen returns fd's pipe or socket as a new *os.File, non-blocking and
// in the netpoller (mode, os.O_RDONLY or os.O_WRONLY, is how a pipe is
// opened), or nil.
func reopen(fd int, mode int) *os.File {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil
	}
	var f *os.File
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		var err error
		if f, err = os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), mode|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0); err != nil {
			return nil
		}
	case syscall.S_IFSOCK:
		nfd, err := dupNonblock(fd)
		if err != nil {
			return nil
		}
		f = os.NewFile(uintptr(nfd), "/dev/fd/"+strconv.Itoa(fd))
	default:
		return nil
	}
	// The same pipe or socket, and in the netpoller (deadlines need it).
	// Not f.Fd(), which would make the descriptor blocking again.
	var st2 syscall.Stat_t
	var serr error = syscall.EBADF
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { serr = syscall.Fstat(int(fd), &st2) })
	}
	if serr != nil || st2.Dev != st.Dev || st2.Ino != st.Ino || f.SetDeadline(time.Time{}) != nil {
		f.Close()
		return nil
	}
	return f
}

// dupNonblock duplicates fd (close-on-exec) and makes the socket's
// description non-blocking, remembering to make it blocking again.
func dupNonblock(fd int) (int, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	fl, err := unix.FcntlInt(uintptr(nfd), unix.F_GETFL, 0)
	if err == nil && fl&unix.O_NONBLOCK == 0 {
		err = syscall.SetNonblock(nfd, true)
		if err == nil {
			restoreMu.Lock()
			restores = append(restores, func() { _ = syscall.SetNonblock(fd, false) })
			restoreMu.Unlock()
		}
	}
	if err != nil {
		syscall.Close(nfd)
		return -1, err
	}
	return nfd, nil
}

// rawFile reads and writes f with package rawio.
type rawFile struct {
	f  *os.File
	rc syscall.RawConn
}

func newRawFile(f *os.File) (*rawFile, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &rawFile{f: f, rc: rc}, nil
}

func (r *rawFile) Read(p []byte) (int, error)  { return rawio.Read(r.rc, p) }
func (r *rawFile) Write(p []byte) (int, error) { return rawio.Write(r.rc, p) }
func (r *rawFile) Close() error                { return r.f.Close() }
