// Package gdb is a client of the GDB Remote Serial Protocol as QEMU's
// gdbstub speaks it, for debugging a guest from Go: it connects and learns
// the target (features, the register list from the XML target
// description, or the guest architecture's without one: package arch),
// reads and writes registers and memory, sets breakpoints and
// watchpoints, and resumes, steps and interrupts the guest. One goroutine
// owns reading the socket; commands are serialized and bound to contexts;
// and because QEMU cannot answer anything while the guest runs, the client
// tracks whether it runs and refuses commands then instead of hanging.
package gdb

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
)

const (
	// QEMU creates its gdb socket while starting; the first retries are
	// short so that dialling right after launch is cheap.
	minDialBackoff = time.Millisecond
	maxDialBackoff = 50 * time.Millisecond

	// interruptResend is how long Interrupt waits for the stop before it
	// sends another interrupt byte. One is enough for QEMU; a second is
	// harmless (a stopped stub ignores it) and covers a byte the stub
	// took for garbage.
	interruptResend = time.Second

	// defaultDetachTimeout bounds the detach Close attempts.
	defaultDetachTimeout = time.Second

	// maxQueued bounds replies nobody asked for; more means the peer is
	// not a gdbstub.
	maxQueued = 1024

	// maxMemory bounds one ReadMemory or WriteMemory.
	maxMemory = 64 << 20
)

// aLongTimeAgo is a deadline in the past, used to interrupt blocked writes.
var aLongTimeAgo = time.Unix(1, 0)

// probePacket is sent to find out where the reply stream stands (see
// roundTrip); its reply, "QC<thread>", cannot be confused with any other.
var probePacket = []byte("qC")

// An Option configures a Client.
type Option func(*options)

type options struct {
	logger        *slog.Logger
	detachTimeout time.Duration
	arch          arch.Arch
}

// WithArch says the guest's architecture, whose registers a stub without
// a target description sends; nil (and the default) is archs.Default().
func WithArch(a arch.Arch) Option {
	return func(o *options) {
		if a != nil {
			o.arch = a
		}
	}
}

// WithLogger sets the logger for protocol diagnostics (stray replies,
// notifications, connection loss). A nil logger is ignored.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithDetachTimeout bounds how long Close tries to detach before it just
// closes the connection. Non-positive values keep the default (1s).
func WithDetachTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.detachTimeout = d
		}
	}
}

// A Client is a connection to one gdbstub. It is safe for concurrent use,
// but the target is one: while it runs, only Wait, Interrupt, Running and
// the accessors of what Dial learnt work.
type Client struct {
	conn net.Conn
	log  *slog.Logger
	opts options

	// Learnt by Dial, read-only afterwards.
	features   map[string]string
	packetSize int
	readChunk  int
	writeChunk int
	desc       description
	index      map[string]int // register name (and alias) -> index in desc.regs
	pcIndex    int            // -1 without a "pc" register
	vcont      map[string]bool
	probe      bool // the stub answers qC, so streams can be resynchronised

	ack atomic.Bool // ack mode: acknowledge every packet

	// cmdSem serializes commands; a waiter can abandon it when its
	// context ends. The fields below it are only used by its holder.
	cmdSem      chan struct{}
	handshaking bool
	outstanding int  // probes whose replies have not arrived yet
	needProbe   bool // a command was abandoned: its reply may still come
	bps         map[Breakpoint]int
	reinsert    []Breakpoint // stepped over, to be put back

	writeMu  sync.Mutex
	lastSent []byte // for retransmission on a nack, in ack mode

	closeOnce  sync.Once
	done       chan struct{} // closed when the connection becomes unusable
	readerDone chan struct{}

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change below
	err      error         // why done is closed
	replies  [][]byte      // non-stop packets not yet taken
	stops    uint64        // stop replies received
	last     Stop          // the latest of them
	haveLast bool
	consumed bool   // last has been returned to a caller
	running  bool   // resumed and no stop reply since
	runGen   uint64 // counts resumes
	stopGen  uint64 // runGen of the latest run that ended
	exit     *Stop  // set once the target exited
	// selThread is the thread the stub's register and memory commands
	// act on (Hg), "" when unknown: a stop may move QEMU's selection to
	// the thread that stopped. cThread is the thread QEMU reports an
	// interrupt on and takes out of single-step mode at a stop (Hc):
	// the thread of the last stop, or the one resumed alone since.
	selThread, cThread string
	noHc               bool // the stub knows no Hc
	// parked are the threads that stopped on a trap (breakpoint, step,
	// watchpoint) and have not run since: resuming one at a breakpoint's
	// address would report that breakpoint again without it moving.
	// watched are those that stopped on a watchpoint, which QEMU reports
	// before the access: resuming them must step past it.
	parked, watched map[string]bool
	// replaced says the target's state was replaced since it last ran
	// (StateReplaced): no thread stopped at a breakpoint it is at.
	replaced bool
}

