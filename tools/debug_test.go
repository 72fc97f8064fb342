package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

type stopOut struct {
	Stopped  bool   `json:"stopped"`
	Running  bool   `json:"running"`
	Reason   string `json:"reason"`
	PC       string `json:"pc"`
	Function string `json:"function"`
	Offset   string `json:"offset"`
	File     string `json:"file"`
	Line     int    `json:"line"`
	Insn     string `json:"insn"`
}

type whereOut struct {
	Addr     string `json:"addr"`
	Function string `json:"function"`
	Offset   string `json:"offset"`
	File     string `json:"file"`
	Line     int    `json:"line"`
}

type breakOut struct {
	Breakpoints []whereOut `json:"breakpoints"`
	Set         int        `json:"set"`
}

// walkOut is debug_translate's result.
type walkOut struct {
	Mode     string `json:"mode"`
	PA       string `json:"pa"`
	PageSize string `json:"page_size"`
	Flags    string `json:"flags"`
	Fault    string `json:"fault"`
	TTBR     string `json:"ttbr"`
	Levels   []struct {
		Level int    `json:"level"`
		Flags string `json:"flags"`
	} `json:"levels"`
}

// memoryOut is debug_memory's result.
type memoryOut struct {
	Addr    string `json:"addr"`
	Symbol  string `json:"symbol"`
	Hexdump string `json:"hexdump"`
}

// breakIn sets a breakpoint on function and checks that debug_break put
// it there, in file.
func (s *session) breakIn(function, file string) {
	s.t.Helper()
	var br breakOut
	s.mustCall("debug_break", map[string]any{"location": function}, &br)
	if len(br.Breakpoints) != 1 || br.Breakpoints[0].Function != function || br.Breakpoints[0].File != file {
		s.t.Fatalf("debug_break %s: %+v", function, br)
	}
}

// watchWrites sets a write watchpoint on symbol and checks that
// debug_watch put it there, length bytes long.
func (s *session) watchWrites(symbol string, length int) {
	s.t.Helper()
	var wo struct {
		Watchpoint struct {
			whereOut
			Kind   string `json:"kind"`
			Length int    `json:"length"`
		} `json:"watchpoint"`
	}
	s.mustCall("debug_watch", map[string]any{"location": symbol}, &wo)
	if wo.Watchpoint.Function != symbol || wo.Watchpoint.Length != length || wo.Watchpoint.Kind != "write" {
		s.t.Fatalf("debug_watch %s: %+v", symbol, wo)
	}
}

// accessOut is the access a watchpoint caught, or a last write.
type accessOut struct {
	Kind string   `json:"kind"`
	Insn whereOut `json:"insn_at"`
	Text string   `json:"insn"`
	Old  string   `json:"old"`
	New  string   `json:"new"`
}

// watchStopOut is debug_continue's result at a watchpoint.
type watchStopOut struct {
	hartStopOut
	Access    *accessOut    `json:"access"`
	Backtrace *backtraceOut `json:"backtrace"`
}

type frameOut struct {
	whereOut
	Trap *struct {
		Cause     string `json:"cause"`
		Interrupt bool   `json:"interrupt"`
	} `json:"trap"`
	User bool `json:"user"`
}

type backtraceOut struct {
	Frames []frameOut `json:"frames"`
	End    string     `json:"end"`
}

// Each per-hart debug tool asks for the debugger before it reads its
// arguments: on a guest booted without gdb, even a call naming no hart
// (hart -1) is told how to boot one with it.
func TestDebugHartToolsNeedGDB(t *testing.T) {
	s := newSession(t)
	s.bootTiny()
	for name, args := range map[string]map[string]any{
		"debug_step":        {},
		"debug_registers":   {},
		"debug_memory":      {"location": "puts"},
		"debug_backtrace":   {},
		"debug_disassemble": {},
		"debug_translate":   {"address": "puts"},
	} {
		args["hart"] = -1
		s.wantError(name, args, "booted without its debugger", "gdb: true")
	}
}

