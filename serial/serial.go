// Package serial connects to a QEMU guest's serial console through a pair of
// named pipes (QEMU's "-chardev pipe"), draining the guest's output
// continuously into a [Buffer] that is addressed by absolute byte offsets
// (cursors). Reads never consume output; memory is bounded by a ring of the
// most recent output, and a transcript file ([WithTranscript]) keeps all of
// it, so nothing is lost. Waits ([Buffer.WaitFor]) watch for patterns,
// kernel panics, a quiet console or the guest's exit, woken by new data.
// [Clean] and [Raw] turn output into text for an agent.
package serial

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/rawio"
)

// defaultReadSize is the drain goroutine's read size.
const defaultReadSize = 64 << 10

// Option configures [Create].
type Option func(*config)

type config struct {
	logger     *slog.Logger
	readSize   int
	ringSize   int
	transcript string
}

func newConfig(opts []Option) config {
	cfg := config{logger: slog.New(slog.DiscardHandler), readSize: defaultReadSize, ringSize: DefaultRingSize}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// WithLogger sets the logger for events nobody can otherwise see, such as
// the drain goroutine failing. By default nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithReadSize sets how many bytes the drain goroutine reads from the
// output FIFO at a time (default 64 KiB). Values < 1 are ignored.
func WithReadSize(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.readSize = n
		}
	}
}

// WithRingSize sets how many of the most recent bytes of output the buffer
// keeps in memory (default [DefaultRingSize], 4 MiB). Memory use is up to
// about twice that. Waits see only these bytes; reads of older ones need a
// transcript. Values < 1 are ignored.
func WithRingSize(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.ringSize = n
		}
	}
}

// WithTranscript makes the buffer append every byte of output to the file
// at path, so that byte offset == cursor, and serve reads of bytes that
// have left the ring from it. The file must not exist: it is created with
// mode 0600 (O_CREATE|O_EXCL|O_APPEND, not following a symlink), its
// missing parent directories with mode 0700. This package never removes
// it, not even on Close. Writes to it are buffered in the ring and flushed
// at least every 64 KiB, within about 10 ms after the console's drain finds
// the pipe empty (the guest went quiet), and before Finish and Close
// return. If writing fails, the
// error is logged, the transcript keeps what it has and gets nothing more,
// and the ring goes on (see [Buffer.TranscriptErr]). An empty path means
// no transcript.
func WithTranscript(path string) Option {
	return func(c *config) { c.transcript = path }
}

// Console is one guest's serial console: the FIFO <base>.in carries bytes to
// the guest and <base>.out bytes from it. A goroutine drains <base>.out into
// [Console.Buffer] from [Create] until [Console.Finish] or [Console.Close],
// so the guest never stalls on a full pipe.
//
// The console opens both FIFOs read-write, so opening never blocks or fails
// for lack of a peer, and writes never fail when QEMU has gone; it also means
// the drain never sees end-of-file, so whoever notices that QEMU exited must
// call [Console.Finish].
//
// All methods are safe for concurrent use.
type Console struct {
	base    string
	in, out *fifo
	buf     *Buffer
	log     *slog.Logger
	size    int

	// writeSem (capacity 1) serialises Write and its use of the write
	// deadline; unlike a mutex, waiting for it honours the context.
	writeSem chan struct{}
	inRC     syscall.RawConn // in.f's

	lifeMu       sync.Mutex // serialises Finish and Close
	finished     bool
	closed       bool
	drainStopped bool

	closing   atomic.Bool   // set by Close before it closes the FIFOs
	stopping  atomic.Bool   // set before the drain is told to stop
	drainDone chan struct{} // closed when the drain goroutine returns
	// wakeR/wakeW is the pipe that wakes the drain's poll(2): to stop
	// it, or for a Sync.
	wakeR, wakeW int
	// np is what the drain waits on in the runtime's netpoller for
	// interactive output (see Console.drain): an inotify instance
	// watching the output FIFO, or where that cannot be had the FIFO
	// opened a second time, non-blocking; nil while the drain naps
	// through a flood. kicked says a stop or a Sync waits for the drain:
	// whoever sets it also moves np's read deadline into the past. Both
	// are guarded by npMu.
	npMu   sync.Mutex
	np     *os.File
	kicked bool
	// syncs are the Syncs waiting for the drain (guarded by syncMu).
	syncMu sync.Mutex
	syncs  []chan struct{}
}

