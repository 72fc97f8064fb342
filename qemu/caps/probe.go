package caps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/filecopy"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// probeAll runs every probe on the binary k names.
func (p *Prober) probeAll(ctx context.Context, k Key) (*Caps, error) {
	dir, err := p.workDir()
	if err != nil {
		return nil, fmt.Errorf("probe QEMU: %w", err)
	}
	defer os.RemoveAll(dir)
	if len(p.cfg.Kernel) == 0 {
		return nil, errors.New("probe QEMU: no kernel to boot")
	}
	kernel := filepath.Join(dir, "tiny.bin")
	if err := os.WriteFile(kernel, p.cfg.Kernel, 0o600); err != nil {
		return nil, fmt.Errorf("probe QEMU: %w", err)
	}
	r, err := p.newRun(dir, k.Path, kernel)
	if err != nil {
		return nil, err
	}
	c := &Caps{Binary: k.Path, Size: k.Size, ModTime: k.ModTime, ProbeVersion: probeVersion}
	c.Version = qemuVersion(ctx, k.Path)
	c.TimerKept, c.InPlaceLoad = r.timed(ctx, r.stateProbes)
	c.ReplayCheckpoint = r.replayCheckpoint(ctx, c.TimerKept)
	if ctx.Err() != nil {
		// Stopped (the server closes): nothing was decided.
		return nil, ctx.Err()
	}
	c.Probed = time.Now().UTC()
	return c, nil
}

// replayCheckpoint decides ReplayCheckpoint, knowing TimerKept.
func (r *run) replayCheckpoint(ctx context.Context, timerKept Result) Result {
	if timerKept.Answer == No {
		// A checkpoint is a snapshot: loaded, it loses the guest's timer
		// as any other, and a guest that uses its timer then takes its
		// interrupts elsewhere than the recording did (the tiny kernel
		// uses none, so the replay probe would not show it).
		return no("a loaded checkpoint loses the guest's timer (timer_kept: no), so the replay of a guest that uses it diverges")
	}
	if _, err := os.Stat(filepath.Join(r.dir, rrImage)); err != nil {
		// The state probes make the image the recording writes into
		// (QEMU makes it: no qemu-img needed); they failed before.
		return Result{Answer: Failed, Detail: "not tried: the state probes failed before making the recording's image (" + timerKept.Detail + ")"}
	}
	res, _ := r.timed(ctx, func(ctx context.Context) (Result, Result) {
		return r.replayProbe(ctx), Result{}
	})
	return res
}

func qemuVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	line, err := qemu.VersionLine(ctx, bin)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(line, "QEMU emulator version ")
}

// run is one probing of one binary.
type run struct {
	p      *Prober
	dir    string
	bin    string
	kernel string
	arch   arch.Arch
	clock  *clock
	n      int // machines started
}

// newRun is a probing of bin, its guest the Prober's architecture's
// kernel (a file in dir).
func (p *Prober) newRun(dir, bin, kernel string) (*run, error) {
	a := p.cfg.Arch
	if a == nil {
		a = archs.Default()
	}
	t := a.QEMU().Probe
	if t == nil {
		return nil, fmt.Errorf("probe QEMU: the probe does not know %s guests' timer", a.Name())
	}
	return &run{p: p, dir: dir, bin: bin, kernel: kernel, arch: a, clock: &clock{TimerProbe: t}}, nil
}

// timed runs a probe under the timeout and times it; a probe that ran
// out of time failed.
func (r *run) timed(ctx context.Context, f func(context.Context) (Result, Result)) (Result, Result) {
	// The clock starts before the deadline is set, so that a probe cut
	// off by it is never timed under the timeout.
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, r.p.cfg.Timeout)
	defer cancel()
	a, b := f(pctx)
	ms := time.Since(start).Milliseconds()
	for _, res := range []*Result{&a, &b} {
		if pctx.Err() != nil && ctx.Err() == nil && res.Answer != No {
			*res = Result{Answer: Failed, Detail: fmt.Sprintf("no answer within %v: %s", r.p.cfg.Timeout, res.Detail)}
		}
		res.Millis = ms
	}
	return a, b
}

// guest is one probe QEMU running the tiny kernel.
type guest struct {
	r      *run
	m      *qemu.Process
	cursor int64
}

