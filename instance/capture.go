package instance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// A guest's traffic is captured in-process on its TAP when the server may
// open a packet socket (CAP_NET_RAW); an ordinary user's server may not, so
// QEMU captures it instead: a filter-dump object on the guest's netdev
// writes every frame it passes, both ways, as a pcap stream into a FIFO in
// the private runtime directory, which the server reads into the same kind
// of capture file (pcap.NewStream). A restore starts a new QEMU: the capture
// goes on with a filter of the new QEMU feeding the same file.

const (
	// captureFilterID names the filter-dump object in QEMU.
	captureFilterID = "qmcp-capture"
	// captureNetdev is the guest's netdev (see qemu.Config.Argv).
	captureNetdev = "net0"
	// captureMaxLen is what QEMU keeps of each frame: all of it, so
	// that the filter sees whole frames; the file keeps the snap length.
	captureMaxLen = pcap.MaxSnaplen
	// qmpWait bounds a QMP command of a capture.
	qmpWait = 5 * time.Second
)

// inProcess reports whether captures run in this process (see above).
func inProcess() bool { return pcap.CanCapture() == nil }

// startQEMUCapture starts a capture through QEMU mch into f (nil: a new
// file in the captures directory).
func (i *Instance) startQEMUCapture(ctx context.Context, mch *qemu.Machine, f *os.File, filter string, snaplen int) (*pcap.Capture, error) {
	m := i.mgr
	opts := pcap.Options{Dir: m.cfg.Captures, Prefix: names.Kept(names.KeptCapture, m.owner, i.name), Boot: i.boot, Snaplen: snaplen, Filter: filter}
	if f != nil {
		opts.File, opts.Path = f, f.Name()
	}
	c, err := pcap.NewStream("qemu:"+captureNetdev, opts)
	if err != nil {
		return nil, err
	}
	if err := i.feedCapture(ctx, mch, c); err != nil {
		st, _ := c.Stop()
		os.Remove(st.Path) // ours, and only a header
		return nil, err
	}
	return c, nil
}

// feedCapture has QEMU mch write its frames into c, through a FIFO that
// exists only until both ends are open.
func (i *Instance) feedCapture(ctx context.Context, mch *qemu.Machine, c *pcap.Capture) error {
	fifo := filepath.Join(i.mgr.cfg.RuntimeDir, names.Name(names.CaptureFIFO, i.mgr.owner, i.name))
	os.Remove(fifo) // one an earlier attempt could not remove
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fmt.Errorf("capture through QEMU: make %s: %w", fifo, err)
	}
	defer os.Remove(fifo)
	// The read end first, without waiting for a writer, so that QEMU's
	// open for writing does not block its main loop.
	r, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("capture through QEMU: open %s: %w", fifo, err)
	}
	ctx, cancel := context.WithTimeout(ctx, qmpWait)
	defer cancel()
	_, err = mch.Monitor().Execute(ctx, "object-add", map[string]any{
		"qom-type": "filter-dump", "id": captureFilterID, "netdev": captureNetdev, "file": fifo, "maxlen": captureMaxLen,
	})
	if err != nil {
		r.Close()
		return fmt.Errorf("capture through QEMU (filter-dump on %s): %w", captureNetdev, err)
	}
	return c.AddStream(r)
}

// stopQEMUCapture removes the filter from the running QEMU, if any, so
// that it closes its end and the capture reads to the end.
func (i *Instance) stopQEMUCapture() {
	mch := i.Machine()
	if mch == nil {
		return
	}
	if _, exited := mch.Exited(); exited {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), qmpWait)
	defer cancel()
	if _, err := mch.Monitor().Execute(ctx, "object-del", map[string]any{"id": captureFilterID}); err != nil {
		// QEMU going away closes its end too.
		i.mgr.log.Debug("remove the capture filter", "instance", i.name, "err", err)
	}
}

// continueCapture, for the QEMU a restore starts, has it feed the capture
// that the QEMU before it fed.
func (i *Instance) continueCapture() func(ctx context.Context, mch *qemu.Machine) error {
	i.mu.Lock()
	c, viaQEMU := i.capture, i.viaQEMU
	i.mu.Unlock()
	if c == nil || !viaQEMU {
		return nil
	}
	return func(ctx context.Context, mch *qemu.Machine) error {
		if err := i.feedCapture(ctx, mch, c); err != nil {
			// The guest is restored all the same; the capture ends
			// with what it has.
			i.mgr.log.Warn("the capture cannot go on after the restore", "instance", i.name, "err", err)
			i.StopCapture()
		}
		return nil
	}
}
