// Package tools is the MCP face of qemu-mcp: it registers the qemu_*,
// serial_* and qmp_* tools on an MCP server and maps each call onto the
// domain packages: a call names its guest (instance), whose whole life is
// package instance's business.
package tools

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/tools/kit"
)

// Config is what the tools need from the process that hosts them.
type Config struct {
	// Guests makes the manager of the server's guests, once: after
	// initialize is answered, or at the first use before that.
	Guests func() (*instance.Manager, error)
	// Version is reported by server_info and the MCP handshake; Revision
	// is the VCS revision of the build.
	Version  string
	Revision string
	// WholeText gives every client every value in a result's text
	// content, also the clients that read the structured content (see
	// readers).
	WholeText bool
	Logger    *slog.Logger
}

// ErrClosed is returned by calls made after shutdown began.
var ErrClosed = errors.New("qemu-mcp is shutting down: no new work is accepted")

// Server adapts MCP tool calls to the guests of an instance.Manager:
// argument decoding, results and errors. Everything a guest's life needs is
// in package instance.
type Server struct {
	cfg      Config
	log      *slog.Logger
	mgr      *instance.Manager
	mgrErr   error
	mgrReady chan struct{} // closed once mgr or mgrErr is set
	// mgrStarted is closed when startManager first runs.
	mgrStarted   chan struct{}
	startManager func()

	// base ends when shutdown begins, which ends every call in flight.
	base    context.Context
	cancel  context.CancelFunc
	closing atomic.Bool

	started time.Time

	// cursors is where each session's next serial_read of each guest
	// starts: sessions over HTTP share the guests, not their reading.
	cursorMu sync.Mutex
	cursors  map[cursorKey]int64
	// noted is the transcript news each session was told (see
	// transcriptNote).
	noted map[cursorKey]int

	// calls holds the reader of each call in progress, by its request:
	// the SDK decodes the client's info from the request's metadata at
	// each ask (20 µs), and a call asks several times.
	calls sync.Map // *mcp.CallToolRequest -> reader
	// inputs are the tools' input schemas, for the limits middleware.
	inputsMu sync.Mutex
	inputs   map[string]*kit.Input
}

type cursorKey struct {
	session *mcp.ServerSession
	guest   *instance.Instance
}

// cursor is where the session's next read of the guest starts.
func (s *Server) cursor(req *mcp.CallToolRequest, in *instance.Instance) int64 {
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	return s.cursors[cursorKey{session(req), in}]
}

// setCursor records where the session's read or wait of the guest ended.
func (s *Server) setCursor(req *mcp.CallToolRequest, in *instance.Instance, c int64) {
	sess := session(req)
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	if s.cursors == nil {
		s.cursors = map[cursorKey]int64{}
	}
	k := cursorKey{sess, in}
	if _, seen := s.cursors[k]; !seen && sess != nil {
		// Forget the session's cursors when it ends.
		go func() {
			sess.Wait()
			s.cursorMu.Lock()
			defer s.cursorMu.Unlock()
			for k := range s.cursors {
				if k.session == sess {
					delete(s.cursors, k)
					delete(s.noted, k)
				}
			}
		}()
	}
	s.cursors[k] = c
}

func session(req *mcp.CallToolRequest) *mcp.ServerSession {
	if req == nil {
		return nil
	}
	return req.Session
}

// New returns the tool state. Call Close when done.
func New(cfg Config) (*Server, error) {
	if cfg.Guests == nil {
		return nil, errors.New("tools: Config.Guests is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, log: cfg.Logger, base: ctx, cancel: cancel, started: time.Now(),
		mgrReady: make(chan struct{}), mgrStarted: make(chan struct{})}
	// The manager (this server's record, its directories) is made once
	// initialize is answered, or at the first use before that; every use
	// waits for it, and Ready reports its failure.
	s.startManager = sync.OnceFunc(func() {
		close(s.mgrStarted)
		if s.closing.Load() {
			// Closed before any use: nothing to make, nothing to undo.
			s.mgrErr = ErrClosed
			close(s.mgrReady)
			return
		}
		go func() {
			defer close(s.mgrReady)
			s.mgr, s.mgrErr = cfg.Guests()
		}()
	})
	return s, nil
}

// Ready makes the server ready to boot guests if it is not yet, waits
// for it, and says why not if it cannot be (its runtime directory or
// record could not be made).
func (s *Server) Ready() error {
	s.startManager()
	<-s.mgrReady
	return s.mgrErr
}

// Started is closed once the server began to make itself ready (after
// answering initialize): Ready then only waits.
func (s *Server) Started() <-chan struct{} { return s.mgrStarted }

// manager is the guests' manager, once it is made.
func (s *Server) manager() (*instance.Manager, error) {
	s.startManager()
	<-s.mgrReady
	return s.mgr, s.mgrErr
}

// Close refuses new calls, ends the ones in flight, stops every guest and
// removes its files and the server's record. Safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	s.closing.Store(true)
	s.cancel()
	m, err := s.manager() // never made if closing came first
	if err != nil {
		return nil
	}
	return m.Close(ctx)
}

