// Command qemu-mcp is an MCP server (stdio) that boots and drives a riscv64
// QEMU guest. It only wires the packages together: flags, logging, the
// runtime directory, signals, and the order of shutdown.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	qemumcp "github.com/qemu-mcp/qemu-mcp"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/rpcframe"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/selftest"
	"github.com/qemu-mcp/qemu-mcp/settings"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3").
var version = "dev"

func main() {
	tuneGC()
	os.Exit(run(os.Args[1:], os.Stderr))
}

// tuneGC sets the collector's target to 200 unless GOGC says otherwise. A
// trivial tool call allocates about 200 KB (gctrace) over a live heap of
// about a megabyte, so at the default of 100 the heap goal
// sits at the runtime's 4 MB floor and a stream of calls is collected
// every 15 or so: measured here, 200 takes a sixth off the server's CPU
// per call for 4 MB more heap at most. (Until the server stopped linking
// gopacket, its 5 MB of scanned globals raised the goal by as much.)
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(200)
	}
}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "doctor" {
		return doctorCmd(args[1:], os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "probe" {
		return probeCmd(args[1:], os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "profile" {
		return profileCmd(args[1:], os.Stdin, os.Stdout, stderr)
	}
	fs := newFlagSet("qemu-mcp", stderr,
		"usage: qemu-mcp [flags]\n       qemu-mcp doctor [--cleanup] [--terminate-orphans] [--json]\n       qemu-mcp probe [-qemu PATH] [--json]\n\nServes MCP over stdio. Flags:\n")
	var (
		selfTest    = fs.Bool("selftest", false, "boot the built-in tiny kernel through the real MCP path, check cleanup, and exit")
		showVersion = fs.Bool("version", false, "print the version and exit")
		logLevel    = fs.String("log-level", "warn", "log level on stderr: debug, info, warn, error (clients such as Claude Code show stderr as errors, so the default says only what is wrong)")
		httpAddr    = fs.String("http", "", "serve MCP streamable HTTP on this address (e.g. 127.0.0.1:8765) instead of stdio; on loopback only your own user's connections are served (the kernel tells who connected), unless -token-file")
		tokenFile   = fs.String("token-file", "", "file (mode 0600) holding the bearer token HTTP clients must send; required for a non-loopback -http address; on loopback it replaces the own-user check, so other users who have the token get in")
		sessionIdle = fs.Duration("http-session-timeout", 30*time.Minute, "close an HTTP session after this long without a request")
		allowHost   = fs.Bool("allow-host-access", false, "let qmp_command and extra_args reach outside the guest (host files, sockets, programs); off by default")
		maxInst     = fs.Int("max-instances", instance.DefaultMaxInstances, "most guests (instances) that run at once")
		maxKept     = fs.String("max-kept", "2G", "total size of kept transcripts, captures and screenshots in the state directory ("+kept.Env+"); the oldest go first")
		gdbTCP      = fs.String("gdb-tcp", "", "also serve the gdbstubs of guests booted with gdb: true on this loopback TCP address (127.0.0.1:0 for a free port each, shown as paths.gdb_address), for your own gdb while the server's debugger is idle; only your own user's connections reach the stub (the kernel tells who connected), other users' are closed")
		wholeText   = fs.Bool("whole-text", false, "put every value of a result in its text content for every client; by default the clients known to show their model the structured content (Claude Code, Codex, Copilot CLI) get a one-line summary as text")
		allowPaths  []string
		qemus       = map[string]string{}
	)
	fs.Func("qemu", "the QEMU binary of riscv64 guests, or `[ARCH=]PATH` of ARCH's (repeatable; default: each architecture's qemu-system-* from PATH)", func(v string) error {
		name, path, err := qemuFlag(v)
		if err == nil {
			qemus[name] = path
		}
		return err
	})
	fs.Func("allow-path", "let the tools read host files in `DIR` (repeatable; adds to "+hostpath.EnvAllowPaths+", colon-separated)", func(v string) error {
		allowPaths = append(allowPaths, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	allowed, err := hostpath.AllowPaths(append([]string{os.Getenv(hostpath.EnvAllowPaths)}, allowPaths...)...)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp: -allow-path: %v\n", err)
		return 2
	}
	keepCap, err := kept.ParseSize(*maxKept)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp: -max-kept: %v\n", err)
		return 2
	}
	if *gdbTCP != "" {
		if err := qemu.CheckLoopback(*gdbTCP); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp: -gdb-tcp: %v\n", err)
			return 2
		}
	}
	if *maxInst < 1 {
		fmt.Fprintf(stderr, "qemu-mcp: -max-instances %d: want at least 1\n", *maxInst)
		return 2
	}
	if *showVersion {
		fmt.Println(versionString())
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "qemu-mcp: -log-level %q: %v\n", *logLevel, err)
		return 2
	}
	// stdout carries the MCP protocol: logs go to stderr only.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	dir := runtimedir.Path()
	if err := runtimedir.Ensure(dir); err != nil {
		fmt.Fprintf(stderr, "qemu-mcp: %v\n", err)
		return 1
	}
	state := kept.Dir(dir)
	if err := kept.Ensure(state); err != nil {
		fmt.Fprintf(stderr, "qemu-mcp: %v\n", err)
		return 1
	}
	set := settings.Settings{
		Captures:   kept.Captures(state),
		KeepCap:    keepCap,
		RuntimeDir: dir,
		Platforms:  platforms(qemus),
		Version:    version,
		Transport:  "stdio",
		Logger:     log,

		AllowHostAccess: *allowHost,
		MaxInstances:    *maxInst,
		AllowPaths:      allowed,
		GDBTCP:          *gdbTCP,
	}
	cfg := tools.Config{Version: version, Revision: revision(), WholeText: *wholeText, Logger: log}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	// A client that closes our stdout must not kill us with SIGPIPE before
	// the guests are stopped: the write fails with EPIPE instead, and that
	// ends the session like stdin's EOF (see serveStdio).
	signal.Ignore(syscall.SIGPIPE)

	if *selfTest {
		if err := selftest.Run(ctx, os.Stdout, set, cfg); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp: selftest failed: %v\n", err)
			return 1
		}
		return 0
	}
	if *httpAddr != "" {
		return serveHTTP(ctx, set, cfg, *httpAddr, *tokenFile, *sessionIdle, log)
	}
	return serve(ctx, set, cfg, log)
}

func serve(ctx context.Context, set settings.Settings, cfg tools.Config, log *slog.Logger) int {
	srv, err := newServer(set, cfg)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchParent(cancel, log)
	watchStdout(cancel, log)
	// The server finishes setting up while it answers initialize; if it
	// cannot (its runtime directory), it ends as it would have at start.
	failed := make(chan error, 1)
	go func() {
		select {
		case <-srv.Started():
		case <-ctx.Done():
			return
		}
		if err := srv.Ready(); err != nil {
			failed <- err
			cancel(err)
		}
	}()

	log.Info("serving MCP on stdio", "version", versionString(), "pid", os.Getpid(), "runtime_dir", set.RuntimeDir)
	// Answers go out whole, one at a time; lines that are not JSON-RPC
	// messages are answered with errors and dropped, not handed to the
	// SDK, which would end the session.
	// The client's socket, if it is one, goes back to blocking mode.
	defer rpcframe.Restore()
	out := rpcframe.NewWriter(&endOnError{w: rpcframe.Stdout(), end: cancel})
	why := serveStdio(ctx, srv, rpcframe.Filter(rpcframe.Stdin(), out, 0), out)
	if cause := context.Cause(ctx); cause != nil {
		why = cause.Error()
	}
	log.Info("shutting down", "why", why)
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := srv.Close(cctx); err != nil {
		log.Error("cleanup", "err", err)
		return 1
	}
	select {
	case err := <-failed:
		log.Error("start", "err", err)
		return 1
	default:
	}
	return 0
}

// serveStdio serves one MCP session on in/out until the client closes in
// or ctx ends, and says which. It does not wait for the stdin reader on
// ctx: a blocking read of a pipe cannot be interrupted, and the process is
// about to exit anyway.
func serveStdio(ctx context.Context, srv *tools.Server, in io.ReadCloser, out io.WriteCloser) string {
	ss, err := srv.NewMCPServer().Connect(ctx, &mcp.IOTransport{Reader: in, Writer: out}, nil)
	if err != nil {
		return "connect: " + err.Error()
	}
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case err := <-ended:
		if err != nil && !errors.Is(err, io.EOF) {
			return "session ended: " + err.Error()
		}
		return "stdin closed"
	case <-ctx.Done():
		go ss.Close()
		return "cancelled"
	}
}

