package instance

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/pcap"
)

// NoCaptureError is a read of a guest's capture when it has had none.
type NoCaptureError struct{ Name string }

func (e *NoCaptureError) Error() string { return fmt.Sprintf("no capture of guest %q yet", e.Name) }

// CaptureRead is a page of a capture file's packets.
type CaptureRead struct {
	// Path is the file read, as the policy resolved it.
	Path    string
	Packets []pcap.Summary
	// Next is the packet number to read from next.
	Next int
}

// captureCursors is where the last read of each capture file ended.
type captureCursors struct {
	mu   sync.Mutex
	next map[string]int
}

// ReadCapture reads up to count packet summaries of a capture file from
// packet number from (0: where the last read of that file ended, see
// CaptureReadTo). With path "", the file is inst's running or last
// capture; any other path is relative to inst's project (the server's
// working directory without inst) and read only where the host-path
// policy allows.
func (m *Manager) ReadCapture(inst *Instance, path string, from, count int) (CaptureRead, error) {
	var f *os.File
	if path == "" {
		if inst == nil {
			return CaptureRead{}, errors.New("instance: ReadCapture of no guest's capture")
		}
		st, _, ok := inst.net.CaptureStats()
		if !ok {
			return CaptureRead{}, &NoCaptureError{Name: inst.Name()}
		}
		path = st.Path
	} else {
		root := m.cfg.HostPolicy.WorkDir
		if inst != nil {
			root = inst.Spec().Root
		}
		scope, err := m.cfg.HostPolicy.Project(root)
		if err != nil {
			return CaptureRead{}, err
		}
		if f, err = scope.Open("capture file", path, false); err != nil {
			return CaptureRead{}, err
		}
		defer f.Close()
		if path, err = hostpath.Real(f); err != nil {
			return CaptureRead{}, err
		}
	}
	if from == 0 {
		m.cursors.mu.Lock()
		from = m.cursors.next[path]
		m.cursors.mu.Unlock()
	}
	var r CaptureRead
	var err error
	if f != nil {
		r.Packets, r.Next, err = pcap.ReadSummariesFrom(f, path, from, count)
	} else {
		r.Packets, r.Next, err = pcap.ReadSummaries(path, from, count)
	}
	if err != nil {
		return CaptureRead{}, fmt.Errorf("read capture %s: %w", path, err)
	}
	r.Path = path
	return r, nil
}

// CaptureReadTo records that the reader of the capture file at path (as
// ReadCapture returned it) has read up to packet next: the next read
// without a start goes on from there.
func (m *Manager) CaptureReadTo(path string, next int) {
	m.cursors.mu.Lock()
	defer m.cursors.mu.Unlock()
	if m.cursors.next == nil {
		m.cursors.next = map[string]int{}
	}
	m.cursors.next[path] = next
}

// Project is the project a call about saved states means, checked by the
// host-path policy and as its real path: root, else inst's project (inst
// may be nil), else the server's working directory.
func (m *Manager) Project(root string, inst *Instance) (string, error) {
	if root == "" && inst != nil {
		root = inst.Spec().Root
	}
	if root == "" {
		root = m.cfg.HostPolicy.WorkDir
	}
	scope, err := m.cfg.HostPolicy.Project(root)
	if err != nil {
		return "", err
	}
	return scope.Dir(), nil
}

// Advice is what a caller can do: start a capture.
func (e *NoCaptureError) Advice() advice.Advice { return advice.Advice{Action: advice.StartCapture} }
