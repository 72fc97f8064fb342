package instance

import (
	"errors"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// A server is degraded by any of what needs its user, and by nothing else.
func TestHealthDegraded(t *testing.T) {
	if (Health{LockFile: "x", QEMUVersion: "v", Guests: []GuestHealth{{Name: "a"}}}).Degraded() {
		t.Error("a healthy server is degraded")
	}
	for what, h := range map[string]Health{
		"lock":         {LockErr: errors.New("x")},
		"stale":        {ExeChanged: "replaced"},
		"scan":         {ScanErr: errors.New("x")},
		"dead servers": {DeadServers: []int{12}},
		"transcript":   {Guests: []GuestHealth{{Name: "a"}, {Name: "b", Transcript: &serial.TranscriptStatus{Err: errors.New("full")}}}},
		"stalled":      {Guests: []GuestHealth{{Name: "a", Stalled: time.Now()}}},
		"monitor":      {Guests: []GuestHealth{{Name: "a", MonitorErr: errors.New("closed")}}},
	} {
		if !h.Degraded() {
			t.Errorf("%s: not degraded", what)
		}
	}
}
