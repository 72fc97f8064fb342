package rpcframe

import (
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/rawio"
)

// Stdin returns the server's standard input to read messages from: where
// it is a pipe (as MCP clients start servers), the pipe opened a second
// time, non-blocking, in the runtime's netpoller, and read with raw
// system calls (package rawio says why). A goroutine blocked in read(2)
// holds a scheduler P, which the runtime's sysmon retakes whenever the
// other Ps are busy and then polls every 20 us for a millisecond or more:
// on a two-core machine whose other core runs the guest's vCPU, that takes
// the time QEMU's I/O thread needs while the guest answers.
//
// Reopening through /proc/self/fd gives a new open file description of the
// same pipe, so the client's end and file descriptor 0 (which a child
// might share) keep their blocking mode. Anything else (a terminal, a
// file, a socket, no /proc) is read as it is, through os.Stdin.
func Stdin() io.Reader {
	if f := reopen(0, os.O_RDONLY); f != nil {
		if r, err := newRawFile(f); err == nil {
			return r
		}
		f.Close()
	}
	return os.Stdin
}

// Stdout is Stdin's counterpart for the server's standard output: the pipe
// reopened non-blocking and written with raw system calls, or os.Stdout.
// A write to a pipe whose reader has gone fails with EPIPE (file
// descriptor 1 itself would have the runtime die of SIGPIPE).
func Stdout() io.WriteCloser {
	if f := reopen(1, os.O_WRONLY); f != nil {
		if w, err := newRawFile(f); err == nil {
			return w
		}
		f.Close()
	}
	return os.Stdout
}

// reopen opens the pipe on fd anew (mode os.O_RDONLY or os.O_WRONLY),
// non-blocking and in the netpoller, or returns nil.
func reopen(fd int, mode int) *os.File {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil
	}
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), mode|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	// The same pipe, and in the netpoller (deadlines need it). Not
	// f.Fd(), which would make the descriptor blocking again.
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
