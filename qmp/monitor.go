// Package qmp is a QEMU Machine Protocol client for a monitor on a unix
// socket. Its Monitor implements go-qemu's qmp.Monitor, so it can back
// qemu.NewDomain and raw.NewMonitor, but unlike go-qemu's SocketMonitor it
// honours contexts, multiplexes concurrent commands, never lets a slow event
// consumer stall commands, and fails promptly when QEMU goes away.
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
)

var _ goqmp.Monitor = (*Monitor)(nil)

const (
	// QEMU creates the socket a few milliseconds after it starts, so the
	// first retries are short to make connecting right after launch cheap;
	// the cap keeps a slow start from turning into a busy loop.
	minDialBackoff = time.Millisecond
	maxDialBackoff = 50 * time.Millisecond
)

// aLongTimeAgo is a deadline in the past, used to interrupt blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// Greeting is what QEMU announces when a client connects.
type Greeting struct {
	Version goqmp.Version `json:"version"`
	// Capabilities lists optional protocol features QEMU offers, e.g.
	// "oob". Monitor does not enable any of them.
	Capabilities []string `json:"capabilities"`
}

// A Monitor is a QMP connection to one QEMU process. It is safe for
// concurrent use. A Monitor has at most one connection in its lifetime: once
// Disconnect is called or the connection is lost it stays closed, because a
// reconnect would silently lose events and in-flight commands. A failed
// ConnectContext, however, may be retried.
type Monitor struct {
	path string
	log  *slog.Logger
	opts options
	ev   *eventHub

	ids atomic.Uint64

	// connectSem and writeSem are mutexes that a waiter can abandon when
	// its context ends.
	connectSem chan struct{}
	writeSem   chan struct{}

	closeOnce sync.Once
	closing   chan struct{} // closed by Disconnect; aborts a connect in progress
	done      chan struct{} // closed once the monitor is unusable

	mu         sync.Mutex
	conn       net.Conn
	greeting   Greeting
	pending    map[uint64]chan<- reply
	readerDone chan struct{}
	err        error // why done is closed
	// stalledSince is when a write that its caller abandoned started;
	// zero when no write is stuck.
	stalledSince time.Time
}

// reply is what the reader hands to a waiting command.
type reply struct {
	line   []byte
	qmpErr *errorBody
	err    error
}

// New returns a Monitor for the QMP socket at path. It does not connect.
func New(path string, opts ...Option) *Monitor {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	log := o.logger.With("qmp_socket", path)
	return &Monitor{
		path:       path,
		log:        log,
		opts:       o,
		ev:         newEventHub(log, o.eventBuffer),
		connectSem: make(chan struct{}, 1),
		writeSem:   make(chan struct{}, 1),
		closing:    make(chan struct{}),
		done:       make(chan struct{}),
	}
}

// Connect is ConnectContext bounded by the default timeout.
func (m *Monitor) Connect() error {
	ctx, cancel := m.defaultContext()
	defer cancel()
	return m.ConnectContext(ctx)
}

// ConnectContext connects to QEMU and completes the QMP handshake. Until ctx
// is done it keeps retrying while the socket does not exist yet or refuses
// connections, so it can be called right after starting QEMU with
// "-qmp unix:PATH,server=on,wait=off". A failed ConnectContext may be retried.
func (m *Monitor) ConnectContext(ctx context.Context) error {
	if err := m.connect(ctx); err != nil {
		return fmt.Errorf("connect qmp %s: %w", m.path, err)
	}
	return nil
}

func (m *Monitor) connect(ctx context.Context) error {
	select {
	case m.connectSem <- struct{}{}:
		defer func() { <-m.connectSem }()
	case <-ctx.Done():
		return ctx.Err()
	case <-m.closing:
		return ErrClosed
	}

	m.mu.Lock()
	err, connected := m.err, m.conn != nil
	m.mu.Unlock()
	switch {
	case err != nil:
		return err
	case connected:
		return errAlreadyConnected
	}

	// Disconnect must be able to abort a connect still waiting for QEMU.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-m.closing:
			cancel(ErrClosed)
		case <-ctx.Done():
		}
	}()

	conn, err := m.dial(ctx)
	if err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	g, err := m.handshake(ctx, conn, r)
	if err != nil {
		conn.Close()
		return err
	}

	m.mu.Lock()
	if err := m.err; err != nil {
		m.mu.Unlock()
		conn.Close()
		return err
	}
	m.conn = conn
	m.greeting = g
	m.pending = make(map[uint64]chan<- reply)
	m.readerDone = make(chan struct{})
	readerDone := m.readerDone
	m.mu.Unlock()

	go m.readLoop(r, readerDone)
	m.log.Debug("qmp: connected", "version", g.Version.String(), "capabilities", g.Capabilities)
	return nil
}

