package qmp

import (
	"log/slog"
	"time"
)

const (
	// DefaultEventBuffer is the number of events kept for replay and queued
	// per subscriber when WithEventBuffer is not given.
	DefaultEventBuffer = 256

	// DefaultTimeout bounds Connect and Run when WithDefaultTimeout is not
	// given. It is generous because some commands (query-qmp-schema, device
	// hot-plug) legitimately take a while on a loaded host.
	DefaultTimeout = 30 * time.Second
)

// An Option configures a Monitor.
type Option func(*options)

type options struct {
	logger         *slog.Logger
	eventBuffer    int
	defaultTimeout time.Duration
}

func defaultOptions() options {
	return options{
		logger:         slog.New(slog.DiscardHandler),
		eventBuffer:    DefaultEventBuffer,
		defaultTimeout: DefaultTimeout,
	}
}

// WithLogger sets the logger for connection diagnostics: dropped events,
// unmatched responses, connection loss. A nil logger is ignored.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithEventBuffer sets how many recent events are kept for replay to new
// subscribers and how many events each subscriber may have queued before
// its oldest ones are dropped. Values below 1 are treated as 1.
func WithEventBuffer(n int) Option {
	return func(o *options) {
		o.eventBuffer = max(n, 1)
	}
}

// WithDefaultTimeout sets the timeout applied by the context-less Connect and
// Run, which exist only to satisfy go-qemu's qmp.Monitor. A non-positive d
// disables the timeout, which lets a hung QEMU hang the caller.
func WithDefaultTimeout(d time.Duration) Option {
	return func(o *options) {
		o.defaultTimeout = d
	}
}
