// Package pcap captures a guest's network traffic on the host side of its
// TAP into pcap files that tcpdump and Wireshark open, and reads them back
// as tcpdump-like one-line summaries.
//
// Capture is in-process and pure Go (no libpcap, CGO_ENABLED=0): an
// AF_PACKET socket bound to the interface (socket.go)
// sees every frame the guest sends and every frame the host sends it. A
// Filter (a small, documented subset of tcpdump's language, see
// FilterSyntax) is evaluated in Go on each frame; frames it rejects are
// counted, not written. Each packet is written to the file with a single
// write, so another reader (ReadSummaries, tcpdump -r) sees every complete
// packet while the capture runs; at most the last record can be cut short,
// and ReadSummaries stops there.
//
// Like the tap package, this acts in the network namespace of the calling
// thread: Start must run where the interface is (normally the process's
// own namespace). Once started, the socket stays bound to that interface
// whatever thread reads it.
//
// Capturing needs CAP_NET_RAW (root); without it Start fails with an error
// wrapping ErrNoPrivilege. An ordinary user's guest is captured by QEMU
// itself instead: its filter-dump object writes each frame of a netdev as a
// pcap stream, into a FIFO the server reads (NewStream, AddStream); the
// same filter, snap length, counters and file come out of it. Capture
// files are never removed by this package.
package pcap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// DefaultSnaplen is the most bytes of a packet kept when Options.Snaplen
	// is 0: tcpdump's classic default, enough for any frame without
	// segmentation offload.
	DefaultSnaplen = 65535
	// MaxSnaplen is libpcap's maximum; the socket reads frames this long.
	MaxSnaplen = 262144

	// drainTimeout bounds how long Stop waits for frames the kernel has
	// already queued on the socket to be written.
	drainTimeout = time.Second
)

var (
	// ErrNoPrivilege means the process may not open a packet socket: it
	// lacks CAP_NET_RAW.
	ErrNoPrivilege = errors.New("not privileged to capture packets")
	// ErrNoInterface means the interface to capture on does not exist (in
	// this network namespace).
	ErrNoInterface = errors.New("no such network interface")
)

// Options say where a capture goes and what it keeps.
type Options struct {
	// File, if set, is the capture file, new and empty, already created by
	// the caller (who checked where it is); the capture owns it from
	// Start on, and Path must then name it.
	File *os.File
	// Path is the capture file. It must not exist yet: a capture never
	// overwrites a file. Its directory is created (0700) if missing. If
	// empty, a new file is made in Dir.
	Path string
	// Dir is the directory for a generated file name (the caller passes
	// <runtime dir>/captures); created 0700 if missing. The name is
	// <Prefix>[-<Boot>]-<UTC time>.pcap, e.g.
	// qmcp1234-2-20261121T130501.123456Z.pcap.
	Dir    string
	Prefix string // file name prefix; default: the interface name
	Boot   int    // boot number in the file name; 0 leaves it out
	// Snaplen is the most bytes kept of each packet (the rest is counted in
	// the record's length but not stored). 0 means DefaultSnaplen; at most
	// MaxSnaplen.
	Snaplen int
	// Filter is a capture filter (see FilterSyntax); empty keeps
	// everything.
	Filter string
}

// Stats are a capture's counters.
type Stats struct {
	Path      string    `json:"path"`
	Interface string    `json:"interface"`
	Filter    string    `json:"filter,omitempty"`
	Snaplen   int       `json:"snaplen"`
	Packets   int64     `json:"packets"`  // packets written to the file
	Bytes     int64     `json:"bytes"`    // packet bytes written (captured lengths, without pcap headers)
	Filtered  int64     `json:"filtered"` // packets seen on the interface that the filter excluded
	Drops     int64     `json:"drops"`    // packets the kernel dropped (socket buffer full)
	Started   time.Time `json:"started"`
	Stopped   time.Time `json:"stopped,omitzero"` // zero while running
	// Error is the write error that ended the capture early (a full
	// disk): the file holds every packet before it.
	Error string `json:"error,omitempty"`
}

// Capture is a running (or stopped) capture.
type Capture struct {
	ifname  string
	ifindex int
	path    string
	filter  *Filter
	snaplen int
	started time.Time

	sock *packetSocket // nil for a capture fed by streams
	// streams are the pcap streams (QEMU's filter-dump) that feed a
	// capture made by NewStream, one after the other; Stop closes it.
	streams   chan *os.File
	streamsMu sync.Mutex // guards sending on streams against its close
	cur       *os.File   // the stream being read, under mu

	file *os.File
	rec  []byte // the record being written

	stopping atomic.Bool
	done     chan struct{} // closed when the reading goroutine has ended

	mu       sync.Mutex
	read     int64 // frames read from the socket, of any interface
	packets  int64
	bytes    int64
	filtered int64
	queued   int64 // frames the kernel queued on the socket (tp_packets - tp_drops)
	drops    int64
	closed   bool // the socket is closed
	stopped  time.Time
	err      error // why the capture ended early

	stopOnce sync.Once
	final    Stats
	stopErr  error
}