// endOnError is the server's stdout: the first failed write (the client
// closed its end) ends the server the way stdin's EOF does, since no answer
// can reach the client any more.
type endOnError struct {
	w    io.WriteCloser
	end  context.CancelCauseFunc
	once sync.Once
}

func (e *endOnError) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.once.Do(func() { e.end(fmt.Errorf("stdout closed: %w", err)) })
	}
	return n, err
}

func (e *endOnError) Close() error { return e.w.Close() }

// watchParent ends the server when the client that started it dies while
// stdin stays open (an inherited pipe can outlive the client). A pidfd on
// the parent becomes readable when it exits: no polling.
func watchParent(cancel context.CancelCauseFunc, log *slog.Logger) {
	ppid := os.Getppid()
	if ppid <= 1 {
		return
	}
	fd, err := unix.PidfdOpen(ppid, 0)
	if err != nil {
		log.Debug("cannot watch parent", "ppid", ppid, "err", err)
		return
	}
	// If the parent died before the pidfd was opened, ppid now names init
	// or a subreaper, and the pidfd may name an unrelated process.
	if os.Getppid() != ppid {
		unix.Close(fd)
		cancel(fmt.Errorf("parent %d exited", ppid))
		return
	}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			break
		}
		cancel(fmt.Errorf("parent %d exited", ppid))
	}()
}

