package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// ErrBlocked is returned when QEMU cannot save the guest's state now.
var ErrBlocked = errors.New("QEMU cannot save the guest now")

// CheckSavable asks QEMU (query-migrate's blocked-reasons, QEMU 6.0 on)
// whether the machine state can be saved now, before anything is written:
// a mounted 9p share blocks it ("Migration is disabled when VirtFS export
// path '...' is mounted in the guest using mount_tag 'TAG'"). shares maps
// a share's mount tag to its host directory, for the message.
func CheckSavable(ctx context.Context, mon *qmp.Monitor, shares map[string]string) error {
	raw, err := mon.Execute(ctx, "query-migrate", nil)
	if err != nil {
		return nil // no answer is no refusal: the save says what fails
	}
	var info struct {
		Blocked []string `json:"blocked-reasons"`
	}
	if json.Unmarshal(raw, &info) != nil || len(info.Blocked) == 0 {
		return nil
	}
	var mounted []string
	for _, r := range info.Blocked {
		for tag, dir := range shares {
			if strings.Contains(r, "mount_tag '"+tag+"'") {
				mounted = append(mounted, fmt.Sprintf("%s (%s)", tag, dir))
			}
		}
	}
	if len(mounted) > 0 {
		return fmt.Errorf("%w: the guest has the 9p share %s mounted, and QEMU cannot save a guest while it is; unmount it in the guest (umount /mnt/TAG) and save again, or boot without shares; nothing was written and the guest runs on",
			ErrBlocked, strings.Join(mounted, ", "))
	}
	return fmt.Errorf("%w: %s; nothing was written and the guest runs on", ErrBlocked, strings.Join(info.Blocked, "; "))
}
