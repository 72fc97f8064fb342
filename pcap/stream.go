package pcap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// ErrStopped means a stream was offered to a capture that has stopped.
var ErrStopped = errors.New("pcap: the capture has stopped")

// NewStream makes a capture of the frames that pcap streams bring (QEMU's
// filter-dump writes one per netdev), named label in Stats.Interface: the
// file is created and its header written now, and frames come from the
// streams AddStream hands it, one after the other. Nothing here needs a
// privilege. Each frame is stamped with the time it is read, as a kernel
// capture stamps it when it passes; QEMU's own stamps count from its start
// in guest time.
func NewStream(label string, opts Options) (*Capture, error) {
	filter, snaplen, err := opts.check()
	if err != nil {
		return nil, err
	}
	c, err := open(label, filter, snaplen, opts)
	if err != nil {
		return nil, err
	}
	c.streams = make(chan *os.File, 1)
	go c.runStreams()
	return c, nil
}

// AddStream hands the capture the next pcap stream, r (a FIFO that a writer
// already opened: a FIFO without one reads as ended). It is read from after
// the one before ends (its writer closed it); the capture owns r from now
// on.
func (c *Capture) AddStream(r *os.File) error {
	c.streamsMu.Lock()
	defer c.streamsMu.Unlock()
	if c.streams == nil || c.stopping.Load() {
		r.Close()
		return ErrStopped
	}
	select {
	case c.streams <- r:
		return nil
	case <-c.done:
		r.Close()
		return errors.Join(ErrStopped, c.Err())
	}
}

// runStreams reads the streams in turn until Stop.
func (c *Capture) runStreams() {
	defer close(c.done)
	for r := range c.streams {
		c.mu.Lock()
		c.cur = r
		c.mu.Unlock()
		ok := c.readStream(r)
		c.mu.Lock()
		c.cur = nil
		c.mu.Unlock()
		r.Close()
		if !ok {
			// The capture failed: streams still offered are closed.
			for r := range c.streams {
				r.Close()
			}
			return
		}
	}
}

// readStream writes one stream's frames; false once the capture failed.
func (c *Capture) readStream(r io.Reader) bool {
	pr, err := newReader(r)
	if err != nil {
		if errors.Is(err, io.EOF) || c.stopping.Load() {
			return true // ended before its header: nothing in it
		}
		c.fail(fmt.Errorf("pcap: read the stream's header: %w", err))
		return false
	}
	if lt := pr.linkType; lt != linkTypeEthernet {
		c.fail(fmt.Errorf("pcap: the stream's frames are of link type %d, not Ethernet", lt))
		return false
	}
	for {
		data, ri, err := pr.next()
		if err != nil {
			// EOF: the writer closed its end. Anything else while
			// stopping: Stop closed ours. A record cut short is what a
			// writer that died mid-frame leaves.
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || c.stopping.Load() {
				return true
			}
			c.fail(fmt.Errorf("pcap: read the stream: %w", err))
			return false
		}
		if !c.take(data, ri.length, time.Now(), false) {
			return false
		}
	}
}

// stopStreams ends a stream capture: what the writer already wrote is read
// (it should have closed its end first; after drainTimeout the stream is
// cut), then the file is closed.
func (c *Capture) stopStreams() {
	c.streamsMu.Lock()
	c.stopping.Store(true)
	close(c.streams)
	c.streamsMu.Unlock()
	select {
	case <-c.done:
	case <-time.After(drainTimeout):
		c.mu.Lock()
		if c.cur != nil {
			c.cur.Close() // wakes the reader
		}
		c.mu.Unlock()
		<-c.done
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.finish()
}
