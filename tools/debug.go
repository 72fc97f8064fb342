package tools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/debugger"
	"github.com/qemu-mcp/qemu-mcp/instance"
)

// debugTimeout bounds a debugger operation other than debug_continue's
// wait: the stub answers in microseconds, so this only ends a hung one.
const debugTimeout = 10 * time.Second

// debugger returns the guest's debugger, or an error that says how to get
// one.
func (s *Server) debugger(t Target) (*instance.Instance, *debugger.Session, error) {
	inst, _, err := s.running(t)
	if err != nil {
		return nil, nil, err
	}
	d := inst.Debugger()
	if d == nil {
		return nil, nil, fmt.Errorf("guest %q was booted without its debugger: boot it again with gdb: true (and restart: true), adding symbols: the kernel's ELF (vmlinux) to break and unwind by name", inst.Name())
	}
	return inst, d, nil
}

// debuggerOn is the debugger of t's guest and the hart h names: what a
// per-hart tool checks first, in that order.
func (s *Server) debuggerOn(t Target, h HartArg) (*debugger.Session, int, error) {
	_, d, err := s.debugger(t)
	if err != nil {
		return nil, 0, err
	}
	hart, err := h.hart()
	return d, hart, err
}

// HartArg picks the hart a per-hart tool acts on.
type HartArg struct {
	Hart *int `json:"hart,omitempty" jsonschema:"hart ID; default: the last stop's"`
}

// hart is the hart asked for, or debugger.LastHart.
func (h HartArg) hart() (int, error) {
	switch {
	case h.Hart == nil:
		return debugger.LastHart, nil
	case *h.Hart < 0:
		return 0, fmt.Errorf("hart %d: want a hart ID (0 for the first hart)", *h.Hart)
	}
	return *h.Hart, nil
}

// onHart names the hart a result is about, and Linux's CPU number for it
// when that differs.
func onHart(hart, processor *int) string {
	if hart == nil {
		return ""
	}
	t := fmt.Sprintf(" on hart %d", *hart)
	if processor != nil && *processor != *hart {
		t += fmt.Sprintf(" (cpu %d)", *processor)
	}
	return t
}

// BreakInput is debug_break's arguments.
type BreakInput struct {
	Location string `json:"location" max:"512" jsonschema:"symbol, symbol+0xOFFSET, 0xADDRESS or file.c:LINE"`
	Remove   bool   `json:"remove,omitempty" jsonschema:"remove the breakpoint at location instead"`
	Hardware bool   `json:"hardware,omitempty" jsonschema:"a hardware breakpoint (for code not yet in memory or read-only)"`
	Target
}

// BreakOutput is debug_break's result.
type BreakOutput struct {
	Changed []debugger.Breakpoint `json:"breakpoints" jsonschema:"the breakpoints set (or removed): address, function, offset, file, line"`
	// All is every breakpoint now set, when there are others.
	Set int `json:"set" jsonschema:"breakpoints and watchpoints set now, in all"`
}

func (s *Server) debugBreak(ctx context.Context, _ *mcp.CallToolRequest, in BreakInput) (*mcp.CallToolResult, BreakOutput, error) {
	_, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, BreakOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	bs, err := d.Break(ctx, in.Location, in.Hardware, in.Remove)
	if err != nil {
		return nil, BreakOutput{}, err
	}
	out := BreakOutput{Changed: bs, Set: len(d.Breakpoints())}
	verb := "set"
	if in.Remove {
		verb = "removed"
	}
	var at []string
	for _, b := range bs {
		at = append(at, b.Where.String()+" "+b.Addr)
	}
	return textResult(fmt.Sprintf("breakpoint %s at %s; %d set", verb, strings.Join(at, ", "), out.Set)), out, nil
}

// ContinueInput is debug_continue's arguments.
type ContinueInput struct {
	Timeout float64 `json:"timeout,omitempty" default:"10" jsonschema:"seconds to wait for the next stop; the guest keeps running past it"`
	Reverse bool    `json:"reverse,omitempty" jsonschema:"replay: back to the previous hit (or the start)"`
	ICount  *uint64 `json:"icount,omitempty" jsonschema:"replay: go to this instruction count"`
	Target
}

