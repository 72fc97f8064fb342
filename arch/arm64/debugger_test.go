package arm64

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// machine is a stopped vCPU of regs and memory for verdicts.
type machine struct {
	regs archtest.Regs
	mem  archtest.Memory
}

func (m machine) ReadRegister(_ context.Context, name string) (uint64, error) {
	return m.regs.Get(name)
}
func (m machine) ReadMemory(context.Context, uint64, int) ([]byte, error) {
	return nil, errors.New("no memory")
}
func (m machine) Translate(_ context.Context, va uint64) (arch.Walk, error) {
	return debugger{}.Walk(va, m.regs.Get, m.mem.Read)
}

// Linux's: 48-bit VAs both halves, 4K granules, the MMU on.
const (
	tcr48   = 16 | 16<<16 | 2<<30
	sctlrOn = 1
)

// tables maps va with a leaf d at level leaf, below a table at root of
// level start.
func tables(m archtest.Memory, root, va uint64, start, leaf int, d uint64) {
	a := root
	for lvl := start; lvl <= leaf; lvl++ {
		pa := a + (va>>(12+9*(3-uint(lvl)))&0x1ff)*8
		if lvl == leaf {
			m[pa] = d
			return
		}
		next := root + uint64(lvl+1)*0x1000
		m[pa] = next | descValid | descTable
		a = next
	}
}

func TestWalk(t *testing.T) {
	const root = 0x40000000
	page := func(pa uint64, attrs uint64) uint64 { return pa | attrs | descValid | descTable | descAF }
	block := func(pa uint64, attrs uint64) uint64 { return pa | attrs | descValid | descAF }
	for _, tc := range []struct {
		name       string
		va         uint64
		leaf       int
		d          uint64
		pa, size   string
		flags      string
		fault      string
		levels     int
		tcr, ttbr0 uint64
	}{
		{name: "kernel 4K page", va: 0xffff8000083755ca, leaf: 3, d: page(0x40575000, apRO|descPXN|descUXN), pa: "0x405755ca", size: "4K", flags: "level-3 page AP=10 (EL1 read-only, EL0 none) AF PXN UXN", levels: 4},
		{name: "2M block", va: 0xffff800008212345, leaf: 2, d: block(0x40200000, 0), pa: "0x40212345", size: "2M", flags: "level-2 block AP=00", levels: 3},
		{name: "1G block", va: 0xffff800048212345, leaf: 1, d: block(0x40000000, apEL0), pa: "0x48212345", size: "1G", flags: "level-1 block AP=01", levels: 2},
		{name: "user page through TTBR0", va: 0x458c0c, leaf: 3, d: page(0x41234000, apEL0|descPXN), pa: "0x41234c0c", size: "4K", flags: "AP=01 (read-write) AF PXN", levels: 4},
		{name: "nothing mapped", va: 0x0, leaf: 2, d: 0, fault: "level 2 descriptor at 0x40002000: not valid (bit 0 clear)", levels: 3},
		{name: "block at level 0", va: 0xffff800008000000, leaf: 0, d: block(0, 0), fault: "a block at level 0", levels: 1},
		{name: "reserved level 3", va: 0xffff800008000000, leaf: 3, d: 0x40000000 | descValid, fault: "reserved", levels: 4},
		{name: "outside TTBR1's range", va: 0xfff0800000000000, fault: "outside TTBR1_EL1's 48-bit range"},
		{name: "39-bit VA starts at level 1", va: 0xffffffc008001234, leaf: 3, d: page(0x40001000, 0), pa: "0x40001234", size: "4K", levels: 3,
			tcr: 25 | 25<<16 | 2<<30},
		{name: "walks disabled", va: 0x1000, fault: "EPD0=1", tcr: tcr48 | 1<<7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := archtest.Memory{}
			tcr := uint64(tcr48)
			if tc.tcr != 0 {
				tcr = tc.tcr
			}
			if tc.levels > 0 {
				// A 39-bit walk starts at level 1.
				start := 0
				if tc.tcr != 0 {
					start = 4 - tc.levels
				}
				tables(m, root, tc.va, start, tc.leaf, tc.d)
			}
			r := archtest.Regs{"SCTLR_EL1": sctlrOn, "TCR_EL1": tcr, "TTBR0_EL1": root, "TTBR1_EL1": root | 1<<48}
			w, err := debugger{}.Walk(tc.va, r.Get, m.Read)
			if err != nil {
				t.Fatal(err)
			}
			if w.PA != tc.pa || w.PageSize != tc.size || !strings.Contains(w.Flags, tc.flags) ||
				(tc.fault == "") != (w.Fault == "") || !strings.Contains(w.Fault, tc.fault) || tc.levels != 0 && len(w.Levels) != tc.levels {
				t.Errorf("walk %#x: %+v\nwant pa %q size %q flags %q fault %q, %d levels", tc.va, w, tc.pa, tc.size, tc.flags, tc.fault, tc.levels)
			}
		})
	}
	off := archtest.Regs{"SCTLR_EL1": 0}
	if w, err := (debugger{}).Walk(0x40080000, off.Get, nil); err != nil || w.PA != "0x40080000" || w.Mode != "MMU off" {
		t.Errorf("MMU off: %+v, %v", w, err)
	}
	r := archtest.Regs{"SCTLR_EL1": sctlrOn, "TCR_EL1": tcr48 | 1<<14, "TTBR0_EL1": 0x40000000}
	if _, err := (debugger{}).Walk(0x1000, r.Get, archtest.Memory{}.Read); err == nil || !strings.Contains(err.Error(), "64K pages") {
		t.Errorf("64K granule: %v", err)
	}
}