// Target names the guest a call is for.
type Target struct {
	Instance string `json:"instance,omitempty" default:"default" jsonschema:"guest name"`
}

func (t Target) name() string {
	if t.Instance == "" {
		return instance.DefaultName
	}
	return t.Instance
}

// instance returns the named guest, in whatever state it is.
func (s *Server) instance(t Target) (*instance.Instance, error) {
	m, err := s.manager()
	if err != nil {
		return nil, err
	}
	return m.Get(t.name())
}

// running returns the named guest and its QEMU if it runs, or an error that
// tells the agent what to do.
func (s *Server) running(t Target) (*instance.Instance, *qemu.Process, error) {
	in, err := s.instance(t)
	if err != nil {
		return nil, nil, err
	}
	m, err := in.Running()
	if err != nil {
		return nil, nil, err
	}
	return in, m, nil
}

// NewMCPServer returns an MCP server with every tool registered.
func (s *Server) NewMCPServer() *mcp.Server {
	ms := mcp.NewServer(&mcp.Implementation{Name: "qemu-mcp", Version: s.cfg.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       s.log,
		// The tools and resources are added once, while initialize is
		// answered (below), and never change: no list_changed. No MCP
		// logging for any client: the server logs to stderr, where the
		// protocol now puts a stdio server's logs, and has no log message
		// to send; the SDK still answers an older client's setLevel.
		Capabilities: &mcp.ServerCapabilities{
			Tools:     &mcp.ToolCapabilities{},
			Resources: &mcp.ResourceCapabilities{},
		},
	})
	s.inputsMu.Lock()
	s.inputs = map[string]*kit.Input{}
	s.inputsMu.Unlock()
	// Adding a tool costs the SDK a parse of its schema, 30 of them as
	// long as the rest of start-up: they are added in the background,
	// side by side, and whatever lists or calls them waits until they are.
	// That work, and the manager's, begins once initialize is answered
	// (or at the first request that is not initialize), so that it does
	// not compete with the answer for the CPU.
	ready := make(chan struct{})
	start := sync.OnceFunc(func() {
		s.startManager()
		go func() {
			defer close(ready)
			s.registerAll(ms)
		}()
	})
	ms.AddReceivingMiddleware(gate(ready, start), s.limits)
	return ms
}

// registerAll adds every tool and resource, the groups side by side.
func (s *Server) registerAll(ms *mcp.Server) {
	var wg sync.WaitGroup
	for _, reg := range []func(*mcp.Server){s.registerBoot, s.registerSerial, s.registerControl, s.registerDisplay, s.registerInfo, s.registerExec, s.registerDebug, s.registerSnapshots, s.registerRecordings, s.registerNetwork, s.registerResources} {
		wg.Go(func() { reg(ms) })
	}
	wg.Wait()
}

// gate starts the registration (start) after initialize, and holds
// requests for tools and resources until it is done (ready is closed).
func gate(ready <-chan struct{}, start func()) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				defer start()
				return next(ctx, method, req)
			}
			start()
			if strings.HasPrefix(method, "tools/") || strings.HasPrefix(method, "resources/") {
				select {
				case <-ready:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return next(ctx, method, req)
		}
	}
}

const instructions = `qemu-mcp boots a riscv64, aarch64 (virt board) or x86_64 (q35) guest under QEMU and drives it.
Boot with qemu_boot (without kernel it boots a built-in tiny kernel whose prompt is "tiny> "),
talk to the serial console with serial_send / serial_read (output is kept and addressed by cursors,
nothing is lost between calls), use qmp_command for the QEMU monitor, qemu_status to look, and
qemu_shutdown to stop. Several guests run side by side under different instance names (every
guest tool takes instance, default "default"; qemu_list lists them). Timeouts are seconds.`

func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
