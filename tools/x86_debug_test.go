package tools_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
)

// The debugger on the x86_64 Linux guest with 4 vCPUs: every vCPU's
// backtrace at ring 0; registers with RFLAGS, CS and the paging mode; a
// write watchpoint on panic_timeout names do_proc_dointvec_conv with old
// and new; a breakpoint reached from a task pinned to CPU 3 unwinds to the
// system call; the walk of linux_banner agrees with QEMU's gva2gpa; LKDTM's
// WRITE_RO forced onto CPU 2 is triaged on CPU 2 as a write to a present
// read-only page, ACCESS_NULL as a not-present page at 0x0.
func TestX86DebugLinux(t *testing.T) {
	archDebugLinux(t, x86_64.Arch, archDebugWant{
		priv: "ring 0", idle: true,
		registers: func(r registersOut) bool {
			return r.System["cr3"] != "" && strings.Contains(r.Translation, "4-level paging") &&
				strings.HasPrefix(r.Status, "RFLAGS ") && strings.Contains(r.Status, "CS 0x10 (CPL 0)")
		},
		store: "mov", syscall: "system call", caller: "seq_read_iter",
		prologue: func(dis string) bool { return strings.Contains(dis, "push") && !strings.Contains(dis, ".byte") },
		walk:     func(walkOut) bool { return true },
		unmapped: "not present",
		writeRO:  []string{"page fault: write to a present read-only page in kernel mode", "at 0x"},
		null:     []string{"page fault: not present, address 0x0", "NULL pointer"},
	})
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
