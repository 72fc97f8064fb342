package tools_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The tutor kernel (testdata/kernels/tutor) is not Linux: it boots with
// -bios none in M-mode on three harts, drops to S-mode with Sv39, and
// runs a shell in U-mode. Booted from the line its make -n qemu prints
// (command_line), the debugger works on it through the tools as on
// Linux: breakpoints in its system calls, watchpoints on its data, and a
// crash triage that finds the hart that crashed by its stack and trap
// CSRs, in S-mode and in M-mode.

// tutorPrompt is the tutor shell's prompt (tutor_test.go waits for it
// too).
const tutorPrompt = `\$ $`

// tutorPanics are the panic patterns of the tutor kernel, whose panic()
// prints "panic: why": the server's defaults (Linux, OpenSBI, U-Boot) do
// not know it.
var tutorPanics = []string{`(?m)^panic: [^\r\n]*`}

// tutorTriage is what the tests read of a triage.
type tutorTriage struct {
	Hart int      `json:"hart"`
	Priv string   `json:"priv"`
	PC   whereOut `json:"pc"`
	Trap *struct {
		Cause string    `json:"cause"`
		Code  int       `json:"code"`
		EPC   *whereOut `json:"epc"`
		TVal  string    `json:"tval"`
	} `json:"trap"`
	TrapSource string        `json:"trap_source"`
	Culprit    *whereOut     `json:"culprit"`
	Verdict    string        `json:"verdict"`
	Walk       *struct{}     `json:"walk"`
	Backtrace  *backtraceOut `json:"backtrace"`
	Others     []hartOut     `json:"other_harts"`
}

type tutorWait struct {
	bootOut
	Panicked    bool         `json:"panicked"`
	PanicMatch  string       `json:"panic_match"`
	Triage      *tutorTriage `json:"triage"`
	TriageError string       `json:"triage_error"`
}

// tutorSession builds the tutor kernel (patched by patch, if not nil) and
// starts a server whose working directory is the build's.
func tutorSession(t *testing.T, patch func(dir string) error) (*session, string) {
	t.Helper()
	needQEMU(t)
	dir := testguest.Tutor(t, patch)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = dir }, nil)
	return s, dir
}

// tutorBootArgs boots the kernel of dir from the line its make qemu
// runs, with the debugger, waiting for the shell's prompt.
func tutorBootArgs(t *testing.T, dir string) map[string]any {
	return map[string]any{"command_line": testguest.TutorQEMULine(t, dir), "gdb": true,
		"wait_for": tutorPrompt, "panic_patterns": tutorPanics, "timeout": 30}
}

// insertBefore is a patch that inserts lines before the first line of
// file that is exactly at.
func insertBefore(file, at string, lines ...string) func(dir string) error {
	return func(dir string) error {
		p := filepath.Join(dir, file)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		src := string(b)
		i := strings.Index(src, "\n"+at+"\n")
		if i < 0 {
			return fmt.Errorf("%s: no line %q", file, at)
		}
		src = src[:i+1] + strings.Join(lines, "\n") + "\n" + src[i+1:]
		return os.WriteFile(p, []byte(src), 0o644)
	}
}

func patches(ps ...func(dir string) error) func(dir string) error {
	return func(dir string) error {
		var errs []error
		for _, p := range ps {
			errs = append(errs, p(dir))
		}
		return errors.Join(errs...)
	}
}