func TestVerdicts(t *testing.T) {
	const root = 0x40000000
	ro := uint64(0x40558000 | apRO | descPXN | descUXN | descAF | descValid | descTable)
	m := machine{archtest.Regs{"SCTLR_EL1": sctlrOn, "TCR_EL1": tcr48, "TTBR0_EL1": root + 0x10000, "TTBR1_EL1": root}, archtest.Memory{}}
	tables(m.mem, root, 0xffff800008358f38, 0, 3, ro)
	el1 := uint64(0x3c5) // EL1h, DAIF masked
	for _, tc := range []struct {
		name string
		t    arch.Trap
		want []string
	}{
		{"WRITE_RO", arch.Trap{Code: 0x9600004f, PC: 0xffff800008322dec, Addr: 0xffff800008358f38, HasAddr: true, Status: el1},
			[]string{"data abort: permission fault at level 3, write to a read-only page at 0xffff800008358f38 from EL1 at 0xffff800008322dec", "the walk's leaf is a level-3 page AP=10"}},
		{"ACCESS_NULL", arch.Trap{Code: 0x96000006, PC: 0xffff800008322ce8, HasAddr: true, Status: el1},
			[]string{"data abort: translation fault at level 2, address 0x0 (a read from EL1 at 0xffff800008322ce8): a NULL pointer dereference", "level-0 descriptor at 0x40010000 is invalid"}},
		{"EL0 on a kernel page", arch.Trap{Code: 0x9200004f, Addr: 0xffff800008358f38, HasAddr: true},
			[]string{"data abort: permission fault at level 3, EL0 access to a kernel page (AP[1]=0) at 0xffff800008358f38 from EL0"}},
		{"execute never", arch.Trap{Code: 0x8600000f, Addr: 0xffff800008358f38, HasAddr: true, Status: el1},
			[]string{"instruction abort: permission fault at level 3, execute of a page EL1 may not execute (PXN)"}},
		{"BUG", arch.Trap{Code: 0xf2000800, PC: 0xffff800008001000}, []string{"a BRK #0x800 at 0xffff800008001000: in Linux a BUG() or WARN()"}},
		{"syscall", arch.Trap{Code: 0x56000000}, []string{"a system call (SVC), not a fault"}},
		{"IRQ", interrupt("IRQ"), []string{"an interrupt (IRQ), not a fault"}},
		{"lost syndrome", arch.Trap{Cause: "synchronous exception (lost)", Code: unknownSyndrome}, []string{"synchronous exception (lost)"}},
	} {
		v, _ := debugger{}.Verdict(context.Background(), m, tc.t)
		for _, w := range tc.want {
			if !strings.Contains(v, w) {
				t.Errorf("%s: verdict %q lacks %q", tc.name, v, w)
			}
		}
	}
	d := debugger{}
	for _, tc := range []struct {
		t     arch.Trap
		fault bool
	}{{decodeESR(0x9600004f), true}, {decodeESR(0x56000000), false}, {decodeESR(0x5a000000), false}, {interrupt("IRQ"), false},
		{arch.Trap{Code: unknownSyndrome}, false}, {decodeESR(0x02000000), true}} {
		if d.IsFault(tc.t) != tc.fault {
			t.Errorf("IsFault(%+v) = %v", tc.t, !tc.fault)
		}
	}
}

