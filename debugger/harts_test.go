package debugger

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
)

// rv is the architecture of the guests these tests describe.
var rv = riscv64.Arch.Debugger()

// cause is a trap of riscv64's cause v, as a frame shows it.
func cause(v uint64) Trap { return (&Session{}).trap(riscv64.DecodeCause(v), false) }

// privs are riscv64's privilege levels by name.
var privs = map[string]uint64{"user": 0, "supervisor": 1, "machine": 3}

func frames(spec ...any) []Frame {
	var out []Frame
	for _, x := range spec {
		switch v := x.(type) {
		case string:
			out = append(out, Frame{Where: Where{Addr: "0xffffffff80001000", Function: v}})
		case Trap:
			t := v
			out[len(out)-1].Trap = &t
		case bool: // the frame before is the user program's
			out[len(out)-1].User = v
			out[len(out)-1].Function = ""
		}
	}
	return out
}

var (
	ipi    = cause(1<<63 | 1)
	timer  = cause(1<<63 | 5)
	ecall  = cause(8)
	pageWr = cause(15)
)

// What a hart does, from its stack: the shapes Linux 6.1 leaves on a
// four-hart guest after a sysrq crash on one of them, and the others; and
// those of a kernel that is not Linux (xv6-style: no trap frames the
// unwinder knows, its fault in the trap CSRs, some of it in M-mode).
func TestClassifyAndCrashScore(t *testing.T) {
	for _, tc := range []struct {
		name, priv string
		f          []Frame
		fault      bool // the trap CSRs show a fault being handled
		state      string
		score      int
	}{
		{"stopped by panic's IPI", "supervisor", frames("handle_IPI", "riscv_intc_irq", "generic_handle_arch_irq", "ret_from_exception",
			"arch_cpu_idle", ipi, "default_idle_call", "do_idle", "cpu_startup_entry"), false, "ipi", -4},
		{"the crash", "supervisor", frames("__delay", "udelay", "panic", "sysrq_handle_crash", "__handle_sysrq", "write_sysrq_trigger",
			"check_syscall_nr", "user", ecall, true), false, "panic", 8},
		{"an oops on a kernel fault", "supervisor", frames("panic", "make_task_dead", "die_kernel_fault", "do_page_fault",
			"ret_from_exception", "lkdtm_WRITE_RO", pageWr, "lkdtm_do_action"), false, "panic", 12},
		{"an oops, its fault also in scause", "supervisor", frames("panic", "make_task_dead", "die_kernel_fault", "do_page_fault",
			"ret_from_exception", "lkdtm_WRITE_RO", pageWr, "lkdtm_do_action"), true, "panic", 12},
		{"a user page fault being handled", "supervisor", frames("handle_mm_fault", "do_page_fault", "ret_from_exception",
			"user", pageWr, true), false, "trap", 0},
		{"idle", "supervisor", frames("arch_cpu_idle", "default_idle_call", "do_idle", "cpu_startup_entry", "smp_callin"), false, "idle", 0},
		{"a timer tick on an idle hart", "supervisor", frames("riscv_timer_interrupt", "handle_percpu_devid_irq", "riscv_intc_irq",
			"ret_from_exception", "arch_cpu_idle", timer, "do_idle"), false, "trap", 0},
		{"spinning", "supervisor", frames("_raw_spin_lock_irqsave", "try_to_wake_up", "check_syscall_nr", "user", ecall, true), false, "lock", 0},
		{"a system call", "supervisor", frames("do_sys_openat2", "sys_openat", "check_syscall_nr", "user", ecall, true), false, "running", 0},
		{"in the trap vector", "supervisor", frames("handle_exception"), false, "trap", 0},
		{"user", "user", frames("user", true), false, "user", 0},
		{"firmware", "machine", frames(""), false, "firmware", 0},
		{"firmware in a fault (sbi_trap_error)", "machine", frames(""), true, "firmware", 4},
		{"CPU hot-unplug", "supervisor", frames("__cpu_die", "takedown_cpu"), false, "running", 0},

		{"xv6: panic in kerneltrap", "supervisor", frames("uartputc_sync", "printf", "panic", "kerneltrap", "kernelvec"), true, "panic", 12},
		{"xv6: panic without a fault", "supervisor", frames("panic", "sys_crash", "syscall", "usertrap"), false, "panic", 8},
		{"xv6: in kerneltrap before it panics", "supervisor", frames("kerneltrap", "kernelvec"), true, "trap", 4},
		{"xv6: the scheduler", "supervisor", frames("scheduler", "main"), false, "running", 0},
		{"M-mode: start", "machine", frames("start", "_entry"), false, "machine mode", 0},
		{"M-mode: a fault into a spinning mtvec", "machine", frames("mtrap_spin"), true, "trap", 4},
		{"M-mode: panic", "machine", frames("kpanic", "mtrap"), true, "panic", 12},
		{"abort", "supervisor", frames("abort", "kmain"), false, "panic", 8},
		{"an assertion", "supervisor", frames("__assert_fail", "kalloc"), false, "panic", 8},
	} {
		if got := classify(rv, rv.Privilege(privs[tc.priv]), tc.f, tc.fault); got != tc.state {
			t.Errorf("%s: state %s, want %s", tc.name, got, tc.state)
		}
		if got := crashScore(rv, Backtrace{Frames: tc.f}, tc.fault); got != tc.score {
			t.Errorf("%s: crash score %d, want %d", tc.name, got, tc.score)
		}
		if stateWords[tc.state] == "" {
			t.Errorf("state %s has no words", tc.state)
		}
	}
}

