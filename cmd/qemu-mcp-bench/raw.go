package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/rawio"
)

var qemuBin = flag.String("qemu", "qemu-system-riscv64", "the QEMU to measure: the servers get it as -qemu, the raw runs run it")

// serverOptions is the command line the server gives QEMU for the tiny
// kernel, with the plumbing it manages marked: the raw runs use exactly
// these options (-nodefaults and the QMP monitor included), so that a
// ceiling is QEMU under the same conditions, read by the fastest reader.
var serverOptions []string

const (
	serialMark = "\x00serial"
	qmpMark    = "\x00qmp"
)

// learnServerOptions boots the tiny kernel through the server and keeps
// its QEMU's options (see serverOptions).
func learnServerOptions(ctx context.Context) error {
	s, err := startServer(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	var b struct {
		Argv    []string `json:"argv"`
		Matched bool     `json:"matched"`
	}
	if err := s.call(ctx, "qemu_boot", withArch(map[string]any{"wait_for": `tiny> $`, "timeout": 60}), &b); err != nil {
		return err
	}
	kernel, err := filepath.Abs(*kernel)
	if err != nil {
		return err
	}
	var opts []string
	for i := 1; i < len(b.Argv); i++ {
		a := b.Argv[i]
		switch {
		case a == "-S":
			continue // the server resumes QEMU once attached; raw runs at once
		case b.Argv[i-1] == "-kernel" && strings.HasPrefix(a, "/proc/self/fd/"):
			a = kernel
		case strings.HasPrefix(a, "pipe,id=serial0,path="):
			a = "pipe,id=serial0,path=" + serialMark
		case strings.HasPrefix(a, "socket,id=qmp0,fd="):
			a = "socket,id=qmp0,path=" + qmpMark + ",server=on,wait=off"
		}
		if strings.Contains(a, "/proc/self/fd/") {
			return fmt.Errorf("server argv has a descriptor the raw run cannot have: %q", a)
		}
		opts = append(opts, a)
	}
	if !strings.Contains(strings.Join(opts, " "), serialMark) {
		return fmt.Errorf("server argv without the serial FIFOs: %q", b.Argv)
	}
	serverOptions = opts
	fmt.Fprintf(os.Stderr, "bench: raw QEMU options (the server's): %s\n", strings.Join(opts, " "))
	return nil
}

// rawArgs are the server's options for a raw QEMU on the FIFOs at base
// with its QMP socket at sock.
func rawArgs(base, sock string) []string {
	args := make([]string, len(serverOptions))
	for i, a := range serverOptions {
		a = strings.ReplaceAll(a, serialMark, base)
		args[i] = strings.ReplaceAll(a, qmpMark, sock)
	}
	return args
}

// A reader is one way to read a FIFO as fast as possible. Each raw figure
// is the best of them, measured in the same run.
type reader struct {
	name string
	// open returns what reads the output FIFO at path.
	open func(path string) (rawReader, error)
}

type rawReader interface {
	// read appends what is there (blocking until something is) to buf.
	read(buf []byte) (int, error)
	close()
}

var readers = []reader{
	{"netpoller", openNetpoll},
	{"netpoller, raw read(2)", openNetpollRaw},
	{"blocking read(2) on a locked thread", openBlocking},
	{"poll(2), batched under a flood", openBatched},
	{"poll(2), 4 ms naps under a flood", func(path string) (rawReader, error) { return openBatchedNap(path, 4*time.Millisecond) }},
	{"naps of 1 to 4 ms, then what FIONREAD says is there", openNapRead},
}

// readDeadline bounds a raw run's reads: a guest that stops answering
// fails the run instead of hanging it.
var readDeadline = 2 * time.Minute

// netpoll: an *os.File on a FIFO is in Go's netpoller.
type netpoll struct{ f *os.File }

func openNetpoll(path string) (rawReader, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	f.SetReadDeadline(time.Now().Add(readDeadline))
	return netpoll{f}, nil
}

func (r netpoll) read(b []byte) (int, error) { return r.f.Read(b) }
func (r netpoll) close()                     { r.f.Close() }

// netpollRaw: the netpoller, read with raw system calls, which wake
// neither the runtime's sysmon nor a thread beyond the one per write (the
// server's drain reads interactive output so).
type netpollRaw struct {
	f  *os.File
	rc syscall.RawConn
}

func openNetpollRaw(path string) (rawReader, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	f.SetReadDeadline(time.Now().Add(readDeadline))
	return netpollRaw{f, rc}, nil
}

func (r netpollRaw) read(b []byte) (int, error) { return rawio.Read(r.rc, b) }
func (r netpollRaw) close()                     { r.f.Close() }

// blocking: a plain blocking read(2) on a thread of its own.
type blocking struct {
	fd   int
	reqs chan []byte
	res  chan result
}

type result struct {
	n   int
	err error
}

func openBlocking(path string) (rawReader, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	r := &blocking{fd: fd, reqs: make(chan []byte), res: make(chan result)}
	go func() {
		runtime.LockOSThread()
		for b := range r.reqs {
			n, err := unix.Read(fd, b)
			r.res <- result{n, err}
		}
	}()
	return r, nil
}

func (r *blocking) read(b []byte) (int, error) {
	r.reqs <- b
	res := <-r.res
	return res.n, res.err
}

func (r *blocking) close() {
	close(r.reqs)
	unix.Close(r.fd)
}

// burst tells a flood from interactive output as the server's drain does:
// more than 256 bytes within a millisecond, read short of the buffer.
type burst struct {
	start time.Time
	bytes int
}

// add counts n bytes just read into a buffer of size; it reports a flood.
func (w *burst) add(n, size int) bool {
	if now := time.Now(); now.Sub(w.start) > time.Millisecond {
		w.start, w.bytes = now, 0
	}
	w.bytes += n
	return w.bytes > 256 && n < size/2
}

// batched: poll(2), then read; once more than 256 bytes came within a
// millisecond, a millisecond's nap between reads lets the pipe gather a
// batch (what the server's drain does: fewer wake-ups leave the emulator
// the CPU).
type batched struct {
	fd    int
	burst burst
	pfd   []unix.PollFd
	nap   time.Duration
}

func openBatched(path string) (rawReader, error) { return openBatchedNap(path, time.Millisecond) }

// openBatchedNap is the batched reader with a longer nap: fewer wake-ups
// still, the emulator's CPU its own for longer.
func openBatchedNap(path string, nap time.Duration) (rawReader, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &batched{fd: fd, nap: nap, pfd: []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}}, nil
}