func (m *Monitor) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	backoff := minDialBackoff
	for attempt := 1; ; attempt++ {
		conn, err := d.DialContext(ctx, "unix", m.path)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (after %d attempts, last: %v)", context.Cause(ctx), attempt, err)
		}
		if !retryableDialError(err) {
			return nil, err
		}
		m.log.Debug("qmp: socket not ready, retrying", "attempt", attempt, "backoff", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (after %d attempts, last: %v)", context.Cause(ctx), attempt, err)
		case <-t.C:
		}
		backoff = min(2*backoff, maxDialBackoff)
	}
}

// retryableDialError reports whether err means QEMU has not started listening
// yet: no socket file, a stale one from an earlier run, or a full backlog.
func retryableDialError(err error) bool {
	return errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EAGAIN)
}

// handshake runs the greeting and capabilities negotiation under ctx. This
// matters beyond hung QEMUs: a QMP socket accepts a second client at the
// kernel level but greets it only after the first one leaves.
func (m *Monitor) handshake(ctx context.Context, conn net.Conn, r *bufio.Reader) (Greeting, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
	g, err := m.negotiate(conn, r)
	if !stop() {
		// The deadline may have interrupted negotiate, or may be about to
		// poison the connection; either way it cannot be used.
		if err != nil {
			return Greeting{}, fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
		return Greeting{}, context.Cause(ctx)
	}
	return g, err
}

func (m *Monitor) negotiate(conn net.Conn, r *bufio.Reader) (Greeting, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return Greeting{}, fmt.Errorf("read greeting: %w", err)
	}
	var banner struct {
		QMP *Greeting `json:"QMP"`
	}
	if err := json.Unmarshal(line, &banner); err != nil || banner.QMP == nil {
		return Greeting{}, fmt.Errorf("unexpected greeting %.100q", line)
	}

	id := m.ids.Add(1)
	cmd := fmt.Appendf(nil, `{"execute":"qmp_capabilities","id":"%d"}`+"\n", id)
	if _, err := conn.Write(cmd); err != nil {
		return Greeting{}, fmt.Errorf("send qmp_capabilities: %w", err)
	}
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return Greeting{}, fmt.Errorf("read qmp_capabilities response: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		msg, err := parseMessage(line)
		if err != nil {
			return Greeting{}, err
		}
		if msg.Event != "" {
			// QMP withholds events until negotiation is done; should a
			// peer not, its events are still worth keeping.
			m.ev.publish(line)
			continue
		}
		if got, ok := msg.id(); !ok || got != id {
			return Greeting{}, fmt.Errorf("unexpected reply to qmp_capabilities: %.100q", line)
		}
		if msg.Error != nil {
			return Greeting{}, msg.Error.toError("qmp_capabilities")
		}
		return *banner.QMP, nil
	}
}

// Greeting returns what QEMU announced on connect; it is the zero Greeting
// before a successful connect.
func (m *Monitor) Greeting() Greeting {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.greeting
	g.Capabilities = append([]string(nil), g.Capabilities...)
	return g
}

// Run is RunContext bounded by the default timeout.
func (m *Monitor) Run(cmd []byte) ([]byte, error) {
	ctx, cancel := m.defaultContext()
	defer cancel()
	return m.RunContext(ctx, cmd)
}

// RunContext sends a command object such as
// {"execute":"query-status","arguments":{...}} and returns QEMU's response
// line, the JSON object holding "return", as go-qemu's raw package expects.
// Any "id" member in cmd is replaced, as ids route responses to callers.
//
// A failure reported by QEMU is returned as *Error. If ctx ends first the
// error wraps ctx.Err(); QEMU may still execute the command. If the
// connection is lost the error wraps ErrClosed.
func (m *Monitor) RunContext(ctx context.Context, cmd []byte) ([]byte, error) {
	name, req, id, err := m.prepare(cmd)
	if err != nil {
		return nil, err
	}
	ch := make(chan reply, 1)
	if err := m.register(id, ch); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", name, err)
	}
	if err := m.write(ctx, req); err != nil {
		m.unregister(id)
		return nil, fmt.Errorf("qmp %s: %w", name, err)
	}

	var r reply
	select {
	case r = <-ch:
	case <-ctx.Done():
		if m.unregister(id) {
			return nil, fmt.Errorf("qmp %s: %w", name, ctx.Err())
		}
		// The reader or teardown already claimed the entry, so a reply is
		// in flight; report what actually happened rather than the timeout.
		r = <-ch
	}
	switch {
	case r.err != nil:
		return nil, fmt.Errorf("qmp %s: %w", name, r.err)
	case r.qmpErr != nil:
		return nil, r.qmpErr.toError(name)
	}
	return r.line, nil
}

