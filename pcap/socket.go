package pcap

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// packetSocket is an AF_PACKET socket bound to one interface, seeing every
// frame the interface sends and receives, whole (up to MaxSnaplen), with
// the kernel's time stamp. It reads through the runtime's poller, so that
// closing it wakes a blocked read.
type packetSocket struct {
	f   *os.File
	rc  syscall.RawConn
	buf []byte
	oob []byte
}

// htons is the protocol number in network byte order, as AF_PACKET wants it.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

func openPacketSocket(ifindex int) (*packetSocket, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("open a packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind a packet socket to interface %d: %w", ifindex, err)
	}
	// Nanosecond stamps taken when the frame passed; without them, the
	// time of the read.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	f := os.NewFile(uintptr(fd), "packet socket")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &packetSocket{f: f, rc: rc, buf: make([]byte, MaxSnaplen), oob: make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))}, nil
}

// read returns the next frame (valid until the next read), its length on
// the wire, its time stamp and the index of the interface it passed.
func (s *packetSocket) read() (data []byte, length int, ts time.Time, ifindex int, err error) {
	var n, oobn int
	var from unix.Sockaddr
	rerr := s.rc.Read(func(fd uintptr) bool {
		// MSG_TRUNC: n is the frame's whole length, even past the buffer.
		n, oobn, _, from, err = unix.Recvmsg(int(fd), s.buf, s.oob, unix.MSG_TRUNC)
		return !errors.Is(err, unix.EAGAIN)
	})
	if rerr != nil {
		return nil, 0, ts, 0, rerr
	}
	if err != nil {
		return nil, 0, ts, 0, err
	}
	if ll, ok := from.(*unix.SockaddrLinklayer); ok {
		ifindex = ll.Ifindex
	}
	if msgs, perr := unix.ParseSocketControlMessage(s.oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
				ts = time.Unix((*unix.Timespec)(unsafe.Pointer(&m.Data[0])).Unix())
			}
		}
	}
	if ts.IsZero() {
		ts = time.Now()
	}
	return s.buf[:min(n, len(s.buf))], n, ts, ifindex, nil
}

// stats returns the kernel's counters since the last call (it resets them
// on each).
func (s *packetSocket) stats() (*unix.TpacketStats, error) {
	var st *unix.TpacketStats
	var err error
	if cerr := s.rc.Control(func(fd uintptr) {
		st, err = unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
	}); cerr != nil {
		return nil, cerr
	}
	return st, err
}

func (s *packetSocket) Close() error { return s.f.Close() }
