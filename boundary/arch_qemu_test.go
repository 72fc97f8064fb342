package boundary

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
)

// The rules classify every QMP and HMP command of the other
// architectures' QEMUs too, and each board's own commands pass for that
// architecture's guests only.
func TestArchQEMUCommandsClassified(t *testing.T) {
	for _, a := range archs.All()[1:] {
		t.Run(a.Name(), func(t *testing.T) {
			m := startArchQEMU(t, a, t.TempDir())
			var cmds []struct{ Name string }
			execute(t, m, "query-commands", nil, &cmds)
			for _, c := range cmds {
				if r := ClassifyQMP(c.Name); r.Name == RuleUnlisted {
					t.Errorf("QMP command %q of the %s QEMU is not classified", c.Name, a.Name())
				}
			}
			for _, line := range strings.Split(hmpLine(t, m, "help"), "\n") {
				if line == "" || line[0] == ' ' || line[0] == '\t' || line[0] == '[' {
					continue
				}
				for _, n := range strings.Split(strings.Fields(line)[0], "|") {
					if r := ClassifyHMP(n); r.Name == RuleUnlisted {
						t.Errorf("HMP command %q of the %s QEMU is not classified", n, a.Name())
					}
				}
			}
			for _, line := range strings.Split(hmpLine(t, m, "info"), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "info" && !InfoSubcommands[f[1]] && f[1] != "usbhost" {
					t.Errorf("info %s of the %s QEMU is not classified", f[1], a.Name())
				}
			}
			for _, c := range a.QEMU().Commands {
				if err := (Policy{Arch: a}).QMP(c, nil); err != nil {
					t.Errorf("%s for a %s guest: %v", c, a.Name(), err)
				}
				if err := (Policy{}).QMP(c, nil); err == nil {
					t.Errorf("%s passes for a guest of another architecture", c)
				}
			}
		})
	}
}
