// Package qemu builds QEMU command lines and supervises one QEMU process with
// its serial console and QMP connection: started paused, attached, resumed,
// tied to the server's life, and torn down completely on every path.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/qmp"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// Paths are the server-managed files of one machine.
type Paths struct {
	SerialIn  string `json:"serial_in"`
	SerialOut string `json:"serial_out"`
	QMPSocket string `json:"qmp_socket"`
	GDBSocket string `json:"gdb_socket,omitempty"`
	// GDBAddress is the gdbstub's loopback TCP address for its owner's
	// gdb, when the server was asked to serve it there too.
	GDBAddress string `json:"gdb_address,omitempty"`
	// VNCSocket is the VNC server's unix socket, with VNC.
	VNCSocket string `json:"vnc_socket,omitempty"`
}

// Exit describes how QEMU ended.
type Exit struct {
	// Code is the exit status; for a signal it is 128+signal, as a shell
	// reports it.
	Code int `json:"exit_status"`
	// Signal names the signal that killed QEMU, if one did.
	Signal string `json:"signal,omitempty"`
	// At is when the exit was noticed.
	At time.Time `json:"at"`
}

func (e Exit) String() string {
	if e.Signal != "" {
		return "killed by " + e.Signal
	}
	return "exited with status " + strconv.Itoa(e.Code)
}

// Process is one supervised QEMU process: the machine a guest runs on.
type Process struct {
	cfg     Config
	argv    []string
	paths   Paths
	ident   proc.Identity
	started time.Time
	log     *slog.Logger

	cmd     *exec.Cmd
	stderr  *Tail
	console *serial.Console
	// borrowed says console belongs to the caller (Runtime.Console).
	borrowed bool
	mon      *qmp.Monitor

	done chan struct{} // closed once QEMU exited and its output is drained
	exit Exit

	closeOnce sync.Once
	cleanups  []func() error
}

// Runtime says where a machine's FIFOs and socket go.
type Runtime struct {
	// SerialBase is the serial FIFOs' path without ".in"/".out"; QMPSocket
	// the QMP socket's path. Both belong in a private directory, and
	// neither may exist (see package names for what the server calls them).
	SerialBase string
	QMPSocket  string
	// GDBSocket, if set, is where QEMU's gdbstub listens (a unix socket,
	// the server's like the QMP socket); empty means no gdbstub.
	GDBSocket string
	// GDBTCP, if set with GDBSocket, also serves the gdbstub on this
	// loopback TCP address ("127.0.0.1:0" picks a free port), to the
	// server's own user only (see gdbProxy), so that a person's gdb can
	// attach with "target remote 127.0.0.1:PORT".
	GDBTCP string
	// VNCSocket is where the VNC server listens, with Config.VNC: a unix
	// socket in the private runtime directory, which QEMU makes. It must
	// not exist.
	VNCSocket string
	// Logger receives supervision logs; nil means slog.Default().
	Logger *slog.Logger
	// ConnectTimeout bounds the QMP connection at start; zero means 10s.
	ConnectTimeout time.Duration
	// Transcript, if set, is the file the complete serial output is
	// appended to (see serial.WithTranscript).
	Transcript string
	// RingSize is the in-memory serial buffer; zero means serial's default.
	RingSize int
	// Console, if set, is a console that outlives this machine (a guest
	// restored into a new QEMU keeps its output and cursors): the machine
	// uses its FIFOs and neither finishes nor closes it. SerialBase,
	// Transcript and RingSize are then ignored.
	Console *serial.Console
	// BeforeCont, if set, runs once QMP is connected and before the guest
	// is resumed; an error fails the start.
	BeforeCont func(ctx context.Context, m *Process) error
	// Paused leaves the guest stopped where it starts (a replay is halted
	// at its first instruction until the debugger runs it).
	Paused bool
}

// maxSocketPath is sun_path's size less its terminating NUL.
const maxSocketPath = 107

// qmpFD is the descriptor QEMU finds its listening QMP socket on: the first
// of exec.Cmd.ExtraFiles.
const qmpFD = 3

