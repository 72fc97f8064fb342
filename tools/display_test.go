package tools_test

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func screenshot(t *testing.T, s *session) *mcp.ImageContent {
	t.Helper()
	res := s.call("qemu_screenshot", nil, nil)
	if res.IsError {
		t.Fatalf("screenshot: %s", text(res))
	}
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			if img.MIMEType != "image/png" {
				t.Fatalf("mime %q", img.MIMEType)
			}
			return img
		}
	}
	t.Fatal("screenshot result has no image content")
	return nil
}

func TestDisplayToolsWithoutGPU(t *testing.T) {
	s := newSession(t)
	s.wantError("qemu_screenshot", nil, "no guest is running")
	s.bootTiny()
	s.wantError("qemu_screenshot", nil, "no display", "gpu: true")
	s.wantError("qemu_send_key", map[string]any{"keys": "ctrl-nosuchkey"}, "nosuchkey", "QEMU key name")
	s.wantError("qemu_type_text", map[string]any{"text": "héllo ☃"}, "'é'", "'☃'", "nothing was typed")
	s.wantError("qemu_mouse", map[string]any{"x": 40000, "y": 0}, "x 40000")
	s.wantError("qemu_mouse", map[string]any{"x": 1, "y": 1, "buttons": []string{"side"}}, "side")
	s.wantError("qemu_boot", map[string]any{"restart": true, "vnc": true}, "gpu: true")
}

func TestScreenshotAndVNC(t *testing.T) {
	s := newSession(t)
	var b struct {
		VNC  string   `json:"vnc"`
		Argv []string `json:"argv"`
	}
	s.mustCall("qemu_boot", map[string]any{"gpu": true, "vnc": true, "wait_for": prompt}, &b)
	if !strings.HasPrefix(b.VNC, "127.0.0.1:59") {
		t.Errorf("vnc %q, want a loopback VNC port", b.VNC)
	}
	img := screenshot(t, s)
	if _, err := png.Decode(bytes.NewReader(img.Data)); err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	var saved struct {
		Path string `json:"path"`
	}
	s.mustCall("qemu_screenshot", map[string]any{"save": true}, &saved)
	if !strings.Contains(saved.Path, "/captures/screenshot-") {
		t.Errorf("saved path %q", saved.Path)
	}
	var k struct {
		Sent [][]string `json:"sent"`
	}
	s.mustCall("qemu_send_key", map[string]any{"keys": "ctrl-alt-delete shift-a ret", "hold_time": 20}, &k)
	if len(k.Sent) != 3 || strings.Join(k.Sent[0], "-") != "ctrl-alt-delete" {
		t.Errorf("sent %v", k.Sent)
	}
	s.mustCall("qemu_mouse", map[string]any{"x": 100, "y": 200, "buttons": []string{"left"}}, nil)
	s.mustCall("qemu_type_text", map[string]any{"text": "Hi!", "delay_ms": 5}, nil)
}
