package peercred

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testusers"
)

// With QEMU_MCP_PEERCRED_DIAL=ADDR the test binary connects to ADDR, says
// "connected" and holds the connection until its stdin closes: the other
// user's client.
func TestMain(m *testing.M) {
	if addr := os.Getenv("QEMU_MCP_PEERCRED_DIAL"); addr != "" {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("connected", c.LocalAddr())
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// both runs f with sock_diag and with the /proc/net fallback.
func both(t *testing.T, f func(t *testing.T)) {
	for _, proc := range []bool{false, true} {
		t.Run(map[bool]string{false: "sock_diag", true: "proc"}[proc], func(t *testing.T) {
			old := noDiag.Load()
			noDiag.Store(proc)
			defer noDiag.Store(old)
			f(t)
		})
	}
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestOwnConnections(t *testing.T) {
	both(t, func(t *testing.T) {
		for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "127.0.0.2:0"} {
			ln := listen(t, addr)
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for side, conn := range map[string]net.Conn{"server": s, "client": c} {
				if uid, err := UID(conn); err != nil || uid != os.Geteuid() {
					t.Errorf("%s %s: uid %d, %v; want %d", addr, side, uid, err, os.Geteuid())
				}
			}
		}
		if t.Name() == "TestOwnConnections/sock_diag" && noDiag.Load() {
			t.Error("sock_diag failed here and the lookups fell back to /proc/net")
		}
	})
}

// A client of another user is told apart, over IPv4, IPv6 and an IPv4
// client of a dual-stack listener.
func TestOtherUser(t *testing.T) {
	users := testusers.New(t, 1)
	bin := testusers.Binary(t, testusers.Shared(t))
	both(t, func(t *testing.T) {
		for _, c := range []struct{ listen, dial string }{
			{"127.0.0.1:0", ""}, {"[::1]:0", ""}, {"[::]:0", "127.0.0.1"},
		} {
			ln := listen(t, c.listen)
			addr := ln.Addr().String()
			if c.dial != "" {
				addr = net.JoinHostPort(c.dial, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
			}
			cmd := users[0].Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), "QEMU_MCP_PEERCRED_DIAL="+addr, "GORACE=atexit_sleep_ms=0")
			stdin, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			uid, err := UID(s)
			s.Close()
			stdin.Close()
			cmd.Wait()
			if err != nil || uid != users[0].UID {
				t.Errorf("%s via %s (%s): uid %d, %v; want %d", c.listen, addr, line, uid, err, users[0].UID)
			}
		}
	})
}

func TestRefusals(t *testing.T) {
	_, err := LookupUID(netip.MustParseAddrPort("192.0.2.1:80"), netip.MustParseAddrPort("127.0.0.1:5000"))
	if !errors.Is(err, ErrNotLoopback) {
		t.Errorf("non-loopback: %v", err)
	}
	both(t, func(t *testing.T) {
		// A port nothing uses: no socket has these addresses.
		ln := listen(t, "127.0.0.1:0")
		port := ln.Addr().(*net.TCPAddr).Port
		_, err := LookupUID(netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port)), netip.MustParseAddrPort("127.0.0.1:1"))
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("no such connection: %v", err)
		}
	})
}

func TestProcAddr(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" && runtime.GOARCH != "riscv64" {
		t.Skip("the expected strings are little-endian")
	}
	for ap, want := range map[string]string{
		"127.0.0.1:8080": "0100007F:1F90",
		"[::1]:443":      "00000000000000000000000001000000:01BB",
	} {
		a := netip.MustParseAddrPort(ap)
		if got := procAddr(a, a.Addr().Is6()); got != want {
			t.Errorf("%s: %s, want %s", ap, got, want)
		}
	}
	if got := procAddr(netip.MustParseAddrPort("127.0.0.1:1"), true); got != "0000000000000000FFFF00000100007F:0001" {
		t.Errorf("v4-mapped: %s", got)
	}
}

// One lookup per accepted connection: what it costs.
func BenchmarkUID(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, _ := net.Dial("tcp", ln.Addr().String())
	defer c.Close()
	s, _ := ln.Accept()
	defer s.Close()
	for _, proc := range []bool{false, true} {
		b.Run(map[bool]string{false: "sock_diag", true: "proc"}[proc], func(b *testing.B) {
			noDiag.Store(proc)
			defer noDiag.Store(false)
			for b.Loop() {
				if _, err := UID(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
