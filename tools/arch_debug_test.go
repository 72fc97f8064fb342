package tools_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The debugger on the aarch64 Linux guest with four vCPUs (hart n is
// vCPU n, and Linux's CPU n: its MPIDR): every vCPU at a glance at EL1;
// registers with the syndrome and translation decoded; a write
// watchpoint on panic_timeout names the store in do_proc_dointvec_conv
// at kernel/sysctl.c with old and new, on the vCPU that wrote; a
// breakpoint reached from a task pinned to CPU 3 names CPU 3 and the
// system call it came from; the walk of linux_banner agrees with QEMU's
// gva2gpa and names its leaf level; LKDTM's WRITE_RO forced onto CPU 2 is
// triaged on CPU 2 as a permission fault, ACCESS_NULL as a translation
// fault at 0x0.
func TestAarch64DebugLinux(t *testing.T) {
	archDebugLinux(t, arm64.Arch, archDebugWant{
		priv: "EL1", processors: true,
		registers: func(r registersOut) bool {
			return r.System["ESR_EL1"] != "" && r.System["VBAR_EL1"] != "" && strings.Contains(r.Translation, "48-bit VA, 4K granule") &&
				strings.HasPrefix(r.Status, "PSTATE EL1h") && r.SCause == nil
		},
		store: "str", syscall: "system call (SVC)", stepOffset: "0x8",
		prologue: func(dis string) bool {
			return (strings.Contains(dis, "stp\tx29, x30, [sp, #-") || strings.Contains(dis, "stp x29, x30, [sp, #-")) && !strings.Contains(dis, ".word")
		},
		walk: func(w walkOut) bool {
			return w.TTBR != "" && strings.HasPrefix(w.Flags, fmt.Sprintf("level-%d ", w.Levels[len(w.Levels)-1].Level)) && strings.Contains(w.Flags, "EL1 read-only")
		},
		unmapped: "not valid",
		writeRO:  []string{"data abort: permission fault at level ", "write to a read-only page at 0x", " from EL1 at 0x", "the walk's leaf is a level-3 page"},
		null:     []string{"data abort: translation fault at level ", "address 0x0", "NULL pointer"},
	})
}

// archDebugWant is what the debugger says of an architecture's Linux
// guest in archDebugLinux, where architectures differ.
type archDebugWant struct {
	// priv is every vCPU's privilege; processors says a vCPU's result
	// names its Linux CPU number too; idle that every vCPU idles once
	// the boot's work is done.
	priv       string
	processors bool
	idle       bool
	// registers checks vCPU 1's registers (the common part is checked).
	registers func(registersOut) bool
	// store is the mnemonic that writes panic_timeout; syscall how the
	// trap from user mode under a system call begins; caller the
	// function under version_proc_show, if checked.
	store, syscall, caller string
	// stepOffset is where two steps from version_proc_show's entry are,
	// if checked; prologue checks the disassembly of its entry.
	stepOffset string
	prologue   func(string) bool
	// walk checks the walk of linux_banner (that QEMU agrees is checked);
	// unmapped is how the walk of 0x0 fails.
	walk     func(walkOut) bool
	unmapped string
	// writeRO and null are what the verdicts of LKDTM's WRITE_RO and
	// ACCESS_NULL say.
	writeRO, null []string
}

// registersOut is the part of debug_registers' result archDebugLinux
// reads.
type registersOut struct {
	Priv        string            `json:"priv"`
	System      map[string]string `json:"system"`
	Status      string            `json:"status"`
	Translation string            `json:"translation"`
	SCause      *struct{}         `json:"scause"`
}

// archDebugLinux is the debugger on a's Linux guest with four vCPUs:
// every vCPU at a glance; registers; a write watchpoint on panic_timeout
// caught on the vCPU that wrote; a breakpoint reached from a task pinned
// to CPU 3 unwinding to the system call; stepping, disassembly and a
// breakpoint by file:LINE; the walk of linux_banner equal to QEMU's
// gva2gpa; LKDTM's WRITE_RO and ACCESS_NULL triaged on the CPUs they
// were forced onto.
func archDebugLinux(t *testing.T, a arch.Arch, want archDebugWant) {
	lin := testguest.ArchLinux(t, a)
	s, _ := archSession(t, a, func(c *testConfig) { c.WorkDir, c.AllowPaths = lin.Dir, []string{lin.Dir} })
	boot := func() {
		t.Helper()
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": lin.Append, "memory": "256M", "smp": 4,
			"gdb": true, "wait_for": testguest.LinuxPrompt, "timeout": 90, "restart": true}, &b)
		if !b.Matched {
			t.Fatalf("boot: %+v", b)
		}
	}
	boot()
	pin := func(cpu int, cmd string) string { return fmt.Sprintf("taskset 0x%x sh -c '%s'", 1<<cpu, cmd) }

	var all struct {
		Harts []hartOut `json:"harts"`
	}
	// CPU 0 idles under rest_init, which arch_call_rest_init (freed init
	// text) called as its last instruction.
	restInit := func() bool {
		bt := all.Harts[0].Backtrace
		i := slices.Index(bt, "rest_init")
		return i >= 0 && i+1 < len(bt) && bt[i+1] == "arch_call_rest_init"
	}
	// Every CPU idles once the boot's deferred work is done: a CPU
	// still freeing the boot's memory (RCU callbacks, the RCU grace
	// period kthread) right after the prompt is running, and asked again
	// a moment later, idle.
	for try := 0; ; try++ {
		res := s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
		t.Logf("all_harts:\n%s", text(res))
		if len(all.Harts) != 4 {
			t.Fatalf("all_harts: %+v", all)
		}
		busy := want.idle && slices.ContainsFunc(all.Harts, func(h hartOut) bool { return h.State != "idle" })
		if try == 20 || !busy && restInit() {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i, h := range all.Harts {
		if h.Hart != i || h.Priv != want.priv || h.State == "" || len(h.Backtrace) < 3 || want.processors && (h.Processor == nil || *h.Processor != i) {
			t.Errorf("all_harts[%d]: %+v", i, h)
		}
		if want.idle && h.State != "idle" {
			t.Errorf("CPU %d is %s, want idle", i, h.State)
		}
	}
	if !restInit() {
		t.Errorf("CPU 0's backtrace: %q, want rest_init < arch_call_rest_init", all.Harts[0].Backtrace)
	}
	var regs registersOut
	res := s.call("debug_registers", map[string]any{"hart": 1}, &regs)
	t.Logf("registers: %s", text(res))
	if regs.Priv != want.priv || !want.registers(regs) {
		t.Errorf("registers of vCPU 1: %+v", regs)
	}

	// Who wrote panic_timeout, and from which vCPU.
	s.watchWrites("panic_timeout", 4)
	s.mustCall("serial_send", map[string]any{"data": pin(1, "echo 7 > /proc/sys/kernel/panic")}, nil)
	var ws watchStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 20}, &ws)
	t.Logf("watch stop: %s", text(res))
	if ws.Hart == nil || *ws.Hart != 1 || ws.Access == nil || ws.Access.Old != "0x0" || ws.Access.New != "0x7" ||
		ws.Access.Insn.Function != "do_proc_dointvec_conv" || ws.Access.Insn.File != "kernel/sysctl.c" || ws.Access.Insn.Line == 0 ||
		!strings.HasPrefix(ws.Access.Text, want.store) {
		t.Fatalf("watch stop: %+v, access %+v", ws.hartStopOut, ws.Access)
	}
	if ws.Backtrace == nil || len(ws.Backtrace.Frames) < 3 {
		t.Errorf("watch stop backtrace: %+v", ws.Backtrace)
	}
	s.mustCall("debug_watch", map[string]any{"location": "panic_timeout", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, nil)

	// A breakpoint from CPU 3, and the system call under it.
	s.mustCall("debug_break", map[string]any{"location": "version_proc_show"}, nil)
	s.mustCall("serial_send", map[string]any{"data": "taskset 0x8 cat /proc/version"}, nil)
	var st hartStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 20}, &st)
	if st.Hart == nil || *st.Hart != 3 || want.processors && (st.Processor == nil || *st.Processor != 3) || st.Function != "version_proc_show" {
		t.Fatalf("breakpoint from CPU 3: %s: %+v", text(res), st)
	}
	var bt struct {
		backtraceOut
		Hart *int `json:"hart"`
	}
	res = s.call("debug_backtrace", nil, &bt)
	t.Logf("backtrace on CPU 3:\n%s", text(res))
	if last := bt.Frames[len(bt.Frames)-1]; bt.Hart == nil || *bt.Hart != 3 || bt.Frames[0].Function != "version_proc_show" ||
		want.caller != "" && (len(bt.Frames) < 2 || bt.Frames[1].Function != want.caller) ||
		!last.User || last.Trap == nil || !strings.HasPrefix(last.Trap.Cause, want.syscall) {
		t.Errorf("backtrace of CPU 3: %+v", bt)
	}
	// Stepping, disassembly, and a breakpoint by file:LINE.
	var dis struct {
		Instructions []string `json:"instructions"`
	}
	s.mustCall("debug_disassemble", map[string]any{"location": "version_proc_show", "count": 6}, &dis)
	if all := strings.Join(dis.Instructions, "\n"); !strings.Contains(all, "<version_proc_show>:") || !want.prologue(all) {
		t.Errorf("disassembly of version_proc_show:\n%s", all)
	}
	s.mustCall("debug_step", map[string]any{"count": 2}, &st)
	if st.Hart == nil || *st.Hart != 3 || st.Function != "version_proc_show" || want.stepOffset != "" && st.Offset != want.stepOffset {
		t.Errorf("two steps into version_proc_show on CPU 3: %+v", st)
	}
	var br breakOut
	s.mustCall("debug_break", map[string]any{"location": "kernel/sysctl.c:455"}, &br)
	if len(br.Breakpoints) == 0 || br.Breakpoints[0].Function != "do_proc_dointvec_conv" {
		t.Errorf("a breakpoint at kernel/sysctl.c:455: %+v", br)
	}
	s.mustCall("debug_break", map[string]any{"location": "kernel/sysctl.c:455", "remove": true}, nil)
	s.mustCall("debug_break", map[string]any{"location": "version_proc_show", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, nil)

	// The walk agrees with QEMU's.
	gpa := s.qemuTranslates("linux_banner")
	var walk walkOut
	res = s.call("debug_translate", map[string]any{"address": "linux_banner"}, &walk)
	t.Logf("gva2gpa: %q; walk: %s", gpa, text(res))
	if walk.PA == "" || !strings.Contains(gpa, "gpa: "+walk.PA) || len(walk.Levels) == 0 || !want.walk(walk) {
		t.Errorf("translate linux_banner: %+v; QEMU says %q", walk, gpa)
	}
	var mem memoryOut
	s.mustCall("debug_memory", map[string]any{"location": "linux_banner", "length": 32}, &mem)
	if !strings.Contains(mem.Hexdump, "|Linux version 6.") {
		t.Errorf("linux_banner:\n%s", mem.Hexdump)
	}
	s.mustCall("debug_translate", map[string]any{"address": "0x0"}, &walk)
	if walk.PA != "" || !strings.Contains(walk.Fault, want.unmapped) {
		t.Errorf("translate 0x0: %+v", walk)
	}
	s.wantError("debug_translate", map[string]any{"address": "linux_banner", "satp": "0x1"}, "satp is riscv64's page table register", "leave satp out")

	type triaged struct {
		Panicked bool `json:"panicked"`
		Triage   *struct {
			Hart    int       `json:"hart"`
			Culprit *whereOut `json:"culprit"`
			Verdict string    `json:"verdict"`
		} `json:"triage"`
		TriageError string `json:"triage_error"`
	}
	for _, tc := range []struct {
		crash, culprit string
		cpu            int
		verdict        []string
	}{
		{"WRITE_RO", "lkdtm_WRITE_RO", 2, want.writeRO},
		{"ACCESS_NULL", "lkdtm_ACCESS_NULL", 0, want.null},
	} {
		if tc.crash != "WRITE_RO" {
			boot()
		}
		s.mustCall("serial_send", map[string]any{"data": "mount -t debugfs none /sys/kernel/debug; echo 1 > /proc/sys/kernel/panic_on_oops", "wait_for": testguest.LinuxPrompt}, nil)
		var p triaged
		res := s.call("serial_send", map[string]any{"data": pin(tc.cpu, "echo "+tc.crash+" > /sys/kernel/debug/provoke-crash/DIRECT"), "wait_for": testguest.LinuxPrompt, "timeout": 30}, &p)
		t.Logf("%s: %s", tc.crash, text(res))
		if !p.Panicked || p.Triage == nil || p.Triage.Hart != tc.cpu || p.Triage.Culprit == nil || p.Triage.Culprit.Function != tc.culprit {
			t.Errorf("%s on CPU %d: %+v (%s)", tc.crash, tc.cpu, p.Triage, p.TriageError)
			continue
		}
		for _, v := range tc.verdict {
			if !strings.Contains(p.Triage.Verdict, v) {
				t.Errorf("%s verdict %q lacks %q", tc.crash, p.Triage.Verdict, v)
			}
		}
	}
}