// Start creates the serial FIFOs, starts QEMU paused, connects QMP and
// resumes the guest, so not a byte of its output can be missed. On any
// failure everything already set up is undone before returning. Start
// closes cfg.Files, whatever happens.
func Start(ctx context.Context, rt Runtime, cfg Config) (*Process, error) {
	// QEMU holds its own copies once it runs; the server needs none.
	defer CloseFiles(cfg.Files)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin, err := cfg.resolveBinary()
	if err != nil {
		return nil, err
	}
	log := rt.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &Process{cfg: cfg, log: log, done: make(chan struct{}), stderr: NewTail(64 << 10)}
	if err := m.start(ctx, rt, cfg, bin); err != nil {
		// A partial start (QEMU running, QMP not connected) is undone
		// completely: process, FIFOs and socket.
		if cerr := m.Close(); cerr != nil {
			log.Warn("cleanup after failed start", "err", cerr)
		}
		return nil, err
	}
	return m, nil
}

// CloseFiles closes the host files of a configuration (Config.Files).
func CloseFiles(files map[string]*os.File) error {
	var errs []error
	for _, f := range files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

func (m *Process) start(ctx context.Context, rt Runtime, cfg Config, bin string) (err error) {
	log := m.log
	opts := []serial.Option{serial.WithLogger(log), serial.WithTranscript(rt.Transcript)}
	if rt.RingSize > 0 {
		opts = append(opts, serial.WithRingSize(rt.RingSize))
	}
	sock := rt.QMPSocket
	if len(sock) > maxSocketPath {
		return fmt.Errorf("qmp socket path %s is %d bytes, more than a unix socket allows (%d): use a shorter runtime directory (QEMU_MCP_RUNTIME_DIR)", sock, len(sock), maxSocketPath)
	}
	if rt.Console != nil {
		m.console, m.borrowed = rt.Console, true
	} else {
		m.console, err = serial.Create(rt.SerialBase, opts...)
		if err != nil {
			return err
		}
		m.addCleanup(m.console.Close)
	}

	// The server listens on the QMP socket and hands QEMU the listening
	// descriptor: the connect below then succeeds at once and the greeting
	// comes as soon as QEMU's main loop runs, where polling for a socket
	// QEMU makes itself costs up to one back-off step per boot (tens of
	// milliseconds when many guests start at once). Binding also fails
	// on anything already at the path, which is never taken over.
	qmpFile, err := m.listen("qmp", sock)
	if err != nil {
		return err
	}
	defer qmpFile.Close() // QEMU has its own copy once started
	m.paths = Paths{SerialIn: m.console.InPath(), SerialOut: m.console.OutPath(), QMPSocket: sock}
	var gdbFile *os.File
	if rt.GDBSocket != "" {
		if len(rt.GDBSocket) > maxSocketPath {
			return fmt.Errorf("gdb socket path %s is %d bytes, more than a unix socket allows (%d): use a shorter runtime directory (QEMU_MCP_RUNTIME_DIR)", rt.GDBSocket, len(rt.GDBSocket), maxSocketPath)
		}
		if gdbFile, err = m.listen("gdb", rt.GDBSocket); err != nil {
			return err
		}
		defer gdbFile.Close()
		m.paths.GDBSocket = rt.GDBSocket
		if rt.GDBTCP != "" {
			// Only the server listens on TCP, for its own user.
			p, err := startGDBProxy(rt.GDBTCP, rt.GDBSocket, log)
			if err != nil {
				return err
			}
			m.addCleanup(p.Close)
			m.paths.GDBAddress = p.Addr()
		}
	}

	if cfg.VNC {
		switch {
		case rt.VNCSocket == "":
			return errors.New("vnc needs a socket path (Runtime.VNCSocket)")
		case len(rt.VNCSocket) > maxSocketPath:
			return fmt.Errorf("vnc socket path %s is %d bytes, more than a unix socket allows (%d): use a shorter runtime directory (QEMU_MCP_RUNTIME_DIR)", rt.VNCSocket, len(rt.VNCSocket), maxSocketPath)
		}
		if _, err := os.Lstat(rt.VNCSocket); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("vnc socket %s already exists: a previous server left it behind; remove it or let the reaper run", rt.VNCSocket)
		}
		cfg.vncSocket = rt.VNCSocket
		m.paths.VNCSocket = rt.VNCSocket
		// QEMU makes the socket; it goes with the machine.
		m.addCleanup(func() error { return removeSocket(rt.VNCSocket) })
	}

	// Every cleanup is registered before QEMU starts: once it runs, the
	// supervisor may run them at any moment.
	m.mon = qmp.New(sock, qmp.WithLogger(log))
	m.addCleanup(m.mon.Disconnect)

	// QMP is descriptor 3; the host files follow, in the order of their
	// paths, so the command line is the same for the same files.
	extra := []*os.File{qmpFile}
	if gdbFile != nil {
		cfg.gdbFD = qmpFD + len(extra)
		extra = append(extra, gdbFile)
	}
	cfg.fds = make(map[string]int, len(cfg.Files))
	for _, p := range slices.Sorted(maps.Keys(cfg.Files)) {
		cfg.fds[p] = qmpFD + len(extra)
		extra = append(extra, cfg.Files[p])
	}
	m.cfg.fds, m.cfg.vncSocket = cfg.fds, cfg.vncSocket
	m.argv = cfg.Argv(m.console.Base(), qmpFD)
	m.argv[0] = bin
	cmd := exec.Command(bin, m.argv[1:]...)
	cmd.ExtraFiles = extra
	cmd.Stdout = m.stderr
	cmd.Stderr = m.stderr
	if err := StartProcess(cmd); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	m.cmd = cmd
	m.started = time.Now()
	info, err := proc.Stat(cmd.Process.Pid)
	if err != nil {
		// The child cannot have been reaped yet, so this is unexpected;
		// kill it through the handle we hold rather than by PID.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("read start time of qemu %d: %w", cmd.Process.Pid, err)
	}
	m.ident = proc.Identity{PID: info.PID, StartTime: info.StartTime}
	log.Info("qemu started", "pid", m.ident.PID, "argv", strings.Join(m.argv, " "))
	go m.supervise()

	connectTimeout := rt.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = 10 * time.Second
	}
	// A QEMU that dies at start (bad option) must fail the connect at
	// once, not after the timeout.
	cctx, cancel := m.whileAlive(ctx, connectTimeout)
	defer cancel()
	if err := m.mon.ConnectContext(cctx); err != nil {
		return m.startError("connect to QMP", err)
	}
	// What runs before the guest does (a snapshot's load, a capture's
	// start) has a minute, not what is left of the connect's bound: a
	// large state loads for seconds on a busy host. A QEMU that dies
	// under it still ends it at once.
	rctx, rcancel := m.whileAlive(ctx, time.Minute)
	defer rcancel()
	if rt.BeforeCont != nil {
		if err := rt.BeforeCont(rctx, m); err != nil {
			return m.startError("prepare the guest", err)
		}
	}
	if rt.Paused {
		return nil
	}
	if _, err := m.mon.Execute(rctx, "cont", nil); err != nil {
		return m.startError("resume guest", err)
	}
	return nil
}

