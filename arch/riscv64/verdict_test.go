package riscv64

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// Every trap cause gets a sentence that says why; page faults are judged
// from the walk of the faulting address and the status at the trap.
func TestVerdict(t *testing.T) {
	const (
		spp = 1 << 8  // trapped from S-mode
		sum = 1 << 18 // S-mode may touch user pages
		mxr = 1 << 19
	)
	okWalk := func(flags uint64) *arch.Walk {
		return &arch.Walk{Mode: "Sv39", PA: "0x80a43000", Flags: pteFlags(flags), Leaf: flags}
	}
	for _, tc := range []struct {
		name string
		f    fault
		want string
	}{
		{"misaligned fetch", fault{trap: DecodeCause(0), tval: 0x80200001}, "instruction address misaligned: a jump or branch to 0x80200001"},
		{"fetch access", fault{trap: DecodeCause(1), tval: 0x1000, walk: &arch.Walk{Mode: "Bare", PA: "0x1000"}}, "instruction access fault at 0x1000: no memory or device there"},
		{"illegal unknown", fault{trap: DecodeCause(2), epc: 0x80200000, insn: ".word 0x0"}, "does not implement"},
		{"illegal fp with FS off", fault{trap: DecodeCause(2), epc: 0x80200000, insn: "fld fa0,0(a0)", bits: 0x2107}, "uses the FPU while sstatus.FS is off"},
		{"illegal fp with FS on", fault{trap: DecodeCause(2), epc: 0x80200000, insn: "fld fa0,0(a0)", status: 1 << 13}, "is not allowed in U-mode"},
		{"illegal csr", fault{trap: DecodeCause(2), epc: 0x80200000, insn: "csrr a0,mstatus", status: spp}, "accesses a CSR that does not exist or that S-mode may not use"},
		{"illegal mret", fault{trap: DecodeCause(2), epc: 0x80200000, insn: "mret", status: spp}, "privileged beyond S-mode"},
		{"ebreak", fault{trap: DecodeCause(3), epc: 0xffffffff80001234}, "a breakpoint (ebreak) at 0xffffffff80001234: in Linux a BUG() or WARN()"},
		{"misaligned load", fault{trap: DecodeCause(4), tval: 0x1003}, "misaligned load at 0x1003"},
		{"load access", fault{trap: DecodeCause(5), tval: 0xffffffd800000000, walk: &arch.Walk{Mode: "Sv39", PA: "0x4000000000"}}, "load access fault at 0xffffffd800000000 (physical 0x4000000000): no memory or device there"},
		{"misaligned store", fault{trap: DecodeCause(6), tval: 0x1001}, "misaligned store at 0x1001"},
		{"store access", fault{trap: DecodeCause(7), tval: 0x0}, "store access fault at 0x0"},
		{"syscall", fault{trap: DecodeCause(8)}, "a system call (ecall from U-mode), not a fault"},
		{"sbi call", fault{trap: DecodeCause(9)}, "an SBI call"},
		{"m ecall", fault{trap: DecodeCause(11)}, "an ecall from M-mode"},
		{"interrupt", fault{trap: DecodeCause(1<<63 | 5)}, "an interrupt (supervisor timer interrupt), not a fault"},
		{"no mapping", fault{trap: DecodeCause(13), tval: 0, status: spp, walk: &arch.Walk{Mode: "Sv57", Faulty: true, Fault: "level 0 PTE at 0x81388000: not valid (V=0): nothing is mapped there",
			Levels: []arch.Level{{Level: 4}, {Level: 0, PTEAddr: "0x81388000"}}}}, "load page fault at 0x0 from S-mode: no mapping (the level-0 PTE at 0x81388000 is not valid)"},
		{"malformed table", fault{trap: DecodeCause(15), status: spp, walk: &arch.Walk{Faulty: true, Fault: "level 1 PTE at 0x1000: reserved combination W=1 R=0"}}, "the page table is malformed: level 1 PTE"},
		{"read-only", fault{trap: DecodeCause(15), tval: 0xffffffff80a002a0, status: spp, walk: okWalk(pteV | pteR | pteA | pteD | pteG)}, "store page fault at 0xffffffff80a002a0 from S-mode: the page is not writable (W=0)"},
		{"not executable", fault{trap: DecodeCause(12), status: spp, walk: okWalk(pteV | pteR | pteW | pteA | pteD)}, "instruction page fault at 0x0 from S-mode: the page is not executable (X=0)"},
		{"execute-only load", fault{trap: DecodeCause(13), status: spp, walk: okWalk(pteV | pteX | pteA)}, "the page is not readable (R=0)"},
		{"execute-only load with MXR", fault{trap: DecodeCause(13), status: spp | mxr, walk: okWalk(pteV | pteX | pteA)}, "the page table now allows it"},
		{"user page from S without SUM", fault{trap: DecodeCause(13), status: spp, walk: okWalk(pteV | pteR | pteW | pteU | pteA | pteD)}, "a user page (U=1) touched from S-mode with sstatus.SUM clear"},
		{"user page from S with SUM", fault{trap: DecodeCause(13), status: spp | sum, walk: okWalk(pteV | pteR | pteU)}, "the accessed bit is clear (A=0)"},
		{"user page executed from S", fault{trap: DecodeCause(12), status: spp | sum, walk: okWalk(pteV | pteR | pteX | pteU | pteA)}, "S-mode may never execute a user page (U=1)"},
		{"supervisor page from U", fault{trap: DecodeCause(13), walk: okWalk(pteV | pteR | pteA)}, "from U-mode: a user access to a supervisor page (U=0)"},
		{"dirty clear", fault{trap: DecodeCause(15), walk: okWalk(pteV | pteR | pteW | pteU | pteA)}, "the dirty bit is clear (D=0)"},
		{"spurious", fault{trap: DecodeCause(15), walk: okWalk(pteV | pteR | pteW | pteU | pteA | pteD)}, "the mapping changed since the fault, or a TLB was stale"},
		{"translation off now", fault{trap: DecodeCause(13), walk: &arch.Walk{Mode: "Bare", PA: "0x0"}}, "translation is off (satp Bare) now"},
		{"software check", fault{trap: DecodeCause(18)}, "software check"},

		// Traps taken into M-mode: mstatus.MPP says where from, and an
		// access M-mode made went to a physical address.
		{"M-mode store access", fault{trap: DecodeCause(7), tval: 0, machine: true, status: 3 << 11},
			"store access fault at 0x0 from M-mode (a physical address: M-mode does not translate): no memory or device there"},
		{"M-mode load access", fault{trap: DecodeCause(5), tval: 0x1000, machine: true, status: 3 << 11}, "load access fault at 0x1000 from M-mode (a physical address"},
		{"M-mode fetch access", fault{trap: DecodeCause(1), tval: 0x0, machine: true, status: 3 << 11}, "instruction access fault at 0x0 from M-mode (a physical address"},
		{"S-mode access into M-mode", fault{trap: DecodeCause(5), tval: 0xc0000000, machine: true, status: 1 << 11, walk: &arch.Walk{Mode: "Bare", PA: "0xc0000000"}},
			"load access fault at 0xc0000000: no memory or device there, or PMP forbids"},
		{"M-mode page fault from S", fault{trap: DecodeCause(13), machine: true, status: 1 << 11, walk: &arch.Walk{Mode: "Sv39", Faulty: true, Fault: "level 2 PTE at 0x80400000: not valid (V=0)",
			Levels: []arch.Level{{Level: 2, PTEAddr: "0x80400000"}}}}, "load page fault at 0x0 from S-mode: no mapping"},
		{"M-mode page fault from U", fault{trap: DecodeCause(13), machine: true, status: 0, walk: okWalk(pteV | pteR | pteA)}, "from U-mode: a user access to a supervisor page"},
		{"M-mode illegal csr", fault{trap: DecodeCause(2), epc: 0x80000000, insn: "csrr a0,0x7c0", machine: true, status: 3 << 11}, "accesses a CSR that does not exist or that M-mode may not use"},
		{"M-mode fp with FS off", fault{trap: DecodeCause(2), epc: 0x80000000, insn: "fld fa0,0(a0)", machine: true, status: 3 << 11}, "uses the FPU while mstatus.FS is off"},
	} {
		if got := verdict(tc.f); !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q does not say %q", tc.name, got, tc.want)
		}
	}
}

