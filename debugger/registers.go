package debugger

import (
	"bytes"
	"context"
	"strconv"

	"github.com/qemu-mcp/qemu-mcp/arch"
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

// gpr is the general register name in a 'g' read, under the name the
// stub may give it instead.
func (s *Session) gpr(regs map[string]uint64, name string) (uint64, bool) {
	v, ok := regs[name]
	if o := s.regs.Other[name]; !ok && o != "" {
		v, ok = regs[o]
	}
	return v, ok
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
	// Exception and FirmwareException, System and Translation are
	// SCause and MCause, CSRs and Satp on architectures other than
	// riscv64.
	Exception         *Trap  `json:"exception,omitempty"`
	FirmwareException *Trap  `json:"firmware_exception,omitempty"`
	System            Values `json:"system,omitempty"`
	Translation       string `json:"translation,omitempty"`
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

	// raw is the trap as the architecture decoded it, for its verdict.
	raw arch.Trap
}

// trap is t as shown; with epc, where it was taken symbolized.
func (s *Session) trap(t arch.Trap, epc bool) Trap {
	tr := Trap{Cause: t.Cause, Interrupt: t.Interrupt, Code: t.Code, raw: t}
	if epc && t.HasPC {
		w := s.Where(t.PC)
		tr.EPC = &w
	}
	if t.HasAddr {
		tr.TVal = hex(t.Addr)
	}
	return tr
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
	pc := all[s.regs.PC]
	r.PC, _ = s.at(all)
	for _, n := range s.regs.General {
		if v, ok := s.gpr(all, n); ok {
			r.GPRs = append(r.GPRs, Value{n, v})
		}
	}
	priv, privErr := th.ReadRegister(ctx, s.regs.Priv)
	if privErr == nil {
		r.Priv = s.d.Privilege(priv).Name
	}
	for _, n := range s.regs.Trap {
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
	v := s.d.View(func(name string) (uint64, bool) {
		if name == s.regs.Priv {
			return priv, privErr == nil
		}
		return r.CSRs.Get(name)
	}, pc, r.PC.Function)
	show := func(t *arch.Trap) *Trap {
		if t == nil {
			return nil
		}
		tr := s.trap(*t, true)
		return &tr
	}
	r.SCause, r.MCause = show(v.Kernel), show(v.Firmware)
	r.Status, r.Satp = v.Status, v.Translation
	if v.Taking != nil {
		r.Verdict, _ = s.explain(ctx, th, *v.Taking)
	}
	if !s.regs.CSRNames {
		r.Exception, r.FirmwareException, r.System, r.Translation = r.SCause, r.MCause, r.CSRs, r.Satp
		r.SCause, r.MCause, r.CSRs, r.Satp = nil, nil, nil, ""
	}
	return r, nil
}
