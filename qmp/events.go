package qmp

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"

	goqmp "github.com/digitalocean/go-qemu/qmp"
)

// eventHub fans events out from the reader to subscribers. Everything it does
// under its lock is non-blocking, because the reader calls it and the reader
// must never stall: a stalled reader would starve every pending command.
type eventHub struct {
	log  *slog.Logger
	size int

	dropped atomic.Uint64

	mu      sync.Mutex
	backlog ring
	subs    map[*subscriber]struct{}
	closed  bool
}

type subscriber struct {
	// ch doubles as the subscriber's bounded queue. The hub is its only
	// sender, so after the hub receives one element to make room, the next
	// send cannot block.
	ch      chan goqmp.Event
	stop    func() bool // releases the context.AfterFunc registration
	dropped uint64
}

func newEventHub(log *slog.Logger, size int) *eventHub {
	return &eventHub{
		log:     log,
		size:    size,
		backlog: newRing(size),
		subs:    make(map[*subscriber]struct{}),
	}
}

// publish records an event line for replay and queues it for every
// subscriber. The raw line is kept rather than a decoded qmp.Event because
// Event.Data is a map: decoding once per subscriber gives each its own copy,
// so a consumer that mutates it cannot race with another.
func (h *eventHub) publish(line []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.backlog.push(line)
	for s := range h.subs {
		h.deliver(s, line)
	}
}

func (h *eventHub) deliver(s *subscriber, line []byte) {
	var ev goqmp.Event
	if err := json.Unmarshal(line, &ev); err != nil {
		// Unreachable for lines that passed parseMessage; kept so a decoder
		// change cannot turn into a silent drop.
		h.log.Warn("qmp: cannot decode event", "err", err)
		return
	}
	for {
		select {
		case s.ch <- ev:
			return
		default:
		}
		select {
		case old := <-s.ch:
			s.dropped++
			h.dropped.Add(1)
			h.log.Debug("qmp: event subscriber is not keeping up, dropped oldest event",
				"event", old.Event, "subscriber_dropped", s.dropped)
		default:
		}
	}
}

// subscribe returns a channel that first replays the backlog and then
// receives new events until ctx is done or the hub is closed.
func (h *eventHub) subscribe(ctx context.Context) (<-chan goqmp.Event, error) {
	s := &subscriber{ch: make(chan goqmp.Event, h.size)}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	h.backlog.each(func(line []byte) { h.deliver(s, line) })
	h.subs[s] = struct{}{}
	// If ctx is already done the callback runs right away, but it blocks on
	// h.mu until this registration is complete.
	s.stop = context.AfterFunc(ctx, func() { h.unsubscribe(s) })
	return s.ch, nil
}

func (h *eventHub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}

// close closes every subscriber channel and refuses new subscribers. Events
// still queued in a channel remain readable before the close is observed.
func (h *eventHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for s := range h.subs {
		s.stop()
		close(s.ch)
	}
	h.subs = nil
	h.backlog = ring{}
}

// ring is a fixed-size FIFO that overwrites its oldest element when full.
type ring struct {
	buf     [][]byte
	head, n int
}

func newRing(size int) ring {
	return ring{buf: make([][]byte, size)}
}

func (r *ring) push(v []byte) {
	if len(r.buf) == 0 {
		return
	}
	if r.n < len(r.buf) {
		r.buf[(r.head+r.n)%len(r.buf)] = v
		r.n++
		return
	}
	r.buf[r.head] = v
	r.head = (r.head + 1) % len(r.buf)
}

func (r *ring) each(f func([]byte)) {
	for i := range r.n {
		f(r.buf[(r.head+i)%len(r.buf)])
	}
}
