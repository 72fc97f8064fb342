package debugger

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Values are named register values in a fixed order; they marshal as one
// JSON object whose keys keep that order (x1..x31 read best in order).
type Values []Value

// Value is one named register value.
type Value struct {
	Name  string
	Value uint64
}

// MarshalJSON writes {"ra":"0x...","sp":"0x...",...} in order.
func (v Values) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, r := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(r.Name))
		b.WriteByte(':')
		b.WriteString(strconv.Quote(hex(r.Value)))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Get returns the value named name.
func (v Values) Get(name string) (uint64, bool) {
	for _, r := range v {
		if r.Name == name {
			return r.Value, true
		}
	}
	return 0, false
}

// abiNames are x1..x31 by ABI name; the stub calls x8 "fp".
var abiNames = []string{
	"ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1",
	"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7",
	"s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
	"t3", "t4", "t5", "t6",
}

// gpr is the register named by its ABI name in a 'g' read, where the stub
// calls s0 "fp".
func gpr(regs map[string]uint64, name string) (uint64, bool) {
	v, ok := regs[name]
	if !ok && name == "s0" {
		v, ok = regs["fp"]
	}
	return v, ok
}

// TrapCSRs are the CSRs Registers reads: the ones worth showing when asking "why did it trap":
// supervisor first (where a kernel runs), then machine (firmware).
var TrapCSRs = []string{
	"sstatus", "sepc", "scause", "stval", "satp", "stvec", "sie", "sip", "sscratch",
	"mstatus", "mepc", "mcause", "mtval", "mtvec", "medeleg", "mideleg", "mie", "mip",
}

// Registers is the hart's state as an agent reads it.
type Registers struct {
	// Hart is the hart read (its mhartid).
	Hart int   `json:"hart"`
	PC   Where `json:"pc"`
	// Priv is the privilege mode the hart is in: user, supervisor or
	// machine.
	Priv string `json:"priv,omitempty"`
	GPRs Values `json:"gprs"`
	CSRs Values `json:"csrs,omitempty"`
	// SCause and MCause decode the last trap taken into supervisor and
	// machine mode (not necessarily the one that matters now).
	SCause *Trap `json:"scause,omitempty"`
	MCause *Trap `json:"mcause,omitempty"`
	// Status decodes sstatus/mstatus fields; Satp the translation mode.
	Status string `json:"status,omitempty"`
	Satp   string `json:"satp,omitempty"`
	// Unavailable lists CSRs the stub does not expose on this QEMU.
	Unavailable []string `json:"unavailable,omitempty"`
	// Verdict explains the trap the hart is taking, when it is stopped
	// in the trap vector.
	Verdict string `json:"verdict,omitempty"`
}

// Trap is a decoded trap: cause, faulting pc and trap value.
type Trap struct {
	Cause     string `json:"cause"`
	Interrupt bool   `json:"interrupt,omitempty"`
	Code      uint64 `json:"code"`
	// EPC is where the trap was taken (sepc/mepc).
	EPC *Where `json:"epc,omitempty"`
	// TVal is stval/mtval: the faulting address for access and page
	// faults, the instruction bits for an illegal instruction.
	TVal string `json:"tval,omitempty"`

	// The trap's raw state, for its verdict: where it was taken, the
	// trap value and the status (SPP, SUM, MXR, FS) it was taken with,
	// and whether it was taken into M-mode (the status is mstatus).
	epc, tval, status uint64
	machine           bool
}

// fault returns what a verdict needs of t.
func (t Trap) fault() fault {
	return fault{trap: t, epc: t.epc, tval: t.tval, status: t.status, machine: t.machine}
}

var exceptionNames = map[uint64]string{
	0: "instruction address misaligned", 1: "instruction access fault",
	2: "illegal instruction", 3: "breakpoint",
	4: "load address misaligned", 5: "load access fault",
	6: "store/AMO address misaligned", 7: "store/AMO access fault",
	8: "environment call from U-mode", 9: "environment call from S-mode",
	10: "environment call from VS-mode", 11: "environment call from M-mode",
	12: "instruction page fault", 13: "load page fault", 15: "store/AMO page fault",
	18: "software check", 19: "hardware error",
	20: "instruction guest-page fault", 21: "load guest-page fault",
	22: "virtual instruction", 23: "store/AMO guest-page fault",
}

var interruptNames = map[uint64]string{
	1: "supervisor software interrupt", 3: "machine software interrupt",
	5: "supervisor timer interrupt", 7: "machine timer interrupt",
	9: "supervisor external interrupt", 11: "machine external interrupt",
	13: "counter overflow interrupt",
}

// DecodeCause decodes an xcause value.
func DecodeCause(v uint64) Trap {
	t := Trap{Interrupt: v>>63 == 1, Code: v &^ (1 << 63)}
	names := exceptionNames
	if t.Interrupt {
		names = interruptNames
	}
	t.Cause = names[t.Code]
	if t.Cause == "" {
		kind := "exception"
		if t.Interrupt {
			kind = "interrupt"
		}
		t.Cause = fmt.Sprintf("reserved %s %d", kind, t.Code)
	}
	return t
}