func TestMemAccess(t *testing.T) {
	for _, tc := range []struct {
		code string
		want mem
	}{
		{"23a0f600", mem{n: 4, base: 13, size: 4, imm: 0, store: true}}, // sw a5,0(a3)
		{"83b58500", mem{n: 4, base: 11, size: 8, imm: 8}},              // ld a1,8(a1)
		{"0325c4ff", mem{n: 4, base: 8, size: 4, imm: -4}},              // lw a0,-4(s0)
		{"1cc2", mem{n: 2, base: 12, size: 4, imm: 0, store: true}},     // c.sw a5,0(a2)
		{"1c60", mem{n: 2, base: 8, size: 8, imm: 0}},                   // c.ld a5,0(s0)
		{"22e4", mem{n: 2, base: 2, size: 8, imm: 8, store: true}},      // c.sdsp s0,8(sp)
		{"a260", mem{n: 2, base: 2, size: 8, imm: 8}},                   // c.ldsp ra,8(sp)
		{"af27b500", mem{n: 4, base: 10, size: 4, store: true}},         // amoadd.w a5,a1,(a0)
	} {
		got, ok := memAccess(archtest.Code(t, tc.code))
		if !ok || got != tc.want {
			t.Errorf("memAccess(%s) = %+v, %v; want %+v", tc.code, got, ok, tc.want)
		}
	}
	if _, ok := memAccess(archtest.Code(t, "0a05")); ok { // c.addi
		t.Errorf("c.addi decoded as a memory access")
	}
}