func stopText(st debugger.StopInfo) string {
	t := stopWhat(st)
	if st.ICount != nil {
		t += fmt.Sprintf(" [icount %d]", *st.ICount)
	}
	if st.Note != "" {
		t += "; " + st.Note
	}
	return t
}

func stopWhat(st debugger.StopInfo) string {
	switch {
	case st.Exited:
		return "QEMU exited"
	case st.Running:
		return "still running (no stop within the timeout)"
	}
	if a := st.Access; a != nil {
		t := fmt.Sprintf("%s watchpoint on %s: %q at %s", a.Kind, a.Data, a.Text, a.Insn.String())
		if a.Old != a.New {
			t += fmt.Sprintf(" changed it %s -> %s", a.Old, a.New)
		} else {
			t += " (value " + a.New + ")"
		}
		return t + onHart(st.Hart, st.Processor) + "; stopped at " + st.Where().String()
	}
	t := fmt.Sprintf("stopped (%s)%s at %s", st.Reason, onHart(st.Hart, st.Processor), st.Where().String())
	if st.Insn != "" {
		t += ": " + st.Insn
	}
	if st.Incomplete != "" {
		t += "; " + st.Incomplete
	}
	return t
}

func (s *Server) debugContinue(ctx context.Context, req *mcp.CallToolRequest, in ContinueInput) (*mcp.CallToolResult, debugger.StopInfo, error) {
	inst, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	timeout, err := seconds("timeout", in.Timeout, 10*time.Second)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	// A stop of the guest ends the wait at once.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(inst.Context(), cancel)()
	ctx = s.debugProgress(ctx, req)
	var st debugger.StopInfo
	switch {
	case in.Reverse && in.ICount != nil:
		return nil, debugger.StopInfo{}, errors.New("reverse and icount: give one (icount goes to a count, back or forward)")
	case in.Reverse:
		st, err = d.ReverseContinue(ctx)
	case in.ICount != nil:
		st, err = d.GoTo(ctx, *in.ICount)
	default:
		st, err = d.Continue(ctx, timeout)
	}
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	adviseStop(&st)
	return textResult(stopText(st)), st, nil
}

func (s *Server) debugPause(ctx context.Context, _ *mcp.CallToolRequest, in Target) (*mcp.CallToolResult, debugger.StopInfo, error) {
	_, d, err := s.debugger(in)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	st, err := d.Pause(ctx)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	return textResult(stopText(st)), st, nil
}

// StepInput is debug_step's arguments.
type StepInput struct {
	Count   int     `json:"count,omitempty" default:"1" jsonschema:"instructions to execute (1 to 10000)"`
	Over    bool    `json:"over,omitempty" jsonschema:"step over calls: a call and all it does counts as one"`
	Reverse bool    `json:"reverse,omitempty" jsonschema:"replay: back count instructions"`
	Timeout float64 `json:"timeout,omitempty" default:"5" jsonschema:"seconds before an unfinished step is stopped"`
	HartArg
	Target
}

func (s *Server) debugStep(ctx context.Context, req *mcp.CallToolRequest, in StepInput) (*mcp.CallToolResult, debugger.StopInfo, error) {
	d, hart, err := s.debuggerOn(in.Target, in.HartArg)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	if in.Count == 0 {
		in.Count = 1
	}
	timeout, err := seconds("timeout", in.Timeout, 5*time.Second)
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	if in.Reverse {
		if in.Over || in.Hart != nil {
			return nil, debugger.StopInfo{}, errors.New("reverse goes back count instructions of the replay: over and hart do not go with it")
		}
		st, err := d.ReverseStep(s.debugProgress(ctx, req), in.Count)
		if err != nil {
			return nil, debugger.StopInfo{}, err
		}
		return textResult(stopText(st)), st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+debugTimeout)
	defer cancel()
	st, err := d.Step(ctx, hart, in.Count, in.Over, timeout)
	if st.Incomplete != "" {
		st.Incomplete += "; debug_continue resumes every hart"
	}
	if err != nil {
		return nil, debugger.StopInfo{}, err
	}
	return textResult(stopText(st)), st, nil
}

