package caps

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
)

// What the probes read from QEMU's monitor, as QEMU 7.2 and 11.1 answer
// it over human-monitor-command.
func TestMonitorAnswers(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want uint64
	}{
		{"000000000200bff8: 0x00000000003d0900\r\n", 0x3d0900}, // 7.2
		{"0200bff8: 0x00000000006acfc0\r\n", 0x6acfc0},         // 11.1
	} {
		if v, err := xpValue(tc.out); err != nil || v != tc.want {
			t.Errorf("xpValue(%q) = %#x, %v", tc.out, v, err)
		}
	}
	for _, bad := range []string{"", "Cannot access memory\r\n", "0200bff8: zz\r\n"} {
		if v, err := xpValue(bad); err == nil {
			t.Errorf("xpValue(%q) = %#x, no error", bad, v)
		}
	}
	if n, err := icountOf("Recording execution '/tmp/rec-1.bin': instruction count = 31250000\r\n"); err != nil || n != 31250000 {
		t.Errorf("icountOf(recording) = %d, %v", n, err)
	}
	if n, err := icountOf("Replaying execution 'rec-1.bin': instruction count = 43754321\r\n"); err != nil || n != 43754321 {
		t.Errorf("icountOf(replaying) = %d, %v", n, err)
	}
	if _, err := icountOf("Record/replay is not active\r\n"); err == nil || !strings.Contains(err.Error(), "not active") {
		t.Errorf("icountOf without record/replay: %v (the error must quote QEMU)", err)
	}
}

// Why QEMU died: its last line, not a deprecation warning about an
// option, and short.
func TestLastWords(t *testing.T) {
	for stderr, want := range map[string]string{
		"": "",
		"qemu-system-riscv64: ../block/io.c:1987: bdrv_co_write_req_prepare: Assertion `child->perm & BLK_PERM_WRITE' failed.\n": "(…ite_req_prepare: Assertion `child->perm & BLK_PERM_WRITE' failed.)",
		"qemu: fatal: boom\nqemu-system-riscv64: warning: -icount rr is deprecated\n\n":                                          "(qemu: fatal: boom)",
		"warning: x is deprecated\n": "",
	} {
		got := lastWords(stderr)
		if strings.HasPrefix(want, "(…") {
			// The tail of a long line: its last 80 bytes.
			if len(got) != 82 || !strings.HasSuffix(got, want[len("(…"):]) {
				t.Errorf("lastWords(%q) = %q", stderr, got)
			}
			continue
		}
		if got != want {
			t.Errorf("lastWords(%q) = %q, want %q", stderr, got, want)
		}
	}
}

// The timer probes' verdict on a loaded guest, from the count at the
// load, a while later, and the timers pending then (riscv64's: the
// machine timer is alarm 0, the supervisor timer 1).
func TestTimerVerdict(t *testing.T) {
	k := &clock{TimerProbe: riscv64.Arch.QEMU().Probe, hz: 10_000_000}
	const saved = 0x1000000
	if res, ok := k.restored(saved, saved, 0); !ok {
		t.Errorf("mtime restored: %+v", res)
	}
	// QEMU 7.2 starts a loaded guest's time from 0 again.
	res, ok := k.restored(0x12, saved, 0)
	if ok || res.Answer != No || !strings.Contains(res.Detail, "mtime after the load") || !strings.Contains(res.Detail, "-1.678 s") {
		t.Errorf("mtime went back: %+v", res)
	}
	const machine, supervisor = 1, 2
	late := uint64(saved + 2*timerDelay.Seconds()*10_000_000)
	for _, tc := range []struct {
		name             string
		now, fired, want uint64
		answer, detail   string
	}{
		{"both timers fired", late, machine | supervisor, machine | supervisor, Yes, "the machine and supervisor (Sstc) timers armed"},
		{"no Sstc", late, machine, machine, Yes, "the machine timer armed"},
		{"supervisor timer lost", late, machine, machine | supervisor, No, "did not fire 150 ms of guest time after their deadline (not fired: supervisor (Sstc) timer)"},
		{"time stands", saved, machine | supervisor, machine | supervisor, No, "time does not run"},
		{"deadline not reached", saved + 10, 0, machine, Failed, "has not reached the deadline"},
	} {
		res := k.verdict(saved, saved, tc.now, tc.fired, tc.want)
		if res.Answer != tc.answer || !strings.Contains(res.Detail, tc.detail) {
			t.Errorf("%s: %+v, want %s (%q)", tc.name, res, tc.answer, tc.detail)
		}
	}
	// A count read by stepping an instruction (aarch64's) may be past
	// the save's by what the guest ran in the steps (here 10 ms); not
	// more, nor behind it.
	a := &clock{TimerProbe: arm64.Arch.QEMU().Probe, hz: 62_500_000}
	for _, tc := range []struct {
		loaded uint64
		ok     bool
	}{{saved, true}, {saved + 62_500_000/100, true}, {saved + 62_500_000/100 + 1, false}, {saved - 1, false}} {
		if res, ok := a.restored(tc.loaded, saved, 10*time.Millisecond); ok != tc.ok || !ok && !strings.Contains(res.Detail, "CNTVCT_EL0 after the load") {
			t.Errorf("aarch64 count %#x after the load, %#x saved: %v %+v", tc.loaded, uint64(saved), ok, res)
		}
	}
}