// Crash machinery by name, beyond Linux's: panic anywhere in a name,
// abort, die, halt, oops as a word; not the words inside other words, nor
// Linux's CPU hot-unplug.
func TestPanicLike(t *testing.T) {
	for fn, want := range map[string]bool{
		"panic": true, "kpanic": true, "Panic": true, "panic_halt": true, "kernel_panic": true, "do_panic": true,
		"abort": true, "k_abort": true, "die": true, "die_if_kernel": true, "halt": true, "cpu_halt": true, "oops": true, "hcf": true,
		"__assert_fail": true, "__assert_func": true, "__stack_chk_fail": true,
		"diet": false, "halted_wait": false, "dies": false, "aborted": false, "": false, "scheduler": false, "kerneltrap": false,
		"cpu_die": false, "__cpu_die": false, "sysrq_handle_crash": false, "fatal_signal_pending": false, "do_exit": false,
	} {
		if got := panicLike(fn); got != want {
			t.Errorf("panicLike(%q) = %v, want %v", fn, got, want)
		}
	}
}

// The crashing frame: a trap's epc; else the caller of the outermost
// panic, whatever its name.
func TestCulprit(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    []Frame
		want string
	}{
		{"Linux sysrq", frames("__delay", "udelay", "panic", "sysrq_handle_crash", "__handle_sysrq"), "sysrq_handle_crash"},
		{"xv6 kerneltrap", frames("consputc", "printf", "panic", "kerneltrap", "kernelvec"), "kerneltrap"},
		{"a kernel's own names", frames("uart_put", "kpanic", "kassert_failed", "vm_map"), "kassert_failed"},
		{"no panic", frames("scheduler", "main"), ""},
	} {
		name := ""
		if got := culprit(rv, Backtrace{Frames: tc.f}, nil); got != nil {
			name = got.Function
		}
		if name != tc.want {
			t.Errorf("%s: culprit %q, want %q", tc.name, name, tc.want)
		}
	}
	epc := Where{Addr: "0x80001234", Function: "sys_ticks"}
	if got := culprit(rv, Backtrace{Frames: frames("panic", "kerneltrap")}, &Trap{EPC: &epc}); got == nil || got.Function != "sys_ticks" {
		t.Errorf("a trap's epc: %+v", got)
	}
}

func TestHartLine(t *testing.T) {
	bt := Backtrace{Frames: frames("handle_IPI", "riscv_intc_irq", "ret_from_exception", "arch_cpu_idle", ipi, "do_idle", "x1", "x2", "x3", "x4")}
	words := frameWords(bt, 6)
	if got := strings.Join(words, " < "); got != "handle_IPI < riscv_intc_irq < ret_from_exception < arch_cpu_idle [supervisor software interrupt] < do_idle < x1 < ..." {
		t.Errorf("frame words: %s", got)
	}
	p := 0
	h := HartState{Hart: 2, Processor: &p, State: "ipi", Halted: true, wait: "wfi", PC: "handle_IPI+0x9a (arch/riscv/kernel/smp.c:183)", Backtrace: words}
	if got := h.Line(); got != "hart 2 (cpu 0) ipi, wfi: handle_IPI+0x9a (arch/riscv/kernel/smp.c:183) < riscv_intc_irq < ret_from_exception < arch_cpu_idle [supervisor software interrupt] < do_idle < x1 < ..." {
		t.Errorf("line: %s", got)
	}
	if got := hartRange([]string{"01", "02", "03", "04"}); got != "harts 0 to 3" {
		t.Errorf("range: %s", got)
	}
}
