package instance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// NoDisplayError is a screenshot of a guest booted without a display.
type NoDisplayError struct {
	// Desc is what QEMU said.
	Desc string
}

func (e *NoDisplayError) Error() string { return fmt.Sprintf("the guest has no display (%s)", e.Desc) }

// Screenshot has QEMU write the guest's screen to path as a PNG.
func (i *Instance) Screenshot(ctx context.Context, path string) error {
	m, err := i.Running()
	if err != nil {
		return err
	}
	if _, err := m.Monitor().Execute(ctx, "screendump", map[string]any{"filename": path, "format": "png"}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && !m.Config().GPU {
			return &NoDisplayError{Desc: qe.Desc}
		}
		return err
	}
	return nil
}

// PressKeys presses each combination of QEMU key codes (package qemu's
// ParseKeys and TypeText make them) for hold, one every gap, and returns
// how many it pressed. send-key returns before the keys are released:
// a gap shorter than hold merges combinations, and the same key pressed
// again before its release is one long press.
func (i *Instance) PressKeys(ctx context.Context, combos [][]string, hold, gap time.Duration) (int, error) {
	m, err := i.Running()
	if err != nil {
		return 0, err
	}
	for n, keys := range combos {
		kv := make([]map[string]string, len(keys))
		for k, key := range keys {
			kv[k] = map[string]string{"type": "qcode", "data": key}
		}
		if _, err := m.Monitor().Execute(ctx, "send-key", map[string]any{"keys": kv, "hold-time": hold.Milliseconds()}); err != nil {
			return n, fmt.Errorf("send %s: %w", strings.Join(keys, "-"), err)
		}
		t := time.NewTimer(gap)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return n + 1, ctx.Err()
		}
	}
	return len(combos), nil
}

// Pointer moves the tablet's pointer to x, y (0 to 32767 each) and clicks
// the buttons (left, right, middle) there.
func (i *Instance) Pointer(ctx context.Context, x, y int, buttons []string) error {
	m, err := i.Running()
	if err != nil {
		return err
	}
	send := func(events ...map[string]any) error {
		_, err := m.Monitor().Execute(ctx, "input-send-event", map[string]any{"events": events})
		return err
	}
	abs := func(axis string, v int) map[string]any {
		return map[string]any{"type": "abs", "data": map[string]any{"axis": axis, "value": v}}
	}
	btn := func(b string, down bool) map[string]any {
		return map[string]any{"type": "btn", "data": map[string]any{"button": b, "down": down}}
	}
	if err := send(abs("x", x), abs("y", y)); err != nil {
		return fmt.Errorf("move pointer: %w", err)
	}
	for _, b := range buttons {
		if err := send(btn(b, true)); err != nil {
			return fmt.Errorf("press %s: %w", b, err)
		}
		if err := send(btn(b, false)); err != nil {
			return fmt.Errorf("release %s: %w", b, err)
		}
	}
	return nil
}