// whileAlive is ctx bounded by d that also ends as soon as QEMU exits.
func (m *Process) whileAlive(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithTimeout(ctx, d)
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	return wctx, cancel
}

// startError explains a failed start with what QEMU itself said, which is
// usually the real reason (a bad option, a missing file).
func (m *Process) startError(step string, err error) error {
	// QEMU that rejects its command line may open the QMP socket first and
	// die an instant later: give it a moment so the error can say why.
	select {
	case <-m.done:
		return fmt.Errorf("qemu %s: %s: %s", m.exit, step, m.qemuSaid())
	case <-time.After(time.Second):
	}
	if said := m.qemuSaid(); said != "(nothing)" {
		return fmt.Errorf("%s: %w; qemu said: %s", step, err, said)
	}
	return fmt.Errorf("%s: %w", step, err)
}

func (m *Process) qemuSaid() string {
	s := strings.TrimSpace(m.stderr.String())
	if s == "" {
		return "(nothing)"
	}
	return s
}

// listen makes the server's listening socket at path, to hand QEMU as a
// descriptor; it is removed with the machine. Binding fails on anything
// already at the path, which is never taken over.
func (m *Process) listen(what, path string) (*os.File, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%s socket %s already exists: a previous server left it behind; remove it or let the reaper run", what, path)
		}
		return nil, fmt.Errorf("listen on %s socket: %w", what, err)
	}
	ln.SetUnlinkOnClose(false)
	m.addCleanup(func() error { return removeSocket(path) })
	f, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("%s socket descriptor: %w", what, err)
	}
	return f, nil
}