// RegistersInput is debug_registers' arguments.
type RegistersInput struct {
	HartArg
	Target
}

func (s *Server) debugRegisters(ctx context.Context, _ *mcp.CallToolRequest, in RegistersInput) (*mcp.CallToolResult, debugger.Registers, error) {
	d, hart, err := s.debuggerOn(in.Target, in.HartArg)
	if err != nil {
		return nil, debugger.Registers{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	r, err := d.Registers(ctx, hart)
	if err != nil {
		return nil, debugger.Registers{}, err
	}
	t := fmt.Sprintf("hart %d: pc %s in %s mode", r.Hart, r.PC.String(), r.Priv)
	if r.SCause != nil {
		t += "; last trap into S-mode: " + r.SCause.Cause
	}
	if r.Exception != nil {
		t += "; last exception into the kernel: " + r.Exception.Cause
	}
	return textResult(t), r, nil
}

// MemoryInput is debug_memory's arguments.
type MemoryInput struct {
	Location string `json:"location" max:"512" jsonschema:"0xADDRESS, symbol or symbol+0xOFFSET"`
	Length   int    `json:"length,omitempty" default:"256" jsonschema:"bytes to read, up to 65536"`
	Physical bool   `json:"physical,omitempty" jsonschema:"location is a guest physical address (default: virtual)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"most hexdump characters (default 16384, at most 32768); next says where to read on"`
	HartArg
	Target
}

// MemoryOutput is debug_memory's result.
type MemoryOutput struct {
	Hart       *int     `json:"hart,omitempty" jsonschema:"the hart whose MMU translated a virtual address"`
	Addr       string   `json:"addr" jsonschema:"the first address read"`
	Symbol     string   `json:"symbol,omitempty" jsonschema:"what the symbols say of addr"`
	Length     int      `json:"length"`
	Hexdump    string   `json:"hexdump" jsonschema:"address, 16 bytes in hex, ASCII; ?? for bytes that could not be read; * for repeated lines"`
	Unreadable []string `json:"unreadable,omitempty" jsonschema:"ranges that could not be read (nothing mapped there)"`
	Next       string   `json:"next,omitempty" jsonschema:"the hexdump stops before here (max_bytes): ask again from this address"`
}

func (s *Server) debugMemory(ctx context.Context, req *mcp.CallToolRequest, in MemoryInput) (*mcp.CallToolResult, MemoryOutput, error) {
	_, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, MemoryOutput{}, err
	}
	if in.Length == 0 {
		in.Length = 256
	}
	limit, err := checkMaxBytes(in.MaxBytes, defaultMaxBytes, s.budget(req).Page)
	if err != nil {
		return nil, MemoryOutput{}, err
	}
	hart, err := in.hart()
	if err != nil {
		return nil, MemoryOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	m, err := d.Memory(ctx, hart, in.Location, in.Length, in.Physical)
	if err != nil {
		return nil, MemoryOutput{}, err
	}
	out := MemoryOutput{Addr: fmt.Sprintf("0x%x", m.Addr), Length: len(m.Data)}
	if !in.Physical {
		out.Hart = &m.Hart
	}
	if m.Where.Function != "" {
		out.Symbol = m.Where.String()
	}
	var next int
	out.Hexdump, next = m.Hexdump(0, limit)
	if next < len(m.Data) {
		out.Next = fmt.Sprintf("0x%x", m.Addr+uint64(next))
	}
	for _, r := range m.Unreadable {
		out.Unreadable = append(out.Unreadable, r.String())
	}
	t := fmt.Sprintf("%d bytes at %s%s", out.Length, out.Addr, onHart(out.Hart, nil))
	if len(out.Unreadable) > 0 {
		t += fmt.Sprintf("; unreadable: %s", strings.Join(out.Unreadable, ", "))
	}
	if out.Next != "" {
		t += "; hexdump cut at max_bytes, read on from " + out.Next
	}
	return textResult(t), out, nil
}

// BacktraceInput is debug_backtrace's arguments.
type BacktraceInput struct {
	MaxFrames int  `json:"max_frames,omitempty" default:"32" jsonschema:"most frames to unwind (1 to 256)"`
	AllHarts  bool `json:"all_harts,omitempty" jsonschema:"every hart at a glance instead"`
	HartArg
	Target
}

// BacktraceOutput is debug_backtrace's result: one hart's frames, or
// with all_harts every hart's state.
type BacktraceOutput struct {
	Hart *int `json:"hart,omitempty"`
	*debugger.Backtrace
	Harts []debugger.HartState `json:"harts,omitempty"`
}

func (s *Server) debugBacktrace(ctx context.Context, _ *mcp.CallToolRequest, in BacktraceInput) (*mcp.CallToolResult, BacktraceOutput, error) {
	d, hart, err := s.debuggerOn(in.Target, in.HartArg)
	if err != nil {
		return nil, BacktraceOutput{}, err
	}
	if in.MaxFrames == 0 {
		in.MaxFrames = 32
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	if in.AllHarts {
		if in.Hart != nil {
			return nil, BacktraceOutput{}, fmt.Errorf("all_harts shows every hart: leave hart out, or ask for hart %d alone", *in.Hart)
		}
		hs, err := d.AllHarts(ctx)
		if err != nil {
			return nil, BacktraceOutput{}, err
		}
		var lines []string
		for _, h := range hs {
			lines = append(lines, h.Line())
		}
		return textResult(strings.Join(lines, "\n") + "\n"), BacktraceOutput{Harts: hs}, nil
	}
	bt, on, err := d.Backtrace(ctx, hart, in.MaxFrames)
	if err != nil {
		return nil, BacktraceOutput{}, err
	}
	return textResult(fmt.Sprintf("hart %d:\n", on) + backtraceText(bt)), BacktraceOutput{Hart: &on, Backtrace: &bt}, nil
}

func backtraceText(bt debugger.Backtrace) string {
	var b strings.Builder
	for i, f := range bt.Frames {
		fmt.Fprintf(&b, "#%d %s", i, f.Where.String())
		if f.Trap != nil {
			fmt.Fprintf(&b, " [trap: %s]", f.Trap.Cause)
		}
		b.WriteByte('\n')
	}
	if bt.End != "" {
		b.WriteString("(" + bt.End + ")\n")
	}
	return b.String()
}

// DisassembleInput is debug_disassemble's arguments.
type DisassembleInput struct {
	Location string `json:"location,omitempty" max:"512" jsonschema:"symbol, symbol+0xOFFSET, 0xADDRESS or file.c:LINE; default the pc"`
	Count    int    `json:"count,omitempty" default:"16" jsonschema:"instructions to decode (1 to 256)"`
	HartArg
	Target
}

// DisassembleOutput is debug_disassemble's result.
type DisassembleOutput struct {
	Hart         int      `json:"hart" jsonschema:"the hart whose pc and MMU were used"`
	PC           string   `json:"pc" jsonschema:"the hart's pc (its line is marked =>)"`
	Instructions []string `json:"instructions" jsonschema:"one per line: address, encoding, instruction, <target> of a jump; symbol+offset where a symbol starts"`
}

func (s *Server) debugDisassemble(ctx context.Context, _ *mcp.CallToolRequest, in DisassembleInput) (*mcp.CallToolResult, DisassembleOutput, error) {
	d, hart, err := s.debuggerOn(in.Target, in.HartArg)
	if err != nil {
		return nil, DisassembleOutput{}, err
	}
	if in.Count == 0 {
		in.Count = 16
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	insts, pc, on, err := d.Disassemble(ctx, hart, in.Location, in.Count)
	if err != nil {
		return nil, DisassembleOutput{}, err
	}
	out := DisassembleOutput{Hart: on, PC: fmt.Sprintf("0x%x", pc), Instructions: d.Listing(insts, pc)}
	return textResult(fmt.Sprintf("%d instructions from 0x%x on hart %d", len(insts), insts[0].Addr, on)), out, nil
}

// SymbolizeInput is debug_symbolize's arguments.
type SymbolizeInput struct {
	Address string `json:"address" max:"512" jsonschema:"0xADDRESS to name, or a symbol or file.c:LINE to find the address of"`
	Target
}

// SymbolizeOutput is debug_symbolize's result.
type SymbolizeOutput struct {
	Locations []debugger.Where `json:"locations" jsonschema:"address, function (the symbol), offset, file, line; several for a line with code in several functions"`
}

func (s *Server) debugSymbolize(_ context.Context, _ *mcp.CallToolRequest, in SymbolizeInput) (*mcp.CallToolResult, SymbolizeOutput, error) {
	_, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, SymbolizeOutput{}, err
	}
	addrs, _, err := d.Resolve(in.Address)
	if err != nil {
		return nil, SymbolizeOutput{}, err
	}
	var out SymbolizeOutput
	var text []string
	for _, a := range addrs {
		w := d.Where(a)
		out.Locations = append(out.Locations, w)
		text = append(text, w.Addr+" "+w.String())
	}
	return textResult(strings.Join(text, "\n")), out, nil
}

// WatchInput is debug_watch's arguments.
type WatchInput struct {
	Location string `json:"location" max:"512" jsonschema:"symbol, symbol+0xOFFSET or 0xADDRESS of the data"`
	Length   int    `json:"length,omitempty" jsonschema:"bytes watched, 1 to 8; default the symbol's size (up to 8)"`
	Kind     string `json:"kind,omitempty" default:"write" jsonschema:"write, read or access"`
	Remove   bool   `json:"remove,omitempty" jsonschema:"remove the watchpoint at location instead"`
	Target
}

// WatchOutput is debug_watch's result.
type WatchOutput struct {
	Watchpoint debugger.Breakpoint `json:"watchpoint" jsonschema:"the watchpoint set (or removed): addr, symbol, kind, length"`
	Set        int                 `json:"set" jsonschema:"breakpoints and watchpoints set now, in all"`
}

func (s *Server) debugWatch(ctx context.Context, _ *mcp.CallToolRequest, in WatchInput) (*mcp.CallToolResult, WatchOutput, error) {
	_, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, WatchOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	w, err := d.Watch(ctx, in.Location, in.Length, in.Kind, in.Remove)
	if err != nil {
		return nil, WatchOutput{}, err
	}
	out := WatchOutput{Watchpoint: w, Set: len(d.Breakpoints())}
	verb := "set"
	if in.Remove {
		verb = "removed"
	}
	return textResult(fmt.Sprintf("%s watchpoint %s on %d bytes at %s %s; %d set", w.Kind, verb, w.Length, w.Where.String(), w.Addr, out.Set)), out, nil
}

// TranslateInput is debug_translate's arguments.
type TranslateInput struct {
	Address string `json:"address" max:"512" jsonschema:"virtual address: 0xADDRESS, symbol or symbol+0xOFFSET"`
	Satp    string `json:"satp,omitempty" max:"32" jsonschema:"riscv64: satp (0x...) whose page table to walk; default the hart's"`
	HartArg
	Target
}

// TranslateOutput is debug_translate's result.
type TranslateOutput struct {
	Hart *int `json:"hart,omitempty"`
	debugger.Walk
}

func (s *Server) debugTranslate(ctx context.Context, _ *mcp.CallToolRequest, in TranslateInput) (*mcp.CallToolResult, TranslateOutput, error) {
	_, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, TranslateOutput{}, err
	}
	var satp *uint64
	if in.Satp != "" {
		v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(in.Satp), "0x"), 16, 64)
		if err != nil {
			return nil, TranslateOutput{}, fmt.Errorf("satp %q: want a hex number such as 0x8000000000080a3d", in.Satp)
		}
		satp = &v
	}
	hart, err := in.hart()
	if err != nil {
		return nil, TranslateOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, debugTimeout)
	defer cancel()
	w, on, err := d.Translate(ctx, hart, in.Address, satp)
	if nr := (*debugger.NoRootError)(nil); errors.As(err, &nr) {
		return nil, TranslateOutput{}, fmt.Errorf("satp is riscv64's page table register: %w; leave satp out", err)
	}
	if err != nil {
		return nil, TranslateOutput{}, err
	}
	out := TranslateOutput{Walk: w}
	t := fmt.Sprintf("%s %s: ", w.Mode, w.VA)
	if satp == nil {
		// The walk used this hart's satp; a given one wins.
		out.Hart = &on
		t = fmt.Sprintf("hart %d %s", on, t)
	}
	if w.Fault != "" {
		t += "no page: " + w.Fault
	} else if w.PageSize == "" {
		t += "physical " + w.PA // paging off: no page, no flags
	} else {
		t += fmt.Sprintf("physical %s (%s page, %s)", w.PA, w.PageSize, w.Flags)
	}
	return textResult(t), out, nil
}