// Create makes the FIFOs <base>.in and <base>.out (mode 0600), opens them and starts draining the output. Pass
// [Console.Base] to QEMU as "-chardev pipe,path=...". Create fails if either
// path exists already, whatever it is (leftovers are for the caller to
// reap); it never follows a symlink and checks that what it opened is the
// FIFO it made, owned by this user. With [WithTranscript] it then creates
// the transcript file; that failing fails Create. On failure it removes the
// FIFOs it created, and nothing else. Removal compares device and inode with
// an lstat just before unlinking, which cannot be atomic, so base's
// directory should be writable only by this user.
func Create(base string, opts ...Option) (*Console, error) {
	cfg := newConfig(opts)
	in, err := makeFIFO(base+".in", true)
	if err != nil {
		return nil, err
	}
	out, err := makeFIFO(base+".out", false)
	if err != nil {
		in.destroy(cfg.logger)
		return nil, err
	}
	// Deadlines are how Write honours its context; they need the runtime
	// poller, which FIFOs support.
	inRC, err := in.f.SyscallConn()
	if err == nil {
		err = in.f.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		in.destroy(cfg.logger)
		out.destroy(cfg.logger)
		return nil, fmt.Errorf("serial: FIFO not pollable: %w", err)
	}
	// Without /proc the drain sleeps in poll(2) on the output FIFO and
	// this pipe; a byte on the pipe tells it to stop.
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		in.destroy(cfg.logger)
		out.destroy(cfg.logger)
		return nil, fmt.Errorf("serial: wake pipe: %w", err)
	}
	// The transcript comes last, so that it exists only if Create succeeds.
	buf, err := openBuffer(&cfg)
	if err != nil {
		unix.Close(wake[0])
		unix.Close(wake[1])
		in.destroy(cfg.logger)
		out.destroy(cfg.logger)
		return nil, err
	}
	c := &Console{
		base:      base,
		in:        in,
		out:       out,
		buf:       buf,
		log:       cfg.logger,
		size:      cfg.readSize,
		writeSem:  make(chan struct{}, 1),
		inRC:      inRC,
		drainDone: make(chan struct{}),
		wakeR:     wake[0],
		wakeW:     wake[1],
	}
	go c.drain()
	return c, nil
}

// Base returns the FIFOs' common path without ".in"/".out", for QEMU's
// "-chardev pipe,path=".
func (c *Console) Base() string { return c.base }

// InPath returns the path of the FIFO carrying bytes to the guest.
func (c *Console) InPath() string { return c.in.path }

// OutPath returns the path of the FIFO carrying bytes from the guest.
func (c *Console) OutPath() string { return c.out.path }

// Buffer returns the buffer holding the guest's output (the most recent
// part in memory, all of it in the transcript if there is one). It stays
// readable after Close.
func (c *Console) Buffer() *Buffer { return c.buf }

// Write sends p to the guest and returns how many bytes went into the pipe.
// If the guest does not read and the pipe is full, Write blocks until ctx is
// done and then returns the count so far with an error wrapping ctx.Err()
// (and [os.ErrDeadlineExceeded] if the pipe was full). A ctx without
// deadline or cancellation lets Write block for as long as the guest does
// not read. Concurrent Writes are serialised, so their bytes do not
// interleave; one waiting for another gives up when its ctx is done. After
// Close, Write fails with an error wrapping [os.ErrClosed].
//
// Control characters pass through untouched ("\x03" is Ctrl-C).
func (c *Console) Write(ctx context.Context, p []byte) (int, error) {
	if err := c.acquireWrite(ctx); err != nil {
		return 0, err
	}
	defer c.releaseWrite()
	return c.writeLocked(ctx, p)
}

