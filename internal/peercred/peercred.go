// Package peercred tells which local user opened the other end of a
// loopback TCP connection, the way SO_PEERCRED does for unix sockets.
//
// Every local user can connect to a port on 127.0.0.1 or ::1, so a server
// that listens there serves the whole machine unless it checks who is
// calling. The kernel knows: both ends of a loopback connection are sockets
// of this host, and each records the user that made it. The peer's socket is
// the one whose local address is our remote address and whose remote
// address is our local one. It is found with an exact sock_diag lookup
// (NETLINK_SOCK_DIAG, one request, one answer, no privilege needed, the
// same interface ss(8) uses), else, where sock_diag is not available, in
// /proc/net/tcp and /proc/net/tcp6.
package peercred

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotFound means no socket of this host has the connection's addresses:
// the peer is not local (or has closed its end already).
var ErrNotFound = errors.New("no local socket is the other end of this connection")

// ErrNotLoopback means the connection is not on a loopback address, so its
// other end may be another host.
var ErrNotLoopback = errors.New("not a loopback connection")

// UID returns the user who owns the other end of the TCP connection c,
// which must be on loopback.
func UID(c net.Conn) (int, error) {
	l, ok1 := c.LocalAddr().(*net.TCPAddr)
	r, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return -1, fmt.Errorf("peer of %v: %w", c.RemoteAddr(), ErrNotLoopback)
	}
	return LookupUID(l.AddrPort(), r.AddrPort())
}

// LookupUID returns the user who owns the socket whose local address is
// remote and whose remote address is local: the other end of our
// connection from local to remote.
func LookupUID(local, remote netip.AddrPort) (int, error) {
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	if !local.Addr().IsLoopback() || !remote.Addr().IsLoopback() {
		return -1, fmt.Errorf("peer %v of %v: %w", remote, local, ErrNotLoopback)
	}
	if !noDiag.Load() {
		uid, err := diagUID(local, remote)
		if !errors.Is(err, errNoDiag) {
			return uid, err
		}
		noDiag.Store(true)
	}
	return procUID(local, remote)
}

// noDiag is set once sock_diag proved unavailable: every lookup then reads
// /proc/net at once.
var noDiag atomic.Bool

// errNoDiag means the kernel offers no sock_diag for TCP.
var errNoDiag = errors.New("sock_diag for TCP is not available")

// Kernel ABI of linux/inet_diag.h and linux/sock_diag.h.
const (
	sockDiagByFamily = 20
	inetDiagNoCookie = ^uint32(0)
)

type inetDiagSockID struct {
	SPort, DPort [2]byte // big-endian
	Src, Dst     [16]byte
	If           uint32
	Cookie       [2]uint32
}

type inetDiagReqV2 struct {
	Family, Protocol, Ext, Pad uint8
	States                     uint32
	ID                         inetDiagSockID
}

type inetDiagMsg struct {
	Family, State, Timer, Retrans uint8
	ID                            inetDiagSockID
	Expires, RQueue, WQueue       uint32
	UID, Inode                    uint32
}

