package tools_test

import (
	"bytes"
	"image/png"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
	s.wantError("qemu_screenshot", nil, "has been booted: call qemu_boot first")
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
	// A unix socket only its user can open: a VNC server answers on it.
	if fi, err := os.Lstat(b.VNC); err != nil || fi.Mode()&os.ModeSocket == 0 || !strings.HasPrefix(filepath.Base(b.VNC), "vnc-") {
		t.Fatalf("vnc %q: %v %v, want the VNC server's socket", b.VNC, fi, err)
	}
	c, err := net.Dial("unix", b.VNC)
	if err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, 12)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, hello); err != nil || !strings.HasPrefix(string(hello), "RFB 003.") {
		t.Errorf("vnc socket says %q, %v", hello, err)
	}
	c.Close()
	for _, a := range b.Argv {
		if strings.Contains(a, "127.0.0.1") {
			t.Errorf("qemu listens on loopback: %q", a)
		}
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

var eventRE = regexp.MustCompile(`input: (EV_KEY|EV_ABS) code=(\d+) value=(-?\d+)`)

// events waits until the guest has printed at least n key/abs events since
// cursor and returns them as "TYPE code value" strings.
func events(t *testing.T, s *session, since int64, until string) []string {
	t.Helper()
	var r waitOut
	s.mustCall("serial_read", map[string]any{"since": since, "wait_for": until, "timeout": 15}, &r)
	if !r.Matched {
		t.Fatalf("guest never printed %q; output: %q", until, r.Output)
	}
	var out []string
	for _, m := range eventRE.FindAllStringSubmatch(r.Output, -1) {
		out = append(out, m[1]+" "+m[2]+" "+m[3])
	}
	return out
}

func cursorNow(s *session) int64 {
	var st struct {
		SerialBytes int64 `json:"serial_bytes"`
	}
	s.mustCall("qemu_status", nil, &st)
	return st.SerialBytes
}

// Verified inside the guest: the tiny kernel's virtio-input driver prints
// every event it receives, and its virtio-gpu driver draws four quadrants.
func TestInputAndScreenInsideGuest(t *testing.T) {
	s := newSession(t)
	var b bootOut
	s.mustCall("qemu_boot", map[string]any{"gpu": true, "wait_for": prompt}, &b)
	for _, want := range []string{"virtio-gpu: at 0x", "virtio-input: keyboard at 0x", "virtio-input: tablet at 0x"} {
		if !strings.Contains(b.Output, want) {
			t.Fatalf("guest did not find its devices (%q missing): %q", want, b.Output)
		}
	}

	// Typed text: "Hi!" is shift+h, i, shift+1 on a US layout.
	from := cursorNow(s)
	s.mustCall("qemu_type_text", map[string]any{"text": "Hi!", "delay_ms": 30}, nil)
	// QEMU releases a combination's keys in reverse order: the last event
	// is shift's release after "1".
	evs := events(t, s, from, `(?s)code=2 value=0.*code=42 value=0\r\n.*tiny> $`)
	var presses []string
	for _, e := range evs {
		if strings.HasSuffix(e, " 1") {
			presses = append(presses, strings.TrimSuffix(strings.TrimPrefix(e, "EV_KEY "), " 1"))
		}
	}
	const (
		shift = "42"
		keyH  = "35"
		keyI  = "23"
		key1  = "2"
	)
	if got, want := strings.Join(presses, ","), strings.Join([]string{shift, keyH, keyI, shift, key1}, ","); got != want {
		t.Errorf("key presses %s, want %s (events %v)", got, want, evs)
	}
	if n := strings.Count(strings.Join(evs, "\n"), " 0"); n != 5 {
		t.Errorf("%d key releases, want 5: %v", n, evs)
	}

	// A combination: ctrl, alt and delete held together.
	from = cursorNow(s)
	s.mustCall("qemu_send_key", map[string]any{"keys": "ctrl-alt-delete", "hold_time": 50}, nil)
	evs = events(t, s, from, `(?s)code=111 value=0.*code=56 value=0.*code=29 value=0\r\n.*tiny> $`)
	if got := strings.Join(evs[:3], ","); got != "EV_KEY 29 1,EV_KEY 56 1,EV_KEY 111 1" {
		t.Errorf("ctrl-alt-delete events %v", evs)
	}

	// The pointer: absolute position, then a left click (BTN_LEFT 272).
	from = cursorNow(s)
	s.mustCall("qemu_mouse", map[string]any{"x": 1000, "y": 32767, "buttons": []string{"left"}}, nil)
	evs = events(t, s, from, `code=272 value=0(?s:.*)tiny> $`)
	if got := strings.Join(evs, ","); got != "EV_ABS 0 1000,EV_ABS 1 32767,EV_KEY 272 1,EV_KEY 272 0" {
		t.Errorf("mouse events %v", evs)
	}

	// The screen: the guest draws red, green, blue and white quadrants.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "gfx", "wait_for": `gfx: 640x480 quadrants red green blue white`}, &w)
	if !w.Matched {
		t.Fatalf("gfx: %q", w.Output)
	}
	img, err := png.Decode(bytes.NewReader(screenshot(t, s).Data))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if bnd := img.Bounds(); bnd.Dx() != 640 || bnd.Dy() != 480 {
		t.Fatalf("screenshot is %v, want 640x480", bnd)
	}
	for _, p := range []struct {
		x, y    int
		r, g, b uint32
		name    string
	}{{160, 120, 255, 0, 0, "red"}, {480, 120, 0, 255, 0, "green"}, {160, 360, 0, 0, 255, "blue"}, {480, 360, 255, 255, 255, "white"}} {
		r, g, bl, _ := img.At(p.x, p.y).RGBA()
		if r>>8 != p.r || g>>8 != p.g || bl>>8 != p.b {
			t.Errorf("pixel (%d,%d) is %d,%d,%d, want %s", p.x, p.y, r>>8, g>>8, bl>>8, p.name)
		}
	}
}