// WriteSlow is Write one byte at a time, waiting charDelay between bytes,
// for guests that read their UART without a FIFO (or poll it slowly) and
// would drop bytes that arrive back to back. It holds the console for its
// whole duration, so other Writes do not interleave. It returns how many
// bytes went out; when ctx is done, between bytes or while one blocks, it
// stops with an error wrapping ctx.Err(). A charDelay <= 0 makes it Write.
func (c *Console) WriteSlow(ctx context.Context, p []byte, charDelay time.Duration) (int, error) {
	if charDelay <= 0 {
		return c.Write(ctx, p)
	}
	if err := c.acquireWrite(ctx); err != nil {
		return 0, err
	}
	defer c.releaseWrite()
	var t *time.Timer
	for i := range p {
		if i > 0 {
			if t == nil {
				t = time.NewTimer(charDelay)
				defer t.Stop()
			} else {
				t.Reset(charDelay)
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return i, fmt.Errorf("serial: write: %w", ctx.Err())
			}
		}
		if _, err := c.writeLocked(ctx, p[i:i+1]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// acquireWrite takes the write semaphore, giving up when ctx is done.
func (c *Console) acquireWrite(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("serial: write: %w", err)
	}
	select {
	case c.writeSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("serial: write: %w", ctx.Err())
	}
}

func (c *Console) releaseWrite() { <-c.writeSem }

// HoldInput makes writes to the guest wait until release is called, after
// any write in progress has ended (or ctx has). Whoever swaps the QEMU
// behind the console holds it, so that nothing typed meanwhile reaches the
// QEMU being replaced, nor the new one before it is ready: such writes go
// to the new one once released, whole.
func (c *Console) HoldInput(ctx context.Context) (release func(), err error) {
	if err := c.acquireWrite(ctx); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(c.releaseWrite) }, nil
}

// DiscardInput drops what was written to the guest and not read: the bytes
// left in the input pipe once the QEMU that was to read them is gone. It
// returns how many. Call it while holding the input (HoldInput).
func (c *Console) DiscardInput() (int, error) {
	rc, err := c.in.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	total := 0
	var rerr error
	buf := make([]byte, 4096)
	if err := rc.Control(func(fd uintptr) {
		for {
			avail, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
			if err != nil || avail == 0 {
				rerr = err
				return
			}
			// The descriptor is non-blocking: an empty pipe is EAGAIN.
			n, err := unix.Read(int(fd), buf[:min(avail, len(buf))])
			if n > 0 {
				total += n
			}
			if err != nil {
				if !errors.Is(err, unix.EAGAIN) {
					rerr = err
				}
				return
			}
		}
	}); err != nil {
		return total, err
	}
	if rerr != nil {
		return total, fmt.Errorf("serial: discard input: %w", rerr)
	}
	return total, nil
}

// writeLocked writes p to the input FIFO; the caller holds the write
// semaphore.
func (c *Console) writeLocked(ctx context.Context, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f := c.in.f
	deadline, _ := ctx.Deadline() // zero (no deadline) if none
	if err := f.SetWriteDeadline(deadline); err != nil {
		return 0, c.writeErr(err)
	}
	// Cancellation without a deadline: move the deadline to the past. The
	// callback is waited for if it started, so it cannot touch the deadline
	// of a later Write.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = f.SetWriteDeadline(time.Unix(1, 0))
	})
	// A raw write, for the reason the drain reads raw (Console.drain).
	n, err := rawio.Write(c.inRC, p)
	if !stop() {
		<-fired
	}
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Every write deadline comes from ctx; its own timer may not have
		// fired yet.
		cerr := ctx.Err()
		if cerr == nil {
			cerr = context.DeadlineExceeded
		}
		return n, fmt.Errorf("serial: write: %w (%w)", cerr, err)
	default:
		return n, c.writeErr(err)
	}
}

// writeErr wraps an error from the input FIFO, reporting [os.ErrClosed] if
// the console has been closed (file methods other than Write report that
// differently).
func (c *Console) writeErr(err error) error {
	if c.closing.Load() && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("serial: write: %w (%w)", os.ErrClosed, err)
	}
	return fmt.Errorf("serial: write: %w", err)
}

// Sync returns once everything QEMU had written to the output FIFO when
// Sync was called is in the buffer. Whoever writes a line of its own into
// the buffer while QEMU is paused (a restore's marker) calls it first, so
// that the line comes after the guest's last output, not within it. After
// Finish or Close it returns at once; if ctx ends first, it returns an
// error wrapping ctx.Err().
func (c *Console) Sync(ctx context.Context) error {
	ch := make(chan struct{})
	c.lifeMu.Lock()
	if c.drainStopped {
		// Finish read the rest; after Close nothing more comes.
		c.lifeMu.Unlock()
		return nil
	}
	c.syncMu.Lock()
	c.syncs = append(c.syncs, ch)
	c.syncMu.Unlock()
	// Under lifeMu: stopDrain, which closes the pipe, cannot run now.
	if err := c.kick(1); err != nil {
		c.lifeMu.Unlock()
		return fmt.Errorf("serial: sync: %w", err)
	}
	c.lifeMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-c.drainDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("serial: sync: %w", ctx.Err())
	}
}

// syncDrain answers the Syncs waiting: it empties the wake pipe, reads
// what the output FIFO holds into the buffer, and releases them. Run by
// the drain only.
func (c *Console) syncDrain(fd int, p []byte) error {
	var b [64]byte
	for {
		if n, err := unix.Read(c.wakeR, b[:]); n <= 0 || err != nil {
			break
		}
	}
	c.syncMu.Lock()
	waiting := c.syncs
	c.syncs = nil
	c.syncMu.Unlock()
	defer func() {
		for _, ch := range waiting {
			close(ch)
		}
	}()
	for {
		avail, err := unix.IoctlGetInt(fd, unix.TIOCINQ)
		if err != nil {
			return fmt.Errorf("FIONREAD on %s: %w", c.out.path, err)
		}
		if avail == 0 {
			return nil
		}
		// FIONREAD said it is there and the drain is the only reader:
		// the read does not block.
		n, err := unix.Read(fd, p[:min(avail, len(p))])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			c.buf.write(p[:n])
		}
	}
}