// Dial connects to a gdbstub at network/address ("unix", a path, or "tcp",
// host:port) and completes the handshake: qSupported, no-ack mode when the
// stub offers it, the target description with everything it includes, and
// the halt reason. Until ctx is done it retries while the socket does not
// exist yet or refuses connections.
//
// QEMU stops the guest when a debugger connects (if it was running), so
// the target is stopped when Dial returns: Continue resumes it. QEMU serves
// one debugger at a time; a second Dial gets no answer until the first
// closes, and fails when ctx ends.
func Dial(ctx context.Context, network, address string, opts ...Option) (*Client, error) {
	o := options{logger: slog.New(slog.DiscardHandler), detachTimeout: defaultDetachTimeout, arch: archs.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	conn, err := dial(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("gdb: dial %s %s: %w", network, address, err)
	}
	c := &Client{
		conn:       conn,
		log:        o.logger.With("gdb", address),
		opts:       o,
		cmdSem:     make(chan struct{}, 1),
		bps:        map[Breakpoint]int{},
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
		changed:    make(chan struct{}),
		pcIndex:    -1,
		parked:     map[string]bool{},
		watched:    map[string]bool{},
	}
	c.ack.Store(true)
	go c.readLoop(bufio.NewReaderSize(conn, 8192))
	if err := c.handshake(ctx); err != nil {
		c.teardown(fmt.Errorf("%w: handshake failed", ErrClosed))
		<-c.readerDone
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (no answer: is another debugger attached?)", err)
		}
		return nil, fmt.Errorf("gdb: %s: handshake: %w", address, err)
	}
	return c, nil
}

func dial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	backoff := minDialBackoff
	for attempt := 1; ; attempt++ {
		conn, err := d.DialContext(ctx, network, address)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil || !(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN)) {
			return nil, fmt.Errorf("%w (after %d attempts)", err, attempt)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (after %d attempts, last: %v)", ctx.Err(), attempt, err)
		case <-t.C:
		}
		backoff = min(2*backoff, maxDialBackoff)
	}
}

