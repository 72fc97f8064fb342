package tools_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// The debugger on the x86_64 Linux guest with 4 vCPUs: every vCPU's
// backtrace at ring 0; registers with RFLAGS, CS and the paging mode; a
// write watchpoint on panic_timeout names do_proc_dointvec_conv with old
// and new; a breakpoint reached from a task pinned to CPU 3 unwinds to the
// system call; the walk of linux_banner agrees with QEMU's gva2gpa; LKDTM's
// WRITE_RO forced onto CPU 2 is triaged on CPU 2 as a write to a present
// read-only page, ACCESS_NULL as a not-present page at 0x0.
func TestX86DebugLinux(t *testing.T) {
	lin := testguest.ArchLinux(t, x86_64.Arch)
	s, _ := archSession(t, x86_64.Arch, func(c *testConfig) { c.WorkDir, c.AllowPaths = lin.Dir, []string{lin.Dir} })
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
	// Every CPU idles once the boot's deferred work is done: a CPU
	// still freeing the boot's memory (RCU callbacks) right after the
	// prompt is running, and asked again a moment later, idle.
	var res *mcp.CallToolResult
	for try := 0; ; try++ {
		res = s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
		t.Logf("all_harts:\n%s", text(res))
		if len(all.Harts) != 4 {
			t.Fatalf("all_harts: %+v", all)
		}
		if try == 20 || !slices.ContainsFunc(all.Harts, func(h hartOut) bool { return h.State != "idle" }) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i, h := range all.Harts {
		if h.Hart != i || h.Priv != "ring 0" || h.State == "" || len(h.Backtrace) < 3 {
			t.Errorf("all_harts[%d]: %+v", i, h)
		}
	}
	// CPU 0 idles under rest_init, which arch_call_rest_init (freed init
	// text, poisoned) called as its last instruction.
	if i := slices.Index(all.Harts[0].Backtrace, "rest_init"); i < 0 || i+1 >= len(all.Harts[0].Backtrace) || all.Harts[0].Backtrace[i+1] != "arch_call_rest_init" {
		t.Errorf("CPU 0's backtrace: %q, want rest_init < arch_call_rest_init", all.Harts[0].Backtrace)
	}
	for i, h := range all.Harts {
		if h.State != "idle" {
			t.Errorf("CPU %d is %s, want idle", i, h.State)
		}
	}
	var regs struct {
		Priv        string            `json:"priv"`
		System      map[string]string `json:"system"`
		Status      string            `json:"status"`
		Translation string            `json:"translation"`
	}
	res = s.call("debug_registers", map[string]any{"hart": 1}, &regs)
	t.Logf("registers: %s", text(res))
	if regs.Priv != "ring 0" || regs.System["cr3"] == "" || !strings.Contains(regs.Translation, "4-level paging") ||
		!strings.HasPrefix(regs.Status, "RFLAGS ") || !strings.Contains(regs.Status, "CS 0x10 (CPL 0)") {
		t.Errorf("registers of CPU 1: %+v", regs)
	}

	// Who wrote panic_timeout, and from which vCPU.
	s.watchWrites("panic_timeout", 4)
	s.mustCall("serial_send", map[string]any{"data": pin(1, "echo 7 > /proc/sys/kernel/panic")}, nil)
	var ws watchStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 20}, &ws)
	t.Logf("watch stop: %s", text(res))
	if ws.Hart == nil || *ws.Hart != 1 || ws.Access == nil || ws.Access.Old != "0x0" || ws.Access.New != "0x7" ||
		ws.Access.Insn.Function != "do_proc_dointvec_conv" || ws.Access.Insn.File != "kernel/sysctl.c" || ws.Access.Insn.Line == 0 ||
		!strings.HasPrefix(ws.Access.Text, "mov") {
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
	if st.Hart == nil || *st.Hart != 3 || st.Function != "version_proc_show" {
		t.Fatalf("breakpoint from CPU 3: %s: %+v", text(res), st)
	}
	var bt struct {
		backtraceOut
		Hart *int `json:"hart"`
	}
	res = s.call("debug_backtrace", nil, &bt)
	t.Logf("backtrace on CPU 3:\n%s", text(res))
	if last := bt.Frames[len(bt.Frames)-1]; bt.Hart == nil || *bt.Hart != 3 || bt.Frames[0].Function != "version_proc_show" ||
		len(bt.Frames) < 2 || bt.Frames[1].Function != "seq_read_iter" || !last.User || last.Trap == nil || !strings.HasPrefix(last.Trap.Cause, "system call") {
		t.Errorf("backtrace of CPU 3: %+v", bt)
	}
	var dis struct {
		Instructions []string `json:"instructions"`
	}
	s.mustCall("debug_disassemble", map[string]any{"location": "version_proc_show", "count": 6}, &dis)
	if all := strings.Join(dis.Instructions, "\n"); !strings.Contains(all, "<version_proc_show>:") || !strings.Contains(all, "push") || strings.Contains(all, ".byte") {
		t.Errorf("disassembly of version_proc_show:\n%s", all)
	}
	s.mustCall("debug_break", map[string]any{"location": "version_proc_show", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, nil)

	// The walk agrees with QEMU's.
	gpa := s.qemuTranslates("linux_banner")
	var walk walkOut
	res = s.call("debug_translate", map[string]any{"address": "linux_banner"}, &walk)
	t.Logf("gva2gpa: %q; walk: %s", gpa, text(res))
	if walk.PA == "" || !strings.Contains(gpa, "gpa: "+walk.PA) || len(walk.Levels) == 0 {
		t.Errorf("translate linux_banner: %+v; QEMU says %q", walk, gpa)
	}
	s.mustCall("debug_translate", map[string]any{"address": "0x0"}, &walk)
	if walk.PA != "" || !strings.Contains(walk.Fault, "not present") {
		t.Errorf("translate 0x0: %+v", walk)
	}

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
		{"WRITE_RO", "lkdtm_WRITE_RO", 2, []string{"page fault: write to a present read-only page in kernel mode", "at 0x"}},
		{"ACCESS_NULL", "lkdtm_ACCESS_NULL", 0, []string{"page fault: not present, address 0x0", "NULL pointer"}},
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

// TestTimeTravelLinux on the x86_64 Linux guest.
func TestX86TimeTravelLinux(t *testing.T) {
	archTimeTravelLinux(t, x86_64.Arch, "__x64_sys_newuname")
}

// A recording of an x86_64 kernel whose command line lacks the options
// that keep its replays fast is told which, and why; with them, or with
// no command line (not Linux), nothing is said.
func TestX86RecordAdvice(t *testing.T) {
	s, _ := archSession(t, x86_64.Arch, nil)
	for i, tc := range []struct{ append, want string }{
		{"console=ttyS0 no_timer_check", "append noapictimer for replays as fast as the recording"},
		{"", ""},
		{"console=ttyS0 noapictimer no_timer_check", ""},
	} {
		args := map[string]any{"arch": "x86_64", "record": fmt.Sprint("r", i), "wait_for": prompt, "timeout": 30, "restart": true}
		if tc.append != "" {
			args["append"] = tc.append
		}
		var b struct {
			Recording *struct {
				Advice string `json:"advice"`
			} `json:"recording"`
		}
		res := s.call("qemu_boot", args, &b)
		if res.IsError || b.Recording == nil {
			t.Fatalf("record with append %q: %s", tc.append, text(res))
		}
		if !strings.HasPrefix(b.Recording.Advice, tc.want) || (tc.want == "") != (b.Recording.Advice == "") ||
			strings.Contains(text(res), "advice:") != (tc.want != "") {
			t.Errorf("record with append %q: advice %q, want %q; text:\n%s", tc.append, b.Recording.Advice, tc.want, text(res))
		}
		s.mustCall("qemu_shutdown", nil, nil)
	}
}