// Finish is called once the writer of the output FIFO (QEMU) is gone: it
// stops the drain, reads what is still in the pipe into the buffer, and
// finishes the buffer, which wakes all waiters. If ctx ends first, the
// buffer is finished anyway and an error is returned. Calling Finish while
// QEMU still writes would lose whatever it writes afterwards. Finish is
// idempotent; after Close it only reports [os.ErrClosed].
func (c *Console) Finish(ctx context.Context) error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.finished {
		return nil
	}
	if c.closed {
		return fmt.Errorf("serial: finish: %w", os.ErrClosed)
	}
	c.finished = true
	defer c.buf.Finish() // also flushes the transcript
	c.stopDrain()
	if err := c.drainRest(ctx); err != nil {
		return fmt.Errorf("serial: finish: %w", err)
	}
	return nil
}

// Close stops the drain, finishes the buffer (waking all waiters), flushes
// and closes the transcript (which stays; see [Buffer.Close]), closes both
// FIFOs and removes them, provided the paths still name the FIFOs Create
// made. Unlike Finish it does not read what is left in the pipe. A pending
// Write fails. The buffer stays readable. Close is idempotent; calls after
// the first return nil.
func (c *Console) Close() error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.closing.Store(true)
	c.stopDrain()
	berr := c.buf.Close()
	return errors.Join(berr, c.in.destroy(c.log), c.out.destroy(c.log))
}

// idleFlushDelay is how soon after a read that emptied the pipe the drain
// flushes the transcript, unless a flush happened meanwhile.
const idleFlushDelay = 10 * time.Millisecond

// flushMaxAge bounds how long output waits for the transcript when the
// guest never goes quiet for idleFlushDelay: a line every few
// milliseconds kept pushing the idle flush back, and the file trailed the
// console by up to transcriptChunk for seconds.
const flushMaxAge = 100 * time.Millisecond

// drain copies the output FIFO into the buffer until stopped. QEMU's UART
// writes the pipe a byte per system call, and the drain serves an echo
// (every microsecond counts) and a flood (waking per byte would take the
// emulator's core) in two modes, interactive and flood; docs/architecture.md
// ("The console's data path") says why each waits as it does. Where neither the inotify
// watch nor a second descriptor can be had (no /proc), it sleeps in poll(2)
// for both (pollOnly). With a transcript, it flushes after idleFlushDelay of
// quiet, not after every short read: that would double its system calls.
func (c *Console) drain() {
	defer close(c.drainDone)
	rc, err := c.out.f.SyscallConn()
	if err != nil {
		c.log.Error("serial: drain cannot start", "path", c.out.path, "err", err)
		return
	}
	d := drainer{c: c, p: make([]byte, c.size), winStart: time.Now(), nb: -1}
	_ = rc.Control(func(f uintptr) { d.fd = int(f) })
	defer d.closeNP()
	defer func() {
		if d.nb >= 0 {
			unix.Close(d.nb)
		}
	}()
	for {
		var stop bool
		var err error
		switch {
		case !d.flooding && d.openNP():
			stop, err = d.interactive()
		case !d.noNP:
			stop, err = d.flood()
		default:
			stop, err = d.pollOnly()
		}
		if err != nil {
			c.log.Error("serial: drain stopped", "path", c.out.path, "err", err)
			return
		}
		if stop {
			return
		}
	}
}

// kick tells the drain to look at c.stopping and the Syncs waiting: the
// flag its flood naps look at, a read deadline in the past for its
// netpoller read, a byte on the wake pipe for its poll(2) (pollOnly). b is
// the byte written.
func (c *Console) kick(b byte) error {
	c.npMu.Lock()
	c.kicked = true
	if c.np != nil {
		_ = c.np.SetReadDeadline(time.Unix(1, 0))
	}
	c.npMu.Unlock()
	if _, err := unix.Write(c.wakeW, []byte{b}); err != nil && !errors.Is(err, unix.EAGAIN) {
		return err
	}
	return nil
}

// takeKick reports and clears a kick.
func (c *Console) takeKick() bool {
	c.npMu.Lock()
	k := c.kicked
	c.kicked = false
	c.npMu.Unlock()
	return k
}

// modeHook, if set (by tests), is called when a drain enters flood mode
// (true) or leaves it (false).
var modeHook atomic.Pointer[func(c *Console, flood bool)]