func (c *Client) handshake(ctx context.Context) error {
	c.handshaking = true
	defer func() { c.handshaking = false }()

	// swbreak/hwbreak ask for the stop reason in stop replies; QEMU 7.2
	// ignores them, others may not. multiprocess is not asked for, so
	// thread ids stay plain ("01").
	cmd := []byte("qSupported:swbreak+;hwbreak+;vContSupported+")
	reply, err := c.roundTrip(ctx, cmd)
	if err == nil {
		err = replyError(cmd, reply)
	}
	if err != nil {
		return err
	}
	c.features = parseFeatures(reply)
	c.packetSize = 400 // gdb's assumption when the stub names none
	if v, ok := c.features["PacketSize"]; ok {
		n, err := strconv.ParseUint(v, 16, 32)
		if err != nil || n < 64 {
			return fmt.Errorf("qSupported: bad PacketSize %q", v)
		}
		c.packetSize = int(min(n, 1<<20))
	}
	// 'm' replies are hex, two characters a byte; chunks are powers of
	// two so that they never straddle a page, which makes the address
	// of a failed read exact.
	c.readChunk = floorPow2(c.packetSize / 2)
	c.writeChunk = floorPow2((c.packetSize - 64) / 2)

	if c.features["QStartNoAckMode"] == "+" {
		cmd := []byte("QStartNoAckMode")
		reply, err := c.roundTrip(ctx, cmd)
		if err != nil {
			return err
		}
		// The reader acknowledged this OK while ack mode was still on,
		// as the protocol wants; from here on, nobody acknowledges.
		if string(reply) == "OK" {
			c.ack.Store(false)
		}
	}

	if c.features["qXfer:features:read"] == "+" {
		c.desc, err = parseDescription(func(annex string) ([]byte, error) {
			return c.xfer(ctx, "features", annex)
		})
		if err != nil {
			return err
		}
	} else {
		c.desc = fallback(c.opts.arch)
	}
	c.index = make(map[string]int, len(c.desc.regs)+33)
	for i, r := range c.desc.regs {
		if _, dup := c.index[r.Name]; !dup {
			c.index[r.Name] = i
		}
	}
	aliases(c.desc.regs, c.index)
	if i, ok := c.index["pc"]; ok {
		c.pcIndex = i
	}

	c.vcont = map[string]bool{}
	if reply, err := c.roundTrip(ctx, []byte("vCont?")); err != nil {
		return err
	} else if rest, ok := bytes.CutPrefix(reply, []byte("vCont")); ok {
		for a := range strings.SplitSeq(string(rest), ";") {
			if a != "" {
				c.vcont[a] = true
			}
		}
	}

	reply, err = c.roundTrip(ctx, probePacket)
	if err != nil {
		return err
	}
	c.probe = bytes.HasPrefix(reply, []byte("QC"))

	st, err := c.haltReason(ctx)
	if err != nil {
		return err
	}
	// A stub starts with register commands on the thread it reports
	// stopped (QEMU: its first vCPU).
	c.mu.Lock()
	c.selThread, c.cThread = st.Thread, st.Thread
	c.mu.Unlock()
	c.log.Debug("gdb: connected", "arch", c.desc.arch, "registers", len(c.desc.regs), "features", c.features)
	return nil
}

// parseFeatures decodes a qSupported reply: "name=value", "name+",
// "name-" or "name?" separated by ';'. Flags map to "+", "-" or "?".
func parseFeatures(reply []byte) map[string]string {
	f := map[string]string{}
	for item := range strings.SplitSeq(string(reply), ";") {
		if name, val, ok := strings.Cut(item, "="); ok {
			f[name] = val
			continue
		}
		if n := len(item); n > 1 && strings.ContainsRune("+-?", rune(item[n-1])) {
			f[item[:n-1]] = item[n-1:]
		}
	}
	return f
}

func floorPow2(n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return p
}

// xfer reads a whole qXfer object, chunk by chunk.
func (c *Client) xfer(ctx context.Context, object, annex string) ([]byte, error) {
	var out []byte
	for {
		cmd := fmt.Appendf(nil, "qXfer:%s:read:%s:%x,%x", object, annex, len(out), c.packetSize)
		reply, err := c.roundTrip(ctx, cmd)
		if err == nil {
			err = replyError(cmd, reply)
		}
		if err != nil {
			return nil, err
		}
		data, err := unescape(reply[1:])
		if err != nil {
			return nil, err
		}
		out = append(out, data...)
		if len(out) > maxDescription {
			return nil, fmt.Errorf("%s: more than %d bytes", annex, maxDescription)
		}
		switch reply[0] {
		case 'l':
			return out, nil
		case 'm':
			if len(data) == 0 {
				return nil, fmt.Errorf("%s: %w: 'm' reply without data", annex, errMalformed)
			}
		default:
			return nil, fmt.Errorf("%s: %w: reply %.40q", annex, errMalformed, reply)
		}
	}
}

