package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
)

// qemu-mcp probe -qemu aarch64=PATH probes the aarch64 QEMU with the
// built-in aarch64 kernel (it keeps the timer, 7.2 and 11.1 alike); an
// architecture the server does not know is refused.
func TestProbeCmdAarch64(t *testing.T) {
	q := testguest.ArchQEMU(t, arm64.Arch)
	t.Setenv(caps.CacheEnv, t.TempDir())
	t.Setenv(runtimedir.Env, runtimeDir(t))
	var out, errb bytes.Buffer
	if rc := probeCmd([]string{"-qemu", "aarch64=" + q, "--json"}, &out, &errb); rc != 0 {
		t.Fatalf("probe: status %d: %s", rc, errb.String())
	}
	var c caps.Caps
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	if c.Binary != q || !c.TimerKept.Yes() || !strings.Contains(c.TimerKept.Detail, "CNTVCT_EL0 restored") {
		t.Errorf("probed %s: %+v", c.Binary, c.TimerKept)
	}
	errb.Reset()
	if rc := probeCmd([]string{"-qemu", "x86=qemu-system-x86_64"}, &out, &errb); rc != 2 || !strings.Contains(errb.String(), `architecture "x86": want one of riscv64, aarch64`) {
		t.Errorf("an unknown architecture: status %d: %s", rc, errb.String())
	}
}
