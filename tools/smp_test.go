package tools_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

type hartOut struct {
	Hart      int      `json:"hart"`
	Processor *int     `json:"processor"`
	Current   bool     `json:"current"`
	Priv      string   `json:"priv"`
	State     string   `json:"state"`
	Halted    bool     `json:"halted"`
	PC        string   `json:"pc"`
	Backtrace []string `json:"backtrace"`
}

type hartStopOut struct {
	stopOut
	Hart       *int   `json:"hart"`
	Processor  *int   `json:"processor"`
	Incomplete string `json:"incomplete"`
}

type hartRegsOut struct {
	Hart int      `json:"hart"`
	Priv string   `json:"priv"`
	PC   whereOut `json:"pc"`
	GPRs struct {
		SP string `json:"sp"`
	} `json:"gprs"`
}

// cpuOfHart reads the guest's /proc/cpuinfo: hart ID -> Linux's CPU
// number (OpenSBI's boot hart becomes CPU 0, so they can differ).
func cpuOfHart(t *testing.T, s *session) map[int]int {
	t.Helper()
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "cat /proc/cpuinfo", "wait_for": testguest.LinuxPrompt}, &w)
	out := map[int]int{}
	for _, m := range regexp.MustCompile(`processor\s*:\s*(\d+)\s*\nhart\s*:\s*(\d+)`).FindAllStringSubmatch(w.Output, -1) {
		cpu, _ := strconv.Atoi(m[1])
		hart, _ := strconv.Atoi(m[2])
		out[hart] = cpu
	}
	return out
}

// mask is taskset's hex mask of the CPU a hart is.
func mask(cpu map[int]int, hart int) string { return fmt.Sprintf("0x%x", 1<<cpu[hart]) }

