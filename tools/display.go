package tools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// ScreenshotInput is qemu_screenshot's arguments.
type ScreenshotInput struct {
	Save bool `json:"save,omitempty" jsonschema:"also keep the PNG under the captures directory and return its path"`
	Target
}

// ScreenshotOutput is qemu_screenshot's result (the image itself is the
// result's image content).
type ScreenshotOutput struct {
	Bytes int    `json:"bytes" jsonschema:"size of the PNG"`
	Path  string `json:"path,omitempty" jsonschema:"where the PNG was saved, with save: true"`
}

func (s *Server) screenshot(ctx context.Context, _ *mcp.CallToolRequest, in ScreenshotInput) (*mcp.CallToolResult, ScreenshotOutput, error) {
	inst, m, err := s.running(in.Target)
	if err != nil {
		return nil, ScreenshotOutput{}, err
	}
	captures := s.cfg.Captures
	if err := os.MkdirAll(captures, 0o700); err != nil {
		return nil, ScreenshotOutput{}, fmt.Errorf("screenshot: %w", err)
	}
	n := s.seq.Add(1)
	// QEMU writes the file itself; a fresh name in our private directory
	// means nothing else can be there.
	path := filepath.Join(captures, fmt.Sprintf("%s-%d.png", names.Kept(names.KeptScreenshot, s.Manager().Owner(), inst.Name()), n))
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := m.Monitor().Execute(qctx, "screendump", map[string]any{"filename": path, "format": "png"}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && !m.Config().GPU {
			return nil, ScreenshotOutput{}, fmt.Errorf("screenshot: the guest has no display (%s): boot with gpu: true", qe.Desc)
		}
		return nil, ScreenshotOutput{}, fmt.Errorf("screenshot: %w", err)
	}
	png, err := os.ReadFile(path)
	if !in.Save {
		os.Remove(path)
		path = ""
	}
	if err != nil {
		return nil, ScreenshotOutput{}, fmt.Errorf("screenshot: read %s: %w", path, err)
	}
	out := ScreenshotOutput{Bytes: len(png), Path: path}
	text := fmt.Sprintf("screenshot: %d bytes of PNG", len(png))
	if path != "" {
		text += ", saved to " + path
	}
	return &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.ImageContent{Data: png, MIMEType: "image/png"},
		&mcp.TextContent{Text: text},
	}}, out, nil
}

// KeyInput is qemu_send_key's arguments.
type KeyInput struct {
	Keys     string `json:"keys" jsonschema:"key combination pressed together, such as ctrl-alt-delete, shift-a, ret; several combinations separated by spaces are sent one after another"`
	HoldTime int    `json:"hold_time,omitempty" default:"100" jsonschema:"milliseconds the keys are held"`
	Target
}

// KeyOutput is qemu_send_key's result.
type KeyOutput struct {
	Sent [][]string `json:"sent" jsonschema:"the QEMU key codes sent, one list per combination"`
}

func (s *Server) sendKey(ctx context.Context, _ *mcp.CallToolRequest, in KeyInput) (*mcp.CallToolResult, KeyOutput, error) {
	if in.HoldTime < 0 || in.HoldTime > 10000 {
		return nil, KeyOutput{}, fmt.Errorf("hold_time %d: want 0 to 10000 ms", in.HoldTime)
	}
	hold := in.HoldTime
	if hold == 0 {
		hold = 100
	}
	var combos [][]string
	for _, c := range strings.Fields(in.Keys) {
		keys, err := qemu.ParseKeys(c)
		if err != nil {
			return nil, KeyOutput{}, err
		}
		combos = append(combos, keys)
	}
	if len(combos) == 0 {
		return nil, KeyOutput{}, errors.New("keys is empty: give a combination such as ctrl-alt-delete, shift-a or ret")
	}
	_, m, err := s.running(in.Target)
	if err != nil {
		return nil, KeyOutput{}, err
	}
	for _, keys := range combos {
		if err := sendCombo(ctx, m, keys, hold); err != nil {
			return nil, KeyOutput{}, err
		}
		// send-key returns before the keys are released: wait, so the
		// next combination is not merged into this one.
		if err := sleep(ctx, time.Duration(hold)*time.Millisecond); err != nil {
			return nil, KeyOutput{}, err
		}
	}
	return textResult(fmt.Sprintf("sent %d key combination(s): %v", len(combos), combos)), KeyOutput{Sent: combos}, nil
}