// TestTimeTravelLinux on the aarch64 Linux guest: record, replay, the last
// write to panic_timeout and the one before it, reverse continue and step,
// an instruction count, triage; checkpoints where this QEMU was probed to
// reload them.
func TestAarch64TimeTravelLinux(t *testing.T) {
	archTimeTravelLinux(t, arm64.Arch, "__arm64_sys_newuname")
}

// archTimeTravelLinux is TestTimeTravelLinux on a's Linux guest, booted
// with the options that keep a's replays as fast as its recordings; uname
// is a's system call of uname.
func archTimeTravelLinux(t *testing.T, a arch.Arch, uname string) {
	lin := testguest.ArchLinux(t, a)
	state := t.TempDir()
	s, _ := archSession(t, a, func(c *testConfig) {
		c.WorkDir, c.AllowPaths = lin.Dir, []string{lin.Dir}
		c.Captures = filepath.Join(state, "captures")
		os.MkdirAll(c.Captures, 0o700)
	})
	appendLine := strings.Join(append([]string{lin.Append}, a.QEMU().ReplayAppend...), " ")
	boot := func(extra map[string]any) {
		t.Helper()
		args := map[string]any{"kernel": lin.Kernel, "initrd": lin.Initrd, "append": appendLine, "memory": "256M",
			"wait_for": testguest.LinuxPrompt, "timeout": 120, "restart": true}
		maps.Copy(args, extra)
		var b bootOut
		if res := s.call("qemu_boot", args, &b); res.IsError || !b.Matched {
			t.Fatalf("boot %v: %s %+v", extra, text(res), b)
		}
	}
	// The recording makes checkpoints where the probe said this QEMU
	// reloads them: the tiny kernel's boot has the QEMU probed first.
	s.mustCall("qemu_boot", map[string]any{"arch": a.Name(), "wait_for": prompt, "timeout": 30}, nil)
	probedArch(t, s, a.Name())
	checkpoints := func() bool {
		p, _, _ := probedArch(t, s, a.Name())
		t.Logf("%s: replay checkpoints %+v", p.Version, p.Caps.Replay)
		return p.Caps.Replay != nil && p.Caps.Replay.Answer == "yes"
	}
	timeTravelLinux(t, s, lin, filepath.Join(state, "recordings"), boot, checkpoints, uname)
}

