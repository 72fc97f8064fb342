package x86_64

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// TestScanPrologue decodes prologues of x86-64 Linux, cut at each pc a
// debugger may stop at.
func TestScanPrologue(t *testing.T) {
	// endbr64; call __fentry__ (as the five-byte nop); push %rbp;
	// mov %rsp,%rbp; push %rbx; sub $0x48,%rsp; mov %rdi,%rbx
	padded := archtest.Code(t, "f3 0f 1e fa 0f 1f 44 00 00 55 48 89 e5 53 48 83 ec 48 48 89 fb")
	// panic in a 6.1 kernel: push %rbp; xor %eax,%eax; mov %rsp,%rbp; ...
	panicking := archtest.Code(t, "55 31 c0 48 89 e5 41 56")
	entry := arch.Prologue{SPOff: -8}
	pushed := arch.Prologue{SPAdjusted: true, SPOff: -16, FPStored: true, FPSlot: 0}
	for _, c := range []struct {
		name string
		code []byte
		want arch.Prologue
	}{
		{"at entry", padded[:0], entry},
		{"after endbr64", padded[:4], entry},
		{"after the ftrace nop", padded[:9], entry},
		{"ftrace live: a call to __fentry__", archtest.Code(t, "f3 0f 1e fa e8 00 10 00 00"), entry},
		{"rbp pushed", padded[:10], pushed},
		{"frame set", padded[:13], standardPrologue},
		{"cut in the mov", padded[:12], pushed},
		{"rbx pushed", padded[:14], arch.Prologue{SPAdjusted: true, SPOff: -24, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		{"sp lowered", padded, arch.Prologue{SPAdjusted: true, SPOff: -24 - 0x48, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		{"panic, before the mov", panicking[:3], pushed},
		{"panic", panicking, arch.Prologue{SPAdjusted: true, SPOff: -24, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		{"sp lowered by 128", archtest.Code(t, "55 48 89 e5 48 83 c4 80"), arch.Prologue{SPAdjusted: true, SPOff: -16 - 128, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
		// rtc_timer_enqueue: lea 0x8(%rsp),%r10; and $-16,%rsp; push
		// -0x8(%r10) (the return address again); push %rbp; mov %rsp,%rbp
		{"stack realigned", archtest.Code(t, "4c 8d 54 24 08 48 83 e4 f0 41 ff 72 f8 55 48 89 e5"), standardPrologue},
		{"a leaf without a frame", archtest.Code(t, "8b 07 01 f0 89 07"), entry},
		{"registers pushed, no frame", archtest.Code(t, "41 54 53 48 89 fb"), arch.Prologue{SPAdjusted: true, SPOff: -24}},
		{"an early return's epilogue", archtest.Code(t, "55 48 89 e5 53 85 ff 74 03 5b 5d c3 8b 07"),
			arch.Prologue{SPAdjusted: true, SPOff: -24, FPSet: true, FPPos: -16, RASaved: true, RAOff: 8}},
	} {
		if got := (debugger{}).ScanPrologue(c.code); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestStandard(t *testing.T) {
	d := debugger{}
	std := d.Standard()
	if got := d.ScanPrologue(archtest.Code(t, "55 48 89 e5")); got != std {
		t.Errorf("Standard() = %+v, the prologue scanned %+v", std, got)
	}
	// The return address at fp+8 is at CFA-8, where the call left it.
	if !std.FPSet || !std.RASaved || std.FPPos+std.RAOff != -8 || std.FPOff != 0 {
		t.Errorf("Standard() = %+v", std)
	}
	if d.PrologueScan() < 16 {
		t.Errorf("PrologueScan() = %d", d.PrologueScan())
	}
}
