package debugger

import (
	"strings"
	"testing"
)

// CSR values the fake guests are given.
const (
	sppS      = 1 << 8  // sstatus.SPP: the trap came from S-mode
	mppS      = 1 << 11 // mstatus.MPP: the trap came from S-mode
	mppM      = 3 << 11 // mstatus.MPP: the trap came from M-mode
	sv39Empty = 8<<60 | 0x80400000>>12
)

// tutorFuncs are the functions of an xv6-style kernel the fakes run.
var tutorFuncs = []string{"_entry", "start", "mtrap_spin", "main", "scheduler", "usertrap", "syscall", "sys_ticks",
	"kernelvec", "kerneltrap", "panic", "printf", "consputc", "spin_forever"}

// kerneltrapPanic makes hart h the hart of an xv6-style kernel that took
// a store page fault at 0x0 in sys_ticks and panicked from its trap
// handler, printing: no trap frame the unwinder knows, the fault in
// scause, taken from S-mode.
func kerneltrapPanic(g *fakeGuest, h int) {
	g.stack(h, "consputc", "printf", "panic", "kerneltrap", "kernelvec")
	r := g.harts[h].regs
	r["scause"], r["sepc"], r["stval"], r["sstatus"], r["satp"] = 15, g.at("sys_ticks"), 0, sppS, sv39Empty
}

// idleHart makes hart h wait in wfi in the scheduler, its last trap a
// timer interrupt.
func idleHart(g *fakeGuest, h int) {
	g.stack(h, "scheduler", "main")
	g.harts[h].halted = true
	g.harts[h].regs["scause"] = 1<<63 | 5
}

// A kernel that is not Linux: the hart that panicked from its trap
// handler is found by its stack (panic) and its scause (a fault taken
// from S-mode), not by Linux's names; the trap comes from scause, and its
// sepc is the culprit; the idle harts say so.
func TestTriageKernelTrapPanic(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 3, tutorFuncs...)
	idleHart(g, 0)
	kerneltrapPanic(g, 1)
	idleHart(g, 2)
	g.harts[2].regs["scause"] = 8 // its last trap a system call
	g.stopped = 0
	tr, err := g.session().Triage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Hart != 1 || tr.Priv != "supervisor" || tr.PC.Function != "consputc" {
		t.Errorf("triage chose hart %d (%s) at %+v", tr.Hart, tr.Priv, tr.PC)
	}
	if tr.Trap == nil || tr.Trap.Cause != "store/AMO page fault" || tr.Trap.TVal != "0x0" || tr.TrapSource != rv.Sources().Kernel {
		t.Errorf("trap %+v from %q", tr.Trap, tr.TrapSource)
	}
	if tr.Culprit == nil || tr.Culprit.Function != "sys_ticks" {
		t.Errorf("culprit %+v", tr.Culprit)
	}
	if !strings.Contains(tr.Verdict, "store page fault at 0x0 from S-mode: no mapping") || tr.Walk == nil || tr.Walk.Mode != "Sv39" {
		t.Errorf("verdict %q, walk %+v", tr.Verdict, tr.Walk)
	}
	if len(tr.Others) != 2 {
		t.Fatalf("others: %+v", tr.Others)
	}
	for _, o := range tr.Others {
		if o.State != "idle" || !o.Halted || !strings.HasPrefix(o.Line(), "hart ") {
			t.Errorf("other hart: %s", o.Line())
		}
	}
	t.Logf("triage: hart %d, %s in %s: %s", tr.Hart, tr.Trap.Cause, tr.Culprit, tr.Verdict)
}