// readLoop is the only reader of the connection. It never blocks on
// anything but the socket (and, in ack mode, on sending the ack).
func (c *Client) readLoop(r *bufio.Reader) {
	defer close(c.readerDone)
	for {
		kind, payload, bad, err := readFrame(r)
		if errors.Is(err, io.EOF) {
			// QEMU closes the connection without a word when the guest
			// makes it exit (sifive_test); on "quit" it says W00 first.
			c.teardown(fmt.Errorf("%w: the stub closed the connection (did QEMU exit?)", ErrClosed))
			return
		}
		if err != nil {
			c.teardown(fmt.Errorf("%w: connection lost: %w", ErrClosed, err))
			return
		}
		ack := c.ack.Load()
		switch {
		case kind == frameAck:
			continue
		case kind == frameNack:
			if ack {
				c.retransmit()
			}
			continue
		case bad && ack:
			if err := c.writeRaw([]byte{'-'}); err != nil {
				c.teardown(fmt.Errorf("%w: write: %w", ErrClosed, err))
				return
			}
			continue
		case bad:
			// Without acks nothing can be retransmitted, and a lost
			// reply would hang its command: give up instead.
			c.teardown(fmt.Errorf("%w: checksum mismatch in no-ack mode", ErrClosed))
			return
		case kind == '%':
			// Notifications belong to non-stop mode, which is never
			// enabled; they are not acknowledged.
			c.log.Debug("gdb: ignoring notification", "packet", shorten(payload))
			continue
		}
		var ackErr error
		if ack {
			ackErr = c.writeRaw([]byte{'+'})
		}
		// Dispatched even if the ack failed: QEMU says W00 and closes
		// the connection at once, and the exit must still be seen.
		if err := c.dispatch(payload); err != nil {
			c.teardown(fmt.Errorf("%w: %w", ErrClosed, err))
			return
		}
		if ackErr != nil {
			c.teardown(fmt.Errorf("%w: write: %w", ErrClosed, ackErr))
			return
		}
	}
}