func privName(p uint64) string {
	switch p {
	case 0:
		return "user"
	case 1:
		return "supervisor"
	case 3:
		return "machine"
	}
	return fmt.Sprintf("unknown (%d)", p)
}

// decodeStatus names the mstatus/sstatus fields a kernel developer checks:
// the previous privilege (where a trap came from), interrupt enables, and
// SUM/MXR (may supervisor touch user pages).
func decodeStatus(v uint64, machine bool) string {
	bit := func(n uint) uint64 { return v >> n & 1 }
	var f []string
	spp := "U"
	if bit(8) == 1 {
		spp = "S"
	}
	f = append(f, "SPP="+spp, fmt.Sprintf("SIE=%d", bit(1)), fmt.Sprintf("SPIE=%d", bit(5)),
		fmt.Sprintf("SUM=%d", bit(18)), fmt.Sprintf("MXR=%d", bit(19)))
	if machine {
		mpp := map[uint64]string{0: "U", 1: "S", 3: "M"}[v>>11&3]
		f = append(f, "MPP="+mpp, fmt.Sprintf("MIE=%d", bit(3)), fmt.Sprintf("MPRV=%d", bit(17)))
	}
	if fs := v >> 13 & 3; fs != 0 {
		f = append(f, "FS="+[]string{"off", "initial", "clean", "dirty"}[fs])
	}
	return strings.Join(f, " ")
}

// decodeSatp says the translation mode, ASID and root page table.
func decodeSatp(v uint64) string {
	mode := map[uint64]string{0: "Bare", 8: "Sv39", 9: "Sv48", 10: "Sv57"}[v>>60]
	if mode == "" {
		mode = fmt.Sprintf("mode %d", v>>60)
	}
	if v>>60 == 0 {
		return "Bare (no translation)"
	}
	return fmt.Sprintf("%s asid=%d root=%s", mode, v>>44&0xffff, hex((v&(1<<44-1))<<12))
}

// Registers reads pc, x1..x31, the privilege mode and the trap CSRs of
// hart (LastHart: the hart of the last stop).
func (s *Session) Registers(ctx context.Context, hart int) (Registers, error) {
	var r Registers
	on, err := s.onHart(ctx, hart, func(th *gdb.Thread) (err error) {
		r, err = s.readRegisters(ctx, th)
		return err
	})
	r.Hart = on
	return r, err
}

func (s *Session) readRegisters(ctx context.Context, th *gdb.Thread) (Registers, error) {
	all, err := th.ReadRegisters(ctx)
	if err != nil {
		return Registers{}, err
	}
	var r Registers
	r.PC = s.Where(all["pc"])
	for _, n := range abiNames {
		if v, ok := gpr(all, n); ok {
			r.GPRs = append(r.GPRs, Value{n, v})
		}
	}
	if p, err := th.ReadRegister(ctx, "priv"); err == nil {
		r.Priv = privName(p)
	}
	for _, n := range TrapCSRs {
		if _, ok := th.Register(n); !ok {
			r.Unavailable = append(r.Unavailable, n)
			continue
		}
		v, err := th.ReadRegister(ctx, n)
		if err != nil {
			r.Unavailable = append(r.Unavailable, n)
			continue
		}
		r.CSRs = append(r.CSRs, Value{n, v})
	}
	trap := func(cause, epc, tval string) *Trap {
		cv, ok := r.CSRs.Get(cause)
		if !ok {
			return nil
		}
		t := DecodeCause(cv)
		if e, ok := r.CSRs.Get(epc); ok {
			w := s.Where(e)
			t.EPC = &w
		}
		if v, ok := r.CSRs.Get(tval); ok {
			t.TVal = hex(v)
		}
		return &t
	}
	r.SCause = trap("scause", "sepc", "stval")
	r.MCause = trap("mcause", "mepc", "mtval")
	if v, ok := r.CSRs.Get("mstatus"); ok {
		r.Status = decodeStatus(v, true)
	} else if v, ok := r.CSRs.Get("sstatus"); ok {
		r.Status = decodeStatus(v, false)
	}
	if v, ok := r.CSRs.Get("satp"); ok {
		r.Satp = decodeSatp(v)
	}
	stvec, _ := r.CSRs.Get("stvec")
	mtvec, hasMtvec := r.CSRs.Get("mtvec")
	switch {
	case r.SCause != nil && (isVector(r.PC.Function) || all["pc"] == stvec&^3):
		t := *r.SCause
		t.epc, _ = r.CSRs.Get("sepc")
		t.tval, _ = r.CSRs.Get("stval")
		t.status, _ = r.CSRs.Get("sstatus")
		r.Verdict, _ = s.explain(ctx, th, t.fault())
	case r.MCause != nil && r.Priv == "machine" && hasMtvec && all["pc"] == mtvec&^3:
		// At the M-mode trap vector's first instruction: a kernel that
		// runs in M-mode taking a trap (firmware's traps included).
		t := *r.MCause
		t.epc, _ = r.CSRs.Get("mepc")
		t.tval, _ = r.CSRs.Get("mtval")
		t.status, _ = r.CSRs.Get("mstatus")
		t.machine = true
		r.Verdict, _ = s.explain(ctx, th, t.fault())
	}
	return r, nil
}