// Which hart crashed, among harts that all show something: a fault
// beats a panic without one; among equals, a hart that runs beats one in
// wfi, and then the hart of the last stop wins.
func TestTriageChoosesHart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(g *fakeGuest)
		stopped int
		want    int
	}{
		{"a panic with a fault beats a panic without", func(g *fakeGuest) {
			g.stack(0, "printf", "panic", "main")
			kerneltrapPanic(g, 1)
			idleHart(g, 2)
		}, 0, 1},
		{"a tie goes to the hart of the last stop", func(g *fakeGuest) {
			g.stack(0, "spin_forever", "panic", "main")
			idleHart(g, 1)
			g.stack(2, "spin_forever", "panic", "main")
		}, 2, 2},
		{"the same tie, the other hart stopped", func(g *fakeGuest) {
			g.stack(0, "spin_forever", "panic", "main")
			idleHart(g, 1)
			g.stack(2, "spin_forever", "panic", "main")
		}, 0, 0},
		{"nothing shown: a hart that runs beats one in wfi", func(g *fakeGuest) {
			idleHart(g, 0)
			g.stack(1, "spin_forever", "main")
			idleHart(g, 2)
		}, 0, 1},
		{"a fault in M-mode beats harts that spin", func(g *fakeGuest) {
			mtrapSpin(g, 2)
			g.stack(0, "main")
			g.stack(1, "main")
		}, 0, 2},
		{"a fault M-mode returned from does not count", func(g *fakeGuest) {
			g.stack(0, "spin_forever", "main")
			g.stack(1, "")
			g.harts[1].regs["priv"], g.harts[1].regs["mcause"] = 3, 4 // mstatus.MPP is U after mret
			idleHart(g, 2)
		}, 0, 0},
		{"a user fault does not count", func(g *fakeGuest) {
			idleHart(g, 0)
			g.stack(1, "usertrap")
			g.harts[1].regs["scause"] = 13 // a load page fault from U-mode
			g.stack(2, "usertrap")
			g.harts[2].regs["scause"] = 8
		}, 2, 2},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			ctx := testContext(t)
			g := newFakeGuest(t, 3, tutorFuncs...)
			tc.setup(g)
			g.stopped = tc.stopped
			tr, err := g.session().Triage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Hart != tc.want {
				t.Errorf("triage chose hart %d, want %d; others %+v", tr.Hart, tc.want, tr.Others)
			}
		})
	}
}

// mtrapSpin makes hart h the hart of a kernel that stored to 0x0 in its
// M-mode start, before it ever ran in S-mode, and trapped into an mtvec
// that spins.
func mtrapSpin(g *fakeGuest, h int) {
	g.stack(h, "mtrap_spin")
	r := g.harts[h].regs
	r["priv"], r["mcause"], r["mepc"], r["mtval"], r["mstatus"], r["mtvec"] = 3, 7, g.at("start"), 0, mppM, g.at("mtrap_spin")
}

// A kernel that faults in M-mode: triage reads mcause, mepc and mtval,
// says where they come from, and judges the address as physical (no page
// walk); the hart at its mtvec says why it trapped.
func TestTriageMachineMode(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 3, tutorFuncs...)
	mtrapSpin(g, 0)
	g.stack(1, "main")
	g.stack(2, "main")
	g.stopped = 1
	s := g.session()
	tr, err := s.Triage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Hart != 0 || tr.Priv != "machine" || tr.PC.Function != "mtrap_spin" {
		t.Errorf("triage chose hart %d (%s) at %+v", tr.Hart, tr.Priv, tr.PC)
	}
	if tr.Trap == nil || tr.Trap.Cause != "store/AMO access fault" || tr.Trap.TVal != "0x0" || tr.TrapSource != rv.Sources().Firmware {
		t.Fatalf("trap %+v from %q", tr.Trap, tr.TrapSource)
	}
	if tr.Culprit == nil || tr.Culprit.Function != "start" {
		t.Errorf("culprit %+v", tr.Culprit)
	}
	if !strings.Contains(tr.Verdict, "store access fault at 0x0 from M-mode (a physical address") || tr.Walk != nil {
		t.Errorf("verdict %q, walk %+v", tr.Verdict, tr.Walk)
	}
	for _, o := range tr.Others {
		if o.State != "running" || o.Priv != "supervisor" {
			t.Errorf("other hart: %s", o.Line())
		}
	}
	t.Logf("triage: %s in %s: %s", tr.Trap.Cause, tr.Culprit, tr.Verdict)

	// At the trap vector's first instruction, the registers explain the
	// trap it is taking.
	g.harts[0].regs["pc"] = g.harts[0].regs["mtvec"]
	r, err := s.Registers(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.MCause == nil || r.MCause.Cause != "store/AMO access fault" || !strings.Contains(r.Verdict, "store access fault at 0x0 from M-mode") {
		t.Errorf("registers at mtvec: mcause %+v, verdict %q", r.MCause, r.Verdict)
	}
}

