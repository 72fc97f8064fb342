package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/tap"
	"golang.org/x/sys/unix"
)

// Network is a guest's TAP device and the capture of its traffic. A
// guest's traffic is captured in-process on its TAP when the server may
// open a packet socket (CAP_NET_RAW); an ordinary user's server may not,
// so QEMU captures it instead: a filter-dump object on the guest's netdev
// writes every frame it passes, both ways, as a pcap stream into a FIFO in
// the private runtime directory, which the server reads into the same
// kind of capture file (pcap.NewStream). A restore starts a new QEMU: the
// capture goes on with a filter of the new QEMU feeding the same file.
type Network struct {
	i *Instance

	mu          sync.Mutex
	dev         *tap.Device
	capture     *pcap.Capture
	viaQEMU     bool // capture is fed by QEMU
	lastCapture *pcap.Stats
}

func (n *Network) makeTAP(t TAPSpec) error {
	i := n.i
	m := i.mgr
	var dev *tap.Device
	var err error
	if t.Name != "" {
		if dev, err = tap.Existing(t.Name, false); err != nil {
			return fmt.Errorf("network tap %s: %w", t.Name, err)
		}
		dev.GuestMAC = names.GuestMAC(m.owner, i.name)
		if !dev.Up {
			m.log.Warn("the guest's TAP is down on the host: frames will not flow until root brings it up", "instance", i.name, "tap", t.Name)
		}
		// Not in the record: it is not ours, and no reaper may delete it.
	} else {
		dev, err = tap.Create(tap.Options{
			Name: names.TAP(m.owner, i.name), GuestMAC: names.GuestMAC(m.owner, i.name),
			CIDR: t.CIDR, Bridge: t.Bridge, UID: os.Getuid(), GID: os.Getgid(),
			// A name is unique to this process and instance, so a link of
			// that name can only be a TAP this instance left at an
			// earlier boot.
			Replace: true,
		})
		if err != nil {
			return fmt.Errorf("network tap: %w", newTAPError(err))
		}
		// Recorded right after it exists, so that if we are killed the
		// next server's reaper deletes it.
		m.recordInstance(i.name, func(r *registry.Instance) { r.TAP = dev.Name })
	}
	n.mu.Lock()
	n.dev = dev
	n.mu.Unlock()
	i.push("tap", func() error {
		// The capture ends with its interface: stop it first, and keep
		// its counts for status.
		n.StopCapture()
		n.mu.Lock()
		n.dev = nil
		n.mu.Unlock()
		if dev.External {
			return nil // someone else's, as it was
		}
		err := dev.Close()
		m.recordInstance(i.name, func(r *registry.Instance) { r.TAP = "" })
		return err
	})
	return nil
}

// TAP is the guest's TAP device while it has one.
func (n *Network) TAP() *tap.Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dev
}