func (r *batched) read(b []byte) (int, error) {
	for {
		if _, err := unix.Poll(r.pfd, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, err
		}
		n, err := unix.Read(r.fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if n > 0 && r.burst.add(n, len(b)) {
			time.Sleep(r.nap)
		}
		return n, err
	}
}

func (r *batched) close() { unix.Close(r.fd) }

// napRead never waits in a system call: it reads what the pipe holds
// (FIONREAD, raw system calls) and naps when it is empty or a flood goes
// on, 1 ms doubling to 4 ms (the server's drain under a flood).
type napRead struct {
	fd    int
	nap   time.Duration
	burst burst
}

func openNapRead(path string) (rawReader, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &napRead{fd: fd, nap: time.Millisecond}, nil
}

func (r *napRead) read(b []byte) (int, error) {
	for {
		avail, err := rawio.Available(r.fd)
		if err != nil {
			return 0, err
		}
		if avail == 0 {
			time.Sleep(r.nap)
			r.nap = min(2*r.nap, 4*time.Millisecond)
			continue
		}
		n, err := rawio.ReadNow(r.fd, b[:min(avail, len(b))])
		switch {
		case n == 0:
		case r.burst.add(n, len(b)):
			time.Sleep(r.nap)
			r.nap = min(2*r.nap, 4*time.Millisecond)
		default:
			r.nap = time.Millisecond
		}
		return n, err
	}
}

func (r *napRead) close() { unix.Close(r.fd) }

// rawQEMU is QEMU alone on FIFOs, with the server's options.
type rawQEMU struct {
	ident proc.Identity
	cmd   *execCmd
	in    *os.File
	inRC  syscall.RawConn // in's, written raw as the server does
	out   rawReader
	dir   string
	acc   []byte
	buf   []byte
}

func startRawWith(rd reader, extra ...string) (*rawQEMU, error) {
	dir, err := os.MkdirTemp("", "qmr")
	if err != nil {
		return nil, err
	}
	base := filepath.Join(dir, "s")
	for _, p := range []string{base + ".in", base + ".out"} {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	in, err := os.OpenFile(base+".in", os.O_RDWR, 0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	out, err := rd.open(base + ".out")
	if err != nil {
		in.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	args := append(rawArgs(base, filepath.Join(dir, "q.sock")), extra...)
	cmd, err := startExec(*qemuBin, args...)
	if err != nil {
		in.Close()
		out.close()
		os.RemoveAll(dir)
		return nil, err
	}
	q := &rawQEMU{cmd: cmd, in: in, out: out, dir: dir, buf: make([]byte, 1<<20)}
	if q.inRC, err = in.SyscallConn(); err != nil {
		q.close()
		return nil, err
	}
	if q.ident, err = identity(cmd.c.Process.Pid); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

// startRaw starts a raw QEMU read through the netpoller (for the runs
// that do not depend on the reader: boots, restores).
func startRaw(extra ...string) (*rawQEMU, error) { return startRawWith(readers[0], extra...) }

func (q *rawQEMU) close() {
	q.cmd.kill()
	q.in.Close()
	q.out.close()
	os.RemoveAll(q.dir)
}

// readUntil reads the FIFO until s has been seen; it returns what was
// read since the last readUntil.
func (q *rawQEMU) readUntil(s string) ([]byte, error) {
	q.acc = q.acc[:0]
	want := []byte(s)
	for {
		n, err := q.out.read(q.buf)
		if err != nil {
			return q.acc, err
		}
		q.acc = append(q.acc, q.buf[:n]...)
		// Only what this read could have completed is searched: the
		// reader of the ceiling does no more work than it must.
		if bytes.Contains(q.acc[max(0, len(q.acc)-n-len(want)+1):], want) {
			return q.acc, nil
		}
	}
}

// type_ writes s to the guest's console with a raw write(2), as the
// server writes typed input (package rawio).
func (q *rawQEMU) type_(s string) (int, error) { return rawio.Write(q.inRC, []byte(s)) }

// echoes times n echo round trips on a raw QEMU at its prompt, the tokens
// numbered from seq.
func (q *rawQEMU) echoes(seq, n int) ([]time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for i := seq; i < seq+n; i++ {
		tok := "e" + strconv.Itoa(i)
		t := time.Now()
		if _, err := q.type_("echo " + tok + "\r"); err != nil {
			return nil, err
		}
		if _, err := q.readUntil(tok + "\r\ntiny> "); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t))
	}
	return ds, nil
}

// rawFloodWith floods a raw QEMU read by rd.
func rawFloodWith(rd reader, size int) (float64, error) {
	q, err := startRawWith(rd)
	if err != nil {
		return 0, err
	}
	defer q.close()
	if _, err := q.readUntil("tiny> "); err != nil {
		return 0, err
	}
	cmd := "flood " + strconv.Itoa(size)
	t := time.Now()
	q.type_(cmd + "\r")
	out, err := q.readUntil("flood done " + strconv.Itoa(size) + "\r\n")
	if err != nil {
		return 0, err
	}
	el := time.Since(t)
	if err := checkFlood(out, cmd, size); err != nil {
		return 0, fmt.Errorf("raw (%s): %w", rd.name, err)
	}
	return float64(size) / el.Seconds(), nil
}

// execCmd is a QEMU the bench started, killed by its own handle.
type execCmd struct{ c *exec.Cmd }

func startExec(bin string, args ...string) (*execCmd, error) {
	c := exec.Command(bin, args...)
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return &execCmd{c}, nil
}

func (e *execCmd) kill() {
	e.c.Process.Kill()
	e.c.Wait()
}