// The built-in kernel under the debugger: a breakpoint by symbol stops it
// when the shell reaches the command; stepping moves one instruction at a
// time and over calls; disassembly names every instruction, privileged
// ones included; the console, QMP and shutdown keep working while the
// guest is stopped.
func TestDebugTinyKernel(t *testing.T) {
	s := newSession(t)
	var b struct {
		bootOut
		Symbols string `json:"symbols"`
		Paths   struct {
			GDBSocket string `json:"gdb_socket"`
		} `json:"paths"`
	}
	s.mustCall("qemu_boot", map[string]any{"gdb": true, "wait_for": prompt}, &b)
	if !b.Matched || !strings.HasSuffix(b.Symbols, ".elf") || b.Paths.GDBSocket == "" {
		t.Fatalf("boot: %+v", b)
	}

	var br breakOut
	s.mustCall("debug_break", map[string]any{"location": "cmd_echo"}, &br)
	if len(br.Breakpoints) != 1 || br.Breakpoints[0].Function != "cmd_echo" || br.Breakpoints[0].Addr != "0x80200228" || br.Set != 1 {
		t.Fatalf("debug_break: %+v", br)
	}
	// The guest kept running: the console answers a command that does
	// not reach the breakpoint.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "help", "wait_for": prompt}, &w)
	if !w.Matched {
		t.Fatalf("help with a breakpoint set elsewhere: %+v", w)
	}

	// A console wait that the breakpoint makes quiet ends at the stop,
	// not at its timeout, and says so; the stop it reported is not
	// reported again.
	var ws struct {
		waitOut
		DebugStop *stopOut `json:"debug_stop"`
	}
	start := time.Now()
	s.mustCall("serial_send", map[string]any{"data": "echo first", "wait_for": "first\r\ntiny> $", "timeout": 30}, &ws)
	if ws.TimedOut || ws.DebugStop == nil || ws.DebugStop.Function != "cmd_echo" || ws.DebugStop.Reason != "breakpoint" {
		t.Fatalf("wait stopped by the breakpoint: %+v, debug_stop %+v", ws.waitOut, ws.DebugStop)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the wait took %v to end at the breakpoint", took)
	}
	var st stopOut
	s.mustCall("debug_continue", map[string]any{"timeout": 0.3}, &st)
	if !st.Running {
		t.Fatalf("continue after a stop the wait reported: %+v", st)
	}
	s.mustCall("serial_read", map[string]any{"wait_for": "first\r\ntiny> $", "timeout": 5}, &w)
	if !w.Matched {
		t.Fatalf("echo after continuing: %+v", w)
	}

	s.mustCall("serial_send", map[string]any{"data": "echo hello"}, nil)
	// The breakpoint is hit between calls: reading the registers finds
	// the guest there and leaves it so, and debug_continue reports that
	// stop rather than passing it by.
	time.Sleep(300 * time.Millisecond)
	var pc struct {
		PC whereOut `json:"pc"`
	}
	s.mustCall("debug_registers", nil, &pc)
	if pc.PC.Function != "cmd_echo" {
		t.Errorf("registers after the hit: pc %+v", pc.PC)
	}
	s.mustCall("debug_continue", map[string]any{"timeout": 10}, &st)
	if !st.Stopped || st.Reason != "breakpoint" || st.Function != "cmd_echo" || st.PC != "0x80200228" || !strings.HasPrefix(st.Insn, "bgeu") {
		t.Fatalf("debug_continue: %+v", st)
	}

	// While stopped: QMP answers, and a console wait ends by its timeout
	// without the echo (the guest does not run).
	var q struct {
		Return struct {
			Running bool `json:"running"`
		} `json:"return"`
	}
	s.mustCall("qmp_command", map[string]any{"command": "query-status"}, &q)
	if q.Return.Running {
		t.Errorf("query-status says running while the debugger holds the guest")
	}
	s.mustCall("serial_read", map[string]any{"wait_for": "\nhello\r\n", "timeout": 0.3}, &w)
	if w.Matched {
		t.Errorf("the echo came while the guest was stopped: %+v", w)
	}

	// Single steps stay in cmd_echo and move forward.
	prev := st.PC
	for range 2 {
		s.mustCall("debug_step", nil, &st)
		if !st.Stopped || st.Reason != "step" || st.Function != "cmd_echo" || st.PC == prev {
			t.Fatalf("debug_step from %s: %+v", prev, st)
		}
		prev = st.PC
	}
	// A console wait on a guest the debugger holds ends at once and
	// says so.
	var held struct {
		waitOut
		DebugStop *stopOut `json:"debug_stop"`
	}
	start = time.Now()
	s.mustCall("serial_read", map[string]any{"wait_for": "never", "timeout": 30}, &held)
	if held.TimedOut || held.DebugStop == nil || held.DebugStop.Reason != "step" || held.DebugStop.PC != prev {
		t.Errorf("wait on a held guest: %+v, debug_stop %+v", held.waitOut, held.DebugStop)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the wait on a held guest took %v", took)
	}
	// Stepping over the calls to putn and puts lands after each of them,
	// in cmd_echo, with the output printed.
	for st.PC != "0x80200246" {
		s.mustCall("debug_step", map[string]any{"over": true}, &st)
		if st.Function != "cmd_echo" {
			t.Fatalf("step over left cmd_echo: %+v", st)
		}
	}
	s.mustCall("serial_read", map[string]any{"wait_for": "hello\r\n", "timeout": 5}, &w)
	if !w.Matched {
		t.Errorf("the echo did not come out while stepping over the calls: %+v", w)
	}

	var regs struct {
		PC   whereOut          `json:"pc"`
		Priv string            `json:"priv"`
		GPRs map[string]string `json:"gprs"`
		CSRs map[string]string `json:"csrs"`
	}
	s.mustCall("debug_registers", nil, &regs)
	if regs.PC.Addr != "0x80200246" || regs.Priv != "supervisor" || regs.GPRs["sp"] == "" || regs.CSRs["sstatus"] == "" || len(regs.GPRs) != 31 {
		t.Errorf("debug_registers: %+v", regs)
	}

	var dis struct {
		PC           string   `json:"pc"`
		Instructions []string `json:"instructions"`
	}
	s.mustCall("debug_disassemble", map[string]any{"location": "halt", "count": 4}, &dis)
	all := strings.Join(dis.Instructions, "\n")
	if !strings.Contains(all, "<halt>:") || !strings.Contains(all, "wfi") || !strings.Contains(all, "<park>:") || strings.Contains(all, ".word") {
		t.Errorf("disassembly of halt:\n%s", all)
	}
	s.mustCall("debug_disassemble", nil, &dis)
	if dis.PC != "0x80200246" || !strings.Contains(strings.Join(dis.Instructions, "\n"), "=> 80200246") {
		t.Errorf("disassembly at the pc: %+v", dis)
	}

	var mem memoryOut
	s.mustCall("debug_memory", map[string]any{"location": "str_banner1", "length": 32}, &mem)
	if !strings.Contains(mem.Hexdump, "|qemu-mcp tiny ke|") || !strings.HasPrefix(mem.Symbol, "str_banner1") {
		t.Errorf("debug_memory of str_banner1: %+v", mem)
	}

	var sym struct {
		Locations []whereOut `json:"locations"`
	}
	s.mustCall("debug_symbolize", map[string]any{"address": "puts"}, &sym)
	if len(sym.Locations) != 1 || sym.Locations[0].Function != "puts" || sym.Locations[0].Offset != "0x0" {
		t.Fatalf("debug_symbolize puts: %+v", sym)
	}
	puts, _ := strconv.ParseUint(strings.TrimPrefix(sym.Locations[0].Addr, "0x"), 16, 64)
	s.mustCall("debug_symbolize", map[string]any{"address": fmt.Sprintf("%#x", puts+2)}, &sym)
	if len(sym.Locations) != 1 || sym.Locations[0].Function != "puts" || sym.Locations[0].Offset != "0x2" {
		t.Errorf("debug_symbolize: %+v", sym)
	}

	// A C function called from assembly: the backtrace shows it and its
	// caller.
	s.mustCall("debug_break", map[string]any{"location": "cmd_echo", "remove": true}, &br)
	if br.Set != 0 {
		t.Errorf("remove: %+v", br)
	}
	s.mustCall("debug_break", map[string]any{"location": "tk_cmd_input"}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, &st)
	if !st.Running {
		t.Fatalf("continue with nothing to hit: %+v", st)
	}
	s.mustCall("serial_send", map[string]any{"data": "input"}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 10}, &st)
	if st.Function != "tk_cmd_input" {
		s.mustCall("serial_read", map[string]any{"since": 0}, &w)
		t.Fatalf("continue to tk_cmd_input: %+v; console:\n%s", st, w.Output)
	}
	var bt backtraceOut
	s.mustCall("debug_backtrace", nil, &bt)
	if len(bt.Frames) < 2 || bt.Frames[0].Function != "tk_cmd_input" || bt.Frames[1].Function != "cmd_input" || bt.Frames[1].Offset != "0x8" {
		t.Errorf("backtrace: %+v", bt)
	}
	// A step into the C function's body, past its prologue: the frame
	// pointer is set, and the leaf's caller is still found.
	s.mustCall("debug_step", map[string]any{"count": 3}, &st)
	s.mustCall("debug_backtrace", nil, &bt)
	if len(bt.Frames) < 2 || bt.Frames[0].Function != "tk_cmd_input" || bt.Frames[1].Function != "cmd_input" {
		t.Errorf("backtrace after the prologue: %+v", bt)
	}

	// Shutdown works on a stopped guest, at once.
	t0 := time.Now()
	var sd struct {
		How string `json:"how"`
	}
	s.mustCall("qemu_shutdown", nil, &sd)
	if time.Since(t0) > 3*time.Second {
		t.Errorf("shutdown of a stopped guest took %s (%+v)", time.Since(t0), sd)
	}
	assertEmptyRuntimeDir(t, s.dir)
}