// Start begins capturing on the interface ifname into a new pcap file, in
// the calling thread's network namespace. It returns once the capture is
// running: every frame from then on is captured.
func Start(ifname string, opts Options) (*Capture, error) {
	filter, snaplen, err := opts.check()
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("pcap: %w: %s: %w", ErrNoInterface, ifname, err)
	}
	if err := probePacketSocket(); err != nil {
		return nil, err
	}
	sock, err := openPacketSocket(ifi.Index)
	if err != nil {
		return nil, fmt.Errorf("pcap: capture on %s: %w", ifname, err)
	}
	// The socket reads whole frames (MaxSnaplen) so that the filter sees
	// all of each one; the file gets snaplen bytes.
	c, err := open(ifname, filter, snaplen, opts)
	if err != nil {
		sock.Close()
		return nil, err
	}
	c.ifindex, c.sock = ifi.Index, sock
	go c.run()
	return c, nil
}

// check validates the options: the filter compiled, the snap length.
func (opts Options) check() (*Filter, int, error) {
	filter, err := Compile(opts.Filter)
	if err != nil {
		return nil, 0, err
	}
	snaplen := opts.Snaplen
	if snaplen == 0 {
		snaplen = DefaultSnaplen
	}
	if snaplen < 0 || snaplen > MaxSnaplen {
		return nil, 0, fmt.Errorf("pcap: snap length %d out of range 1..%d", opts.Snaplen, MaxSnaplen)
	}
	if opts.Path == "" && opts.Dir == "" && opts.File == nil {
		return nil, 0, errors.New("pcap: neither a capture file nor a directory for it was given")
	}
	return filter, snaplen, nil
}

// open makes the capture file (or takes opts.File) and writes its header.
func open(ifname string, filter *Filter, snaplen int, opts Options) (*Capture, error) {
	f, path := opts.File, opts.Path
	if f == nil {
		var err error
		if f, path, err = createFile(ifname, opts); err != nil {
			return nil, err
		}
	}
	c := &Capture{
		ifname:  ifname,
		path:    path,
		filter:  filter,
		snaplen: snaplen,
		started: time.Now(),
		file:    f,
		done:    make(chan struct{}),
	}
	if _, err := f.Write(fileHeader(snaplen)); err != nil {
		f.Close()
		return nil, fmt.Errorf("pcap: write the header of %s: %w", path, err)
	}
	return c, nil
}

// CanCapture reports whether Start may capture here: whether this process
// may open a packet socket (CAP_NET_RAW). Without it, captures go through
// QEMU (NewStream).
func CanCapture() error { return probePacketSocket() }

// probePacketSocket opens and closes a packet socket that receives nothing
// (protocol 0), to learn whether the process may before anything is
// created.
func probePacketSocket() error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return fmt.Errorf("pcap: %w: opening a packet socket: %w: capturing needs CAP_NET_RAW (root)", ErrNoPrivilege, err)
		}
		return fmt.Errorf("pcap: open a packet socket: %w", err)
	}
	unix.Close(fd)
	return nil
}

// createFile creates the capture file (never over an existing one) and its
// directory.
func createFile(ifname string, o Options) (*os.File, string, error) {
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if o.Path != "" {
		if err := os.MkdirAll(filepath.Dir(o.Path), 0o700); err != nil {
			return nil, "", fmt.Errorf("pcap: capture directory: %w", err)
		}
		f, err := os.OpenFile(o.Path, flags, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return nil, "", fmt.Errorf("pcap: capture file %s exists already; not overwriting it", o.Path)
			}
			return nil, "", fmt.Errorf("pcap: create capture file: %w", err)
		}
		return f, o.Path, nil
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("pcap: capture directory: %w", err)
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = ifname
	}
	if strings.ContainsRune(prefix, '/') {
		return nil, "", fmt.Errorf("pcap: file name prefix %q contains a /", prefix)
	}
	if o.Boot != 0 {
		prefix += "-" + strconv.Itoa(o.Boot)
	}
	stamp := time.Now().UTC().Format("20060102T150405.000000Z")
	for i := 1; i <= 100; i++ {
		name := prefix + "-" + stamp
		if i > 1 {
			name += "-" + strconv.Itoa(i)
		}
		path := filepath.Join(o.Dir, name+".pcap")
		f, err := os.OpenFile(path, flags, 0o600)
		if err == nil {
			return f, path, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, "", fmt.Errorf("pcap: create capture file: %w", err)
		}
	}
	return nil, "", fmt.Errorf("pcap: no free capture file name for %s in %s", prefix+"-"+stamp, o.Dir)
}

