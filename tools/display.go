package tools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/qemu"
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
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, ScreenshotOutput{}, err
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, path, err := inst.Display().Screenshot(qctx, in.Save)
	if err != nil {
		return nil, ScreenshotOutput{}, fmt.Errorf("screenshot: %w", err)
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

// keyMillis checks a keyboard tool's milliseconds argument, 0 to 10000,
// where 0 means def; the error names the unit where the name does not.
func keyMillis(name string, v, def int) (int, error) {
	if v < 0 || v > 10000 {
		unit := " ms"
		if strings.HasSuffix(name, "_ms") {
			unit = ""
		}
		return 0, fmt.Errorf("%s %d: want 0 to 10000%s", name, v, unit)
	}
	if v == 0 {
		return def, nil
	}
	return v, nil
}

func (s *Server) sendKey(ctx context.Context, _ *mcp.CallToolRequest, in KeyInput) (*mcp.CallToolResult, KeyOutput, error) {
	hold, err := keyMillis("hold_time", in.HoldTime, 100)
	if err != nil {
		return nil, KeyOutput{}, err
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
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, KeyOutput{}, err
	}
	// Each combination is released before the next is pressed.
	holdFor := time.Duration(hold) * time.Millisecond
	if _, err := inst.Display().PressKeys(ctx, combos, holdFor, holdFor); err != nil {
		return nil, KeyOutput{}, err
	}
	return textResult(fmt.Sprintf("sent %d key combination(s): %v", len(combos), combos)), KeyOutput{Sent: combos}, nil
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
	delay, err := keyMillis("delay_ms", in.DelayMS, 50)
	if err != nil {
		return nil, TypeOutput{}, err
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
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, TypeOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, maxTyping+10*time.Second)
	defer cancel()
	// A key must be released before the same key is pressed again, or the
	// guest sees one long press: hold shorter than the gap.
	hold := time.Duration(max(delay/2, 10)) * time.Millisecond
	if n, err := inst.Display().PressKeys(ctx, combos, hold, time.Duration(delay)*time.Millisecond); err != nil {
		if n < len(combos) && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("typed %d of %d characters: %w", n, len(combos), err)
		}
		return nil, TypeOutput{Typed: n}, err
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
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, MouseOutput{}, err
	}
	if err := inst.Display().Pointer(ctx, in.X, in.Y, in.Buttons); err != nil {
		return nil, MouseOutput{}, err
	}
	text := "pointer at " + strconv.Itoa(in.X) + "," + strconv.Itoa(in.Y)
	if len(in.Buttons) > 0 {
		text += "; clicked " + strings.Join(in.Buttons, ", ")
	}
	return textResult(text), MouseOutput{X: in.X, Y: in.Y, Clicked: in.Buttons}, nil
}

func (s *Server) registerDisplay(ms *mcp.Server) {
	add(s, ms, tool("qemu_screenshot", "Screenshot", reading,
		"Take a PNG screenshot of the guest's display (QMP screendump), returned as image content; save: true also keeps it under the captures directory. Needs a guest booted with gpu: true."), s.screenshot)
	add(s, ms, tool("qemu_send_key", "Send key", mutating,
		"Press a key combination on the guest's keyboard, such as ctrl-alt-delete, shift-a or ret (QMP send-key); several combinations separated by spaces are pressed one after another."), s.sendKey)
	add(s, ms, tool("qemu_type_text", "Type text", mutating,
		"Type text on the guest's keyboard, one key event per character on a US layout (shifted characters handled); characters with no key are named in the error and nothing is typed."), s.typeText)
	add(s, ms, tool("qemu_mouse", "Mouse", mutating,
		"Move the guest's absolute pointer (tablet) to x, y in 0..32767 and optionally click buttons (left, right, middle) there."), s.mouse)
}