// A breakpoint in a system call stops the hart that makes it, in the
// call's function at its file:line, with a backtrace through the trap
// handler (usertrap) that dispatched it; a watchpoint on the tick count
// names the function that counts (clockintr) and the value before and
// after.
func TestTutorDebugBreakAndWatch(t *testing.T) {
	s, dir := tutorSession(t, nil)
	var b tutorWait
	s.mustCall("qemu_boot", tutorBootArgs(t, dir), &b)
	if !b.Matched || b.Panicked {
		t.Fatalf("boot: %+v", b)
	}

	s.breakIn("sys_ticks", "kernel/syscall.c")
	s.mustCall("serial_send", map[string]any{"data": "ticks"}, nil)
	var st hartStopOut
	res := s.call("debug_continue", map[string]any{"timeout": 10}, &st)
	t.Logf("breakpoint: %s", text(res))
	if !st.Stopped || st.Reason != "breakpoint" || st.Function != "sys_ticks" || st.File != "kernel/syscall.c" || st.Line == 0 || st.Hart == nil {
		t.Fatalf("debug_continue to sys_ticks: %+v", st)
	}
	var bt struct {
		backtraceOut
		Hart *int `json:"hart"`
	}
	res = s.call("debug_backtrace", nil, &bt)
	t.Logf("backtrace:\n%s", text(res))
	var fns []string
	for _, f := range bt.Frames {
		fns = append(fns, f.Function)
	}
	if bt.Hart == nil || *bt.Hart != *st.Hart || len(fns) < 3 || fns[0] != "sys_ticks" || fns[1] != "syscall" || fns[2] != "usertrap" {
		t.Errorf("backtrace from sys_ticks: hart %v, %v", bt.Hart, fns)
	}
	s.mustCall("debug_break", map[string]any{"location": "sys_ticks", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, nil)
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": `\d+\r\n` + tutorPrompt, "timeout": 5}, &w)
	if !w.Matched {
		t.Fatalf("ticks after the breakpoint: %+v", w)
	}

	// A write watchpoint on the tick count.
	s.watchWrites("ticks", 8)
	var ws watchStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 10}, &ws)
	t.Logf("watchpoint: %s", text(res))
	if ws.Access == nil || ws.Access.Kind != "write" || ws.Access.Insn.Function != "clockintr" || ws.Access.Insn.File != "kernel/trap.c" ||
		ws.Access.Old == "" || ws.Access.New == "" || !oneApart(ws.Access.Old, ws.Access.New) || ws.Hart == nil || *ws.Hart != 0 {
		t.Fatalf("watch stop: %+v, access %+v", ws.hartStopOut, ws.Access)
	}
	s.mustCall("debug_watch", map[string]any{"location": "ticks", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.2}, nil)
	s.mustCall("serial_send", map[string]any{"data": "ticks", "wait_for": `\d+\r\n` + tutorPrompt}, &w)
	if !w.Matched {
		t.Fatalf("ticks after the watchpoint: %+v", w)
	}
}

// oneApart says whether new is old + 1 (both 0x... numbers).
func oneApart(old, new string) bool {
	var o, n uint64
	if _, err := fmt.Sscanf(old, "0x%x", &o); err != nil {
		return false
	}
	if _, err := fmt.Sscanf(new, "0x%x", &n); err != nil {
		return false
	}
	return n == o+1
}

// A NULL store planted in a system call: the kernel's trap handler
// prints the trap and panics; the wait that sees the panic gets a triage
// that names the hart, the system call at its file:line, and a store
// page fault at 0x0, from scause (this kernel's trap frames are not
// Linux's).
func TestTutorTriageNullStore(t *testing.T) {
	s, dir := tutorSession(t, insertBefore("kernel/syscall.c", "  return ticks;", "  *(volatile int *)0 = 1;"))
	line := testguest.SourceLine(t, filepath.Join(dir, "kernel", "syscall.c"), "*(volatile int *)0 = 1;")
	var b tutorWait
	s.mustCall("qemu_boot", tutorBootArgs(t, dir), &b)
	if !b.Matched || b.Panicked {
		t.Fatalf("boot: %+v", b)
	}
	var p tutorWait
	res := s.call("serial_send", map[string]any{"data": "ticks", "wait_for": tutorPrompt, "panic_patterns": tutorPanics, "timeout": 10}, &p)
	t.Logf("ticks: %s", text(res))
	if !p.Panicked || !strings.Contains(p.PanicMatch, "panic: kerneltrap") || p.Triage == nil {
		t.Fatalf("no panic, or no triage: %+v (%s)", p.bootOut, p.TriageError)
	}
	tr := p.Triage
	if tr.Hart != 0 || tr.Priv != "supervisor" {
		t.Errorf("triage of hart %d (%s), want hart 0 in S-mode", tr.Hart, tr.Priv)
	}
	if tr.Culprit == nil || tr.Culprit.Function != "sys_ticks" || tr.Culprit.File != "kernel/syscall.c" || tr.Culprit.Line != line {
		t.Errorf("culprit %+v, want sys_ticks at kernel/syscall.c:%d", tr.Culprit, line)
	}
	if tr.Trap == nil || tr.Trap.Cause != "store/AMO page fault" || tr.Trap.TVal != "0x0" || !strings.HasPrefix(tr.TrapSource, "scause") ||
		!strings.Contains(tr.Verdict, "store page fault at 0x0 from S-mode: no mapping") || tr.Walk == nil {
		t.Errorf("trap %+v from %q, verdict %q", tr.Trap, tr.TrapSource, tr.Verdict)
	}
	panicked := false
	for _, f := range tr.Backtrace.Frames {
		panicked = panicked || f.Function == "panic"
	}
	if !panicked || len(tr.Others) != 2 {
		t.Errorf("backtrace %+v; others %+v", tr.Backtrace, tr.Others)
	}
	for _, o := range tr.Others {
		if o.State != "idle" || !o.Halted {
			t.Errorf("other hart %d: %+v, want idle in wfi", o.Hart, o)
		}
	}
}

