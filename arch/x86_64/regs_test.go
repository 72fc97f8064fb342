package x86_64

import (
	"strings"
	"testing"
)

// Only long mode's code is read: real mode and legacy protected mode are
// named, with why.
func TestForeign(t *testing.T) {
	for _, tc := range []struct {
		regs map[string]uint64
		want string
	}{
		{map[string]uint64{"cr0": 0x60000010, "cs": 0xf000, "rip": 0xfff0}, "16-bit real mode (CR0.PE=0: the pc is IP, at CS:IP f000:fff0)"},
		{map[string]uint64{"cr0": 0x11, "efer": 0, "cs": 0x10, "rip": 0x1000000}, "legacy protected mode (EFER.LMA=0"},
		{map[string]uint64{"cr0": 0x80050033, "efer": 0xd01, "cs": 0x10, "rip": 0xffffffff81000000}, ""},
		{map[string]uint64{}, ""},
	} {
		got := debugger{}.Foreign(func(n string) (uint64, bool) { v, ok := tc.regs[n]; return v, ok })
		if !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
			t.Errorf("Foreign(%x) = %q, want %q", tc.regs, got, tc.want)
		}
	}
}
