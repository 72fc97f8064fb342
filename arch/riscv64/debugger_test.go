package riscv64

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// Prologues as GCC emits them for Linux 6.1 and the built-in kernel
// (bytes from objdump), up to and past the point the frame pointer is set.
func TestScanPrologue(t *testing.T) {
	for _, tc := range []struct {
		name, code string
		want       arch.Prologue
	}{
		// add sp,sp,-112; sd s0,96(sp); sd s1,88(sp); sd s2,80(sp);
		// add s0,sp,112; sd ra,104(sp)
		{"__se_sys_sethostname", "5971 a2f0 a6ec cae8 8018 86f4",
			arch.Prologue{SPAdjusted: true, SPOff: -112, FPSet: true, RASaved: true, RAOff: -8, FPOff: -16}},
		// The same, stopped before ra is saved: a leaf's view.
		{"__se_sys_sethostname before sd ra", "5971 a2f0 a6ec cae8 8018",
			arch.Prologue{SPAdjusted: true, SPOff: -112, FPSet: true, FPOff: -16}},
		// Stopped before the frame pointer is set.
		{"__se_sys_sethostname before add s0", "5971 a2f0 a6ec cae8",
			arch.Prologue{SPAdjusted: true, SPOff: -112, FPStored: true, FPSlot: 96}},
		// panic: the frame pointer 64 bytes below the CFA.
		// add sp,sp,-160; sd s0,80(sp); sd s1,72(sp); sd s2,64(sp);
		// sd ra,88(sp); sd s3..s7; add s0,sp,96
		{"panic", "3571 a2e8 a6e4 cae0 86ec 4efc 52f8 56f4 5af0 5eec 8010",
			arch.Prologue{SPAdjusted: true, SPOff: -160, FPSet: true, FPPos: -64, RASaved: true, RAOff: -8, FPOff: -16}},
		// do_sys_poll: 32-bit forms. add sp,sp,-1072; sd ra,1064(sp);
		// sd s0,1056(sp); sd s1,1048(sp); add s0,sp,1072
		{"do_sys_poll", "130101bd 23341142 23308142 233c9140 13040143",
			arch.Prologue{SPAdjusted: true, SPOff: -1072, FPSet: true, RASaved: true, RAOff: -8, FPOff: -16}},
		// The built-in kernel's leaf tk_cmd_input: add sp,sp,-16;
		// sd s0,8(sp); add s0,sp,16 (ra stays in the register).
		{"tk_cmd_input", "4111 22e4 0008",
			arch.Prologue{SPAdjusted: true, SPOff: -16, FPSet: true, FPOff: -8}},
		{"nothing", "", arch.Prologue{}},
	} {
		if got := (debugger{}).ScanPrologue(archtest.Code(t, tc.code)); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestIsCall(t *testing.T) {
	for _, tc := range []struct {
		code string
		n    int
		call bool
	}{
		{"ef002022", 4, true},  // jal ra,... (putn)
		{"e7800000", 4, true},  // jalr ra,0(ra)
		{"6f000000", 4, false}, // j (jal zero)
		{"8290", 2, true},      // c.jalr ra
		{"8280", 2, false},     // c.jr t0 (jalr zero)
		{"8280", 2, false},
		{"0a05", 2, false}, // c.addi
	} {
		n, call := debugger{}.Call(archtest.Code(t, tc.code))
		if n != tc.n || call != tc.call {
			t.Errorf("Call(%s) = %d, %v; want %d, %v", tc.code, n, call, tc.n, tc.call)
		}
	}
}

func TestDecode(t *testing.T) {
	for v, want := range map[uint64]string{
		8:         "environment call from U-mode",
		13:        "load page fault",
		15:        "store/AMO page fault",
		1<<63 | 5: "supervisor timer interrupt",
		1<<63 | 9: "supervisor external interrupt",
		14:        "reserved exception 14",
		1<<63 | 2: "reserved interrupt 2",
	} {
		if got := DecodeCause(v).Cause; got != want {
			t.Errorf("DecodeCause(%#x) = %q, want %q", v, got, want)
		}
	}
	if got := decodeSatp(8<<60 | 3<<44 | 0x80a3d); got != "Sv39 asid=3 root=0x80a3d000" {
		t.Errorf("decodeSatp = %q", got)
	}
	if got := decodeSatp(0); got != "Bare (no translation)" {
		t.Errorf("decodeSatp(0) = %q", got)
	}
	// SPP=S, SIE=1, SPIE=0, SUM=1
	if got := decodeStatus(1<<8|1<<1|1<<18, false); got != "SPP=S SIE=1 SPIE=0 SUM=1 MXR=0" {
		t.Errorf("decodeStatus = %q", got)
	}
}
