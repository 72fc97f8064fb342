package rpcframe

import (
	"io"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func blocking(t *testing.T, f *os.File) bool {
	t.Helper()
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fl&unix.O_NONBLOCK == 0
}

// A pipe is opened anew, non-blocking and in the netpoller, while the
// descriptor it came from keeps its blocking mode; messages go through.
func TestReopenPipe(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil { // blocking, as a client hands it
		t.Fatal(err)
	}
	pr, pw := os.NewFile(uintptr(p[0]), "r"), os.NewFile(uintptr(p[1]), "w")
	defer pr.Close()
	defer pw.Close()
	rf := reopen(p[0], os.O_RDONLY)
	wf := reopen(p[1], os.O_WRONLY)
	if rf == nil || wf == nil {
		t.Fatal("a pipe was not reopened")
	}
	defer rf.Close()
	defer wf.Close()
	if !blocking(t, pr) || !blocking(t, pw) {
		t.Fatal("reopening changed the original descriptors' blocking mode")
	}
	r, err := newRawFile(rf)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newRawFile(wf)
	if err != nil {
		t.Fatal(err)
	}
	passes(t, w, r, "read")
	// EOF once every write end is closed, the original one included.
	w.Close()
	pw.Close()
	if _, err := r.Read(make([]byte, 100)); err != io.EOF {
		t.Fatalf("read after the writers closed: %v, want io.EOF", err)
	}
}

// A socket (what Node gives its children) is read and written through a
// duplicate in the netpoller; its description is non-blocking until
// Restore.
func TestReopenSocket(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, client := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "client")
	defer ours.Close()
	defer client.Close()
	f := reopenRaw(fds[0], os.O_RDWR)
	if f == nil {
		t.Fatal("a socket was not reopened")
	}
	defer f.Close()
	if blocking(t, ours) {
		t.Fatal("the socket's description is still blocking")
	}
	if !blocking(t, client) {
		t.Fatal("the client's end changed mode")
	}
	passes(t, client, f, "read")
	passes(t, f, client, "the client read")
	Restore()
	if !blocking(t, ours) {
		t.Fatal("Restore left the socket non-blocking")
	}
}

// Anything but a pipe or a socket is left as it is.
func TestReopenOthers(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if reopen(int(f.Fd()), os.O_RDONLY) != nil {
		t.Fatal("a regular file was reopened")
	}
}

// passes writes a JSON-RPC line to w and checks that one read of r
// returns it whole; who names the reader in the failure.
func passes(t *testing.T, w io.Writer, r io.Reader, who string) {
	t.Helper()
	msg := []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}` + "\n")
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 100)
	n, err := r.Read(b)
	if err != nil || string(b[:n]) != string(msg) {
		t.Fatalf("%s %q, %v", who, b[:n], err)
	}
}