// Execute runs command with args (omitted when nil) and returns the value of
// the response's "return" member.
func (m *Monitor) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	cmd, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, args})
	if err != nil {
		return nil, fmt.Errorf("qmp %s: encode arguments: %w", command, err)
	}
	resp, err := m.RunContext(ctx, cmd)
	if err != nil {
		return nil, err
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("qmp %s: decode response: %w", command, err)
	}
	return r.Return, nil
}

// prepare extracts the command name and stamps cmd with a fresh id.
func (m *Monitor) prepare(cmd []byte) (name string, req []byte, id uint64, err error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(cmd, &obj); err != nil || obj == nil {
		return "", nil, 0, fmt.Errorf("qmp: command is not a JSON object: %.100q", cmd)
	}
	for _, key := range []string{"execute", "exec-oob"} {
		if v, ok := obj[key]; ok {
			if err := json.Unmarshal(v, &name); err != nil {
				return "", nil, 0, fmt.Errorf("qmp: %q is not a string: %s", key, v)
			}
			break
		}
	}
	if name == "" {
		return "", nil, 0, fmt.Errorf(`qmp: command has no "execute" member: %.100q`, cmd)
	}

	id = m.ids.Add(1)
	// A string id, because go-qemu decodes responses into structs with
	// `ID string` and would fail on a number.
	obj["id"] = strconv.AppendQuote(nil, strconv.FormatUint(id, 10))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return "", nil, 0, fmt.Errorf("qmp %s: encode: %w", name, err)
	}
	return name, buf.Bytes(), id, nil
}

func (m *Monitor) register(id uint64, ch chan<- reply) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.err != nil:
		return m.err
	case m.conn == nil:
		return ErrNotConnected
	}
	m.pending[id] = ch
	return nil
}

// unregister reports whether id was still pending, i.e. no reply is coming.
func (m *Monitor) unregister(id uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pending[id]; !ok {
		return false
	}
	delete(m.pending, id)
	return true
}

// write sends one command. Writes are serialized so that commands are never
// interleaved on the wire. A command is written whole or not at all: once
// its first byte may be on the wire, the write goes on in the background
// even if ctx ends (QEMU would misparse half a command, and the only way
// out of that is to close the connection). A caller whose ctx ends first
// gets an error saying the command was abandoned; its answer, if it
// comes, is discarded, and the connection stays. Meanwhile later writers
// wait, and Stalled says since when.
func (m *Monitor) write(ctx context.Context, b []byte) error {
	select {
	case m.writeSem <- struct{}{}:
	case <-ctx.Done():
		if since, ok := m.Stalled(); ok {
			return fmt.Errorf("%w (QEMU has not taken the previous command for %v: is it stopped?)", ctx.Err(), time.Since(since).Round(time.Millisecond))
		}
		return ctx.Err()
	case <-m.done:
		return m.Err()
	}
	if err := ctx.Err(); err != nil {
		<-m.writeSem
		return err
	}
	m.mu.Lock()
	conn, err := m.conn, m.err
	m.mu.Unlock()
	if err != nil {
		<-m.writeSem
		return err
	}

	written := make(chan error, 1)
	start := time.Now()
	go func() {
		_, werr := conn.Write(b)
		m.mu.Lock()
		m.stalledSince = time.Time{}
		m.mu.Unlock()
		<-m.writeSem
		if werr != nil {
			// The socket is broken (or closed by Disconnect).
			m.teardown(fmt.Errorf("%w: write: %w", ErrClosed, werr))
		}
		written <- werr
	}()
	select {
	case werr := <-written:
		if werr != nil {
			return m.Err()
		}
		return nil
	case <-ctx.Done():
		m.mu.Lock()
		if m.stalledSince.IsZero() {
			m.stalledSince = start
		}
		m.mu.Unlock()
		return fmt.Errorf("%w: QEMU did not take the command in time (is it stopped?); the command was abandoned and the monitor stays connected", ctx.Err())
	}
}

// Stalled reports whether a command write has been blocked since a caller
// gave up on it (QEMU not reading its monitor: stopped, or hung), and
// since when.
func (m *Monitor) Stalled() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stalledSince, !m.stalledSince.IsZero()
}

// readLoop is the only reader of the connection. It never blocks on anything
// but the socket, so commands and Disconnect cannot be starved by consumers.
func (m *Monitor) readLoop(r *bufio.Reader, done chan<- struct{}) {
	defer close(done)
	for {
		// ReadBytes grows as needed: query-qmp-schema alone is well over
		// bufio.Scanner's 64 KiB default.
		line, err := r.ReadBytes('\n')
		if err != nil {
			m.teardown(fmt.Errorf("%w: connection lost: %w", ErrClosed, err))
			return
		}
		m.dispatch(bytes.TrimRight(line, "\r\n"))
	}
}