// The Linux guest under the debugger: a breakpoint on sys_newuname stops
// the kernel when the shell runs uname, the backtrace names it at
// kernel/sys.c and the system call it came from, linux_banner reads
// "Linux version" (virtually and physically), removing the breakpoint
// lets the shell answer, and a sysrq crash's wait carries a triage that
// names sysrq_handle_crash.
func TestDebugLinux(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = lin.Dir }, nil)
	var b struct {
		bootOut
		Symbols string `json:"symbols"`
	}
	s.mustCall("qemu_boot", map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
		"memory": "256M", "gdb": true, "wait_for": testguest.LinuxPrompt, "timeout": 60}, &b)
	if !b.Matched || filepath.Base(b.Symbols) != "vmlinux" {
		t.Fatalf("boot: %+v", b)
	}

	s.breakIn("sys_newuname", "kernel/sys.c")
	s.mustCall("serial_send", map[string]any{"data": "uname -sr"}, nil)
	var st stopOut
	s.mustCall("debug_continue", map[string]any{"timeout": 20}, &st)
	if !st.Stopped || st.Reason != "breakpoint" || st.Function != "sys_newuname" || st.File != "kernel/sys.c" || st.Line == 0 {
		t.Fatalf("debug_continue: %+v", st)
	}

	var bt backtraceOut
	s.mustCall("debug_backtrace", nil, &bt)
	t.Logf("backtrace: %+v", bt)
	if len(bt.Frames) < 2 || bt.Frames[0].Function != "sys_newuname" || bt.Frames[0].File != "kernel/sys.c" || bt.Frames[0].Line != st.Line {
		t.Fatalf("backtrace: %+v", bt)
	}
	last := bt.Frames[len(bt.Frames)-1]
	if !last.User || last.Trap == nil || last.Trap.Cause != "environment call from U-mode" {
		t.Errorf("the backtrace does not end in the user program's system call: %+v", bt)
	}

	var regs struct {
		Priv   string `json:"priv"`
		SCause struct {
			Cause string `json:"cause"`
		} `json:"scause"`
		Satp string `json:"satp"`
	}
	s.mustCall("debug_registers", nil, &regs)
	if regs.Priv != "supervisor" || regs.SCause.Cause != "environment call from U-mode" || !strings.HasPrefix(regs.Satp, "Sv") {
		t.Errorf("debug_registers: %+v", regs)
	}

	var mem memoryOut
	s.mustCall("debug_memory", map[string]any{"location": "linux_banner", "length": 64}, &mem)
	if !strings.Contains(mem.Hexdump, "|Linux version 6.") {
		t.Errorf("linux_banner:\n%s", mem.Hexdump)
	}
	// The kernel's image is mapped at 0xffffffff80000000 from where
	// OpenSBI loaded it, 0x80200000.
	virt, err := strconv.ParseUint(strings.TrimPrefix(mem.Addr, "0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	phys := virt - 0xffffffff80000000 + 0x80200000
	s.mustCall("debug_memory", map[string]any{"location": fmt.Sprintf("0x%x", phys), "length": 16, "physical": true}, &mem)
	if !strings.Contains(mem.Hexdump, "|Linux version 6.") {
		t.Errorf("linux_banner at physical 0x%x:\n%s", phys, mem.Hexdump)
	}
	// Unmapped memory is reported, not an error.
	var um struct {
		Unreadable []string `json:"unreadable"`
		Hexdump    string   `json:"hexdump"`
	}
	s.mustCall("debug_memory", map[string]any{"location": "0x1000", "length": 32}, &um)
	if len(um.Unreadable) != 1 || !strings.Contains(um.Hexdump, "?? ??") {
		t.Errorf("unmapped read: %+v", um)
	}

	s.mustCall("debug_break", map[string]any{"location": "sys_newuname", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.5}, &st)
	if !st.Running {
		t.Errorf("continue without breakpoints: %+v", st)
	}
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, &w)
	if !w.Matched || !strings.Contains(w.Output, "Linux 6.1") {
		t.Errorf("uname after the breakpoint: %+v", w)
	}

	// Stopped in the trap vector, before and after it saved the
	// registers: the backtrace finds the trapped context either way.
	s.mustCall("debug_break", map[string]any{"location": "handle_exception"}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 10}, &st)
	if st.Function != "handle_exception" {
		t.Fatalf("continue to the trap vector: %+v", st)
	}
	s.mustCall("debug_backtrace", nil, &bt)
	if len(bt.Frames) < 2 || bt.Frames[1].Trap == nil {
		t.Fatalf("backtrace in the vector: %+v", bt)
	}
	trapped := bt.Frames[1]
	var vr struct {
		Verdict string `json:"verdict"`
	}
	s.mustCall("debug_registers", nil, &vr)
	if vr.Verdict == "" {
		t.Errorf("debug_registers in the trap vector has no verdict")
	}
	t.Logf("in the vector: %s", vr.Verdict)
	s.mustCall("debug_step", map[string]any{"count": 30}, &st)
	if st.Function != "_save_context" {
		t.Fatalf("30 steps into the vector: %+v", st)
	}
	s.mustCall("debug_backtrace", nil, &bt)
	if len(bt.Frames) < 2 || bt.Frames[1].Addr != trapped.Addr || bt.Frames[1].Trap == nil || bt.Frames[1].Trap.Cause != trapped.Trap.Cause {
		t.Errorf("backtrace in the vector after the save: %+v; before: %+v", bt, trapped)
	}
	t.Logf("trapped context: %+v, trap %+v", trapped, *trapped.Trap)
	s.mustCall("debug_break", map[string]any{"location": "handle_exception", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, &st)

	var p struct {
		Panicked   bool   `json:"panicked"`
		PanicMatch string `json:"panic_match"`
		Triage     *struct {
			PC        whereOut     `json:"pc"`
			Culprit   *whereOut    `json:"culprit"`
			Backtrace backtraceOut `json:"backtrace"`
		} `json:"triage"`
		TriageError string `json:"triage_error"`
	}
	res := s.call("serial_send", map[string]any{"data": "echo c > /proc/sysrq-trigger", "wait_for": testguest.LinuxPrompt, "timeout": 30}, &p)
	if !p.Panicked || p.Triage == nil {
		t.Fatalf("panic: %+v", p)
	}
	tj, _ := json.MarshalIndent(res.StructuredContent.(map[string]any)["triage"], "", " ")
	t.Logf("triage: %s\n%s", text(res), tj)
	found := false
	for _, f := range p.Triage.Backtrace.Frames {
		found = found || f.Function == "sysrq_handle_crash"
	}
	if !found || p.Triage.Culprit == nil || p.Triage.Culprit.Function != "sysrq_handle_crash" || p.Triage.Culprit.File != "drivers/tty/sysrq.c" {
		t.Errorf("triage does not name sysrq_handle_crash: %+v", p.Triage)
	}
	if !strings.Contains(text(res), "in sysrq_handle_crash") {
		t.Errorf("the wait's summary does not name the culprit: %s", text(res))
	}
}