func sendCombo(ctx context.Context, m *qemu.Machine, keys []string, holdMS int) error {
	kv := make([]map[string]string, len(keys))
	for i, k := range keys {
		kv[i] = map[string]string{"type": "qcode", "data": k}
	}
	_, err := m.Monitor().Execute(ctx, "send-key", map[string]any{"keys": kv, "hold-time": holdMS})
	if err != nil {
		return fmt.Errorf("send %s: %w", strings.Join(keys, "-"), err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TypeInput is qemu_type_text's arguments.
type TypeInput struct {
	Text    string `json:"text" max:"1000" jsonschema:"text to type on the guest's keyboard (US layout); \\n is Return, \\t is Tab"`
	DelayMS int    `json:"delay_ms,omitempty" default:"50" jsonschema:"milliseconds between characters"`
	Target
}

// TypeOutput is qemu_type_text's result.
type TypeOutput struct {
	Typed int `json:"typed" jsonschema:"characters typed"`
}

func (s *Server) typeText(ctx context.Context, _ *mcp.CallToolRequest, in TypeInput) (*mcp.CallToolResult, TypeOutput, error) {
	if in.DelayMS < 0 || in.DelayMS > 10000 {
		return nil, TypeOutput{}, fmt.Errorf("delay_ms %d: want 0 to 10000", in.DelayMS)
	}
	delay := in.DelayMS
	if delay == 0 {
		delay = 50
	}
	combos, err := qemu.TypeText(in.Text)
	if err != nil {
		return nil, TypeOutput{}, err
	}
	// Typing is paced, so its length is its duration: refuse what cannot
	// finish inside a client's request time-out, rather than time out.
	if d := time.Duration(len(combos)*delay) * time.Millisecond; d > maxTyping {
		return nil, TypeOutput{}, fmt.Errorf("text of %d characters at delay_ms %d takes %v, more than the %v a call may type for: type it in parts", len(combos), delay, d, maxTyping)
	}
	_, m, err := s.running(in.Target)
	if err != nil {
		return nil, TypeOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, maxTyping+10*time.Second)
	defer cancel()
	// A key must be released before the same key is pressed again, or the
	// guest sees one long press: hold shorter than the gap.
	hold := max(delay/2, 10)
	for i, keys := range combos {
		if err := sendCombo(ctx, m, keys, hold); err != nil {
			return nil, TypeOutput{Typed: i}, fmt.Errorf("typed %d of %d characters: %w", i, len(combos), err)
		}
		if err := sleep(ctx, time.Duration(delay)*time.Millisecond); err != nil {
			return nil, TypeOutput{Typed: i + 1}, err
		}
	}
	return textResult(fmt.Sprintf("typed %d characters", len(combos))), TypeOutput{Typed: len(combos)}, nil
}

// maxTyping bounds how long one qemu_type_text may type: inside the 60 s a
// client gives a request.
const maxTyping = 30 * time.Second

// MouseInput is qemu_mouse's arguments.
type MouseInput struct {
	X       int      `json:"x" jsonschema:"absolute x, 0 (left) to 32767 (right)"`
	Y       int      `json:"y" jsonschema:"absolute y, 0 (top) to 32767 (bottom)"`
	Buttons []string `json:"buttons,omitempty" maxitems:"8" jsonschema:"buttons to click at that position: left, right, middle"`
	Target
}

// MouseOutput is qemu_mouse's result.
type MouseOutput struct {
	X       int      `json:"x"`
	Y       int      `json:"y"`
	Clicked []string `json:"clicked,omitempty"`
}

func (s *Server) mouse(ctx context.Context, _ *mcp.CallToolRequest, in MouseInput) (*mcp.CallToolResult, MouseOutput, error) {
	for _, v := range []struct {
		name string
		v    int
	}{{"x", in.X}, {"y", in.Y}} {
		if v.v < 0 || v.v > 32767 {
			return nil, MouseOutput{}, fmt.Errorf("%s %d: want 0 to 32767 (absolute coordinates)", v.name, v.v)
		}
	}
	for _, b := range in.Buttons {
		switch b {
		case "left", "right", "middle":
		default:
			return nil, MouseOutput{}, fmt.Errorf("button %q: want left, right or middle", b)
		}
	}
	_, m, err := s.running(in.Target)
	if err != nil {
		return nil, MouseOutput{}, err
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
	if err := send(abs("x", in.X), abs("y", in.Y)); err != nil {
		return nil, MouseOutput{}, fmt.Errorf("move pointer: %w", err)
	}
	for _, b := range in.Buttons {
		if err := send(btn(b, true)); err != nil {
			return nil, MouseOutput{}, fmt.Errorf("press %s: %w", b, err)
		}
		if err := send(btn(b, false)); err != nil {
			return nil, MouseOutput{}, fmt.Errorf("release %s: %w", b, err)
		}
	}
	text := "pointer at " + strconv.Itoa(in.X) + "," + strconv.Itoa(in.Y)
	if len(in.Buttons) > 0 {
		text += "; clicked " + strings.Join(in.Buttons, ", ")
	}
	return textResult(text), MouseOutput{X: in.X, Y: in.Y, Clicked: in.Buttons}, nil
}
