package boundary_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
)

// countingQEMU is a wrapper of the QEMU under test that counts its starts
// in a file, so that a test sees whether a check started QEMU.
func countingQEMU(t *testing.T) (bin string, starts func() int) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "starts")
	bin = filepath.Join(dir, "qemu-system-riscv64")
	script := fmt.Sprintf("#!/bin/sh\necho >>%q\nexec %q \"$@\"\n", log, testguest.QEMU(t))
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, func() int {
		b, _ := os.ReadFile(log)
		return bytes.Count(b, []byte("\n"))
	}
}

func propPolicy(t *testing.T, bin, cache string) boundary.Policy {
	return boundary.Policy{Props: caps.NewPropProber(caps.PropsConfig{Binary: bin, CacheDir: cache,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})}
}

func wantRefusal(t *testing.T, what string, err error, rule, says string) {
	t.Helper()
	var re *boundary.RefusedError
	switch {
	case rule == "" && err != nil:
		t.Errorf("%s: refused: %v", what, err)
	case rule == "":
	case !errors.As(err, &re):
		t.Errorf("%s: %v, want a refusal by %s", what, err, rule)
	case re.Rule != rule || !strings.Contains(err.Error(), says):
		t.Errorf("%s: %v, want rule %s saying %q", what, err, rule, says)
	default:
		t.Logf("%s: %v", what, err)
	}
}

// The property rule with the types of the QEMU under test (7.2, or 11.1
// with QEMU_MCP_QEMU set): what passes, what is refused and why, the
// same for -global, -device, QMP and HMP device_add; QEMU takes what
// passes; and the types are asked of QEMU once, then read from the cache.
func TestQEMUDeviceProperties(t *testing.T) {
	bin, starts := countingQEMU(t)
	cache := t.TempDir()
	p := propPolicy(t, bin, cache)

	pass := []string{
		"-global", "virtio-mmio.force-legacy=false",
		"-global", "virtio-blk-device.queue-size=256",
		"-global", "virtio-blk-pci.disable-legacy=auto",
		"-global", "driver=virtio-mmio,property=ioeventfd,value=on",
		"-global", "virtio-pci.page-per-vq=on",
		"-global", "virtio-device.packed=off",
		"-device", "virtio-rng-pci,disable-legacy=on,id=rng1",
		"-device", `{"driver":"ich9-usb-ehci1","id":"ehci"}`,
		"-device", "virtio-serial-pci,id=vs,max_ports=4",
	}
	start := time.Now()
	if err := p.ExtraArgs(pass); err != nil {
		t.Fatal(err)
	}
	t.Logf("checked with this QEMU's types in %v (%d QEMU started)", time.Since(start).Round(time.Millisecond), starts())
	if n := starts(); n != 1 {
		t.Errorf("%d QEMUs started for one check, want 1", n)
	}
	// And QEMU takes them.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testguest.QEMU(t), append([]string{"-M", "virt", "-bios", "none", "-nodefaults",
		"-display", "none", "-S", "-qmp", "stdio"}, pass...)...)
	cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")
	if out, err := cmd.CombinedOutput(); err != nil || bytes.Contains(out, []byte(`"error"`)) {
		t.Errorf("QEMU does not take what passed: %v\n%s", err, out)
	}

	for _, tt := range []struct {
		args       []string
		rule, says string
	}{
		{[]string{"-global", "loader.file=/etc/passwd"}, boundary.RuleHostFile, "property file of loader is a string (str)"},
		{[]string{"-global", "virtio-blk-pci.romfile=x"}, boundary.RuleHostFile, "property romfile of virtio-blk-pci is a string (str)"},
		{[]string{"-device", "virtio-blk-device,drive=x,serial=abc"}, boundary.RuleBlockLayer, "property drive of virtio-blk-device is a string (str)"},
		{[]string{"-global", "virtio-blk-device.queue-size=abc"}, boundary.RuleGuestDevice, "queue-size of virtio-blk-device (uint16)"},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=/etc/passwd"}, boundary.RuleGuestDevice, "disable-legacy of virtio-blk-pci (OnOffAuto)"},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=report"}, boundary.RuleGuestDevice, "OnOffAuto"},
		{[]string{"-global", "virtio-pci.disable-legacy=on"}, boundary.RuleGuestDevice, "name a class that has it"},
		{[]string{"-global", "virtio-blk-pci.failover_pair_id=x"}, boundary.RuleGuestDevice, "is a string (str)"},
		{[]string{"-global", "no-such-device.x=1"}, boundary.RuleGuestDevice, "no device class"},
		{[]string{"-global", "memory-backend-file.mem-path=/etc"}, boundary.RuleGuestDevice, "no device class"},
		{[]string{"-device", "virtio-rng-pci,disable-legacy=/etc/passwd"}, boundary.RuleGuestDevice, "OnOffAuto"},
		{[]string{"-device", "virtio-blk-device,serial=abc"}, boundary.RuleBlockLayer, "device model"},
		{[]string{"-device", "no-such-model"}, boundary.RuleGuestDevice, "no device model"},
	} {
		wantRefusal(t, strings.Join(tt.args, " "), p.ExtraArgs(tt.args), tt.rule, tt.says)
	}

	type A = map[string]any
	for _, tt := range []struct {
		args       A
		rule, says string
	}{
		{A{"driver": "virtio-rng-pci", "disable-legacy": "auto", "id": "r2"}, "", ""},
		{A{"driver": "ioh3420", "id": "rp2", "chassis": float64(3)}, "", ""},
		{A{"driver": "virtio-rng-pci", "disable-legacy": "/etc/passwd"}, boundary.RuleGuestDevice, "OnOffAuto"},
		{A{"driver": "virtio-blk-device", "drive": "x", "serial": "abc"}, boundary.RuleBlockLayer, "drive"},
		{A{"driver": "loader", "file": "/etc/passwd"}, boundary.RuleHostFile, "property file of loader is a string (str)"},
	} {
		wantRefusal(t, fmt.Sprintf("device_add %v", tt.args), p.QMP("device_add", tt.args), tt.rule, tt.says)
		line := "device_add " + tt.args["driver"].(string)
		for k, v := range tt.args {
			if k != "driver" {
				line += fmt.Sprintf(",%s=%v", k, v)
			}
		}
		wantRefusal(t, line, p.HMP(line), tt.rule, tt.says)
		err := p.QMP("human-monitor-command", A{"command-line": line})
		wantRefusal(t, "qmp "+line, errors.Unwrap(err), tt.rule, tt.says)
	}
	asked := starts()
	t.Logf("%d QEMUs started for all these checks", asked)

	// Another server with the same cache: no QEMU at all.
	q := propPolicy(t, bin, cache)
	if err := q.ExtraArgs(pass); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, "cached loader.file", q.ExtraArgs([]string{"-global", "loader.file=/etc/passwd"}), boundary.RuleHostFile, "(str)")
	if n := starts(); n != asked {
		t.Errorf("the second policy started %d QEMUs, want none (the cache answers)", n-asked)
	}
}