func (c *Client) dispatch(p []byte) error {
	if isStopReply(p) {
		s, err := parseStop(p)
		if err != nil {
			c.log.Warn("gdb: odd stop reply", "err", err)
		}
		c.mu.Lock()
		c.stops++
		c.last, c.haveLast, c.consumed = s, true, false
		if c.running {
			// Only stops that end a run park a thread: the answer
			// to '?' is always a plain SIGTRAP in QEMU.
			c.running = false
			c.stopGen = c.runGen
			if s.Signal == SIGTRAP {
				c.parked[s.Thread] = true
			}
			if s.Reason == ReasonWatch || s.Reason == ReasonRWatch || s.Reason == ReasonAWatch {
				c.watched[s.Thread] = true
			}
		}
		if s.Thread != c.selThread {
			c.selThread = ""
		}
		c.cThread = s.Thread
		if s.exited() {
			c.exit = &s
		}
		c.notifyLocked()
		c.mu.Unlock()
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running && len(p) > 1 && p[0] == 'O' && isHex(p[1:]) {
		// Console output a stub may send before the stop reply.
		c.log.Debug("gdb: target output", "hex", shorten(p[1:]))
		return nil
	}
	if len(c.replies) >= maxQueued {
		return fmt.Errorf("%w: %d replies nobody asked for", errMalformed, len(c.replies))
	}
	c.replies = append(c.replies, p)
	c.notifyLocked()
	return nil
}

func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// await blocks until cond, evaluated with mu held, is true, ctx ends, or
// the connection dies. cond is checked first, so what arrived before the
// connection died (a final stop reply) is still seen.
func (c *Client) await(ctx context.Context, cond func() bool) error {
	for {
		c.mu.Lock()
		if cond() {
			c.mu.Unlock()
			return nil
		}
		if err := c.err; err != nil {
			c.mu.Unlock()
			return err
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// send writes b whole. If ctx ends before any of it is written the
// connection stays usable; a partial packet on the wire would make the
// stub misparse what follows, so then the connection is closed.
func (c *Client) send(ctx context.Context, b []byte, packet bool) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.Err(); err != nil {
		return err
	}
	if packet {
		c.lastSent = b
	}
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetWriteDeadline(aLongTimeAgo)
		close(cut)
	})
	n, err := c.conn.Write(b)
	if !stop() {
		<-cut
		c.conn.SetWriteDeadline(time.Time{})
		if err != nil && n == 0 {
			return ctx.Err()
		}
	}
	if err != nil {
		c.teardown(fmt.Errorf("%w: write: %w", ErrClosed, err))
		return c.Err()
	}
	return nil
}

// writeRaw sends acks from the reader.
func (c *Client) writeRaw(b []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err := c.conn.Write(b)
	return err
}

func (c *Client) retransmit() {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.lastSent == nil {
		return
	}
	if _, err := c.conn.Write(c.lastSent); err != nil {
		c.teardown(fmt.Errorf("%w: write: %w", ErrClosed, err))
	}
}

func (c *Client) sendPacket(ctx context.Context, payload []byte) error {
	return c.send(ctx, appendPacket(nil, payload), true)
}

// roundTrip sends cmd and returns its reply. The caller holds cmdSem (or
// is Dial) and the target is stopped.
//
// Replies carry no ids, so two things could misalign them. A command
// abandoned when its ctx ended may still be answered later. And QEMU drops
// a packet that arrives while the guest runs, which happens when the guest
// was resumed behind the debugger's back (QMP "cont"): the packet's first
// byte stops the guest and only a stop reply comes. In both cases the
// client sends a probe (qC), whose reply cannot be confused with any other,
// and counts: replies before the answer to a probe sent before cmd are
// stale, and a probe sent after cmd answered first means cmd was dropped
// and must be sent again.
func (c *Client) roundTrip(ctx context.Context, cmd []byte) (_ []byte, err error) {
	sent := false
	defer func() {
		if sent && err != nil && ctx.Err() != nil {
			// Abandoned: its reply (or a probe's) may still come.
			c.needProbe = true
		}
	}()
	if c.needProbe {
		if !c.probe {
			return nil, errors.New("an abandoned command left the reply stream out of step and the stub cannot be probed (no qC): reconnect")
		}
		if err := c.sendPacket(ctx, probePacket); err != nil {
			return nil, err
		}
		c.outstanding++
		c.needProbe = false
	}
	before := c.outstanding
	c.mu.Lock()
	seen := c.stops
	c.mu.Unlock()
	if err := c.sendPacket(ctx, cmd); err != nil {
		return nil, err
	}
	sent = true
	probed := false
	for {
		var reply []byte
		var stopped bool
		// QEMU 11's stub drops a packet that arrives while the guest runs
		// (resumed behind the debugger's back) without any stop reply: its
		// first byte pauses the guest, and nothing answers. A command met
		// by silence is probed once; the probe's answer coming first says
		// the command was dropped (see below).
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !probed && c.probe && !c.handshaking {
			wctx, cancel = context.WithTimeout(ctx, silenceProbe)
		}
		err := c.await(wctx, func() bool {
			if c.stops != seen {
				seen, stopped = c.stops, true
				return true
			}
			if len(c.replies) > 0 {
				reply = c.replies[0]
				c.replies[0] = nil
				c.replies = c.replies[1:]
				return true
			}
			return false
		})
		cancel()
		if err != nil && ctx.Err() == nil && wctx.Err() != nil {
			probed = true
			c.log.Debug("gdb: no reply to a command; probing", "cmd", shorten(cmd))
			if err := c.sendPacket(ctx, probePacket); err != nil {
				return nil, err
			}
			c.outstanding++
			continue
		}
		if err != nil {
			return nil, err
		}
		if stopped {
			if c.handshaking {
				// QEMU reports stopping the guest for the connection
				// before it reads anything: the command is not lost.
				continue
			}
			if !c.probe {
				c.needProbe = true
				return nil, fmt.Errorf("the target stopped while %s was outstanding (was it resumed outside the debugger?); retry", shorten(cmd))
			}
			c.log.Debug("gdb: stop reply while a command was outstanding; probing", "cmd", shorten(cmd))
			if err := c.sendPacket(ctx, probePacket); err != nil {
				return nil, err
			}
			c.outstanding++
			continue
		}
		if c.outstanding > 0 && bytes.HasPrefix(reply, []byte("QC")) {
			c.outstanding--
			if before > 0 {
				before--
				continue
			}
			c.log.Debug("gdb: command was dropped by a running target; resending", "cmd", shorten(cmd))
			if err := c.sendPacket(ctx, cmd); err != nil {
				return nil, err
			}
			before = c.outstanding
			continue
		}
		if before > 0 {
			c.log.Debug("gdb: discarding stale reply", "reply", shorten(reply))
			continue
		}
		return reply, nil
	}
}

// silenceProbe is how long a command waits for its reply before the
// client asks whether the stub dropped it: QEMU answers in microseconds,
// a large memory read in a few milliseconds.
const silenceProbe = 250 * time.Millisecond

// acquire takes cmdSem, and checks that the target can take commands.
func (c *Client) acquire(ctx context.Context) error {
	select {
	case c.cmdSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.stateErr()
	}
	if err := c.stateErr(); err != nil {
		<-c.cmdSem
		return err
	}
	return nil
}

func (c *Client) release() { <-c.cmdSem }

// stateErr says why the target cannot take a command now, if it cannot.
func (c *Client) stateErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.exit != nil:
		return fmt.Errorf("%w (%s)", ErrExited, c.exit)
	case c.err != nil:
		return c.err
	case c.running:
		return ErrRunning
	}
	return nil
}

