package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/peercred"
	"github.com/qemu-mcp/qemu-mcp/settings"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

// isLoopback reports whether a listen address only accepts local clients.
// An empty host or an unspecified address listens on every interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readToken reads a bearer token from a file that only its owner can read:
// a token others can read protects nothing.
func readToken(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("token file %s: the token must be at least 16 characters (e.g. openssl rand -hex 32)", path)
	}
	return tok, nil
}

// requireToken rejects requests without the bearer token, comparing in
// constant time so the token cannot be guessed byte by byte from timings.
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="qemu-mcp"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <token from --token-file>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// peerKey keys the connection's peer in a request's context.
type peerKey struct{}

// peer is the user at the other end of one connection, looked up once, at
// its first request: a client sends many requests on one connection, and
// the lookup stays off the accept loop.
type peer struct {
	conn net.Conn
	once sync.Once
	uid  int
	err  error
}

// withPeer is http.Server.ConnContext: it notes each connection, for
// requireOwner.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, peerKey{}, &peer{conn: c})
}

// requireOwner serves only connections that the server's own user opened.
// On loopback every local user can connect; the kernel tells who did (see
// internal/peercred), so the owner's clients need nothing more, no token
// to pass around and no file to read. Other users get 403, once per
// connection in the log.
func requireOwner(owner int, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := r.Context().Value(peerKey{}).(*peer)
		if p == nil {
			http.Error(w, "forbidden: cannot tell who opened this connection", http.StatusForbidden)
			return
		}
		first := false
		p.once.Do(func() {
			first = true
			p.uid, p.err = peercred.UID(p.conn)
		})
		uid, err := p.uid, p.err
		switch {
		case err != nil:
			if first {
				log.Warn("http: refused a connection whose user cannot be told", "remote", p.conn.RemoteAddr(), "err", err)
			}
			http.Error(w, "forbidden: this qemu-mcp server serves only its owner's connections, and the user of this one cannot be told: "+err.Error(), http.StatusForbidden)
			return
		case uid != owner:
			if first {
				log.Warn("http: refused another user's connection", "remote", p.conn.RemoteAddr(), "uid", uid)
			}
			http.Error(w, fmt.Sprintf("forbidden: this qemu-mcp server serves only its owner (uid %d), and this connection is from uid %d; "+
				"its owner can let other users in by starting it with --token-file", owner, uid), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkOrigin refuses a request whose Origin header names another site than
// the one it was sent to (the MCP spec: servers must validate Origin, or a
// web page the user visits could drive the guests through the browser).
// Requests without Origin (every non-browser client) pass.
func checkOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
				http.Error(w, "forbidden: Origin "+strconv.Quote(o)+" is not this server", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// maxSessions bounds the HTTP sessions open at once: a client that opens
// sessions and abandons them must not grow the server without end.
const maxSessions = 64

// capSessions keeps at most max sessions: a request that opens one more
// first closes the session least recently used. It tracks use by the
// Mcp-Session-Id header of requests and of the answers that open them.
func capSessions(ms *mcp.Server, max int, next http.Handler) http.Handler {
	var mu sync.Mutex
	used := map[string]time.Time{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			mu.Lock()
			used[id] = time.Now()
			mu.Unlock()
			next.ServeHTTP(w, r)
			return
		}
		open := map[string]*mcp.ServerSession{}
		for ss := range ms.Sessions() {
			open[ss.ID()] = ss
		}
		mu.Lock()
		for id := range used {
			if open[id] == nil {
				delete(used, id) // closed meanwhile (idle time-out, DELETE)
			}
		}
		var victims []*mcp.ServerSession
		for len(open)-len(victims) >= max {
			oldest, at := "", time.Time{}
			for id := range open {
				if t := used[id]; oldest == "" || t.Before(at) {
					oldest, at = id, t
				}
			}
			victims = append(victims, open[oldest])
			delete(open, oldest)
			delete(used, oldest)
		}
		mu.Unlock()
		for _, ss := range victims {
			ss.Close()
		}
		next.ServeHTTP(&sessionRecorder{ResponseWriter: w, record: func(id string) {
			mu.Lock()
			used[id] = time.Now()
			mu.Unlock()
		}}, r)
	})
}

// sessionRecorder notes the session ID an answer opens.
type sessionRecorder struct {
	http.ResponseWriter
	record func(string)
	done   bool
}

func (s *sessionRecorder) WriteHeader(code int) {
	if !s.done {
		s.done = true
		if id := s.Header().Get("Mcp-Session-Id"); id != "" {
			s.record(id)
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionRecorder) Write(b []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *sessionRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *sessionRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// serveHTTP serves MCP streamable HTTP on addr until ctx ends, at /mcp (what
// clients assume) and /. Every session shares the one tool server, so they
// drive the same guests; each has its own read cursors. Idle sessions are
// closed after sessionTimeout.
func serveHTTP(ctx context.Context, set settings.Settings, cfg tools.Config, addr, tokenFile string, sessionTimeout time.Duration, log *slog.Logger) int {
	var token string
	if tokenFile != "" {
		t, err := readToken(tokenFile)
		if err != nil {
			log.Error("http", "err", err)
			return 2
		}
		token = t
	} else if !isLoopback(addr) {
		log.Error("http: a non-loopback address needs --token-file: anyone who can reach it could drive QEMU", "addr", addr)
		return 2
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("http: listen", "addr", addr, "err", err)
		return 1
	}
	set.Transport = "http"
	set.Address = ln.Addr().String()
	srv, err := newServer(set, cfg)
	if err == nil {
		err = srv.Ready()
	}
	if err != nil {
		ln.Close()
		log.Error("start", "err", err)
		return 1
	}
	ms := srv.NewMCPServer()
	// DNS-rebinding protection stays on (the SDK refuses a non-local Host
	// header on a local connection).
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms },
		&mcp.StreamableHTTPOptions{Logger: log, SessionTimeout: sessionTimeout})
	h = capSessions(ms, maxSessions, h)
	h = checkOrigin(h)
	if token != "" {
		// The owner opted in: whoever has the token gets in, from
		// anywhere the address is reachable.
		h = requireToken(token, h)
	} else {
		h = requireOwner(os.Geteuid(), log, h)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	mux.Handle("/", h)
	// A client that trickles a request body must not hold a connection
	// (and a descriptor) for ever; event streams are responses, which
	// these limits do not cut.
	hs := &http.Server{Handler: mux, ConnContext: withPeer, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("serving MCP over HTTP", "version", versionString(), "pid", os.Getpid(), "addr", "http://"+set.Address, "token", token != "", "runtime_dir", set.RuntimeDir)

	code := 0
	select {
	case <-ctx.Done():
		log.Info("shutting down", "why", context.Cause(ctx))
	case err := <-served:
		log.Error("http server stopped", "err", err)
		code = 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Open event streams would hold Shutdown for its whole timeout: the
	// tool server is closed first, then connections.
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := srv.Close(cctx); err != nil {
		log.Error("cleanup", "err", err)
		code = 1
	}
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("http shutdown", "err", err)
	}
	hs.Close()
	return code
}
