package rawio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

func pipe(t *testing.T) (r, w *os.File, rrc, wrc syscall.RawConn) {
	t.Helper()
	r, w, err := os.Pipe() // non-blocking, in the netpoller
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	if rrc, err = r.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	if wrc, err = w.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	return r, w, rrc, wrc
}

// Read waits for data, returns what is there, honours the deadline, and
// says io.EOF once the writer has gone.
func TestRead(t *testing.T) {
	r, w, rrc, wrc := pipe(t)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 64)
		n, err := Read(rrc, b)
		if err != nil {
			t.Error(err)
		}
		got <- b[:n]
	}()
	time.Sleep(10 * time.Millisecond) // the reader parks first
	if _, err := Write(wrc, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := Read(rrc, make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	r.SetReadDeadline(time.Time{})
	w.Close()
	if n, err := Read(rrc, make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("read after the writer closed: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := Read(rrc, nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
}

// Write writes everything, waiting for room when the pipe is full (far
// more than a pipe holds goes through), and fails with EPIPE, not a
// signal, once the reader has gone.
func TestWrite(t *testing.T) {
	r, _, rrc, wrc := pipe(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	done := make(chan []byte)
	go func() {
		var got []byte
		b := make([]byte, 4096)
		for len(got) < len(want) {
			n, err := Read(rrc, b)
			if err != nil {
				t.Error(err)
				break
			}
			got = append(got, b[:n]...)
		}
		done <- got
	}()
	n, err := Write(wrc, want)
	if err != nil || n != len(want) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if got := <-done; !bytes.Equal(got, want) {
		t.Fatal("what was read is not what was written")
	}
	r.Close()
	if _, err := Write(wrc, []byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write without a reader: %v, want EPIPE", err)
	}
}

// A write into a full pipe that nobody reads ends at the deadline with
// what went in.
func TestWriteDeadline(t *testing.T) {
	_, w, _, wrc := pipe(t)
	w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := Write(wrc, make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write into a full pipe: %v, want os.ErrDeadlineExceeded", err)
	}
	if n <= 0 || n >= 1<<20 {
		t.Fatalf("wrote %d bytes before the deadline: want what the pipe holds", n)
	}
}

// Available says what the pipe holds, and ReadNow takes it without waiting;
// on an empty non-blocking pipe ReadNow says EAGAIN rather than blocking.
func TestAvailableReadNow(t *testing.T) {
	r, w, _, _ := pipe(t)
	fd := int(r.Fd()) // Fd makes r blocking; set it back as the netpoller had it
	if err := syscall.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	if n, err := Available(fd); n != 0 || err != nil {
		t.Fatalf("empty pipe: Available %d, %v", n, err)
	}
	if _, err := ReadNow(fd, make([]byte, 8)); err != syscall.EAGAIN {
		t.Fatalf("ReadNow on an empty pipe: %v, want EAGAIN", err)
	}
	msg := bytes.Repeat([]byte("uart "), 1000)
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	n, err := Available(fd)
	if n != len(msg) || err != nil {
		t.Fatalf("after %d bytes: Available %d, %v", len(msg), n, err)
	}
	b := make([]byte, n)
	if got, err := ReadNow(fd, b); got != n || err != nil || !bytes.Equal(b, msg) {
		t.Fatalf("ReadNow: %d, %v", got, err)
	}
	if n, err := ReadNow(fd, nil); n != 0 || err != nil {
		t.Fatalf("empty ReadNow: %d, %v", n, err)
	}
	if _, err := Available(-1); err == nil {
		t.Fatal("Available of a closed descriptor: no error")
	}
}
