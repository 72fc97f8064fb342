package instance

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// ErrNotRecordable is a boot that QEMU cannot record faithfully.
var ErrNotRecordable = errors.New("this guest cannot be recorded")

// checkRecordable names what of a machine QEMU cannot record so that it
// replays faithfully; restore tells which boot asks (a recording or a
// replay).
func (s Spec) checkRecordable(what string) error {
	c := s.QEMU
	var no []string
	if c.SMP > 1 {
		no = append(no, fmt.Sprintf("smp %d (QEMU records and replays one hart only)", c.SMP))
	}
	if s.TAP != nil || (c.Network != "" && c.Network != "none") {
		no = append(no, "a network (QEMU 7.2's replay of network traffic freezes; record with network: none)")
	}
	for k, d := range c.Drives {
		if !d.ReadOnly {
			no = append(no, fmt.Sprintf("drives[%d] %s writable (a replay must read what the recording read: attach it with readonly: true)", k, d.Path))
		}
	}
	if len(c.Shares) > 0 {
		no = append(no, "shares (a replay cannot give the guest the host directory as it was)")
	}
	if c.GPU || c.VNC {
		no = append(no, "gpu (QEMU 11's recording of a virtio display hangs the guest's boot)")
	}
	if s.Snapshot != nil {
		no = append(no, "a snapshot to start from (a recording starts from a boot)")
	}
	if len(no) > 0 {
		return fmt.Errorf("%w: %s cannot hold %s; nothing was started", ErrNotRecordable, what, strings.Join(no, "; "))
	}
	return nil
}

// typist is the console a shell runs on, typed on through Type.
type typist struct {
	i   *Instance
	con *serial.Console
}

func (t typist) Write(ctx context.Context, p []byte) (int, error) { return t.i.Type(ctx, p, 0) }
func (t typist) Buffer() *serial.Buffer                           { return t.con.Buffer() }