// drainer is the drain goroutine's state.
type drainer struct {
	c  *Console
	fd int // the blocking descriptor: floods, Syncs, pollOnly
	p  []byte
	// noNP: the netpoller descriptor cannot be had here (no /proc, or
	// the FIFO is not pollable): pollOnly.
	noNP bool
	// flooding: in flood mode until floodQuiet without output.
	flooding bool
	// armed: an idle flush is due after idleFlushDelay of quiet, or at
	// armedAt+flushMaxAge at the latest.
	armed   bool
	armedAt time.Time
	// The burst window: bytes read since winStart.
	winStart time.Time
	winBytes int
	npRC     syscall.RawConn
	// deadline is np's read deadline as the drain last set it.
	deadline time.Time
	// watching: np is an inotify instance watching the FIFO, not the
	// FIFO itself; confirmed: it has reported a write; noWatch: the
	// watch cannot be had here, or did not report a write (see
	// watchGuard), and np is the FIFO.
	watching, confirmed, noWatch bool
	ev                           []byte // inotify events, read and dropped
	// nb is the FIFO opened a third time, non-blocking and outside the
	// netpoller (-1 until the watch needs it): one read(2) takes what
	// the pipe holds or says EAGAIN. pending: the watch has reported a
	// write that nb has not looked for since.
	nb      int
	pending bool
}

// watchGuard is how long the drain waits for the first inotify event of a
// console before it looks whether output came without one. A kernel that
// reported no FIFO writes to inotify would otherwise leave the drain
// asleep beside a pipe filling up: once it is seen to, the drain watches
// the FIFO itself. Output that comes with an event confirms the watch,
// and the guard is not set again.
const watchGuard = 100 * time.Millisecond

// watchPath, if set (by tests), names the file the inotify watch is put
// on in place of the FIFO.
var watchPath atomic.Pointer[func(fd int) string]

// openNP opens what the interactive mode waits on unless it is open: the
// watch (openWatch), or else the FIFO; false means pollOnly. It reopens
// the FIFO through /proc/self/fd, which gives a new open file description
// of the very pipe the console made (no path is looked up again),
// read-write like the first so that it never sees end-of-file.
func (d *drainer) openNP() bool {
	c := d.c
	c.npMu.Lock()
	defer c.npMu.Unlock()
	if c.np != nil {
		return true
	}
	if d.noNP {
		return false
	}
	if !d.noWatch {
		f, err := d.openWatch()
		if err == nil {
			d.watching = true
			return d.setNP(f)
		}
		d.noWatch = true
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENOSPC) {
			// The user's inotify instances or watches ran out (128
			// instances by default, shared by every program of the user):
			// the console works, floods are 5-9 % slower; a person can fix it.
			c.log.Warn("serial: no inotify watch on the output FIFO: this user's inotify limit is reached (sysctl fs.inotify.max_user_instances / max_user_watches); the console works, its floods read slower", "path", c.out.path, "err", err)
		} else {
			c.log.Debug("serial: no inotify watch on the output FIFO; the drain waits on the FIFO itself, which costs QEMU's writes under a flood", "path", c.out.path, "err", err)
		}
	}
	d.watching = false
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(d.fd), os.O_RDWR|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err == nil {
		// Deadlines need the netpoller: this fails if the descriptor is
		// not in it.
		if err = f.SetReadDeadline(time.Time{}); err != nil {
			f.Close()
		}
	}
	if err != nil {
		d.noNP = true
		c.log.Debug("serial: output FIFO not pollable through the runtime; the drain reads it in poll(2) only", "path", c.out.path, "err", err)
		return false
	}
	return d.setNP(f)
}

// setNP makes f, in the netpoller, np. c.npMu must be held.
func (d *drainer) setNP(f *os.File) bool {
	c := d.c
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		d.noNP = true
		return false
	}
	c.np, d.npRC, d.deadline = f, rc, time.Time{}
	if c.kicked {
		_ = f.SetReadDeadline(time.Unix(1, 0))
		d.deadline = time.Unix(1, 0)
	}
	return true
}

// openWatch makes an inotify instance, in the netpoller, that watches the
// output FIFO for writes: the drain learns of output without polling the
// pipe. Linux wakes the readers of a pipe on every write once anybody has
// polled it (pipe->poll_usage, kept for the pipe's life), where QEMU's
// UART writes a byte per write(2): a pipe never polled lets a flood run
// 5 to 9 % faster. The watch goes with the instance when the drain
// closes it for a flood, and costs QEMU's writes nothing after.
func (d *drainer) openWatch() (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	path := "/proc/self/fd/" + strconv.Itoa(d.fd) // the very pipe: no name is looked up
	if h := watchPath.Load(); h != nil {
		path = (*h)(d.fd)
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		f.Close()
		return nil, fmt.Errorf("inotify_add_watch: %w", err)
	}
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("inotify not in the netpoller: %w", err)
	}
	if d.nb < 0 {
		nb, err := unix.Open("/proc/self/fd/"+strconv.Itoa(d.fd), unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("non-blocking FIFO: %w", err)
		}
		d.nb = nb
	}
	if d.ev == nil {
		d.ev = make([]byte, 4096)
	}
	// What QEMU wrote before the watch was there has no event.
	d.pending = true
	return f, nil
}