// run reads frames until Stop closes the socket, and writes those that
// pass the filter.
func (c *Capture) run() {
	defer close(c.done)
	errorsInARow := 0
	for {
		data, length, ts, ifindex, err := c.sock.read()
		if err != nil {
			if c.stopping.Load() {
				return
			}
			// The socket reports ENETDOWN once when the interface goes
			// down, and goes on when it comes back up: keep reading. An
			// error that persists ends the capture.
			errorsInARow++
			if errorsInARow >= 100 {
				c.fail(fmt.Errorf("pcap: reading from %s: %w", c.ifname, err))
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		errorsInARow = 0

		// Before bind, the socket received frames of every interface; they
		// may still be queued.
		other := ifindex != 0 && ifindex != c.ifindex
		if !c.take(data, length, ts, other) {
			return
		}
	}
}

// take filters one frame, length bytes long on the wire and stamped ts,
// and writes it; false once the capture failed.
func (c *Capture) take(data []byte, length int, ts time.Time, other bool) bool {
	keep := !other && c.filter.Match(data)
	if keep {
		if len(data) > c.snaplen {
			data = data[:c.snaplen]
		}
		// One write(2) per packet: readers of the file see whole
		// packets.
		c.rec = appendRecord(c.rec[:0], ts, length, data)
		if _, err := c.file.Write(c.rec); err != nil {
			c.fail(fmt.Errorf("pcap: write %s: %w", c.path, err))
			return false
		}
	}
	c.mu.Lock()
	c.read++
	switch {
	case keep:
		c.packets++
		c.bytes += int64(len(data))
	case !other:
		c.filtered++
	}
	c.mu.Unlock()
	return true
}

func (c *Capture) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// pollKernelLocked adds the kernel's counters since the last call (the
// kernel resets them on every read). c.mu must be held.
func (c *Capture) pollKernelLocked() {
	if c.closed || c.sock == nil {
		return
	}
	st, err := c.sock.stats()
	if err != nil {
		return
	}
	c.queued += int64(st.Packets) - int64(st.Drops) // tp_packets counts drops too
	c.drops += int64(st.Drops)
}

func (c *Capture) statsLocked() Stats {
	return Stats{
		Path:      c.path,
		Interface: c.ifname,
		Filter:    c.filter.String(),
		Snaplen:   c.snaplen,
		Packets:   c.packets,
		Bytes:     c.bytes,
		Filtered:  c.filtered,
		Drops:     c.drops,
		Started:   c.started,
		Stopped:   c.stopped,
		Error:     errString(c.err),
	}
}

// Path is the capture file.
func (c *Capture) Path() string { return c.path }

// Stats returns the counters so far (final ones after Stop).
func (c *Capture) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pollKernelLocked()
	return c.statsLocked()
}

// Err reports why the capture ended on its own (a write error), or nil.
func (c *Capture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed when the capture has ended: after Stop, or on a write
// error (see Err), after which nothing more is captured.
func (c *Capture) Done() <-chan struct{} { return c.done }

// Stop ends the capture: frames the kernel had already queued are written
// first (for at most a second), then the socket and the file are closed.
// It returns the final counters, and the error that ended the capture early
// or closing the file gave. Calling it again returns the same. The file
// stays.
func (c *Capture) Stop() (Stats, error) {
	c.stopOnce.Do(func() {
		if c.sock == nil {
			c.stopStreams()
			return
		}
		c.drain(drainTimeout)
		c.stopping.Store(true)
		c.mu.Lock()
		c.pollKernelLocked()
		c.closed = true
		c.mu.Unlock()
		// Closing the socket wakes the goroutine blocked reading it.
		c.sock.Close()
		<-c.done
		c.finish()
	})
	return c.final, c.stopErr
}

// finish closes the file once nothing writes to it any more, and keeps the
// final counters.
func (c *Capture) finish() {
	err := c.file.Close()
	c.mu.Lock()
	c.stopped = time.Now()
	c.final = c.statsLocked()
	if err != nil {
		err = fmt.Errorf("pcap: close %s: %w", c.path, err)
	}
	c.stopErr = errors.Join(c.err, err)
	c.mu.Unlock()
}

// drain waits until the goroutine has read every frame the kernel had
// queued on the socket by now, so that what happened before Stop is in the
// file: a guest's last reply is often still in the socket when the caller
// decides to stop.
func (c *Capture) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		c.pollKernelLocked()
		caughtUp := c.read >= c.queued || c.err != nil
		c.mu.Unlock()
		if caughtUp || time.Now().After(deadline) {
			return
		}
		select {
		case <-c.done:
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