// With -gdb-tcp the server also serves the stub on loopback TCP, to its own
// user; its debugger uses the unix socket, and once it holds nothing (no
// breakpoints, guest running) it lets go, so that a person's gdb can attach
// over TCP.
func TestDebugTCPLetsAnotherDebuggerAttach(t *testing.T) {
	s := newSessionWith(t, func(c *testConfig) { c.GDBTCP = "127.0.0.1:0" }, nil)
	var b struct {
		bootOut
		Paths struct {
			GDBSocket  string `json:"gdb_socket"`
			GDBAddress string `json:"gdb_address"`
		} `json:"paths"`
	}
	s.mustCall("qemu_boot", map[string]any{"gdb": true, "wait_for": prompt}, &b)
	if b.Paths.GDBAddress == "" || b.Paths.GDBSocket == "" || !strings.HasPrefix(b.Paths.GDBAddress, "127.0.0.1:") {
		t.Fatalf("paths: %+v", b.Paths)
	}
	var br breakOut
	s.mustCall("debug_break", map[string]any{"location": "cmd_echo"}, &br)
	s.mustCall("serial_send", map[string]any{"data": "echo x"}, nil)
	var st stopOut
	s.mustCall("debug_continue", nil, &st)
	if st.Function != "cmd_echo" {
		t.Fatalf("continue: %+v", st)
	}
	// While the server holds the stub, another debugger is not served.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c, err := gdb.Dial(ctx, "tcp", b.Paths.GDBAddress); err == nil {
		c.Close()
		t.Errorf("a second debugger attached while the server held the stub")
	}
	s.mustCall("debug_break", map[string]any{"location": "cmd_echo", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, &st)
	if !st.Running {
		t.Fatalf("continue: %+v", st)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := gdb.Dial(ctx, "tcp", b.Paths.GDBAddress)
	if err != nil {
		t.Fatalf("attach after the server let go: %v", err)
	}
	pc, err := c.ReadRegister(ctx, "pc")
	if err != nil || pc < 0x80200000 {
		t.Errorf("pc %#x, %v", pc, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("detach: %v", err)
	}
	// The guest runs on, and the server's debugger attaches again.
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo again", "wait_for": "again\r\ntiny> $"}, &w)
	if !w.Matched {
		t.Errorf("the guest does not answer after the other debugger left: %+v", w)
	}
	var regs struct {
		Priv string `json:"priv"`
	}
	s.mustCall("debug_registers", nil, &regs)
	if regs.Priv != "supervisor" {
		t.Errorf("registers after reattaching: %+v", regs)
	}
}

// Why did it fault, and who wrote this: with the Linux guest, a write
// watchpoint on panic_timeout catches the sysctl store, a translation
// agrees with QEMU's own, and LKDTM faults get their verdicts.
func TestDebugLinuxFaults(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = lin.Dir }, nil)
	boot := func() {
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
			"memory": "256M", "gdb": true, "wait_for": testguest.LinuxPrompt, "timeout": 60, "restart": true}, &b)
		if !b.Matched {
			t.Fatalf("boot: %+v", b)
		}
	}
	boot()

	s.watchWrites("panic_timeout", 4)
	s.mustCall("serial_send", map[string]any{"data": "echo 7 > /proc/sys/kernel/panic"}, nil)
	var st watchStopOut
	res := s.call("debug_continue", map[string]any{"timeout": 20}, &st)
	t.Logf("watch stop: %s", text(res))
	if st.Access == nil || st.Access.Old != "0x0" || st.Access.New != "0x7" || st.Access.Insn.Function != "do_proc_dointvec_conv" ||
		st.Access.Insn.File != "kernel/sysctl.c" || st.Access.Insn.Line == 0 || !strings.HasPrefix(st.Access.Text, "sw ") {
		t.Fatalf("watch stop: %+v access %+v", st.stopOut, st.Access)
	}
	if st.Backtrace == nil || len(st.Backtrace.Frames) < 3 {
		t.Errorf("watch stop backtrace: %+v", st.Backtrace)
	}
	// Pausing the guest the watchpoint stopped says where it is, and does
	// not handle the stop again (which would step another instruction).
	var again struct {
		stopOut
		Access *struct{} `json:"access"`
	}
	s.mustCall("debug_pause", nil, &again)
	if again.PC != st.PC || again.Reason != "watch" || again.Access != nil {
		t.Errorf("pause after the watch stop: %+v (the stop was at %s)", again, st.PC)
	}
	// Several at once: a second watchpoint, and a duplicate refused.
	var two struct {
		Set int `json:"set"`
	}
	s.mustCall("debug_watch", map[string]any{"location": "panic_on_oops", "kind": "access"}, &two)
	if two.Set != 2 {
		t.Errorf("two watchpoints: %+v", two)
	}
	s.wantError("debug_watch", map[string]any{"location": "panic_on_oops"}, "already set", "remove it first")
	s.mustCall("debug_watch", map[string]any{"location": "panic_on_oops", "remove": true}, nil)
	s.mustCall("debug_watch", map[string]any{"location": "panic_timeout", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, nil)
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "cat /proc/sys/kernel/panic", "wait_for": `\n7\r\n`}, &w)
	if !w.Matched {
		t.Errorf("panic_timeout reads back: %+v", w)
	}

	// Translation agrees with HMP gva2gpa.
	var hmp struct {
		Return string `json:"return"`
	}
	hmp.Return = s.qemuTranslates("linux_banner")
	var walk walkOut
	s.mustCall("debug_translate", map[string]any{"address": "linux_banner"}, &walk)
	t.Logf("gva2gpa: %q; walk: %+v", hmp.Return, walk)
	if walk.PA == "" || !strings.Contains(hmp.Return, "gpa: "+walk.PA) || len(walk.Levels) == 0 || walk.Levels[len(walk.Levels)-1].Flags[1] != 'R' {
		t.Errorf("translate linux_banner: %+v; QEMU says %q", walk, hmp.Return)
	}
	s.mustCall("debug_translate", map[string]any{"address": "0x0"}, &walk)
	if walk.PA != "" || !strings.Contains(walk.Fault, "not valid") {
		t.Errorf("translate 0x0: %+v", walk)
	}
	s.mustCall("qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "gva2gpa 0"}}, &hmp)
	if !strings.Contains(hmp.Return, "Unmapped") {
		t.Errorf("QEMU translates 0: %q", hmp.Return)
	}

	// LKDTM faults, each ending in a panic (panic_on_oops).
	type triageOut struct {
		Panicked bool `json:"panicked"`
		Triage   *struct {
			Culprit *whereOut `json:"culprit"`
			Verdict string    `json:"verdict"`
			Trap    *struct {
				Cause string `json:"cause"`
				TVal  string `json:"tval"`
			} `json:"trap"`
		} `json:"triage"`
	}
	for _, tc := range []struct {
		crash, culprit, verdict string
	}{
		{"WRITE_RO", "lkdtm_WRITE_RO", "store page fault at 0x"},
		{"ACCESS_NULL", "lkdtm_ACCESS_NULL", "load page fault at 0x0 from S-mode: no mapping"},
	} {
		boot()
		s.mustCall("serial_send", map[string]any{"data": "mount -t debugfs none /sys/kernel/debug; echo 1 > /proc/sys/kernel/panic_on_oops", "wait_for": testguest.LinuxPrompt}, nil)
		var p triageOut
		res := s.call("serial_send", map[string]any{"data": "echo " + tc.crash + " > /sys/kernel/debug/provoke-crash/DIRECT", "wait_for": testguest.LinuxPrompt, "timeout": 30}, &p)
		t.Logf("%s: %s", tc.crash, text(res))
		if !p.Panicked || p.Triage == nil || p.Triage.Culprit == nil || p.Triage.Culprit.Function != tc.culprit || !strings.Contains(p.Triage.Verdict, tc.verdict) {
			t.Errorf("%s: %+v", tc.crash, p.Triage)
		}
		if tc.crash == "WRITE_RO" && (p.Triage == nil || !strings.Contains(p.Triage.Verdict, "not writable (W=0)")) {
			t.Errorf("WRITE_RO verdict: %+v", p.Triage)
		}
	}
}

// qemuTranslates is QEMU's own translation of symbol (HMP gva2gpa).
// QEMU translates with the hart's current mode: while it is in firmware
// (RISC-V M-mode: an SBI call, a timer) it says Unmapped. It asks again.
func (s *session) qemuTranslates(symbol string) string {
	s.t.Helper()
	var sym struct {
		Locations []whereOut `json:"locations"`
	}
	s.mustCall("debug_symbolize", map[string]any{"address": symbol}, &sym)
	var hmp struct {
		Return string `json:"return"`
	}
	for range 50 {
		s.mustCall("qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "gva2gpa " + sym.Locations[0].Addr}}, &hmp)
		if strings.Contains(hmp.Return, "gpa:") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return hmp.Return
}