// boot starts a guest; extra are more QEMU arguments, loadvm a qcow2 to
// attach for a load, before (if set) runs before the guest first runs.
func (r *run) boot(ctx context.Context, gdbStub bool, loadvm string, before func(context.Context, *qemu.Process) error, extra ...string) (*guest, error) {
	r.n++
	n := strconv.Itoa(r.n)
	rt := qemu.Runtime{
		SerialBase: filepath.Join(r.dir, "s"+n),
		QMPSocket:  filepath.Join(r.dir, "q"+n+".sock"),
		Logger:     r.p.log.With("probe", filepath.Base(r.bin)),
		BeforeCont: before,
	}
	if gdbStub {
		rt.GDBSocket = filepath.Join(r.dir, "g"+n+".sock")
	}
	opts := []qemu.Option{qemu.WithArch(r.arch), qemu.WithBinary(r.bin), qemu.WithKernel(r.kernel), qemu.WithMemory("64M")}
	if len(extra) > 0 {
		opts = append(opts, qemu.WithExtraArgs(extra...))
	}
	cfg := qemu.NewConfig(opts...)
	if loadvm != "" {
		cfg.LoadVM = &qemu.LoadVM{Path: loadvm}
	}
	m, err := qemu.Start(ctx, rt, cfg)
	if err != nil {
		return nil, err
	}
	return &guest{r: r, m: m}, nil
}

func (g *guest) close() {
	// Quit is quick and polite; Close kills what is left.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g.m.Shutdown(ctx, qemu.Quit, time.Second)
	g.m.Close()
}

func (g *guest) mon() *qmp.Monitor { return g.m.Monitor() }

// expect waits for re on the console after what the last expect saw.
func (g *guest) expect(ctx context.Context, re string, timeout time.Duration) error {
	m, err := g.m.Console().Buffer().Wait(ctx, g.cursor, regexp.MustCompile(re), timeout)
	if err != nil {
		return err
	}
	if !m.Matched {
		return fmt.Errorf("the guest did not print %q within %v (it printed %q)", re, timeout, tail(m.Output))
	}
	g.cursor = m.Cursor
	return nil
}

func tail(b []byte) string {
	if len(b) > 80 {
		b = b[len(b)-80:]
	}
	return string(b)
}

// typeLine types s and a return, at most 4 bytes at a time, each after
// the guest echoed the last (a recording QEMU drops input that comes
// faster than the guest takes it), and waits for the answer want.
func (g *guest) typeLine(ctx context.Context, s, want string) error {
	for i := 0; i < len(s); i += 4 {
		chunk := s[i:min(i+4, len(s))]
		if _, err := g.m.Console().Write(ctx, []byte(chunk)); err != nil {
			return err
		}
		if err := g.expect(ctx, regexp.QuoteMeta(chunk), 5*time.Second); err != nil {
			return err
		}
	}
	if _, err := g.m.Console().Write(ctx, []byte("\r")); err != nil {
		return err
	}
	return g.expect(ctx, regexp.QuoteMeta(want)+`\r\ntiny> $`, 5*time.Second)
}

func (g *guest) hmp(ctx context.Context, line string) (string, error) {
	raw, err := g.mon().Execute(ctx, "human-monitor-command", map[string]any{"command-line": line})
	if err != nil {
		return "", fmt.Errorf("%s: %w", line, err)
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("%s: %w", line, err)
	}
	return out, nil
}

func (g *guest) qmp(ctx context.Context, cmd string, args map[string]any) error {
	var a any // no "arguments": null
	if args != nil {
		a = args
	}
	_, err := g.mon().Execute(ctx, cmd, a)
	return err
}

// xpValue is the value in HMP's answer to "xp /1gx ADDR": "ADDR: 0xVALUE"
// (QEMU 7.2 writes the address in 16 digits, 11.1 in 8).
func xpValue(out string) (uint64, error) {
	_, v, ok := strings.Cut(strings.TrimSpace(out), ": ")
	if !ok {
		return 0, fmt.Errorf("xp answered %q", out)
	}
	return strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(v), "0x"), 16, 64)
}

// image makes an empty qcow2 at path through the guest's QEMU (no
// qemu-img needed), detached again after.
func (g *guest) image(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	node := "probe-file-" + strconv.Itoa(g.r.n)
	if err := g.qmp(ctx, "blockdev-add", map[string]any{"driver": "file", "node-name": node, "filename": path}); err != nil {
		return err
	}
	err = g.mon().RunJob(ctx, "blockdev-create", map[string]any{"options": map[string]any{"driver": "qcow2", "file": node, "size": 64 << 20}})
	if derr := g.qmp(ctx, "blockdev-del", map[string]any{"node-name": node}); err == nil {
		err = derr
	}
	return err
}