// readWatched reads what the FIFO holds once the watch has reported a
// write, and otherwise waits in the netpoller for the watch (r is 0 then).
// Every write queues an event (or merges into one not read yet), so data
// that comes after the read below has an event to wake the drain: an
// event read, then one read of the FIFO, is all a write costs the drain.
func (d *drainer) readWatched(np syscall.RawConn) (r int, err error) {
	if d.pending {
		r, err := rawio.ReadNow(d.nb, d.p)
		switch {
		case r == len(d.p):
			return r, nil // more may be there: look again
		case err == nil, errors.Is(err, unix.EAGAIN):
			d.pending = false
			return r, nil
		}
		return 0, fmt.Errorf("read: %w", err)
	}
	n, err := rawio.Read(np, d.ev)
	if n > 0 {
		d.confirmed, d.pending = true, true
	}
	return 0, err
}

// watchFailed tells, at the guard's deadline, whether output waits in the
// FIFO that the watch did not report.
func (d *drainer) watchFailed() bool {
	if avail, err := rawio.Available(d.fd); err != nil || avail == 0 {
		return false
	}
	// The event may have come with the deadline.
	var fd int
	_ = d.npRC.Control(func(f uintptr) { fd = int(f) })
	if n, _ := rawio.ReadNow(fd, d.ev); n > 0 {
		d.confirmed = true
		return false
	}
	return true
}

// closeNP closes the interactive mode's descriptor, which takes it out of
// the netpoller's epoll set.
func (d *drainer) closeNP() {
	c := d.c
	c.npMu.Lock()
	defer c.npMu.Unlock()
	if c.np != nil {
		c.np.Close()
		c.np = nil
	}
}

// take hands the r bytes just read to the buffer; it reports whether they
// make the output a flood.
func (d *drainer) take(r int) (burst bool) {
	c := d.c
	if woke, _ := c.buf.write(d.p[:r]); woke {
		// A wait this woke runs on this thread now, rather than on
		// another that the scheduler would have to wake: the drain is
		// about to block anyway.
		runtime.Gosched()
	}
	now := time.Now()
	if c.buf.tr != nil && r < len(d.p) {
		switch {
		case !d.armed:
			d.armed, d.armedAt = true, now
		case now.Sub(d.armedAt) >= flushMaxAge:
			_ = c.buf.Flush() // a failure was logged; this read's bytes included
			d.armed = false
		}
	}
	if now.Sub(d.winStart) > burstWindow {
		d.winStart, d.winBytes = now, 0
	}
	d.winBytes += r
	return d.winBytes > burstBytes && r < len(d.p)/2
}

// quietTimeout is how long a read may wait before the drain has something
// to do without output: flush the transcript, or retry a stopped one; 0
// means no limit.
func (d *drainer) quietTimeout() time.Duration {
	switch {
	case d.armed:
		return idleFlushDelay
	case d.c.buf.transcriptStopped():
		// A stopped transcript is tried again while the guest is quiet
		// too.
		return transcriptRetry
	}
	return 0
}

// quiet is the read's timeout expiring without output.
func (d *drainer) quiet() {
	if d.armed || d.c.buf.transcriptStopped() {
		_ = d.c.buf.Flush() // a failure was logged
	}
	d.armed = false
}

// kicked handles a kick: stop reports that the drain must stop.
func (d *drainer) kicked() (stop bool, err error) {
	if d.c.stopping.Load() {
		return true, nil
	}
	if err := d.c.syncDrain(d.fd, d.p); err != nil {
		return false, fmt.Errorf("sync: %w", err)
	}
	return false, nil
}

// interactive reads through the netpoller until a stop (stop), a failure
// (err) or a flood (neither: the caller goes on in flood mode).
func (d *drainer) interactive() (stop bool, err error) {
	c := d.c
	for {
		// A kick that comes after this check moves the deadline set
		// here into the past: none is lost.
		c.npMu.Lock()
		kicked := c.kicked
		c.kicked = false
		if !kicked {
			var want time.Time
			if t := d.quietTimeout(); t > 0 {
				want = time.Now().Add(t)
			}
			if d.watching && !d.confirmed {
				if g := time.Now().Add(watchGuard); want.IsZero() || g.Before(want) {
					want = g
				}
			}
			// A deadline that is still at least half its delay away
			// stays: moving a runtime timer for every byte of an echo
			// costs more than flushing a little early.
			if !want.Equal(d.deadline) && (want.IsZero() || d.deadline.IsZero() || time.Until(d.deadline) < idleFlushDelay/2) {
				if err := c.np.SetReadDeadline(want); err != nil {
					c.npMu.Unlock()
					return false, fmt.Errorf("read deadline: %w", err)
				}
				d.deadline = want
			}
		}
		np := d.npRC
		c.npMu.Unlock()
		if kicked {
			if stop, err := d.kicked(); stop || err != nil {
				return stop, err
			}
			continue
		}
		var r int
		if d.watching {
			r, err = d.readWatched(np)
		} else {
			r, err = rawio.Read(np, d.p)
		}
		if r > 0 && d.take(r) {
			d.closeNP()
			d.flooding = true
			if h := modeHook.Load(); h != nil {
				(*h)(c, true)
			}
			return false, nil
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A kick (seen at the top of the loop), quiet, or the watch
			// guard.
			d.deadline = time.Unix(1, 0) // expired: set anew
			c.npMu.Lock()
			k := c.kicked
			c.npMu.Unlock()
			if d.watching && !d.confirmed && d.watchFailed() {
				c.log.Warn("serial: the kernel did not report a write to the output FIFO through inotify; the drain waits on the FIFO itself", "path", c.out.path)
				d.noWatch = true
				d.closeNP()
				return false, nil // the caller opens the FIFO
			}
			if !k {
				d.quiet()
			}
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			return false, fmt.Errorf("read: %w", err)
		}
	}
}