// The Linux guest with four harts, tasks pinned with taskset to the CPU
// of the hart wanted: every hart at a glance; registers of a hart
// chosen; a breakpoint hit from hart 3 names hart 3 and its system
// call; steps run the hart stepped alone (a busy hart does not move)
// and continue runs them all; a step over a call that waits for stopped
// harts, and a step of a hart parked in firmware, end at their timeout
// and say why; a watchpoint names the hart that wrote; a
// crash forced onto hart 2 is triaged on hart 2, with a line for each
// other hart.
func TestDebugLinuxSMP(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	s := newSessionWith(t, func(c *testConfig) { c.WorkDir = lin.Dir }, nil)
	boot := func(smp int) {
		t.Helper()
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
			"memory": "256M", "smp": smp, "gdb": true, "wait_for": testguest.LinuxPrompt, "timeout": 60, "restart": true}, &b)
		if !b.Matched {
			t.Fatalf("boot with smp %d: %+v", smp, b)
		}
	}
	boot(4)
	cpu := cpuOfHart(t, s)
	t.Logf("hart -> cpu: %v", cpu)
	if len(cpu) != 4 {
		t.Fatalf("/proc/cpuinfo lists harts %v, want 4", cpu)
	}

	// Every hart at a glance.
	var all struct {
		Harts []hartOut `json:"harts"`
	}
	res := s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
	t.Logf("all_harts of 4 (%d characters):\n%s", len(structured(t, res)), text(res))
	if len(all.Harts) != 4 {
		t.Fatalf("all_harts: %+v", all)
	}
	for i, h := range all.Harts {
		if h.Hart != i || h.Processor == nil || *h.Processor != cpu[i] || h.State == "" || h.PC == "" || len(h.Backtrace) == 0 || h.Priv == "" {
			t.Errorf("all_harts[%d]: %+v", i, h)
		}
	}

	// Registers of the hart asked for: each hart has its own stack.
	var r1, r2 hartRegsOut
	res = s.call("debug_registers", map[string]any{"hart": 1}, &r1)
	s.mustCall("debug_registers", map[string]any{"hart": 2}, &r2)
	if r1.Hart != 1 || r2.Hart != 2 || r1.GPRs.SP == "" || r1.GPRs.SP == r2.GPRs.SP || !strings.HasPrefix(text(res), "hart 1:") {
		t.Errorf("registers of harts 1 and 2: %+v, %+v; %s", r1, r2, text(res))
	}
	s.wantError("debug_registers", map[string]any{"hart": 4}, "no hart 4", "harts 0 to 3")
	s.wantError("debug_backtrace", map[string]any{"hart": -1}, "hart -1")

	// A busy task on hart 1, to see who moves.
	s.mustCall("serial_send", map[string]any{"data": "taskset " + mask(cpu, 1) + " sh -c 'while :; do :; done' &", "wait_for": testguest.LinuxPrompt}, nil)
	pcOf := func(hart int) string {
		t.Helper()
		var r hartRegsOut
		s.mustCall("debug_registers", map[string]any{"hart": hart}, &r)
		return r.PC.Addr
	}

	// A breakpoint reached from a task pinned to hart 3: only reading
	// /proc/version calls version_proc_show.
	s.mustCall("debug_break", map[string]any{"location": "version_proc_show"}, nil)
	s.mustCall("serial_send", map[string]any{"data": "taskset " + mask(cpu, 3) + " cat /proc/version"}, nil)
	var st hartStopOut
	t0 := time.Now()
	res = s.call("debug_continue", map[string]any{"timeout": 20}, &st)
	t.Logf("breakpoint stop in %v: %s", time.Since(t0), text(res))
	if st.Hart == nil || *st.Hart != 3 || st.Processor == nil || *st.Processor != cpu[3] || st.Function != "version_proc_show" || !strings.Contains(text(res), "on hart 3") {
		t.Fatalf("breakpoint from hart 3: %+v (hart %v)", st, st.Hart)
	}
	var bt struct {
		backtraceOut
		Hart *int `json:"hart"`
	}
	res = s.call("debug_backtrace", nil, &bt)
	t.Logf("backtrace: %s", text(res))
	last := bt.Frames[len(bt.Frames)-1]
	if bt.Hart == nil || *bt.Hart != 3 || bt.Frames[0].Function != "version_proc_show" || !last.User || last.Trap == nil || last.Trap.Cause != "environment call from U-mode" {
		t.Errorf("backtrace of hart 3: %+v", bt)
	}
	var r3 hartRegsOut
	s.mustCall("debug_registers", nil, &r3)
	if r3.Hart != 3 || r3.PC.Function != "version_proc_show" {
		t.Errorf("registers of the last stop's hart: %+v", r3)
	}

	// Steps run hart 3 alone: the busy hart 1 stays where it is.
	busy := pcOf(1)
	t0 = time.Now()
	s.mustCall("debug_step", nil, &st)
	t.Logf("one step: %v", time.Since(t0))
	if st.Hart == nil || *st.Hart != 3 || st.Reason != "step" {
		t.Errorf("step: %+v", st)
	}
	t0 = time.Now()
	s.mustCall("debug_step", map[string]any{"count": 40, "over": true}, &st)
	t.Logf("40 steps over calls: %v, now at %s+%s", time.Since(t0), st.Function, st.Offset)
	if st.Hart == nil || *st.Hart != 3 || st.Incomplete != "" {
		t.Errorf("steps over: %+v", st)
	}
	if pc := pcOf(1); pc != busy {
		t.Errorf("hart 1 moved from %s to %s while hart 3 was stepped", busy, pc)
	}

	// Continue runs every hart: the busy one moves.
	s.mustCall("debug_break", map[string]any{"location": "version_proc_show", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.3}, nil)
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, &w)
	if !strings.Contains(w.Output, "Linux version") {
		t.Errorf("cat after the breakpoint: %+v", w)
	}
	moved := false
	for range 5 {
		s.mustCall("debug_pause", nil, nil)
		moved = pcOf(1) != busy
		s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
		if moved {
			break
		}
	}
	if !moved {
		t.Errorf("the busy hart 1 stayed at %s across continues", busy)
	}
	s.mustCall("serial_send", map[string]any{"data": "kill %1", "wait_for": testguest.LinuxPrompt}, nil)

	// Taking a CPU offline waits for the other harts: stepped over with
	// the others stopped, the call cannot return, and says so at its
	// timeout. The hart is then parked in OpenSBI, in wfi: a step of it
	// cannot finish either.
	parked := 2
	if cpu[parked] == 0 {
		parked = 1 // the boot CPU stays
	}
	s.mustCall("debug_break", map[string]any{"location": "device_offline"}, nil)
	s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf("taskset %s sh -c 'echo 0 > /sys/devices/system/cpu/cpu%d/online'", mask(cpu, 3), cpu[parked])}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 20}, &st)
	if st.Function != "device_offline" || st.Hart == nil || *st.Hart != 3 {
		t.Fatalf("offline from hart 3: %+v", st)
	}
	t0 = time.Now()
	res = s.call("debug_step", map[string]any{"over": true, "count": 200, "timeout": 2}, &st)
	took := time.Since(t0)
	t.Logf("stepping over the offline, %v: %s", took, text(res))
	if st.Hart == nil || *st.Hart != 3 || !strings.Contains(st.Incomplete, "a call did not return") || took < 2*time.Second || took > 8*time.Second {
		t.Errorf("step over a call that waits for stopped harts: %+v, after %v", st, took)
	}
	s.mustCall("debug_break", map[string]any{"location": "device_offline", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, &w)
	if !strings.Contains(w.Output, fmt.Sprintf("CPU%d: off", cpu[parked])) {
		t.Errorf("offline: %q", w.Output)
	}
	s.mustCall("debug_pause", nil, nil)
	s.mustCall("debug_backtrace", map[string]any{"all_harts": true}, &all)
	if h := all.Harts[parked]; h.State != "firmware" || h.Priv != "machine" {
		t.Errorf("offline hart %d: %+v", parked, h)
	}
	t0 = time.Now()
	res = s.call("debug_step", map[string]any{"hart": parked, "timeout": 1}, &st)
	took = time.Since(t0)
	t.Logf("step of the parked hart, %v: %s", took, text(res))
	if st.Hart == nil || *st.Hart != parked || !strings.Contains(st.Incomplete, "wfi") || took < time.Second || took > 5*time.Second {
		t.Errorf("step of a parked hart: %+v, after %v", st, took)
	}
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_send", map[string]any{"data": fmt.Sprintf("echo 1 > /sys/devices/system/cpu/cpu%d/online", cpu[parked]), "wait_for": testguest.LinuxPrompt}, nil)

	// A watchpoint names the hart that made the access.
	s.mustCall("debug_watch", map[string]any{"location": "panic_timeout"}, nil)
	s.mustCall("serial_send", map[string]any{"data": "taskset " + mask(cpu, 1) + " sh -c 'echo 7 > /proc/sys/kernel/panic'"}, nil)
	var ws watchStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 20}, &ws)
	t.Logf("watch stop: %s", text(res))
	if ws.Hart == nil || *ws.Hart != 1 || ws.Access == nil || ws.Access.New != "0x7" || !strings.Contains(text(res), "on hart 1") {
		t.Errorf("watch stop: %+v, access %+v", ws.hartStopOut, ws.Access)
	}
	s.mustCall("debug_watch", map[string]any{"location": "panic_timeout", "remove": true}, nil)
	s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
	s.mustCall("serial_read", map[string]any{"wait_for": testguest.LinuxPrompt, "timeout": 10}, nil)

	// A crash forced onto hart 2 is triaged there.
	type triaged struct {
		Panicked    bool  `json:"panicked"`
		OutputStart int64 `json:"output_start"`
		Triage      *struct {
			Hart       int          `json:"hart"`
			Processor  *int         `json:"processor"`
			Culprit    *whereOut    `json:"culprit"`
			Backtrace  backtraceOut `json:"backtrace"`
			OtherHarts []hartOut    `json:"other_harts"`
		} `json:"triage"`
		TriageError string `json:"triage_error"`
	}
	var p triaged
	res = s.call("serial_send", map[string]any{"data": "taskset " + mask(cpu, 2) + " sh -c 'echo c > /proc/sysrq-trigger'", "wait_for": testguest.LinuxPrompt, "timeout": 30}, &p)
	t.Logf("crash on hart 2: %s", text(res))
	if !p.Panicked || p.Triage == nil {
		t.Fatalf("crash: %+v", p)
	}
	var fns []string
	for _, f := range p.Triage.Backtrace.Frames {
		fns = append(fns, f.Function)
	}
	tr := p.Triage
	if tr.Hart != 2 || tr.Processor == nil || *tr.Processor != cpu[2] || !slices.Contains(fns, "sysrq_handle_crash") || !slices.Contains(fns, "panic") ||
		tr.Culprit == nil || tr.Culprit.Function != "sysrq_handle_crash" || !strings.Contains(text(res), "on hart 2") {
		t.Errorf("triage: hart %d, culprit %+v, backtrace %v", tr.Hart, tr.Culprit, fns)
	}
	if len(tr.OtherHarts) != 3 || strings.Count(text(res), "\n  hart ") != 3 {
		t.Errorf("other harts: %+v", tr.OtherHarts)
	}
	for _, o := range tr.OtherHarts {
		if o.Hart == 2 || o.State == "panic" {
			t.Errorf("other hart: %+v", o)
		}
	}
	// The triage is the last stop: per-hart tools default to hart 2. The
	// panicking hart still runs (it prints, and waits in udelay), now and
	// then in the firmware for an SBI call, where no kernel frame shows:
	// asked again, it is back in panic.
	for try := 0; ; try++ {
		res = s.call("debug_backtrace", nil, &bt)
		if bt.Hart == nil || *bt.Hart != 2 {
			t.Fatalf("backtrace after the triage: %s", text(res))
		}
		if strings.Contains(text(res), "panic") {
			break
		}
		if try == 20 {
			t.Errorf("backtrace after the triage, 20 times: %s", text(res))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Once panic has stopped the other harts, they sit in its stop IPI;
	// a wait that reads the panic again still triages hart 2, ranked
	// above them.
	ipis := 0
	for range 30 {
		ipis = 0
		s.mustCall("debug_backtrace", map[string]any{"all_harts": true}, &all)
		for _, h := range all.Harts {
			if h.State == "ipi" {
				ipis++
			}
		}
		if ipis == 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ipis != 3 {
		t.Errorf("after the panic, %d harts handle its stop IPI, want 3: %+v", ipis, all.Harts)
	}
	var again triaged
	res = s.call("serial_read", map[string]any{"since": p.OutputStart, "wait_for": testguest.LinuxPrompt, "timeout": 2}, &again)
	t.Logf("the crash again, the others stopped: %s", text(res))
	if !again.Panicked || again.Triage == nil || again.Triage.Hart != 2 || again.Triage.Culprit == nil || again.Triage.Culprit.Function != "sysrq_handle_crash" {
		t.Errorf("triage with the other harts in the stop IPI: %+v", again.Triage)
	} else {
		for _, o := range again.Triage.OtherHarts {
			if o.State != "ipi" || o.Backtrace[0] != "handle_IPI" {
				t.Errorf("other hart after the stop IPI: %+v", o)
			}
		}
	}

	// Eight harts still read at a glance.
	boot(8)
	res = s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
	n := len(structured(t, res))
	t.Logf("all_harts of 8 (%d characters, text %d):\n%s", n, len(text(res)), text(res))
	if len(all.Harts) != 8 || n > 8000 {
		t.Errorf("all_harts of 8: %d harts, %d characters", len(all.Harts), n)
	}
}

// The built-in kernel runs on the hart OpenSBI booted (its lottery picks
// one, mostly hart 0) and leaves the others in OpenSBI: on one hart every
// stop names hart 0 and nothing else; with two, the other is seen in
// firmware, its registers read, and a hart that does not exist is refused.
func TestDebugHartsTiny(t *testing.T) {
	s := newSession(t)
	for _, smp := range []int{1, 2} {
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"gdb": true, "smp": smp, "wait_for": prompt, "restart": true}, &b)
		if !b.Matched {
			t.Fatalf("boot: %+v", b)
		}
		s.mustCall("debug_break", map[string]any{"location": "cmd_echo"}, nil)
		s.mustCall("serial_send", map[string]any{"data": "echo x"}, nil)
		var st hartStopOut
		res := s.call("debug_continue", nil, &st)
		if st.Hart == nil || *st.Hart < 0 || *st.Hart >= smp {
			t.Fatalf("smp %d: stop %+v, %s", smp, st, text(res))
		}
		k := *st.Hart // the kernel's hart
		if st.Function != "cmd_echo" || st.Processor != nil || !strings.Contains(text(res), fmt.Sprintf("on hart %d", k)) {
			t.Errorf("smp %d: stop %+v, %s", smp, st, text(res))
		}
		var all struct {
			Harts []hartOut `json:"harts"`
		}
		res = s.call("debug_backtrace", map[string]any{"all_harts": true}, &all)
		t.Logf("smp %d:\n%s", smp, text(res))
		if len(all.Harts) != smp || !all.Harts[k].Current || all.Harts[k].State != "running" || all.Harts[k].Backtrace[0] != "cmd_echo" {
			t.Fatalf("smp %d: all_harts %+v", smp, all.Harts)
		}
		if smp == 2 {
			o := 1 - k // the hart left in firmware
			var r hartRegsOut
			s.mustCall("debug_registers", map[string]any{"hart": o}, &r)
			if h := all.Harts[o]; r.Hart != o || r.Priv != "machine" || h.State != "firmware" || h.Current {
				t.Errorf("hart %d: registers %+v, at a glance %+v", o, r, h)
			}
			s.mustCall("debug_step", map[string]any{"hart": o, "timeout": 1}, &st)
			if st.Hart == nil || *st.Hart != o {
				t.Errorf("step of hart %d: %+v", o, st)
			}
			// The step made that hart the default.
			s.mustCall("debug_registers", nil, &r)
			if r.Hart != o {
				t.Errorf("registers after a step of hart %d: %+v", o, r)
			}
		}
		s.wantError("debug_registers", map[string]any{"hart": smp}, fmt.Sprintf("no hart %d", smp))
		s.mustCall("debug_break", map[string]any{"location": "cmd_echo", "remove": true}, nil)
		s.mustCall("debug_continue", map[string]any{"timeout": 0.1}, nil)
		var w waitOut
		s.mustCall("serial_read", map[string]any{"wait_for": prompt}, &w)
		if !w.Matched {
			t.Errorf("smp %d: the shell after the breakpoint: %+v", smp, w)
		}
	}
}
