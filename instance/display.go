package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// Display is a guest's screen, keyboard and pointer, through QEMU.
type Display struct{ i *Instance }

// Display is the guest's screen, keyboard and pointer.
func (i *Instance) Display() Display { return Display{i} }

// NoDisplayError is a screenshot of a guest booted without a display.
type NoDisplayError struct {
	// Desc is what QEMU said.
	Desc string
}

func (e *NoDisplayError) Error() string { return fmt.Sprintf("the guest has no display (%s)", e.Desc) }

// Screenshot has QEMU write the guest's screen as a PNG into a new kept
// file, and returns it; keep leaves the file among the kept files (path),
// else it is removed.
func (d Display) Screenshot(ctx context.Context, keep bool) (png []byte, path string, err error) {
	i := d.i
	m, err := i.Running()
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(i.mgr.cfg.Captures, 0o700); err != nil {
		return nil, "", err
	}
	// QEMU writes the file itself; a fresh name in our private directory
	// means nothing else can be there.
	path = i.mgr.keptPath(names.KeptScreenshot, i.name, ".png")
	if _, err := m.Monitor().Execute(ctx, "screendump", map[string]any{"filename": path, "format": "png"}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && !m.Config().GPU {
			return nil, "", &NoDisplayError{Desc: qe.Desc}
		}
		return nil, "", err
	}
	png, err = os.ReadFile(path)
	if !keep {
		os.Remove(path)
		path = ""
	}
	if err != nil {
		return nil, "", fmt.Errorf("read %s: %w", path, err)
	}
	return png, path, nil
}

// KeepAnswer keeps raw, a QMP answer of the guest too large to return, as
// a new kept file, and returns its path.
func (d Display) KeepAnswer(raw []byte) (string, error) {
	i := d.i
	path := i.mgr.keptPath(names.KeptAnswer, i.name, ".json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// PressKeys presses each combination of QEMU key codes (package qemu's
// ParseKeys and TypeText make them) for hold, one every gap, and returns
// how many it pressed. send-key returns before the keys are released:
// a gap shorter than hold merges combinations, and the same key pressed
// again before its release is one long press.
func (d Display) PressKeys(ctx context.Context, combos [][]string, hold, gap time.Duration) (int, error) {
	i := d.i
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
func (d Display) Pointer(ctx context.Context, x, y int, buttons []string) error {
	i := d.i
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

// Advice is what a caller can do: boot with a display.
func (e *NoDisplayError) Advice() advice.Advice { return advice.Advice{Action: advice.BootWithDisplay} }
