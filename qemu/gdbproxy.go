package qemu

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/internal/peercred"
)

// gdbProxy serves a machine's gdbstub (a unix socket in the server's private
// runtime directory) on loopback TCP, to the server's own user only. Every
// local user can connect to a loopback port, and a gdbstub gives whoever
// connects all of the guest: its memory, its registers, and the power to
// leave it stopped. So QEMU never listens on TCP itself: the server does,
// asks the kernel which user opened each connection (internal/peercred),
// closes other users' at once, and joins the owner's to the stub's socket.
type gdbProxy struct {
	ln    net.Listener
	sock  string
	owner int
	log   *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startGDBProxy listens on addr, a loopback TCP address, for the stub at
// the unix socket sock.
func startGDBProxy(addr, sock string, log *slog.Logger) (*gdbProxy, error) {
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.New("listen for the gdbstub on " + addr + ": " + err.Error())
	}
	p := &gdbProxy{ln: ln, sock: sock, owner: os.Geteuid(), log: log, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is where the proxy listens.
func (p *gdbProxy) Addr() string { return p.ln.Addr().String() }

func (p *gdbProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.isClosed() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			p.log.Warn("gdb-tcp: accept", "err", err)
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

func (p *gdbProxy) handle(c net.Conn) {
	defer c.Close()
	uid, err := peercred.UID(c)
	if err != nil || uid != p.owner {
		p.log.Warn("gdb-tcp: refused a connection that is not from this server's user", "remote", c.RemoteAddr(), "uid", uid, "err", err)
		return
	}
	u, err := net.Dial("unix", p.sock)
	if err != nil {
		p.log.Warn("gdb-tcp: connect to the gdbstub", "socket", p.sock, "err", err)
		return
	}
	if !p.track(u) {
		u.Close()
		return
	}
	defer p.untrack(u)
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// One side ended: end the other, so that neither waits for
		// ever on a peer that is gone.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	<-done
}

func (p *gdbProxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *gdbProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *gdbProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Close stops listening, ends every connection and waits for them.
func (p *gdbProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}
