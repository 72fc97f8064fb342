package arm64

import (
	"encoding/binary"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

func insnBytes(x uint32) []byte { return binary.LittleEndian.AppendUint32(nil, x) }

// TestDisassembleSystem checks the instructions a kernel is made of that
// arm64asm does not decode, or writes otherwise than objdump (whose text,
// binutils 2.40's, each case gives).
func TestDisassembleSystem(t *testing.T) {
	for _, c := range []struct {
		x    uint32
		want string
	}{
		{0xd5385201, "mrs x1, esr_el1"},
		{0xd5382020, "mrs x0, ttbr1_el1"},
		{0xd518d080, "msr tpidr_el1, x0"},
		{0xd538411c, "mrs x28, sp_el0"},
		{0xd53b4220, "mrs x0, daif"},
		{0xd5380000, "mrs x0, midr_el1"},
		{0xd53ff000, "mrs x0, s3_7_c15_c0_0"}, // implementation defined: no name
		{0xd50342df, "msr daifset, #0x2"},
		{0xd503413f, "msr ssbs, #0x1"},
		{0xd500419f, "msr pan, #0x1"},
		{0xd69f03e0, "eret"},
		{0xd503207f, "wfi"},
		{0xd5033fdf, "isb"},
		{0xd5033b9f, "dsb ish"},
		{0xd508871f, "tlbi vmalle1"},
		{0xd50b7522, "ic ivau, x2"},
		{0xd508711f, "ic ialluis"},
		{0xd5087814, "at s1e1r, x20"},
		{0xd50b7fe1, "sys #3, C7, C15, #7, x1"},
		{0xd4000002, "hvc #0x0"},
		{0xd4000003, "smc #0x0"},
		{0xd4000001, "svc #0x0"},
		{0xd4210000, "brk #0x800"},
		{0x00000000, "udf #0"},
		{0xd503233f, "paciasp"},
		{0xd50323bf, "autiasp"},
		{0xd503245f, "bti c"},
		{0xd503241f, "bti"},
		{0xd50320ff, "xpaclri"},
		{0xd503229f, "csdb"},
		{0xd50320df, "hint #0x6"},
		{0xd50330ff, "sb"},
		{0xd65f0bff, "retaa"},
		{0xd73f0a11, "blraa x16, x17"},
		{0xd63f081f | 3<<5, "blraaz x3"},
		{0xb8e00041, "ldaddal w0, w1, [x2]"},
		{0xf820001f | 2<<5, "stadd x0, [x2]"},
		{0xf8a08062, "swpa x0, x2, [x3]"},
		{0x88e0ffe2, "casal w0, w2, [sp]"},
		{0x48207c82, "casp x0, x1, x2, x3, [x4]"},
		{0xa9bf7bfd, "stp x29, x30, [sp, #-16]!"},
		{0xf84107e0, "ldr x0, [sp], #16"},
		{0xf8637841, "ldr x1, [x2, x3, lsl #3]"},
		{0x910003fd, "mov x29, sp"},
		{0xd65f03c0, "ret"},
	} {
		got := debugger{}.Disassemble(insnBytes(c.x), 0xffff800008010000, 1, nil)
		if len(got) != 1 || got[0].Text != c.want || !got[0].Known {
			t.Errorf("%08x: %+v, want %q", c.x, got, c.want)
		}
	}
}

func TestDisassembleBranchesAndData(t *testing.T) {
	sym := func(a uint64) (string, uint64, bool) {
		if a >= 0xffff800008325200 && a < 0xffff800008325300 {
			return "__panic_unhandled", a - 0xffff800008325200, true
		}
		return "", 0, false
	}
	// From el1h_64_sync_handler: bl __panic_unhandled, b.eq forward, a
	// word no decoder knows, and half an instruction at the end.
	code := append(append(append(insnBytes(0x97ffff20), insnBytes(0x540004c0)...), insnBytes(0xffffffff)...), 0x1f, 0x20)
	got := debugger{}.Disassemble(code, 0xffff800008325580, 10, sym)
	want := []arch.Instruction{
		{Addr: 0xffff800008325580, Encoding: "97ffff20", Text: "bl 0xffff800008325200", Target: "__panic_unhandled", Known: true},
		{Addr: 0xffff800008325584, Encoding: "540004c0", Text: "b.eq 0xffff80000832561c", Known: true},
		{Addr: 0xffff800008325588, Encoding: "ffffffff", Text: ".word 0xffffffff"},
	}
	archtest.Instructions(t, got, want)
	if got := (debugger{}).Disassemble(insnBytes(0x97ffff20+0x10), 0xffff800008325580, 1, sym); got[0].Target != "__panic_unhandled+0x40" {
		t.Errorf("bl into a function: target %q, want __panic_unhandled+0x40", got[0].Target)
	}
	if got := (debugger{}).Disassemble(code, 0, 2, nil); len(got) != 2 {
		t.Errorf("count 2: %d instructions", len(got))
	}
}

func TestCall(t *testing.T) {
	for _, c := range []struct {
		x    uint32
		call bool
	}{
		{0x97ffff20, true},  // bl
		{0xd63f0200, true},  // blr x16
		{0xd73f0a11, true},  // blraa x16, x17
		{0xd63f087f, true},  // blraaz x3
		{0x17fffffb, false}, // b
		{0xd61f0200, false}, // br x16
		{0xd65f03c0, false}, // ret
		{0xa9bf7bfd, false}, // stp
	} {
		n, call := debugger{}.Call(insnBytes(c.x))
		if n != 4 || call != c.call {
			t.Errorf("%08x: Call = %d, %v; want 4, %v", c.x, n, call, c.call)
		}
		if got := (debugger{}).CallBefore(insnBytes(c.x)); got != c.call {
			t.Errorf("%08x: CallBefore = %v, want %v", c.x, got, c.call)
		}
	}
	if _, call := (debugger{}).Call([]byte{0x20, 0xff}); call {
		t.Error("Call of 2 bytes: a call")
	}
}

func TestAccess(t *testing.T) {
	for _, c := range []struct {
		x    uint32
		text string
		want arch.MemAccess
		ok   bool
	}{
		{0xa9bf7bfd, "stp x29, x30, [sp, #-16]!", arch.MemAccess{Len: 4, Size: 16, Base: "sp", Offset: -16, Store: true}, true},
		{0xa9b37bfd, "stp x29, x30, [sp, #-208]!", arch.MemAccess{Len: 4, Size: 16, Base: "sp", Offset: -208, Store: true}, true},
		{0xa90e77fc, "stp x28, x29, [sp, #224]", arch.MemAccess{Len: 4, Size: 16, Base: "sp", Offset: 224, Store: true}, true},
		{0xb9000041, "str w1, [x2]", arch.MemAccess{Len: 4, Size: 4, Base: "x2", Store: true}, true},
		{0xb906281f, "str wzr, [x0, #1576]", arch.MemAccess{Len: 4, Size: 4, Base: "x0", Offset: 1576, Store: true}, true},
		{0xf90067e7, "str x7, [sp, #200]", arch.MemAccess{Len: 4, Size: 8, Base: "sp", Offset: 200, Store: true}, true},
		{0xf81f0fe0, "str x0, [sp, #-16]!", arch.MemAccess{Len: 4, Size: 8, Base: "sp", Offset: -16, Store: true}, true},
		{0xf84107e0, "ldr x0, [sp], #16", arch.MemAccess{Len: 4, Size: 8, Base: "sp"}, true},
		{0x39413675, "ldrb w21, [x19, #77]", arch.MemAccess{Len: 4, Size: 1, Base: "x19", Offset: 77}, true},
		{0x79000c20, "strh w0, [x1, #6]", arch.MemAccess{Len: 4, Size: 2, Base: "x1", Offset: 6, Store: true}, true},
		{0xf81f83a0, "stur x0, [x29, #-8]", arch.MemAccess{Len: 4, Size: 8, Base: "x29", Offset: -8, Store: true}, true},
		{0x78001020, "sturh w0, [x1, #1]", arch.MemAccess{Len: 4, Size: 2, Base: "x1", Offset: 1, Store: true}, true},
		{0xb9800420, "ldrsw x0, [x1, #4]", arch.MemAccess{Len: 4, Size: 4, Base: "x1", Offset: 4}, true},
		{0x78802420, "ldrsh x0, [x1], #2", arch.MemAccess{Len: 4, Size: 2, Base: "x1"}, true},
		{0x3d800fe0, "str q0, [sp, #48]", arch.MemAccess{Len: 4, Size: 16, Base: "sp", Offset: 48, Store: true}, true},
		{0xadbf07e0, "stp q0, q1, [sp, #-32]!", arch.MemAccess{Len: 4, Size: 32, Base: "sp", Offset: -32, Store: true}, true},
		{0xfc1f8c21, "str d1, [x1, #-8]!", arch.MemAccess{Len: 4, Size: 8, Base: "x1", Offset: -8, Store: true}, true},
		{0xc89ffc20, "stlr x0, [x1]", arch.MemAccess{Len: 4, Size: 8, Base: "x1", Store: true}, true},
		{0x88dffc20, "ldar w0, [x1]", arch.MemAccess{Len: 4, Size: 4, Base: "x1"}, true},
		{0xc8027c20, "stxr w2, x0, [x1]", arch.MemAccess{Len: 4, Size: 8, Base: "x1", Store: true}, true},
		{0xc803fc20, "stlxr w3, x0, [x1]", arch.MemAccess{Len: 4, Size: 8, Base: "x1", Store: true}, true},
		{0xc85f7c20, "ldxr x0, [x1]", arch.MemAccess{Len: 4, Size: 8, Base: "x1"}, true},
		{0xb8e00041, "ldaddal w0, w1, [x2]", arch.MemAccess{Len: 4, Size: 4, Base: "x2", Store: true}, true},
		{0xf820005f, "stadd x0, [x2]", arch.MemAccess{Len: 4, Size: 8, Base: "x2", Store: true}, true},
		{0x38208062, "swpb w0, w2, [x3]", arch.MemAccess{Len: 4, Size: 1, Base: "x3", Store: true}, true},
		{0x88e0ffe2, "casal w0, w2, [sp]", arch.MemAccess{Len: 4, Size: 4, Base: "sp", Store: true}, true},
		{0x48207c82, "casp x0, x1, x2, x3, [x4]", arch.MemAccess{Len: 4, Size: 16, Base: "x4", Store: true}, true},
		{0x0864fd06, "caspal w4, w5, w6, w7, [x8]", arch.MemAccess{Len: 4, Size: 8, Base: "x8", Store: true}, true},
		{0xf8bfc020, "ldapr x0, [x1]", arch.MemAccess{Len: 4, Size: 8, Base: "x1"}, true},
		{0xf8fffc20, "ldrab x0, [x1, #-8]!", arch.MemAccess{Len: 4, Size: 8, Base: "x1", Offset: -8}, true},
		{0xf8236841, "str x1, [x2, x3]", arch.MemAccess{}, false},
		{0x58000800, "ldr x0, 0x100", arch.MemAccess{}, false},
		{0xf9800000, "prfm pldl1keep, [x0]", arch.MemAccess{}, false},
		{0x910003fd, "mov x29, sp", arch.MemAccess{}, false},
	} {
		if got := (debugger{}).Disassemble(insnBytes(c.x), 0, 1, nil)[0].Text; got != c.text {
			t.Errorf("%08x reads %q, want %q", c.x, got, c.text)
		}
		got, ok := debugger{}.Access(insnBytes(c.x))
		if ok != c.ok || ok && got != c.want {
			t.Errorf("%s: Access = %+v, %v; want %+v, %v", c.text, got, ok, c.want, c.ok)
		}
	}
}