// flood reads a flood without waiting in a system call: it naps, then
// reads what the pipe holds (Available says how much, so the read of the
// blocking descriptor cannot block), with raw system calls. A goroutine
// blocked in poll(2) holds a scheduler P, and with one P (package cpus) or
// two the runtime's sysmon takes it back, and polls every 20 us for it,
// many times a second; a napping goroutine holds nothing. It returns at a
// stop (stop), a failure (err), or after floodQuiet without output
// (neither: the caller goes back to interactive). A stop or a Sync waits
// for the current nap, floodNap at most.
func (d *drainer) flood() (stop bool, err error) {
	c := d.c
	nap := burstNap
	var quiet time.Duration
	for {
		if c.takeKick() || c.stopping.Load() {
			if stop, err := d.kicked(); stop || err != nil {
				return stop, err
			}
		}
		avail, err := rawio.Available(d.fd)
		if err != nil {
			return false, fmt.Errorf("FIONREAD: %w", err)
		}
		if avail > 0 {
			r, err := rawio.ReadNow(d.fd, d.p[:min(avail, len(d.p))])
			if err != nil {
				return false, fmt.Errorf("read: %w", err)
			}
			quiet = 0
			if !d.take(r) {
				// A read that filled half the buffer: read on at once.
				nap = burstNap
				continue
			}
		} else {
			quiet += nap
			if quiet >= floodQuiet {
				d.quiet()
				d.flooding = false
				if h := modeHook.Load(); h != nil {
					(*h)(c, false)
				}
				return false, nil // quiet: back to interactive
			}
			if quiet >= idleFlushDelay {
				d.quiet()
			}
		}
		time.Sleep(nap)
		// A flood that goes on: longer naps, fewer wake-ups, the
		// emulator the CPU for longer.
		nap = min(2*nap, floodNap)
	}
}

// pollOnly is the drain where the netpoller descriptor cannot be had: it
// sleeps in poll(2), napping between reads during a flood, until a stop
// (stop) or a failure (err).
func (d *drainer) pollOnly() (stop bool, err error) {
	c := d.c
	fds := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}, {Fd: int32(c.wakeR), Events: unix.POLLIN}}
	nap := burstNap
	for {
		timeout := -1
		if t := d.quietTimeout(); t > 0 {
			timeout = int(t / time.Millisecond)
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll: %w", err)
		}
		if fds[1].Revents != 0 || c.stopping.Load() {
			c.takeKick()
			if stop, err := d.kicked(); stop || err != nil {
				return stop, err
			}
			continue
		}
		if n == 0 {
			d.quiet()
			continue
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			// POLLERR/POLLHUP cannot happen while we hold a write end;
			// if they do, the guest will stall once the pipe fills.
			return false, fmt.Errorf("poll: revents %#x", fds[0].Revents)
		}
		// Poll said readable and the drain is the only reader: no block.
		r, err := unix.Read(d.fd, d.p)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("read: %w", err)
		}
		if r > 0 && d.take(r) {
			time.Sleep(nap)
			nap = min(2*nap, floodNap)
		} else {
			nap = burstNap
		}
	}
}

// Burst moderation of the drain (see drain). A 64 KiB pipe holds over
// 25 ms of the fastest UART output seen here (2.5 MB/s), so naps of a few
// milliseconds cannot stall the guest.
const (
	burstWindow = time.Millisecond
	burstBytes  = 256
	burstNap    = time.Millisecond
	// floodNap is the longest nap: naps double while a flood goes on.
	floodNap = 4 * time.Millisecond
	// floodQuiet is how long the output stays quiet before the drain
	// leaves flood mode for interactive again.
	floodQuiet = 20 * time.Millisecond
)

