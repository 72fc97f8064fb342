// Package tools is the MCP face of qemu-mcp: it registers the qemu_*,
// serial_* and qmp_* tools on an MCP server and maps each call onto the
// domain packages, one QEMU instance per server.
package tools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/boundary"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// Config is what the tools need from the process that hosts them.
type Config struct {
	// RuntimeDir holds the FIFOs and the QMP socket; it must exist and be
	// private (see internal/runtimedir).
	RuntimeDir string
	// WorkDir is the default project_root.
	WorkDir string
	// BuiltinKernel is the image booted when qemu_boot names no kernel.
	BuiltinKernel []byte
	// QEMUBinary overrides qemu-system-riscv64.
	QEMUBinary string
	// Version is reported by server_info and the MCP handshake; Revision
	// is the VCS revision of the build.
	Version  string
	Revision string
	// Transport ("stdio" or "http") and Address go into the registry record.
	Transport string
	Address   string
	// LockFile overrides the repository lock path (see lock.Path).
	LockFile string
	// RingSize is the in-memory serial buffer; 0 means serial's default.
	// Older output is read back from the transcript.
	RingSize int
	// AllowHostAccess lifts the boundary that keeps qmp_command and
	// extra_args inside the guest (see internal/boundary).
	AllowHostAccess bool
	Logger          *slog.Logger
}

// ErrClosed is returned by calls made after shutdown began.
var ErrClosed = errors.New("qemu-mcp is shutting down: no new work is accepted")

// Server holds the state the tools share: the one machine and the read cursor.
type Server struct {
	cfg Config
	log *slog.Logger
	pid int

	// base is cancelled when shutdown begins, which cancels every call.
	base   context.Context
	cancel context.CancelFunc

	// gate admits calls until shutdown begins; calls hold it for reading.
	gate     sync.RWMutex
	closing  bool
	inflight sync.WaitGroup

	// life serialises boot and shutdown so two boots cannot race.
	life sync.Mutex

	started time.Time
	// qemuVersion is asked of the emulator on first use, then kept.
	qemuVersion func() string

	mu         sync.Mutex // guards the fields below
	machine    *qemu.Machine
	lk         *lock.Lock // the repository lock held for machine
	rec        registry.Record
	recRemoved bool
	boots      int
	attempts   int
	shots      int
	readCursor int64
	prompt     string           // the boot profile's prompt: serial_send's default wait_for
	panics     []*regexp.Regexp // the boot profile's panic patterns, added to the defaults
	net        netState
}

// New returns the tool state. Call Close when done.
func New(cfg Config) (*Server, error) {
	if cfg.RuntimeDir == "" {
		return nil, errors.New("tools: RuntimeDir is required")
	}
	if cfg.WorkDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("tools: working directory: %w", err)
		}
		cfg.WorkDir = wd
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The captures directory exists from the start: QMP commands may only
	// write there, and the boundary resolves its real path.
	if err := os.MkdirAll(runtimedir.CapturesDir(cfg.RuntimeDir), 0o700); err != nil {
		return nil, fmt.Errorf("tools: captures directory: %w", err)
	}
	if cfg.Transport == "" {
		cfg.Transport = registry.TransportStdio
	}
	// The record is what lets the next server reap after us if we are
	// killed, so a server that cannot write it does not start.
	rec, err := registry.Self(cfg.Transport, cfg.Address, cfg.Version)
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	if err := registry.Write(cfg.RuntimeDir, rec); err != nil {
		return nil, fmt.Errorf("tools: write registry record: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bin := cfg.QEMUBinary
	return &Server{cfg: cfg, log: cfg.Logger, pid: os.Getpid(), base: ctx, cancel: cancel, rec: rec, started: time.Now(),
		qemuVersion: sync.OnceValue(func() string { return qemuVersion(bin) })}, nil
}

// policy is the host-access boundary for QMP and extra_args.
func (s *Server) policy() boundary.Policy {
	return boundary.Policy{AllowHostAccess: s.cfg.AllowHostAccess, CapturesDir: runtimedir.CapturesDir(s.cfg.RuntimeDir)}
}

// enter admits one call, or refuses once shutdown has begun, so Close never
// races a call that is about to start work (the TOCTOU of seed 003). The
// returned context is cancelled by the call's own context or by shutdown.
func (s *Server) enter(ctx context.Context) (context.Context, func(), error) {
	s.gate.RLock()
	if s.closing {
		s.gate.RUnlock()
		return nil, nil, ErrClosed
	}
	s.inflight.Add(1)
	s.gate.RUnlock()
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	return cctx, func() {
		stop()
		cancel()
		s.inflight.Done()
	}, nil
}

// Close stops admitting calls, cancels the ones in flight and waits for them,
// then stops QEMU and removes its files. Safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	s.gate.Lock()
	s.closing = true
	s.gate.Unlock()
	s.cancel()
	waited := make(chan struct{})
	go func() { s.inflight.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		s.log.Warn("tool calls still running at shutdown; stopping qemu anyway")
	}
	s.life.Lock()
	defer s.life.Unlock()
	err := s.stopMachine(ctx, qemu.Quit, 5*time.Second)
	if rerr := s.removeRecord(); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove registry record: %w", rerr))
	}
	return err
}

// stopMachine shuts the current machine down and removes its files.
// s.life must be held.
func (s *Server) stopMachine(ctx context.Context, how qemu.Method, wait time.Duration) error {
	s.mu.Lock()
	m, l, dev := s.machine, s.lk, s.net.dev
	s.mu.Unlock()
	if m == nil {
		return nil
	}
	_, err := m.Shutdown(ctx, how, wait)
	err = errors.Join(err, m.Close())
	s.released(m, l, dev)
	return err
}

// current returns the machine of the last boot, running or not.
func (s *Server) current() *qemu.Machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.machine
}

// running returns the machine if QEMU is still running, or an error that
// tells the agent what to do.
func (s *Server) running() (*qemu.Machine, error) {
	m := s.current()
	if m == nil {
		return nil, errors.New("no guest is running: call qemu_boot first")
	}
	if exit, ok := m.Exited(); ok {
		return nil, fmt.Errorf("the guest has exited (%s): call qemu_boot to start it again; serial_read still returns its output", exit)
	}
	return m, nil
}

// NewMCPServer returns an MCP server with every tool registered.
func (s *Server) NewMCPServer() *mcp.Server {
	ms := mcp.NewServer(&mcp.Implementation{Name: "qemu-mcp", Version: s.cfg.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       s.log,
	})
	s.register(ms)
	s.registerNetwork(ms)
	s.registerResources(ms)
	return ms
}

const instructions = `qemu-mcp boots a riscv64 guest under qemu-system-riscv64 and drives it.
Boot with qemu_boot (without kernel it boots a built-in tiny kernel whose prompt is "tiny> "),
talk to the serial console with serial_send / serial_read (output is kept and addressed by cursors,
nothing is lost between calls), use qmp_command for the QEMU monitor, qemu_status to look, and
qemu_shutdown to stop. Timeouts are seconds.`

// handle adapts a typed handler to the admission gate, so every tool gets
// the same shutdown behaviour.
func handle[In, Out any](s *Server, h func(context.Context, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		cctx, leave, err := s.enter(ctx)
		if err != nil {
			return nil, zero, err
		}
		defer leave()
		return h(cctx, req, in)
	}
}

func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