// command runs f with cmdSem held and the target stopped, after putting
// back breakpoints a Continue stepped over.
func (c *Client) command(ctx context.Context, f func() error) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	if err := c.putBack(ctx); err != nil {
		return err
	}
	return f()
}

// exchange is roundTrip that also turns error and empty replies into
// errors.
func (c *Client) exchange(ctx context.Context, cmd []byte) ([]byte, error) {
	reply, err := c.roundTrip(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if err := replyError(cmd, reply); err != nil {
		return nil, err
	}
	return reply, nil
}

// expectOK is exchange for commands answered with "OK".
func (c *Client) expectOK(ctx context.Context, cmd []byte) error {
	reply, err := c.exchange(ctx, cmd)
	if err != nil {
		return err
	}
	if string(reply) != "OK" {
		return fmt.Errorf("%s: %w: reply %.40q", shorten(cmd), errMalformed, reply)
	}
	return nil
}

// teardown makes the client permanently unusable. The first cause wins.
func (c *Client) teardown(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = cause
	c.notifyLocked()
	c.mu.Unlock()
	close(c.done)
	c.conn.Close()
	c.log.Debug("gdb: connection closed", "cause", cause)
}

// Close detaches from the target, then closes the connection; blocked
// calls return. Detaching makes QEMU remove every breakpoint and
// watchpoint and resume the guest (a running target is interrupted
// first); a guest left stopped, or with breakpoints no debugger will
// report, would simply hang. The detach is bounded (WithDetachTimeout) and
// skipped if the connection is already gone. Close returns the detach's
// error, if any; the connection is closed either way.
func (c *Client) Close() error { return c.shut("close", c.detach) }

// Leave closes the connection without detaching: the target stays as it
// is, stopped or not started yet, where Close's detach would resume it
// (QEMU resumes on a detach even a guest that has not run yet). It is for
// a client that set no breakpoints or watchpoints; one that did is
// detached as by Close, since a stub keeps them after a silent leave and
// a guest that met one would stop with no debugger to say so.
func (c *Client) Leave() error { return c.shut("leave", c.leave) }

// shut runs before, bounded by the detach timeout, then closes the
// connection; once.
func (c *Client) shut(op string, before func(ctx context.Context) error) error {
	var err error
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.detachTimeout)
		defer cancel()
		err = before(ctx)
		c.teardown(ErrClosed)
		<-c.readerDone
	})
	if err != nil {
		return fmt.Errorf("gdb: %s: detach: %w", op, err)
	}
	return nil
}

// leave detaches only a client that set breakpoints (see Leave).
func (c *Client) leave(ctx context.Context) error {
	set := false
	select {
	case c.cmdSem <- struct{}{}:
		set = len(c.bps) > 0
		<-c.cmdSem
	case <-ctx.Done():
		set = true // a command holds on: detach, to be safe
	case <-c.done:
	}
	if !set {
		return nil
	}
	return c.detach(ctx)
}

func (c *Client) detach(ctx context.Context) error {
	c.mu.Lock()
	dead, running := c.err != nil || c.exit != nil, c.running
	c.mu.Unlock()
	if dead {
		return nil
	}
	if running {
		if _, err := c.Interrupt(ctx); err != nil {
			return err
		}
	}
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	return c.expectOK(ctx, []byte("D"))
}

// Done is closed when the connection becomes unusable.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is nil while the connection is usable, else why it is not.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Supported returns the features the stub announced in qSupported:
// "PacketSize" maps to its hex value, flags to "+", "-" or "?".
func (c *Client) Supported() map[string]string { return maps.Clone(c.features) }

// Arch is the target description's architecture ("riscv:rv64"), or "" if
// it names none.
func (c *Client) Arch() string { return c.desc.arch }

// Running reports whether the target was resumed and has not reported a
// stop since. A guest resumed behind the debugger's back (QMP "cont") is
// not noticed until the next command stops it.
func (c *Client) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}