// A probe that runs out of time failed, whatever it was about to say,
// unless it had found the capability missing; one stopped because the
// server closes is left as it was (probeAll then discards it).
func TestTimed(t *testing.T) {
	r := &run{p: &Prober{cfg: Config{Timeout: 100 * time.Millisecond}}}
	slow := func(ctx context.Context) (Result, Result) {
		<-ctx.Done()
		return no("lost the timer"), Result{Answer: Yes, Detail: "half done"}
	}
	a, b := r.timed(t.Context(), slow)
	if a.Answer != No || a.Millis < 100 {
		t.Errorf("a No at the timeout: %+v", a)
	}
	if b.Answer != Failed || b.Detail != "no answer within 100ms: half done" || b.Millis < 100 {
		t.Errorf("a Yes at the timeout: %+v", b)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, b := r.timed(ctx, slow); b.Answer != Yes {
		t.Errorf("stopped: %+v", b)
	}
	fast := func(context.Context) (Result, Result) { return Result{Answer: Yes}, Result{Answer: No} }
	if a, b := r.timed(t.Context(), fast); a.Answer != Yes || b.Answer != No {
		t.Errorf("in time: %+v %+v", a, b)
	}
}

// The replay probe runs again when its QEMU died, at most three times,
// and its answer says so.
func TestRetryCrashed(t *testing.T) {
	attempts := func(results ...Result) (func(int) (Result, string), *[]int) {
		var ran []int
		return func(n int) (Result, string) {
			ran = append(ran, n)
			res := results[min(n, len(results))-1]
			if res.Answer == Failed {
				return res, "killed by SIGSEGV (bad thing)"
			}
			return res, ""
		}, &ran
	}
	var retried []int
	retrying := func(n int, crash string) { retried = append(retried, n) }

	f, ran := attempts(Result{Answer: Failed, Detail: "monitor closed"}, Result{Answer: Yes, Detail: "same registers"})
	res := retryCrashed(t.Context(), 3, f, retrying)
	if res.Answer != Yes || res.Detail != "same registers (QEMU died in 1 earlier attempt(s): killed by SIGSEGV (bad thing))" || len(*ran) != 2 {
		t.Errorf("died once: %+v after %v", res, *ran)
	}
	f, ran = attempts(Result{Answer: Failed, Detail: "monitor closed"})
	res = retryCrashed(t.Context(), 3, f, retrying)
	if res.Answer != Failed || !strings.HasPrefix(res.Detail, "QEMU died (attempt 3 of 3): killed by SIGSEGV (bad thing); monitor closed (QEMU died in 2 earlier") || len(*ran) != 3 {
		t.Errorf("died every time: %+v after %v", res, *ran)
	}
	if len(retried) != 3 {
		t.Errorf("retries announced: %v, want 3", retried)
	}
	f, ran = attempts(no("diverged"))
	if res := retryCrashed(t.Context(), 3, f, retrying); res.Answer != No || res.Detail != "diverged" || len(*ran) != 1 {
		t.Errorf("a clean No: %+v after %v", res, *ran)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f, ran = attempts(Result{Answer: Failed, Detail: "monitor closed"})
	if res := retryCrashed(ctx, 3, f, retrying); res.Answer != Failed || len(*ran) != 1 {
		t.Errorf("stopped: %+v after %v", res, *ran)
	}
}

// Where a load loses the timer (QEMU 7.2), a replay's checkpoint is not
// trusted either: no replay is tried. Where the state probes could not
// tell, the replay probe runs and says why it could not either.
func TestReplayCheckpointKnowsTimerKept(t *testing.T) {
	r := &run{p: fakeProber(t, "", nil, time.Second), dir: t.TempDir(), bin: "/nonexistent/qemu"}
	res := r.replayCheckpoint(t.Context(), no("mtime went back"))
	if res.Answer != No || !strings.Contains(res.Detail, "timer_kept: no") || res.Millis != 0 {
		t.Errorf("after timer_kept no: %+v", res)
	}
	// The state probes failed before making the recording's image.
	res = r.replayCheckpoint(t.Context(), failed("boot", errors.New("qemu: cannot open the kernel")))
	if res.Answer != Failed || !strings.Contains(res.Detail, "state probes failed") || !strings.Contains(res.Detail, "qemu: cannot open the kernel") {
		t.Errorf("after timer_kept failed early: %+v", res)
	}
	// After it: the replay probe runs (and fails here, with no QEMU).
	if err := os.WriteFile(filepath.Join(r.dir, rrImage), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res = r.replayCheckpoint(t.Context(), failed("save", errors.New("timed out")))
	if res.Answer != Failed || !strings.Contains(res.Detail, "/nonexistent/qemu") {
		t.Errorf("after timer_kept failed late: %+v", res)
	}
}