// The built-in aarch64 tiny kernel under the debugger, its own ELF the
// symbols: a breakpoint by symbol stops the shell's echo; at EL1 with the
// MMU off, registers say so and a translation is the identity; the
// backtrace, a step and the disassembly of its halt loop read.
func TestAarch64DebugTinyKernel(t *testing.T) {
	s, _ := aarch64Session(t, nil)
	var b struct {
		bootOut
		Symbols string `json:"symbols"`
	}
	s.mustCall("qemu_boot", map[string]any{"arch": "aarch64", "gdb": true, "wait_for": prompt, "timeout": 30}, &b)
	if !b.Matched || !strings.HasSuffix(b.Symbols, ".elf") {
		t.Fatalf("boot: %+v", b)
	}
	s.breakIn("cmd_echo", "testdata/images/tiny-aarch64/kernel.S")
	s.mustCall("serial_send", map[string]any{"data": "echo hi"}, nil)
	var st hartStopOut
	s.mustCall("debug_continue", map[string]any{"timeout": 10}, &st)
	if st.Reason != "breakpoint" || st.Function != "cmd_echo" || st.Insn == "" {
		t.Fatalf("continue to cmd_echo: %+v", st)
	}
	var regs struct {
		Priv        string `json:"priv"`
		Translation string `json:"translation"`
		PC          whereOut
	}
	s.mustCall("debug_registers", nil, &regs)
	if regs.Priv != "EL1" || !strings.HasPrefix(regs.Translation, "MMU off") {
		t.Errorf("registers at cmd_echo: %+v", regs)
	}
	var walk walkOut
	s.mustCall("debug_translate", map[string]any{"address": "cmd_echo"}, &walk)
	var sym struct {
		Locations []whereOut `json:"locations"`
	}
	s.mustCall("debug_symbolize", map[string]any{"address": "cmd_echo"}, &sym)
	if walk.Mode != "MMU off" || len(sym.Locations) == 0 || walk.PA != sym.Locations[0].Addr {
		t.Errorf("translate cmd_echo with the MMU off: %+v (cmd_echo at %+v)", walk, sym.Locations)
	}
	var bt backtraceOut
	s.mustCall("debug_backtrace", nil, &bt)
	if len(bt.Frames) < 2 || bt.Frames[0].Function != "cmd_echo" {
		t.Errorf("backtrace at cmd_echo: %+v", bt)
	}
	s.mustCall("debug_step", nil, &st)
	if st.Reason != "step" || st.Function != "cmd_echo" || st.Offset != "0x4" {
		t.Errorf("a step from cmd_echo: %+v", st)
	}
	var dis struct {
		Instructions []string `json:"instructions"`
	}
	s.mustCall("debug_disassemble", map[string]any{"location": "halt", "count": 3}, &dis)
	if all := strings.Join(dis.Instructions, "\n"); !strings.Contains(all, "<halt>:") || !strings.Contains(all, "wfi") || strings.Contains(all, ".word") {
		t.Errorf("disassembly of halt:\n%s", all)
	}
	s.mustCall("debug_break", map[string]any{"location": "cmd_echo", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, nil)
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": "hi\r\n" + prompt, "timeout": 5}, &w)
	if !w.Matched {
		t.Errorf("echo after continuing: %+v", w)
	}
}
