package debugger

import (
	"strings"
	"testing"
)

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
	ipi    = DecodeCause(1<<63 | 1)
	timer  = DecodeCause(1<<63 | 5)
	ecall  = DecodeCause(8)
	pageWr = DecodeCause(15)
)

// What a hart does, from its stack: the shapes Linux 6.1 leaves on a
// four-hart guest after a sysrq crash on one of them, and the others.
func TestClassifyAndCrashScore(t *testing.T) {
	for _, tc := range []struct {
		name, priv string
		f          []Frame
		state      string
		score      int
	}{
		{"stopped by panic's IPI", "supervisor", frames("handle_IPI", "riscv_intc_irq", "generic_handle_arch_irq", "ret_from_exception",
			"arch_cpu_idle", ipi, "default_idle_call", "do_idle", "cpu_startup_entry"), "ipi", -4},
		{"the crash", "supervisor", frames("__delay", "udelay", "panic", "sysrq_handle_crash", "__handle_sysrq", "write_sysrq_trigger",
			"check_syscall_nr", "user", ecall, true), "panic", 8},
		{"an oops on a kernel fault", "supervisor", frames("panic", "make_task_dead", "die_kernel_fault", "do_page_fault",
			"ret_from_exception", "lkdtm_WRITE_RO", pageWr, "lkdtm_do_action"), "panic", 12},
		{"a user page fault being handled", "supervisor", frames("handle_mm_fault", "do_page_fault", "ret_from_exception",
			"user", pageWr, true), "trap", 0},
		{"idle", "supervisor", frames("arch_cpu_idle", "default_idle_call", "do_idle", "cpu_startup_entry", "smp_callin"), "idle", 0},
		{"a timer tick on an idle hart", "supervisor", frames("riscv_timer_interrupt", "handle_percpu_devid_irq", "riscv_intc_irq",
			"ret_from_exception", "arch_cpu_idle", timer, "do_idle"), "trap", 0},
		{"spinning", "supervisor", frames("_raw_spin_lock_irqsave", "try_to_wake_up", "check_syscall_nr", "user", ecall, true), "lock", 0},
		{"a system call", "supervisor", frames("do_sys_openat2", "sys_openat", "check_syscall_nr", "user", ecall, true), "running", 0},
		{"in the trap vector", "supervisor", frames("handle_exception"), "trap", 0},
		{"user", "user", frames("user", true), "user", 0},
		{"firmware", "machine", frames(""), "firmware", 0},
	} {
		if got := classify(tc.priv, tc.f); got != tc.state {
			t.Errorf("%s: state %s, want %s", tc.name, got, tc.state)
		}
		if got := crashScore(Backtrace{Frames: tc.f}); got != tc.score {
			t.Errorf("%s: crash score %d, want %d", tc.name, got, tc.score)
		}
		if stateWords[tc.state] == "" {
			t.Errorf("state %s has no words", tc.state)
		}
	}
}

func TestHartLine(t *testing.T) {
	bt := Backtrace{Frames: frames("handle_IPI", "riscv_intc_irq", "ret_from_exception", "arch_cpu_idle", ipi, "do_idle", "x1", "x2", "x3", "x4")}
	words := frameWords(bt, 6)
	if got := strings.Join(words, " < "); got != "handle_IPI < riscv_intc_irq < ret_from_exception < arch_cpu_idle [supervisor software interrupt] < do_idle < x1 < ..." {
		t.Errorf("frame words: %s", got)
	}
	p := 0
	h := HartState{Hart: 2, Processor: &p, State: "ipi", Halted: true, PC: "handle_IPI+0x9a (arch/riscv/kernel/smp.c:183)", Backtrace: words}
	if got := h.Line(); got != "hart 2 (cpu 0) ipi, wfi: handle_IPI+0x9a (arch/riscv/kernel/smp.c:183) < riscv_intc_irq < ret_from_exception < arch_cpu_idle [supervisor software interrupt] < do_idle < x1 < ..." {
		t.Errorf("line: %s", got)
	}
	if got := hartRange([]string{"01", "02", "03", "04"}); got != "harts 0 to 3" {
		t.Errorf("range: %s", got)
	}
}
