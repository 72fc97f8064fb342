package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/profile"
)

// profileRoundTrip boots line as command_line in a server whose project
// is root, writes a profile from it with `qemu-mcp profile`, and boots
// again with no arguments: the QEMU command lines are the same.
func profileRoundTrip(t *testing.T, root, line, prompt string) {
	t.Helper()
	dir := runtimeDir(t)
	cmd := serverCmd(dir)
	cmd.Dir = root
	cmd.Stderr = &logWriter{t: t}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var first, second struct {
		Argv    []string `json:"argv"`
		Matched bool     `json:"matched"`
		Profile string   `json:"profile"`
		Output  string   `json:"output"`
		Cursor  int64    `json:"cursor"`
	}
	callInto(ctx, t, cs, "qemu_boot", map[string]any{"command_line": line, "wait_for": prompt, "timeout": 30}, &first)
	if !first.Matched {
		t.Fatalf("command_line boot: prompt %q not seen in %d bytes: %q", prompt, first.Cursor, first.Output)
	}
	var out, errs strings.Builder
	if code := profileCmd([]string{"-dir", root, "-qemu", testguest.QEMU(t), "-prompt", prompt, line}, strings.NewReader(""), &out, &errs); code != 0 {
		t.Fatalf("qemu-mcp profile: exit %d: %s%s", code, out.String(), errs.String())
	}
	t.Logf("qemu-mcp profile:\n%s", out.String())
	f, err := profile.Load(root)
	if err != nil || f == nil || f.Default != "default" {
		t.Fatalf("profile written: %+v, %v", f, err)
	}
	callInto(ctx, t, cs, "qemu_boot", map[string]any{"restart": true}, &second)
	if !second.Matched || second.Profile != "default" {
		t.Fatalf("qemu_boot {}: matched %v, profile %q; %d bytes: %q", second.Matched, second.Profile, second.Cursor, second.Output)
	}
	if !reflect.DeepEqual(first.Argv, second.Argv) {
		t.Errorf("argv differ:\ncommand_line: %q\nprofile:      %q", first.Argv, second.Argv)
	}
	// A second write of the same name is refused, the file kept.
	before, _ := os.ReadFile(filepath.Join(root, profile.FileName))
	if code := profileCmd([]string{"-dir", root, line}, strings.NewReader(""), &out, &errs); code == 0 {
		t.Error("a second profile of the same name was written over the first")
	}
	if after, _ := os.ReadFile(filepath.Join(root, profile.FileName)); string(after) != string(before) {
		t.Error("a refused write changed the file")
	}
}

func TestProfileFromCommandLine(t *testing.T) {
	needQEMU(t)
	root := t.TempDir()
	b, err := os.ReadFile("../../testdata/images/tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "tiny.bin"), b, 0o644)
	os.WriteFile(filepath.Join(root, "disk.img"), make([]byte, 1<<20), 0o644)
	profileRoundTrip(t, root, `qemu-system-riscv64 -machine virt -bios none -kernel tiny.bin -m 64M -smp 2 -nographic \
  -global virtio-mmio.force-legacy=false -global virtio-blk-device.queue-size=64 \
  -drive file=disk.img,if=none,format=raw,id=x0 -device virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0`, `tiny> $`)
}

// The teaching kernel's own make -n qemu, as it prints it.
func TestProfileFromTutorLine(t *testing.T) {
	needQEMU(t)
	dir := testguest.Tutor(t, nil)
	profileRoundTrip(t, dir, testguest.TutorQEMULine(t, dir), `\$ $`)
}

// A refused line writes nothing and says why.
func TestProfileRefusedLine(t *testing.T) {
	root := t.TempDir()
	var out, errs strings.Builder
	code := profileCmd([]string{"-dir", root, "--", "-kernel k -monitor telnet::4444,server,nowait"}, strings.NewReader(""), &out, &errs)
	if code == 0 || !strings.Contains(out.String(), "telnet::4444") || !strings.Contains(errs.String(), "nothing was written") {
		t.Errorf("exit %d, out %q, err %q", code, out.String(), errs.String())
	}
	if _, err := os.Stat(filepath.Join(root, profile.FileName)); !os.IsNotExist(err) {
		t.Errorf("a profile was written: %v", err)
	}
	// From standard input, as make -n prints it.
	out.Reset()
	errs.Reset()
	code = profileCmd([]string{"-dir", root, "-name", "qemu", "-"}, strings.NewReader("qemu-system-riscv64 -kernel k \\\n  -m 256\n"), &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errs.String())
	}
	f, err := profile.Load(root)
	if err != nil || f.Profiles["qemu"].Memory != "256M" || f.Profiles["qemu"].Kernel != "k" {
		t.Errorf("profile %+v, %v", f, err)
	}
}