// A hart in S-mode that never trapped there (scause 0) has its last trap
// in mcause: an illegal instruction from S-mode, judged as S-mode's.
func TestTriageNeverTrappedInS(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 1, tutorFuncs...)
	g.stack(0, "spin_forever", "main")
	r := g.harts[0].regs
	r["mcause"], r["mepc"], r["mtval"], r["mstatus"] = 2, g.at("main"), 0x30002573, mppS // csrr a0,mstatus
	tr, err := g.session().Triage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Trap == nil || tr.Trap.Cause != "illegal instruction" || tr.TrapSource != rv.Sources().NoKernel || tr.Culprit == nil || tr.Culprit.Function != "main" ||
		!strings.Contains(tr.Verdict, "accesses a CSR that does not exist or that S-mode may not use") {
		t.Errorf("trap %+v from %q, culprit %+v, verdict %q", tr.Trap, tr.TrapSource, tr.Culprit, tr.Verdict)
	}
}

// Every hart at a glance: M-mode code of the kernel is machine mode, or
// a trap when it is in a fault; M-mode outside the kernel's symbols is
// firmware; kernel code in wfi is idle.
func TestAllHartsMachineMode(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 4, tutorFuncs...)
	g.stack(0, "start", "_entry")
	g.harts[0].regs["priv"] = 3
	mtrapSpin(g, 1)
	g.stack(2, "")
	g.harts[2].regs["priv"] = 3
	idleHart(g, 3)
	hs, err := g.session().AllHarts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"machine mode", "trap", "firmware", "idle"}
	if len(hs) != len(want) {
		t.Fatalf("harts: %+v", hs)
	}
	for i, h := range hs {
		if h.State != want[i] || stateWords[h.State] == "" {
			t.Errorf("hart %d: %s, want %s", i, h.Line(), want[i])
		}
		t.Log(h.Line())
	}
}

// A running guest whose crashed hart is caught in firmware (panic's SBI
// call that stops the other harts) runs on briefly until the hart is back
// in the kernel, where its stack shows the panic; a hart that stays in
// firmware is given up on after a few looks; a guest that was stopped is
// not run.
func TestTriageWaitsOutFirmware(t *testing.T) {
	inSBICall := func(g *fakeGuest, h int) {
		g.stack(h, "")
		r := g.harts[h].regs
		r["priv"], r["mcause"], r["mepc"], r["mstatus"] = 3, 9, g.at("panic"), mppS
	}
	for _, tc := range []struct {
		name     string
		running  bool
		leaves   bool // the hart leaves firmware when the guest runs
		function string
		resumes  int
	}{
		// Resumed when the session connects, after the first look, and
		// when the triage is done.
		{"back in the kernel", true, true, "spin_forever", 3},
		{"stays in firmware", true, false, "", 1 + firmwareLooks - 1 + 1},
		{"a stopped guest", false, true, "", 0},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			ctx := testContext(t)
			g := newFakeGuest(t, 3, tutorFuncs...)
			idleHart(g, 0)
			idleHart(g, 1)
			inSBICall(g, 2)
			g.stopped, g.running = 0, tc.running
			g.resumed = func(n int) {
				if n >= 2 && tc.leaves {
					g.stack(2, "spin_forever", "panic", "sys_ticks", "syscall")
					g.harts[2].regs["priv"] = 1
				}
			}
			tr, err := g.session().Triage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Hart != 2 || tr.PC.Function != tc.function {
				t.Errorf("triage of hart %d at %+v, want hart 2 at %q", tr.Hart, tr.PC, tc.function)
			}
			if tc.leaves && tc.running && (tr.Culprit == nil || tr.Culprit.Function != "sys_ticks") {
				t.Errorf("culprit %+v", tr.Culprit)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.resumes != tc.resumes {
				t.Errorf("the guest was resumed %d times, want %d", g.resumes, tc.resumes)
			}
		})
	}
}