func TestTrapFrame(t *testing.T) {
	b := make([]byte, ptSize)
	put := func(off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put(29*8, 0xffff000000ea7900)
	put(30*8, 0xffff800008322ddc)
	put(ptSP, 0xffff000000ea78f0)
	put(ptPC, 0xffff800008322dec)
	put(ptPSTATE, 0x60000005)
	binary.LittleEndian.PutUint32(b[ptSyscallNo:], 0xffffffff)
	r := machine{regs: archtest.Regs{"ESR_EL1": 0x9600004f, "FAR_EL1": 0xffff800008358f38}}
	d := debugger{}
	tr, f, user := d.TrapFrame(context.Background(), r, "el1h_64_sync", b)
	if user || f.PC != 0xffff800008322dec || f.FP != 0xffff000000ea7900 || f.RA != 0xffff800008322ddc || f.SP != 0xffff000000ea78f0 ||
		tr.Code != 0x9600004f || tr.Addr != 0xffff800008358f38 || !tr.HasAddr || !strings.HasPrefix(tr.Cause, "data abort (ESR 0x9600004f)") {
		t.Errorf("el1h_64_sync frame: %+v %+v %v", tr, f, user)
	}
	// The same syndrome cannot be a frame from EL0's: lost.
	put(ptPSTATE, 0)
	if tr, _, user := d.TrapFrame(context.Background(), r, "el0t_64_sync", b); !user || tr.Code != unknownSyndrome || d.IsFault(tr) {
		t.Errorf("el0t_64_sync frame with an EL1 abort's syndrome: %+v %v", tr, user)
	}
	binary.LittleEndian.PutUint32(b[ptSyscallNo:], 64)
	if tr, _, _ := d.TrapFrame(context.Background(), r, "el0t_64_sync", b); tr.Cause != "system call (SVC) 64" || d.IsFault(tr) {
		t.Errorf("el0t_64_sync frame of write(2): %+v", tr)
	}
	if tr, _, _ := d.TrapFrame(context.Background(), r, "el1h_64_irq", b); !tr.Interrupt || tr.Cause != "IRQ" {
		t.Errorf("el1h_64_irq frame: %+v", tr)
	}
	if got := d.TrapFrameAt(arch.Frame{FP: 0xffff000000ea7a30}, 0); got != 0xffff000000ea7a30-ptStackFrame {
		t.Errorf("TrapFrameAt: %#x", got)
	}
	if !d.IsEntry("el0t_64_sync") || d.IsEntry("el1_abort") || !d.IsVector("vectors") || !d.IsFirst("__secondary_switched") {
		t.Error("entry, vector and first frame names")
	}
}

func TestPrivilegeAndPSTATE(t *testing.T) {
	d := debugger{}
	for cpsr, want := range map[uint64]arch.Privilege{
		0x0: {Name: "EL0", User: true}, 0x3c5: {Name: "EL1"}, 0x3c9: {Name: "EL2", Firmware: true}, 0x3cd: {Name: "EL3", Firmware: true},
		0x10: {Name: "AArch32 user", User: true},
	} {
		if got := d.Privilege(cpsr); got != want {
			t.Errorf("Privilege(%#x) = %+v, want %+v", cpsr, got, want)
		}
	}
	if got := decodePSTATE(0x600003c5 | 1<<22); got != "EL1h DAIF=DAIF masked PAN=1 NZCV=-ZC-" {
		t.Errorf("PSTATE: %q", got)
	}
	if got := decodeTranslation(func(n string) (uint64, bool) { v, ok := archtest.Regs{"SCTLR_EL1": 0}[n]; return v, ok }); !strings.HasPrefix(got, "MMU off") {
		t.Errorf("translation with the MMU off: %q", got)
	}
}