// registerDebug adds the debug_* tools; each needs a guest booted with
// gdb: true.
func (s *Server) registerDebug(ms *mcp.Server) {
	add(s, ms, tool("debug_break", "Breakpoint", mutating,
		"Set or remove a breakpoint at a symbol, 0xADDRESS or file.c:LINE (guest booted with gdb: true). The guest keeps its run state; debug_continue waits for the hit."), s.debugBreak)
	add(s, ms, tool("debug_continue", "Continue", mutating,
		"Resume every hart and wait for the next stop (breakpoint, watchpoint): hart, reason, pc, function+offset, file:line, instruction, and on a replay icount. On timeout the guest runs on and running is true."), s.debugContinue)
	add(s, ms, tool("debug_pause", "Pause", mutating,
		"Stop every hart and say where the one QEMU names is (QMP and the console keep working; debug_continue resumes)."), s.debugPause)
	add(s, ms, tool("debug_step", "Step", mutating,
		"Execute count instructions on one hart, the others stay stopped (over: a call counts as one). A step that cannot finish (wfi, a call waiting on a stopped hart) ends at timeout and says why."), s.debugStep)
	add(s, ms, tool("debug_registers", "Registers", reading,
		"pc, general registers, privilege level, and the trap registers with causes decoded (riscv64: sstatus, sepc, scause, stval, satp, mstatus, mcause...; aarch64: ESR_EL1, FAR_EL1, ELR_EL1, SPSR_EL1, TCR_EL1, TTBRn_EL1; x86_64: cr0-cr4, efer, eflags)."), s.debugRegisters)
	add(s, ms, tool("debug_memory", "Read memory", reading,
		"Hexdump up to 64 KiB of guest memory at a symbol or address (virtual through a hart's MMU, or physical), unreadable ranges reported."), s.debugMemory)
	add(s, ms, tool("debug_backtrace", "Backtrace", reading,
		"Unwind a hart's stack by frame pointers: function+offset at file:line; trap frames carry their cause. all_harts: each hart's mode, pc, state (idle, trap, ipi, lock, panic, user, firmware, machine mode, running), short backtrace."), s.debugBacktrace)
	add(s, ms, tool("debug_disassemble", "Disassemble", reading,
		"Disassemble count instructions at a location (default the pc), privileged ones included, jumps symbolized."), s.debugDisassemble)
	add(s, ms, tool("debug_watch", "Watchpoint", mutating,
		"Set or remove a data watchpoint (write, read or access) on a symbol or address; debug_continue reports the accessing hart, instruction and line, old and new value, a backtrace."), s.debugWatch)
	add(s, ms, tool("debug_last_write", "Last write", reading,
		"Replays only: the last write that changed a location before now (or before an icount): old and new value, instruction, function, file:line, backtrace, icount; or that none did."), s.debugLastWrite)
	add(s, ms, tool("debug_translate", "Translate", reading,
		"Walk the page table for a virtual address as a hart's MMU does (riscv64 Sv39/48/57; aarch64 4K pages, TTBR0/1; x86_64 4/5-level): each level's PTE and flags, then the physical address and page size, or why the walk stops."), s.debugTranslate)
	add(s, ms, tool("debug_symbolize", "Symbolize", reading,
		"Name an address (function+offset, file:line), or find the address of a symbol or file.c:LINE."), s.debugSymbolize)
}