// StartCapture captures the guest's traffic on its TAP into f, a new empty
// file the caller created (and checked), or with f nil into a new file in
// the captures directory. A capture that fails to start leaves f closed
// and removed.
func (n *Network) StartCapture(f *os.File, filter string, snaplen int) (*pcap.Capture, error) {
	fail := func(err error) (*pcap.Capture, error) {
		if f != nil {
			f.Close()
			os.Remove(f.Name()) // new, empty and ours
		}
		return nil, err
	}
	i := n.i
	n.mu.Lock()
	dev, running := n.dev, n.capture
	n.mu.Unlock()
	if dev == nil {
		return fail(fmt.Errorf("guest %q has %w", i.name, ErrNoTAP))
	}
	if running != nil {
		return fail(&CaptureRunningError{Name: i.name, Path: running.Path()})
	}
	m := i.mgr
	var c *pcap.Capture
	var err error
	viaQEMU := !inProcess()
	if viaQEMU {
		mch, rerr := i.Running()
		if rerr != nil {
			return fail(rerr)
		}
		c, err = n.startQEMUCapture(context.Background(), mch, f, filter, snaplen)
		f = nil // startQEMUCapture closed and removed it on failure
		if err != nil {
			return nil, err
		}
	} else {
		opts := pcap.Options{Dir: m.cfg.Captures,
			Prefix: names.Kept(names.KeptCapture, m.owner, i.name), Boot: i.boot, Snaplen: snaplen, Filter: filter}
		if f != nil {
			opts.File, opts.Path = f, f.Name()
		}
		if c, err = pcap.Start(dev.Name, opts); err != nil {
			return fail(fmt.Errorf("capture on %s: %w", dev.Name, err))
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dev != dev || n.capture != nil {
		// The guest stopped, or another capture started, meanwhile: do
		// not leave this one running.
		go c.Stop()
		return nil, fmt.Errorf("guest %q changed while the capture started: try again", i.name)
	}
	n.capture, n.viaQEMU = c, viaQEMU
	return c, nil
}

// StopCapture stops the running capture and returns its counts; false if
// none runs.
func (n *Network) StopCapture() (pcap.Stats, bool) {
	i := n.i
	n.mu.Lock()
	c, viaQEMU := n.capture, n.viaQEMU
	n.capture, n.viaQEMU = nil, false
	n.mu.Unlock()
	if c == nil {
		return pcap.Stats{}, false
	}
	if viaQEMU {
		n.stopQEMUCapture()
	}
	st, err := c.Stop()
	if err != nil {
		i.mgr.log.Warn("stop capture", "instance", i.name, "path", st.Path, "err", err)
	}
	n.mu.Lock()
	n.lastCapture = &st
	n.mu.Unlock()
	return st, true
}

// CaptureStats reports the running capture, or else the last one.
func (n *Network) CaptureStats() (pcap.Stats, bool, bool) {
	n.mu.Lock()
	c, last := n.capture, n.lastCapture
	n.mu.Unlock()
	if c != nil {
		return c.Stats(), true, true
	}
	if last != nil {
		return *last, false, true
	}
	return pcap.Stats{}, false, false
}

// StartCaptureFile starts capturing the guest's traffic into path: a new
// file, relative to the guest's project and created there or in the
// captures directory only (the host-path policy), or a new file of the
// captures directory when path is "".
func (n *Network) StartCaptureFile(path, filter string, snaplen int) (*pcap.Capture, error) {
	i := n.i
	var f *os.File
	if path != "" {
		scope, err := i.mgr.cfg.HostPolicy.Project(i.Spec().Root)
		if err != nil {
			return nil, err
		}
		if f, err = scope.Create("capture file", path); err != nil {
			return nil, err
		}
	}
	return n.StartCapture(f, filter, snaplen)
}

// startQEMUCapture starts a capture through QEMU mch into f (nil: a new
// file in the captures directory).
func (n *Network) startQEMUCapture(ctx context.Context, mch *qemu.Process, f *os.File, filter string, snaplen int) (*pcap.Capture, error) {
	i := n.i
	m := i.mgr
	opts := pcap.Options{Dir: m.cfg.Captures, Prefix: names.Kept(names.KeptCapture, m.owner, i.name), Boot: i.boot, Snaplen: snaplen, Filter: filter}
	if f != nil {
		opts.File, opts.Path = f, f.Name()
	}
	c, err := pcap.NewStream("qemu:"+captureNetdev, opts)
	if err != nil {
		return nil, err
	}
	if err := n.feedCapture(ctx, mch, c); err != nil {
		st, _ := c.Stop()
		os.Remove(st.Path) // ours, and only a header
		return nil, err
	}
	return c, nil
}

// feedCapture has QEMU mch write its frames into c, through a FIFO that
// exists only until both ends are open.
func (n *Network) feedCapture(ctx context.Context, mch *qemu.Process, c *pcap.Capture) error {
	i := n.i
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
func (n *Network) stopQEMUCapture() {
	i := n.i
	mch := i.Process()
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
func (n *Network) continueCapture() func(ctx context.Context, mch *qemu.Process) error {
	i := n.i
	n.mu.Lock()
	c, viaQEMU := n.capture, n.viaQEMU
	n.mu.Unlock()
	if c == nil || !viaQEMU {
		return nil
	}
	return func(ctx context.Context, mch *qemu.Process) error {
		if err := n.feedCapture(ctx, mch, c); err != nil {
			// The guest is restored all the same; the capture ends
			// with what it has.
			i.mgr.log.Warn("the capture cannot go on after the restore", "instance", i.name, "err", err)
			n.StopCapture()
		}
		return nil
	}
}

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

// tapPrivilegeError is a TAP an ordinary user's server may not make. Its
// advice is the ways such a user has: a persistent TAP root makes once
// (never file capabilities on the server: they would give every user who
// runs it the host's network).
type tapPrivilegeError struct{ err error }

// newTAPError is err, a TAP the server could not make, with advice if it
// may not make one at all.
func newTAPError(err error) error {
	if errors.Is(err, tap.ErrNoPrivilege) {
		return &tapPrivilegeError{err}
	}
	return err
}

func (e *tapPrivilegeError) Error() string { return e.err.Error() }
func (e *tapPrivilegeError) Unwrap() error { return e.err }

// Advice names the user a persistent TAP would be made for.
func (e *tapPrivilegeError) Advice() advice.Advice {
	u := "$USER"
	if cu, err := user.Current(); err == nil {
		u = cu.Username
	}
	return advice.Advice{Action: advice.PersistentTAP, Name: u}
}