// A store to 0x0 in M-mode, on hart 2 in start() before it ever runs in
// S-mode, into an mtvec that reports it and spins: the triage finds hart
// 2 by its mcause, reads mcause, mepc and mtval, names start() as the
// culprit and judges the address as physical.
func TestTutorTriageMachineMode(t *testing.T) {
	s, dir := tutorSession(t, patches(
		insertBefore("kernel/start.c", "// start runs in M-mode on the hart's own stack (entry.S). It prepares",
			"// mtrap_report is the M-mode trap vector of a hart that faults in start():",
			"// it reports the trap and spins.",
			"__attribute__((aligned(4))) void mtrap_report(void)",
			"{",
			`	printf("panic: M-mode trap mcause=0x%lx mepc=0x%lx mtval=0x%lx\n", csr_read(mcause), csr_read(mepc), csr_read(mtval));`,
			"	for (;;)",
			"		;",
			"}",
			""),
		insertBefore("kernel/start.c", "	csr_write(mstatus, (ms & ~MSTATUS_MPP_MASK) | MSTATUS_MPP_S);",
			"	if (hart == 2) {",
			"		csr_write(mtvec, mtrap_report);",
			"		*(volatile int *)0 = 1;",
			"	}"),
	))
	line := testguest.SourceLine(t, filepath.Join(dir, "kernel", "start.c"), "*(volatile int *)0 = 1;")
	var b tutorWait
	res := s.call("qemu_boot", tutorBootArgs(t, dir), &b)
	t.Logf("boot: %s", text(res))
	if res.IsError || !b.Panicked || !strings.Contains(b.PanicMatch, "panic: M-mode trap mcause=0x7") || b.Triage == nil {
		t.Fatalf("boot: %+v, triage error %q", b.bootOut, b.TriageError)
	}
	tr := b.Triage
	// The hart is in mtrap_report (its loop, or the end of its printf).
	inReport := false
	for _, f := range tr.Backtrace.Frames {
		inReport = inReport || f.Function == "mtrap_report"
	}
	if tr.Hart != 2 || tr.Priv != "machine" || !inReport {
		t.Errorf("triage of hart %d (%s) at %+v, want hart 2 in M-mode in mtrap_report: %+v", tr.Hart, tr.Priv, tr.PC, tr.Backtrace)
	}
	if tr.Trap == nil || tr.Trap.Cause != "store/AMO access fault" || tr.Trap.TVal != "0x0" || !strings.HasPrefix(tr.TrapSource, "mcause") {
		t.Errorf("trap %+v from %q", tr.Trap, tr.TrapSource)
	}
	if tr.Culprit == nil || tr.Culprit.Function != "start" || tr.Culprit.File != "kernel/start.c" || tr.Culprit.Line != line {
		t.Errorf("culprit %+v, want start at kernel/start.c:%d", tr.Culprit, line)
	}
	if !strings.Contains(tr.Verdict, "store access fault at 0x0 from M-mode (a physical address") || tr.Walk != nil {
		t.Errorf("verdict %q, walk %v", tr.Verdict, tr.Walk)
	}
	// The others boot on (hart 0 may not have left QEMU's reset ROM at
	// 0x1000 yet: firmware), or wait.
	for _, o := range tr.Others {
		if o.State == "panic" || o.State == "trap" {
			t.Errorf("other hart %d: %+v", o.Hart, o)
		}
	}

	// Every hart at a glance: hart 2 is in a trap, in M-mode, in the
	// kernel's code (not firmware).
	var all struct {
		Harts []hartOut `json:"harts"`
	}
	res = s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
	t.Logf("all harts:\n%s", text(res))
	if len(all.Harts) != 3 || all.Harts[2].State != "trap" || all.Harts[2].Priv != "machine" {
		t.Errorf("all_harts: %+v", all.Harts)
	}
}