// CheckLoopback accepts a loopback host:port for the gdbstub.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("gdb tcp address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("gdb tcp address %q is not loopback: the gdbstub gives whoever connects the whole guest, so only 127.0.0.1 or [::1] is allowed", addr)
	}
	return nil
}

// supervise waits for QEMU to exit. The FIFO never reports EOF (the server
// holds a write end), so the process is the only reliable exit signal.
func (m *Process) supervise() {
	err := m.cmd.Wait()
	exit := Exit{At: time.Now()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			exit.Code = 128 + int(ws.Signal())
			exit.Signal = unix.SignalName(ws.Signal())
		} else {
			exit.Code = ee.ExitCode()
		}
	} else if err != nil {
		exit.Code = -1
		m.log.Warn("wait for qemu", "pid", m.ident.PID, "err", err)
	}
	m.exit = exit
	// QEMU's last QMP events (SHUTDOWN) may still be unread on the
	// socket: let the reader reach its end before the monitor is torn
	// down with the files.
	if m.mon.Greeting().Version.QEMU.Major > 0 {
		t := time.NewTimer(time.Second)
		select {
		case <-m.mon.Done():
		case <-t.C:
		}
		t.Stop()
	}
	// Whatever the guest printed last is still in the pipe: keep it. A
	// borrowed console goes on draining for the next QEMU.
	if !m.borrowed {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m.console.Finish(ctx)
		cancel()
	}
	if said := strings.TrimSpace(m.stderr.String()); said != "" && exit.Code != 0 {
		m.log.Warn("qemu exited", "pid", m.ident.PID, "status", exit.String(), "stderr", said)
	} else {
		m.log.Info("qemu exited", "pid", m.ident.PID, "status", exit.String())
	}
	// A guest that powered itself off leaves nothing to talk to: remove the
	// FIFOs and the socket before anyone can observe the exit, so "exited"
	// always means "and cleaned up". The buffer stays readable.
	if err := m.removeFiles(); err != nil {
		m.log.Warn("cleanup after qemu exit", "err", err)
	}
	close(m.done)
}

func (m *Process) addCleanup(f func() error) { m.cleanups = append(m.cleanups, f) }

// Config is the configuration the machine was started with.
func (m *Process) Config() Config { return m.cfg }

// PID is QEMU's process ID.
func (m *Process) PID() int { return m.ident.PID }

// Identity is QEMU's PID and start time, for records that outlive us.
func (m *Process) Identity() proc.Identity { return m.ident }

// Argv is the exact command line QEMU was started with.
func (m *Process) Argv() []string { return append([]string(nil), m.argv...) }

// Paths are the FIFOs and socket in use.
func (m *Process) Paths() Paths { return m.paths }

// File is a host file QEMU got as an inherited descriptor: the command line
// names it /proc/self/fd/FD.
type File struct {
	FD   int    `json:"fd"`
	Path string `json:"path"`
}

// Files lists the host files QEMU got as descriptors, by descriptor.
func (m *Process) Files() []File {
	out := make([]File, 0, len(m.cfg.fds))
	for p, fd := range m.cfg.fds {
		out = append(out, File{FD: fd, Path: p})
	}
	slices.SortFunc(out, func(a, b File) int { return a.FD - b.FD })
	return out
}

// Started is when QEMU was started.
func (m *Process) Started() time.Time { return m.started }

// Console is the serial console.
func (m *Process) Console() *serial.Console { return m.console }

// Monitor is the QMP connection.
func (m *Process) Monitor() *qmp.Monitor { return m.mon }

