package boundary

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
)

// The rules classify every QMP and HMP command of the aarch64 QEMU too,
// and its board's own command passes for aarch64 guests only.
func TestAarch64QEMUCommandsClassified(t *testing.T) {
	m := startArchQEMU(t, arm64.Arch, t.TempDir())
	var cmds []struct{ Name string }
	execute(t, m, "query-commands", nil, &cmds)
	for _, c := range cmds {
		if r := ClassifyQMP(c.Name); r.Name == RuleUnlisted {
			t.Errorf("QMP command %q of the aarch64 QEMU is not classified", c.Name)
		}
	}
	for _, line := range strings.Split(hmpLine(t, m, "help"), "\n") {
		if line == "" || line[0] == ' ' || line[0] == '\t' || line[0] == '[' {
			continue
		}
		for _, n := range strings.Split(strings.Fields(line)[0], "|") {
			if r := ClassifyHMP(n); r.Name == RuleUnlisted {
				t.Errorf("HMP command %q of the aarch64 QEMU is not classified", n)
			}
		}
	}
	for _, line := range strings.Split(hmpLine(t, m, "info"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "info" && !InfoSubcommands[f[1]] && f[1] != "usbhost" {
			t.Errorf("info %s of the aarch64 QEMU is not classified", f[1])
		}
	}
	if err := (Policy{Arch: arm64.Arch}).QMP("query-gic-capabilities", nil); err != nil {
		t.Errorf("query-gic-capabilities for an aarch64 guest: %v", err)
	}
	if err := (Policy{}).QMP("query-gic-capabilities", nil); err == nil {
		t.Error("query-gic-capabilities passes for a guest of another architecture")
	}
}