// watchStdout ends the server as soon as the client closes its end of our
// stdout, even while no answer is due (a 30 s wait in flight): poll(2)
// reports POLLERR on a pipe's write end once it has no reader, and POLLHUP
// on a socket or terminal that hung up. A regular file or /dev/null never
// reports either.
func watchStdout(cancel context.CancelCauseFunc, log *slog.Logger) {
	fd := int32(os.Stdout.Fd())
	go func() {
		// Events 0: only the conditions poll always reports.
		fds := []unix.PollFd{{Fd: fd}}
		for {
			n, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				log.Debug("cannot watch stdout", "err", err)
				return
			}
			if n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				cancel(errors.New("stdout closed by the client"))
				return
			}
		}
	}()
}

func versionString() string {
	if rev := revision(); rev != "" {
		return version + " (" + rev + ")"
	}
	return version
}

// revision is the VCS revision the binary was built from, "-dirty" when
// the tree had changes.
func revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

// newServer wires the tools to the guests: the settings become the guests'
// configuration and policies here, once, and the manager is made from it
// when the tools first need it.
func newServer(set settings.Settings, cfg tools.Config) (*tools.Server, error) {
	guests, err := set.Manager()
	if err != nil {
		return nil, err
	}
	cfg.Guests = guests
	return tools.New(cfg)
}

// qemuFlag reads one -qemu: PATH for the default architecture, or
// ARCH=PATH.
func qemuFlag(v string) (archName, path string, err error) {
	if name, p, ok := strings.Cut(v, "="); ok && !strings.Contains(name, "/") {
		a, err := archs.Lookup(name)
		if err != nil {
			return "", "", err
		}
		return a.Name(), p, nil
	}
	return archs.Default().Name(), v, nil
}

// platforms are the guests' platforms: each architecture's QEMU (qemus,
// by name) and its built-in kernel.
func platforms(qemus map[string]string) map[string]instance.Platform {
	out := map[string]instance.Platform{}
	for _, a := range archs.All() {
		k := qemumcp.Tiny(a.Name())
		out[a.Name()] = instance.Platform{QEMU: qemus[a.Name()], Kernel: k.Kernel, Symbols: k.ELF}
	}
	return out
}

// newFlagSet is the flag set of the command or subcommand name: its errors
// and its usage (the text, then the flags' defaults) go to stderr.
func newFlagSet(name string, stderr io.Writer, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}
