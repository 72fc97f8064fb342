package tools_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProfiles(t *testing.T) {
	// Project roots must be the server's working directory or below it.
	ws := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = ws }, nil)
	root := filepath.Join(ws, "project")
	kernel := testImage(t, "tiny.bin")
	os.MkdirAll(filepath.Join(root, "out"), 0o755)
	os.WriteFile(filepath.Join(root, "out", "k.bin"), kernel, 0o644)
	os.WriteFile(filepath.Join(root, "disk.img"), make([]byte, 1<<20), 0o644)
	os.WriteFile(filepath.Join(root, ".qemu-mcp.json"), []byte(`{
  "default": "dev",
  "profiles": {
    "dev": {"kernel": "out/k.bin", "memory": "64M", "prompt": "tiny> $", "drives": [{"path": "disk.img", "readonly": true}]},
    "big": {"kernel": "out/k.bin", "memory": "256M", "smp": 2}
  }
}`), 0o644)

	var b struct {
		Profile string   `json:"profile"`
		Matched bool     `json:"matched"`
		Argv    []string `json:"argv"`
		Files   []struct {
			FD   int    `json:"fd"`
			Path string `json:"path"`
		} `json:"files"`
	}
	// The default profile: its prompt is the wait_for.
	s.mustCall("qemu_boot", map[string]any{"project_root": root}, &b)
	var st struct {
		Files []struct {
			FD   int    `json:"fd"`
			Path string `json:"path"`
		} `json:"files"`
	}
	s.mustCall("qemu_status", nil, &st)
	b.Files = st.Files
	argv := strings.Join(b.Argv, " ")
	if b.Profile != "dev" || !b.Matched || !strings.Contains(argv, "-m 64M") || len(b.Files) != 2 || b.Files[0].Path != filepath.Join(root, "disk.img") ||
		!strings.Contains(argv, fmt.Sprintf("-drive file=/proc/self/fd/%d,format=raw,if=none,id=drive0,readonly=on", b.Files[0].FD)) {
		t.Fatalf("default profile boot: %+v", b)
	}
	// serial_send waits for the profile's prompt by default.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo via-profile"}, &w)
	if !w.Matched || !strings.HasSuffix(w.Output, "via-profile\ntiny> ") {
		t.Errorf("send with the profile prompt: %+v", w)
	}
	// A named profile, with an explicit argument overriding it.
	s.mustCall("qemu_boot", map[string]any{"project_root": root, "profile": "big", "memory": "96M", "restart": true, "wait_for": prompt}, &b)
	argv = strings.Join(b.Argv, " ")
	if b.Profile != "big" || !strings.Contains(argv, "-m 96M") || !strings.Contains(argv, "-smp 2") {
		t.Errorf("big profile with override: %s", argv)
	}
	s.wantError("qemu_boot", map[string]any{"project_root": root, "profile": "nope", "restart": true}, ".qemu-mcp.json", `no profile "nope"`, "big, dev")
	other := filepath.Join(ws, "other")
	os.Mkdir(other, 0o755)
	s.wantError("qemu_boot", map[string]any{"project_root": other, "profile": "dev", "restart": true}, "has no .qemu-mcp.json")
	os.WriteFile(filepath.Join(root, ".qemu-mcp.json"), []byte(`{"profiles": {"dev": {"kernal": "x"}}}`), 0o644)
	s.wantError("qemu_boot", map[string]any{"project_root": root, "restart": true}, ".qemu-mcp.json", `profile "dev"`, `unknown field "kernal"`)
}

// network: "user" gives the guest a NIC on QEMU's slirp without any
// privilege. Only the NIC's presence is checked: no traffic is sent.
func TestNetworkUser(t *testing.T) {
	s, b := bootUBoot(t, map[string]any{"network": "user", "wait_for": `Net:\s+eth0: virtio-net`})
	if !contains(b.Argv, "user,id=net0") {
		t.Fatalf("U-Boot did not find the user-mode NIC: %+v", b)
	}
	s.wantError("qemu_boot", map[string]any{"restart": true, "network": "bridge"}, `network "bridge"`)
}