// diagUID asks the kernel for exactly one socket: the peer's.
func diagUID(local, remote netip.AddrPort) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return -1, fmt.Errorf("%w: %w", errNoDiag, err)
	}
	defer unix.Close(fd)
	// A reply that never comes must not hang the caller.
	tv := unix.Timeval{Sec: 1}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)

	req := inetDiagReqV2{Protocol: unix.IPPROTO_TCP, States: ^uint32(0)}
	req.Family = unix.AF_INET
	if local.Addr().Is6() {
		req.Family = unix.AF_INET6
	}
	// The peer's socket: its source is our remote, its destination us.
	binary.BigEndian.PutUint16(req.ID.SPort[:], remote.Port())
	binary.BigEndian.PutUint16(req.ID.DPort[:], local.Port())
	putAddr(&req.ID.Src, remote.Addr())
	putAddr(&req.ID.Dst, local.Addr())
	req.ID.Cookie = [2]uint32{inetDiagNoCookie, inetDiagNoCookie}

	const hdrLen = unix.SizeofNlMsghdr
	buf := make([]byte, hdrLen+int(unsafe.Sizeof(req)))
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&buf[0]))
	hdr.Len = uint32(len(buf))
	hdr.Type = sockDiagByFamily
	hdr.Flags = unix.NLM_F_REQUEST
	hdr.Seq = 1
	*(*inetDiagReqV2)(unsafe.Pointer(&buf[hdrLen])) = req
	if err := unix.Sendto(fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return -1, fmt.Errorf("%w: send: %w", errNoDiag, err)
	}
	reply := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, reply, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("sock_diag: receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(reply[:n])
		if err != nil {
			return -1, fmt.Errorf("sock_diag: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return -1, errors.New("sock_diag: short error")
				}
				errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data)))
				switch errno {
				case unix.ENOENT:
					return -1, fmt.Errorf("peer %v of %v: %w", remote, local, ErrNotFound)
				case unix.EINVAL, unix.EOPNOTSUPP, unix.EAFNOSUPPORT, unix.EPROTONOSUPPORT:
					return -1, fmt.Errorf("%w: %w", errNoDiag, errno)
				}
				return -1, fmt.Errorf("sock_diag: %w", errno)
			case sockDiagByFamily:
				if len(m.Data) < int(unsafe.Sizeof(inetDiagMsg{})) {
					return -1, errors.New("sock_diag: short answer")
				}
				msg := (*inetDiagMsg)(unsafe.Pointer(&m.Data[0]))
				return int(msg.UID), nil
			case unix.NLMSG_DONE:
				return -1, fmt.Errorf("peer %v of %v: %w", remote, local, ErrNotFound)
			}
		}
	}
}

// putAddr writes a in the kernel's layout: IPv4 in the first four bytes.
func putAddr(dst *[16]byte, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		copy(dst[:], b[:])
		return
	}
	*dst = a.As16()
}

// procUID finds the peer's line in /proc/net/tcp or tcp6. An IPv4 client
// of a dual-stack listener is in tcp6 under a v4-mapped address, so both
// files are searched for an IPv4 connection.
func procUID(local, remote netip.AddrPort) (int, error) {
	files := []string{"/proc/net/tcp6"}
	if local.Addr().Is4() {
		files = []string{"/proc/net/tcp", "/proc/net/tcp6"}
	}
	for _, name := range files {
		uid, err := scanTable(name, local, remote)
		if err == nil || !errors.Is(err, ErrNotFound) {
			return uid, err
		}
	}
	return -1, fmt.Errorf("peer %v of %v: %w", remote, local, ErrNotFound)
}

func scanTable(name string, local, remote netip.AddrPort) (int, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return -1, ErrNotFound // no IPv6 in this kernel
	}
	if err != nil {
		return -1, fmt.Errorf("look up the peer of a loopback connection: %w", err)
	}
	defer f.Close()
	v6 := strings.HasSuffix(name, "6")
	// The peer's socket: local address our remote, remote address ours.
	wantLocal, wantRemote := procAddr(remote, v6), procAddr(local, v6)
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid ...
		if len(fields) < 8 || fields[1] != wantLocal || fields[2] != wantRemote {
			continue
		}
		uid, err := strconv.Atoi(fields[7])
		if err != nil {
			return -1, fmt.Errorf("%s: uid %q: %w", name, fields[7], err)
		}
		return uid, nil
	}
	if err := sc.Err(); err != nil {
		return -1, fmt.Errorf("read %s: %w", name, err)
	}
	return -1, ErrNotFound
}

// procAddr formats an address as /proc/net/tcp{,6} does: each 32-bit word
// of the address as the kernel holds it (network order) printed as a
// native-endian number in hex, then the port in hex. In tcp6, IPv4
// addresses appear v4-mapped.
func procAddr(ap netip.AddrPort, v6 bool) string {
	var b []byte
	if v6 {
		a := netip.AddrFrom16(ap.Addr().As16()) // maps IPv4
		s := a.As16()
		b = s[:]
	} else {
		s := ap.Addr().As4()
		b = s[:]
	}
	var sb strings.Builder
	for i := 0; i < len(b); i += 4 {
		fmt.Fprintf(&sb, "%08X", binary.NativeEndian.Uint32(b[i:i+4]))
	}
	return sb.String() + ":" + fmt.Sprintf("%04X", ap.Port())
}