// stub attaches to the guest's gdbstub, which stops the guest.
func (g *guest) stub(ctx context.Context) (*gdb.Client, error) {
	return gdb.Dial(ctx, "unix", g.m.Paths().GDBSocket, gdb.WithArch(g.r.arch))
}

// count reads the stopped guest's timer count: through HMP xp where it
// is in memory (QMP has no physical read), else through the gdbstub; ran
// is how long the guest may have run for it.
func (g *guest) count(ctx context.Context) (v uint64, ran time.Duration, err error) {
	k := g.r.clock
	if k.Count.Addr != 0 {
		out, err := g.hmp(ctx, fmt.Sprintf("xp /1gx %#x", k.Count.Addr))
		if err != nil {
			return 0, 0, err
		}
		v, err := xpValue(out)
		return v, 0, err
	}
	c, err := g.stub(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	start := k.stepped
	v, err = k.count(ctx, c)
	return v, k.stepped - start, err
}

const (
	// rrImage is the empty qcow2 each replay attempt copies to record
	// into (the state probes make it).
	rrImage  = "rr.qcow2"
	snapNode = "probe-snap"
	tag      = "probe"
	// timerDelay is when the armed timers fire, in guest time after the
	// save.
	timerDelay = 150 * time.Millisecond
)

func no(format string, args ...any) Result {
	return Result{Answer: No, Detail: fmt.Sprintf(format, args...)}
}

func failed(what string, err error) Result {
	return Result{Answer: Failed, Detail: what + ": " + err.Error()}
}

// stateProbes saves the tiny kernel with armed timers, then loads the
// snapshot into the same QEMU (in place) and into a fresh one, and looks
// each time whether the timer's count is back where the save left it,
// the timers fire when they should, and the guest answers.
func (r *run) stateProbes(ctx context.Context) (kept, inPlace Result) {
	snap := filepath.Join(r.dir, "snap.qcow2")
	a, err := r.boot(ctx, true, "", nil)
	if err != nil {
		return failed("boot", err), failed("boot", err)
	}
	defer a.close()
	if err := a.expect(ctx, `tiny> $`, 10*time.Second); err != nil {
		return failed("boot", err), failed("boot", err)
	}
	if err := a.image(ctx, snap); err != nil {
		return failed("make an image", err), failed("make an image", err)
	}
	if err := a.image(ctx, filepath.Join(r.dir, rrImage)); err != nil {
		return failed("make an image", err), failed("make an image", err)
	}
	if err := a.qmp(ctx, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": snapNode,
		"file": map[string]any{"driver": "file", "filename": snap}}); err != nil {
		return failed("attach the image", err), failed("attach the image", err)
	}
	// Let the guest's clock run, so that a lost timer shows.
	time.Sleep(300 * time.Millisecond)
	c, err := a.stub(ctx) // the guest stops
	if err != nil {
		return failed("attach the debugger", err), failed("attach the debugger", err)
	}
	stepped := r.clock.stepped
	saved, err := r.clock.count(ctx, c)
	if err != nil {
		c.Close()
		return failed("read "+r.clock.Counter, err), failed("read "+r.clock.Counter, err)
	}
	armed, err := r.clock.arm(ctx, c, saved, timerDelay)
	if err != nil {
		c.Close()
		return failed("arm the timer", err), failed("arm the timer", err)
	}
	// The count at the save is past saved by what the guest ran for
	// the steps that read it and armed the timers.
	ran := r.clock.stepped - stepped
	err = a.m.Monitor().RunJob(ctx, "snapshot-save", map[string]any{"tag": tag, "vmstate": snapNode, "devices": []string{snapNode}})
	c.Close() // the guest runs on
	if err != nil {
		return failed("save", err), failed("save", err)
	}
	inPlace = r.inPlace(ctx, a, saved, armed, ran)
	a.close()
	kept, silent := r.fresh(ctx, snap, saved, armed, ran)
	if silent {
		// A loaded guest that does not answer may be QEMU 11.1's rare
		// hang after a load rather than a lost timer: the cached answer
		// is no only if a second load says so too.
		again, _ := r.fresh(ctx, snap, saved, armed, ran)
		again.Detail += " (loaded twice; the first: " + kept.Detail + ")"
		kept = again
	}
	return kept, inPlace
}