// stopDrain stops the drain goroutine and waits for it. Everything it read
// is in the buffer when stopDrain returns. c.lifeMu must be held.
func (c *Console) stopDrain() {
	if c.drainStopped {
		return
	}
	c.drainStopped = true
	c.stopping.Store(true)
	if err := c.kick(0); err != nil {
		c.log.Error("serial: stopping drain", "path", c.out.path, "err", err)
	}
	<-c.drainDone
	unix.Close(c.wakeR)
	unix.Close(c.wakeW)
}

// drainRest reads what is left in the output pipe into the buffer, using
// FIONREAD to know when it is empty. The drain goroutine must be stopped.
// (golang.org/x/sys/unix names Linux's FIONREAD TIOCINQ on most
// architectures; they are the same ioctl.)
func (c *Console) drainRest(ctx context.Context) error {
	// The descriptor is blocking, but FIONREAD says how much is there, so
	// no read below can block; ctx is checked between reads.
	f := c.out.f
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	p := make([]byte, c.size)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var avail int
		var ierr error
		if err := rc.Control(func(fd uintptr) {
			avail, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ)
		}); err != nil {
			return err
		}
		if ierr != nil {
			return fmt.Errorf("FIONREAD on %s: %w", c.out.path, ierr)
		}
		if avail == 0 {
			return nil
		}
		n, err := f.Read(p[:min(avail, len(p))])
		if n > 0 {
			_, _ = c.buf.Write(p[:n])
		}
		if err != nil {
			return err
		}
	}
}

// fifo is one FIFO made and opened by Create, identified by device and inode
// so that it is only ever removed while the path still names it.
type fifo struct {
	path     string
	f        *os.File
	dev, ino uint64
}

// makeFIFO creates and opens the FIFO at path (read-write, no symlinks)
// and verifies it is the FIFO just made, owned by this user.
func makeFIFO(path string, pollable bool) (*fifo, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("serial: %s already exists; leaving it alone: %w", path, fs.ErrExist)
		}
		return nil, fmt.Errorf("serial: mkfifo %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, fmt.Errorf("serial: lstat %s after mkfifo: %w", path, err)
	}
	if err := checkFIFO(path, st.Mode, st.Uid); err != nil {
		// Replaced already: not ours to remove.
		return nil, err
	}
	ff := &fifo{path: path, dev: uint64(st.Dev), ino: uint64(st.Ino)}
	var f *os.File
	var err error
	if pollable {
		f, err = os.OpenFile(path, os.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	} else {
		// A blocking descriptor wrapped by NewFile stays out of the
		// runtime's netpoller (see Console.drain for why).
		var fd int
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == nil {
			f = os.NewFile(uintptr(fd), path)
		}
	}
	if err != nil {
		_ = ff.remove()
		return nil, fmt.Errorf("serial: open %s: %w", path, err)
	}
	ff.f = f
	fi, err := f.Stat()
	if err == nil {
		sys, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok:
			err = fmt.Errorf("serial: %s: no stat data", path)
		case uint64(sys.Dev) != ff.dev || uint64(sys.Ino) != ff.ino:
			err = fmt.Errorf("serial: %s was replaced while being opened", path)
		default:
			err = checkFIFO(path, sys.Mode, sys.Uid)
		}
	}
	if err != nil {
		_ = f.Close()
		_ = ff.remove()
		return nil, err
	}
	return ff, nil
}

// checkFIFO verifies stat data describes a FIFO owned by this user.
func checkFIFO(path string, mode, uid uint32) error {
	if mode&syscall.S_IFMT != syscall.S_IFIFO {
		return fmt.Errorf("serial: %s is not a FIFO (mode %#o)", path, mode)
	}
	if int(uid) != os.Getuid() {
		return fmt.Errorf("serial: %s is owned by uid %d, not %d", path, uid, os.Getuid())
	}
	return nil
}

// destroy closes the FIFO and removes it if the path still names it.
func (ff *fifo) destroy(log *slog.Logger) error {
	var errs []error
	if ff.f != nil {
		if err := ff.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, fmt.Errorf("serial: close %s: %w", ff.path, err))
		}
	}
	if err := ff.remove(); err != nil {
		log.Warn("serial: not removing FIFO", "path", ff.path, "err", err)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove removes the path if it still names this FIFO (same device and
// inode); a missing path is fine.
func (ff *fifo) remove() error {
	var st unix.Stat_t
	if err := unix.Lstat(ff.path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("serial: lstat %s: %w", ff.path, err)
	}
	if uint64(st.Dev) != ff.dev || uint64(st.Ino) != ff.ino {
		return fmt.Errorf("serial: %s is no longer the FIFO we made; leaving it", ff.path)
	}
	if err := os.Remove(ff.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("serial: %w", err)
	}
	return nil
}
