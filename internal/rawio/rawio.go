// Package rawio reads and writes non-blocking descriptors that are in the
// runtime's netpoller with raw system calls: a read or write that would
// block parks the goroutine in the netpoller, as os.File does, but the call
// itself skips the runtime's entersyscall/exitsyscall. Those wake the
// runtime's sysmon thread whenever it sleeps deeply (all Ps idle), and a
// woken sysmon then polls every 20 us for a millisecond or more: for a
// server that answers a tool call, idles, and answers the next, that is
// every call. On a small machine whose other cores run guests, those
// wake-ups take the time an emulator's I/O thread needs. A non-blocking
// read or write of a pipe never blocks, so the bookkeeping (which lets the
// scheduler run other goroutines while a call blocks) buys nothing here.
package rawio

import (
	"io"
	"syscall"
	"unsafe"
)

// Read reads into p from the descriptor behind rc (non-blocking, in the
// netpoller), waiting for data as os.File.Read does, deadlines included.
// It returns io.EOF at end of file.
func Read(rc syscall.RawConn, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p to the descriptor behind rc (non-blocking, in the
// netpoller), waiting for room as os.File.Write does, deadlines included.
func Write(rc syscall.RawConn, p []byte) (int, error) {
	done := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for done < len(p) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[done])), uintptr(len(p)-done))
			switch e {
			case 0:
				done += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err != nil {
		return done, err
	}
	if errno != 0 {
		return done, errno
	}
	return done, nil
}

// Available is how many bytes the pipe behind fd holds (FIONREAD), asked
// with a raw system call.
func Available(fd int) (int, error) {
	var n int32
	for {
		_, _, e := syscall.RawSyscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			continue
		}
		return 0, e
	}
}

// ReadNow reads into p from fd with a raw system call. The caller knows
// the read cannot block: fd is non-blocking, or Available said p's worth
// is there and nobody else reads fd.
func ReadNow(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(r), nil
		case syscall.EINTR:
			continue
		}
		return 0, e
	}
}