func (m *Monitor) dispatch(line []byte) {
	if len(line) == 0 {
		return
	}
	msg, err := parseMessage(line)
	if err != nil {
		m.log.Warn("qmp: discarding malformed message", "err", err, "line", truncate(line))
		return
	}
	if msg.Event != "" {
		m.ev.publish(line)
		return
	}
	if !msg.Return && msg.Error == nil {
		m.log.Warn("qmp: discarding message that is neither event nor response", "line", truncate(line))
		return
	}

	id, ok := msg.id()
	var ch chan<- reply
	if ok {
		m.mu.Lock()
		ch = m.pending[id]
		delete(m.pending, id)
		m.mu.Unlock()
	}
	switch {
	case ch != nil:
		ch <- reply{line: line, qmpErr: msg.Error}
	case ok && id <= m.ids.Load():
		m.log.Debug("qmp: discarding response to abandoned command", "id", id)
	default:
		m.log.Warn("qmp: discarding response with unknown id", "id", string(msg.ID), "line", truncate(line))
	}
}

// teardown makes the monitor permanently unusable. The first cause wins.
func (m *Monitor) teardown(cause error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	m.err = cause
	conn, pending := m.conn, m.pending
	m.conn, m.pending = nil, nil
	m.mu.Unlock()

	if conn != nil {
		conn.Close()
	}
	for _, ch := range pending {
		ch <- reply{err: cause}
	}
	m.ev.close()
	close(m.done)
	m.log.Debug("qmp: monitor closed", "cause", cause)
}

// Disconnect closes the connection, fails pending commands with ErrClosed and
// closes all event channels. It is idempotent, safe to call before Connect,
// and does not wait for QEMU.
func (m *Monitor) Disconnect() error {
	m.closeOnce.Do(func() { close(m.closing) })
	m.teardown(ErrClosed)
	m.mu.Lock()
	readerDone := m.readerDone
	m.mu.Unlock()
	if readerDone != nil {
		<-readerDone
	}
	return nil
}

// Done returns a channel closed when the monitor becomes unusable, because
// of Disconnect or because the connection was lost.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err reports why the monitor closed: nil while it is usable, ErrClosed
// after Disconnect, or an error wrapping ErrClosed and the I/O error that
// ended the connection.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Events returns a channel of QEMU events. It first replays the most recent
// events already received (up to the event buffer size), so that events
// emitted between Connect and Events are not lost, then delivers new ones.
// Each call creates an independent subscriber with its own bounded queue; if
// it falls behind, its oldest events are dropped, and nothing else waits for
// it. The channel is closed when ctx is done or the monitor closes.
func (m *Monitor) Events(ctx context.Context) (<-chan goqmp.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("qmp events: %w", err)
	}
	ch, err := m.ev.subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("qmp events: %w", m.Err())
	}
	return ch, nil
}

// DroppedEvents returns how many events were discarded from subscriber queues
// because their consumers fell behind, summed over all subscribers.
func (m *Monitor) DroppedEvents() uint64 { return m.ev.dropped.Load() }

func (m *Monitor) defaultContext() (context.Context, context.CancelFunc) {
	if m.opts.defaultTimeout <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), m.opts.defaultTimeout)
}

// message is the envelope of anything QEMU sends after the greeting.
type message struct {
	Event  string          `json:"event"`
	ID     json.RawMessage `json:"id"`
	Return presence        `json:"return"`
	Error  *errorBody      `json:"error"`
}

// presence records that a member exists without copying its value, which can
// be megabytes.
type presence bool

func (p *presence) UnmarshalJSON([]byte) error {
	*p = true
	return nil
}

type errorBody struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *errorBody) toError(command string) *Error {
	return &Error{Command: command, Class: e.Class, Desc: e.Desc}
}

// parseMessage decodes the top-level members of line. Classifying by
// substring would not do: query-qmp-schema's response contains "event".
func parseMessage(line []byte) (message, error) {
	var msg message
	if err := json.Unmarshal(line, &msg); err != nil {
		return message{}, fmt.Errorf("decode %.100q: %w", line, err)
	}
	return msg, nil
}

// id returns the numeric id this package assigned, if msg carries one.
func (msg *message) id() (uint64, bool) {
	var s string
	if err := json.Unmarshal(msg.ID, &s); err != nil {
		return 0, false
	}
	id, err := strconv.ParseUint(s, 10, 64)
	return id, err == nil
}

func truncate(b []byte) string {
	const limit = 200
	if len(b) <= limit {
		return string(b)
	}
	return string(b[:limit]) + "..."
}

// Running asks QEMU whether the guest runs (query-status).
func (m *Monitor) Running(ctx context.Context) (bool, error) {
	raw, err := m.Execute(ctx, "query-status", nil)
	if err != nil {
		return false, err
	}
	var st struct {
		Running bool `json:"running"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return false, fmt.Errorf("query-status: %w", err)
	}
	return st.Running, nil
}