// after checks a loaded guest: its count was back at saved before it ran
// (loaded; ran is how long the guest may have run between the two reads,
// in steps), it answers, its time runs forward, and the armed timers fired.
// silent says the "no" is that the guest did not answer.
func (g *guest) after(ctx context.Context, loaded, saved, armed uint64, ran time.Duration, word string) (res Result, silent bool) {
	k := g.r.clock
	if res, ok := k.restored(loaded, saved, ran); !ok {
		return res, false
	}
	if err := g.typeLine(ctx, "echo "+word, word); err != nil {
		return no("the loaded guest does not answer: %v", err), true
	}
	time.Sleep(2 * timerDelay)
	c, err := g.stub(ctx)
	if err != nil {
		return failed("attach the debugger", err), false
	}
	defer c.Close()
	now, err := k.count(ctx, c)
	if err != nil {
		return failed("read "+k.Counter, err), false
	}
	fired, err := k.fired(ctx, c)
	if err != nil {
		return failed("read the timers", err), false
	}
	return k.verdict(saved, loaded, now, fired, armed), false
}

// inPlace lets a (saved a moment ago) run on and type, then loads the
// snapshot into it.
func (r *run) inPlace(ctx context.Context, a *guest, saved, armed uint64, ran time.Duration) Result {
	if err := a.typeLine(ctx, "echo one", "one"); err != nil {
		return failed("run after the save", err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := a.qmp(ctx, "stop", nil); err != nil {
		return failed("stop", err)
	}
	if err := a.m.Monitor().RunJob(ctx, "snapshot-load", map[string]any{"tag": tag, "vmstate": snapNode, "devices": []string{snapNode}}); err != nil {
		return no("snapshot-load into the running QEMU failed: %v", err)
	}
	loaded, loadRan, err := a.count(ctx)
	if err != nil {
		return failed("read "+r.clock.Counter, err)
	}
	if err := a.qmp(ctx, "cont", nil); err != nil {
		return failed("cont", err)
	}
	res, _ := a.after(ctx, loaded, saved, armed, ran+loadRan, "two")
	return res
}

// fresh loads the snapshot into a new QEMU before it first runs; silent
// says the loaded guest did not answer.
func (r *run) fresh(ctx context.Context, snap string, saved, armed uint64, ran time.Duration) (res Result, silent bool) {
	var loaded uint64
	var loadRan time.Duration
	b, err := r.boot(ctx, true, snap, func(ctx context.Context, m *qemu.Process) error {
		if err := m.Monitor().RunJob(ctx, "snapshot-load", map[string]any{"tag": tag, "vmstate": qemu.SnapshotNode, "devices": []string{qemu.SnapshotNode}}); err != nil {
			return err
		}
		var err error
		loaded, loadRan, err = (&guest{r: r, m: m}).count(ctx)
		return err
	})
	if err != nil {
		return failed("load into a new QEMU", err), false
	}
	defer b.close()
	b.cursor = b.m.Console().Buffer().End()
	return b.after(ctx, loaded, saved, armed, ran+loadRan, "three")
}

// replayProbe records the tiny kernel booting and answering a typed
// line, then replays it: to a checkpoint C before the typing (savevm
// there), on to T after it (the registers there are the reference), back
// to C with the double load (loadvm, one instruction, loadvm again), and
// forward to T again, where the registers must be the reference's.
func (r *run) replayProbe(ctx context.Context) Result {
	return retryCrashed(ctx, replayAttempts, func(n int) (Result, string) { return r.replayAttempt(ctx, n) },
		func(n int, crash string) {
			r.p.log.Debug("probe: QEMU died during the replay probe; trying again", "binary", r.bin, "attempt", n, "crash", crash)
		})
}

// replayAttempts bounds the replay probe's attempts whose QEMU died.
const replayAttempts = 3

// retryCrashed runs attempt (numbered from 1) until its QEMU did not die
// (crash is ""), attempts ran, or ctx ends. QEMU 11.1 can die in the replay
// (its monitor closing under the probe): that says nothing of the
// checkpoints, whose every load the time travel verifies anyway, so an
// attempt whose QEMU died is run again, from a new recording, and the
// answer says what happened; a QEMU that died in the last attempt is no
// answer (Failed).
func retryCrashed(ctx context.Context, attempts int, attempt func(n int) (Result, string), retrying func(n int, crash string)) Result {
	var crashes []string
	for i := 1; ; i++ {
		res, crash := attempt(i)
		if crash == "" || i == attempts || ctx.Err() != nil {
			if len(crashes) > 0 {
				res.Detail += fmt.Sprintf(" (QEMU died in %d earlier attempt(s): %s)", len(crashes), strings.Join(crashes, "; "))
			}
			if crash != "" {
				res = Result{Answer: Failed, Detail: fmt.Sprintf("QEMU died (attempt %d of %d): %s; %s", i, attempts, crash, res.Detail)}
			}
			return res
		}
		retrying(i, crash)
		crashes = append(crashes, crash)
	}
}

// rrFiles are one attempt's record/replay log and image.
type rrFiles struct{ log, img string }

// args are the QEMU arguments that record (mode "record") or replay
// ("replay") the attempt.
func (f rrFiles) args(mode string) []string {
	return []string{"-icount", "shift=auto,rr=" + mode + ",rrfile=" + f.log + ",rrsnapshot=init",
		"-drive", "file=" + f.img + ",format=qcow2,if=none,id=rr"}
}

// replayAttempt records the tiny kernel, replays it to a checkpoint and
// back through it; crash says how QEMU ended if one of its processes
// died on its own.
func (r *run) replayAttempt(ctx context.Context, n int) (res Result, crash string) {
	rr := rrFiles{log: filepath.Join(r.dir, fmt.Sprintf("rec-%d.bin", n)), img: filepath.Join(r.dir, fmt.Sprintf("rr-%d.qcow2", n))}
	// Each attempt starts from the empty image: a record writes its
	// start into it.
	if err := filecopy.New(filepath.Join(r.dir, rrImage), rr.img); err != nil {
		return failed("the recording's image", err), ""
	}
	rec, err := r.boot(ctx, false, "", nil, rr.args("record")...)
	if err != nil {
		return failed("record", err), ""
	}
	c, t, err := recordSession(ctx, rec)
	crash = rec.died()
	rec.close()
	if err != nil {
		return failed("record", err), crash
	}
	p, err := r.boot(ctx, false, "", func(ctx context.Context, m *qemu.Process) error {
		_, err := (&guest{m: m}).hmp(ctx, "replay_break "+strconv.FormatUint(c, 10))
		return err
	}, rr.args("replay")...)
	if err != nil {
		return failed("replay", err), ""
	}
	defer p.close()
	if replayStarted != nil {
		replayStarted(n, p.m)
	}
	res = p.checkpointRoundTrip(ctx, c, t)
	if res.Answer != Yes {
		return res, p.died()
	}
	return res, ""
}

// died says how the guest's QEMU ended if it died on its own, else "".
func (g *guest) died() string {
	if g.mon().Err() != nil {
		// The monitor went first; the exit is noticed just after.
		select {
		case <-g.m.Done():
		case <-time.After(time.Second):
		}
	}
	if e, ok := g.m.Exited(); ok {
		return strings.TrimSpace(e.String() + " " + lastWords(g.m.Stderr()))
	}
	return ""
}

// checkpointRoundTrip takes the replaying guest, stopped by the break at
// c set before it ran, through the checkpoint there: savevm at c, replay
// to t (the reference registers), the double load of the checkpoint, and
// replay to t again, where the registers must be the reference's.
func (g *guest) checkpointRoundTrip(ctx context.Context, c, t uint64) Result {
	if err := g.waitStop(ctx, 10*time.Second); err != nil {
		return failed("replay to the checkpoint", err)
	}
	if _, err := g.hmpOK(ctx, "savevm ck"); err != nil {
		return failed("checkpoint", err)
	}
	want, err := g.replayTo(ctx, t, 10*time.Second)
	if err != nil {
		return failed("replay past the checkpoint", err)
	}
	for run := 1; run <= replayRuns; run++ {
		// The double load: the first load sets the replay's clock shift,
		// the second restores the timers against it.
		if _, err := g.hmpOK(ctx, "loadvm ck"); err != nil {
			return no("run %d of %d: loadvm of the checkpoint failed: %v", run, replayRuns, err)
		}
		if _, err := g.replayTo(ctx, c+1, 5*time.Second); err != nil {
			return no("run %d of %d: the replay froze one instruction after loading the checkpoint: %v", run, replayRuns, err)
		}
		if _, err := g.hmpOK(ctx, "loadvm ck"); err != nil {
			return no("run %d of %d: the second loadvm of the checkpoint failed: %v", run, replayRuns, err)
		}
		got, err := g.replayTo(ctx, t, 10*time.Second)
		if err != nil {
			return no("run %d of %d: the replay from the checkpoint did not reach instruction %d: %v", run, replayRuns, t, err)
		}
		if got != want {
			return no("run %d of %d: the replay from the checkpoint reached instruction %d in another state than the replay from the start", run, replayRuns, t)
		}
	}
	return Result{Answer: Yes, Detail: fmt.Sprintf("checkpoint at instruction %d, double load, replay to %d: same registers as from the start, %d runs of %d", c, t, replayRuns, replayRuns)}
}

// replayRuns is how many times the replay probe goes back through its
// checkpoint: time travel is offered where every run comes back to the
// same state, as reverse steps and searches go back many times.
const replayRuns = 10

// lastWords is the last line QEMU printed that is not a deprecation
// warning (one for an option of the caller's would not say why QEMU
// died): an abort's message.
func lastWords(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.Contains(l, "deprecated") {
			return "(" + tail([]byte(l)) + ")"
		}
	}
	return ""
}

// replayStarted, when a test sets it, sees each attempt's replaying QEMU
// as it starts.
var replayStarted func(attempt int, m *qemu.Process)

// recordSession lets the recording guest boot and answer a typed line;
// c is an instruction count before the typing, t one after the answer.
func recordSession(ctx context.Context, g *guest) (c, t uint64, err error) {
	if err := g.expect(ctx, `tiny> $`, 10*time.Second); err != nil {
		return 0, 0, err
	}
	c0, err := g.icount(ctx)
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(200 * time.Millisecond)
	c1, err := g.icount(ctx)
	if err != nil {
		return 0, 0, err
	}
	// Between the two, off the counts info replay gives (where the
	// vCPU stopped for a timer, which a break at that very instruction
	// meets in the middle of its checkpoint).
	c = c0 + (c1-c0)/2 + 4321
	if err := g.typeLine(ctx, "echo replay", "replay"); err != nil {
		return 0, 0, err
	}
	time.Sleep(100 * time.Millisecond)
	if t, err = g.icount(ctx); err != nil {
		return 0, 0, err
	}
	t += 1234
	// The recording must go on past t, however long a busy machine holds
	// its QEMU back: a replay to a t it never recorded runs off the log.
	var n uint64
	err = poll(ctx, 10*time.Second, 20*time.Millisecond, func() (done bool, err error) {
		n, err = g.icount(ctx)
		return n > t+100_000, err
	}, func() error { return fmt.Errorf("the recording did not pass instruction %d in 10s (at %d)", t, n) })
	if err != nil {
		return 0, 0, err
	}
	return c, t, nil
}

// poll calls done every interval until it says done or fails, ctx ends,
// or timeout passes, when the error is late's.
func poll(ctx context.Context, timeout, every time.Duration, done func() (bool, error), late func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := done(); ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return late()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

var icountRe = regexp.MustCompile(`instruction count = (\d+)`)

// icount is the record or replay position (HMP info replay).
func (g *guest) icount(ctx context.Context) (uint64, error) {
	out, err := g.hmp(ctx, "info replay")
	if err != nil {
		return 0, err
	}
	return icountOf(out)
}

// icountOf is the instruction count in HMP's answer to "info replay".
func icountOf(out string) (uint64, error) {
	m := icountRe.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("info replay answered %q", strings.TrimSpace(out))
	}
	return strconv.ParseUint(m[1], 10, 64)
}

// hmpOK runs an HMP command whose output is empty on success.
func (g *guest) hmpOK(ctx context.Context, line string) (string, error) {
	out, err := g.hmp(ctx, line)
	if err == nil && strings.TrimSpace(out) != "" {
		err = fmt.Errorf("%s: %s", line, strings.TrimSpace(out))
	}
	return out, err
}

// waitStop waits until the replaying guest is stopped (at a break).
func (g *guest) waitStop(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, timeout, 10*time.Millisecond, func() (bool, error) {
		running, err := g.mon().Running(ctx)
		return !running, err
	}, func() error {
		n, _ := g.icount(ctx)
		return fmt.Errorf("still running after %v (at instruction %d)", timeout, n)
	})
}

// replayTo replays to instruction n and returns the registers there.
func (g *guest) replayTo(ctx context.Context, n uint64, timeout time.Duration) (string, error) {
	if _, err := g.hmpOK(ctx, "replay_break "+strconv.FormatUint(n, 10)); err != nil {
		return "", err
	}
	if err := g.qmp(ctx, "cont", nil); err != nil {
		return "", err
	}
	if err := g.waitStop(ctx, timeout); err != nil {
		return "", err
	}
	at, err := g.icount(ctx)
	if err != nil {
		return "", err
	}
	if at != n {
		return "", fmt.Errorf("stopped at instruction %d, not %d", at, n)
	}
	return g.hmp(ctx, "info registers")
}