// Version is QEMU's version, "7.2.22", as it announced on connect: asked
// once per machine, and free to ask again.
func (m *Process) Version() string {
	v := m.mon.Greeting().Version.QEMU
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

// Done is closed when QEMU has exited and its last output is in the buffer.
func (m *Process) Done() <-chan struct{} { return m.done }

// Exited reports whether QEMU has exited, and how.
func (m *Process) Exited() (Exit, bool) {
	select {
	case <-m.done:
		return m.exit, true
	default:
		return Exit{}, false
	}
}

// Stderr is the tail of what QEMU printed on its own stdout and stderr.
func (m *Process) Stderr() string { return m.stderr.String() }

// Method says how Shutdown asks QEMU to stop before it resorts to signals.
type Method string

// The ways to ask.
const (
	// Quit asks QEMU to exit now (QMP quit); disk images are flushed.
	Quit Method = "quit"
	// Powerdown asks the guest to power off (QMP system_powerdown), which
	// only works for guests that handle the power button.
	Powerdown Method = "powerdown"
	// Kill sends SIGKILL at once.
	Kill Method = "kill"
)

// Ending says how a shutdown ended.
type Ending struct {
	// How is the step that stopped QEMU: "already-exited", "powerdown",
	// "quit", "sigterm" or "sigkill".
	How  string `json:"how"`
	Exit Exit   `json:"exit"`
}

// Shutdown stops QEMU, politest first: the chosen method, then SIGTERM,
// then SIGKILL, each to the exact process started, verified by start time.
// wait bounds the polite step; the signal steps wait up to two seconds each.
// It does not remove files: Close does.
func (m *Process) Shutdown(ctx context.Context, method Method, wait time.Duration) (Ending, error) {
	if exit, ok := m.Exited(); ok {
		return Ending{How: "already-exited", Exit: exit}, nil
	}
	if wait <= 0 {
		wait = 10 * time.Second
	}
	const signalWait = 2 * time.Second
	type step struct {
		how  string
		do   func() error
		wait time.Duration
	}
	qmpStep := func(name string) func() error {
		return func() error {
			qctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			_, err := m.mon.Execute(qctx, name, nil)
			return err
		}
	}
	var steps []step
	switch method {
	case Powerdown:
		steps = append(steps, step{"powerdown", qmpStep("system_powerdown"), wait}, step{"quit", qmpStep("quit"), signalWait})
	case Quit, "":
		steps = append(steps, step{"quit", qmpStep("quit"), wait})
	case Kill:
	default:
		return Ending{}, fmt.Errorf("shutdown method %q: want quit, powerdown or kill", method)
	}
	if method != Kill {
		steps = append(steps, step{"sigterm", func() error { return m.signal(unix.SIGTERM) }, signalWait})
	}
	steps = append(steps, step{"sigkill", func() error { return m.signal(unix.SIGKILL) }, signalWait})
	for _, s := range steps {
		if err := s.do(); err != nil {
			m.log.Debug("shutdown step failed", "step", s.how, "err", err)
		}
		t := time.NewTimer(s.wait)
		select {
		case <-m.done:
			t.Stop()
			return Ending{How: s.how, Exit: m.exit}, nil
		case <-ctx.Done():
			t.Stop()
			return Ending{}, fmt.Errorf("shutdown of qemu %d: %w", m.ident.PID, ctx.Err())
		case <-t.C:
		}
	}
	return Ending{}, fmt.Errorf("qemu %d did not exit after SIGKILL", m.ident.PID)
}

func (m *Process) signal(sig unix.Signal) error {
	err := proc.Signal(m.ident, sig)
	if errors.Is(err, proc.ErrNotFound) {
		return nil
	}
	return err
}

// Close kills QEMU if it still runs, waits for it, and removes the FIFOs and
// the socket. Files are removed once; later calls return nil.
func (m *Process) Close() error {
	var errs []error
	if m.cmd != nil {
		if _, exited := m.Exited(); !exited {
			if err := m.signal(unix.SIGKILL); err != nil {
				errs = append(errs, err)
			}
			select {
			case <-m.done:
			case <-time.After(5 * time.Second):
				errs = append(errs, fmt.Errorf("qemu %d did not exit after SIGKILL", m.ident.PID))
			}
		}
	}
	return errors.Join(append(errs, m.removeFiles())...)
}

// removeFiles runs the cleanups once, newest first (firecracker's model:
// each step undoes one step of start).
func (m *Process) removeFiles() error {
	var errs []error
	m.closeOnce.Do(func() {
		for i := len(m.cleanups) - 1; i >= 0; i-- {
			if err := m.cleanups[i](); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// removeSocket removes path only if it is a socket: never a file someone
// put there, never through a symlink.
func removeSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("remove socket: %s is not a socket (%v): left alone", path, fi.Mode().Type())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove socket %s: %w", path, err)
	}
	return nil
}
