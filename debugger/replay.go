package debugger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Timeline is the recording a replaying guest runs through (its host
// provides it): where the replay is and ends, breaks at an instruction
// count, and the faithful points a replay can start from. Going back is
// one mechanism: back to a start point at or before the place wanted,
// then forward with breakpoints or watchpoints, keeping the last hit.
type Timeline interface {
	// Position is the replay's instruction count.
	Position(ctx context.Context) (uint64, error)
	// End is the last instruction count the replay can stop at.
	End() uint64
	// StopAt makes the replay stop when it reaches instruction n; the
	// stub reports that stop as a pause.
	StopAt(ctx context.Context, n uint64) error
	// InPlace says whether Load works: the QEMU reloads a start point
	// faithfully into the process that replays (the double load). Without
	// it, going back is Restart.
	InPlace() bool
	// Starts lists the start points at or before n, latest first; the
	// last is 0, the recording's start.
	Starts(n uint64) []uint64
	// Load puts the stopped guest's state back to start point n in
	// place. The load is faithful only as the double load: load, run one
	// instruction, load again; a run that makes no progress means the
	// point is bad (Failed).
	Load(ctx context.Context, n uint64) error
	// Failed says start point n did not load faithfully: it is not
	// offered again.
	Failed(n uint64, why string)
	// Restart replays again from instruction 0 in a new QEMU, stopped
	// there (the stub's connection goes with the old one).
	Restart(ctx context.Context) error
	// Guard holds the QEMU's exit until release: a load can crash QEMU,
	// which is then a failed load (Restart replaces it), not the guest's
	// end.
	Guard() (release func())
	// Spacing is how far apart, in replay time, the timeline wants start
	// points; 0: it keeps none.
	Spacing() time.Duration
	// Checkpoint offers a start point at the guest's position n, reached
	// after spent of replay since the last start point; the timeline
	// keeps it if it wants one there.
	Checkpoint(ctx context.Context, n uint64, spent time.Duration) error
	// Sync brings the console up to what the guest printed so far.
	Sync()
	// ReadPhysical reads length bytes of guest-physical memory at pa as
	// they were at start point n, out of the point's saved state without
	// loading it (milliseconds, against a load's hundreds); an error says
	// it cannot, and the caller loads the point instead.
	ReadPhysical(ctx context.Context, n, pa uint64, length int) ([]byte, error)
}

// ErrAtEnd is a forward step or continue at the end of the recording.
var ErrAtEnd = errors.New("the replay is at the end of its recording")

// Replay stop reasons.
const (
	// ReasonEnd: the replay reached the end of its recording.
	ReasonEnd = "end"
	// ReasonStart: going back found no earlier hit and stopped at the
	// start of the recording.
	ReasonStart = "start"
	// ReasonICount: the replay went to the instruction count asked for.
	ReasonICount = "icount"
)

// Progress reports how far a long operation got; done and total are
// instruction counts of the replay (or 0 when unknown).
type Progress func(msg string, done, total uint64)

type progressKey struct{}

// WithProgress has the debugger report the progress of long operations
// (going back and forth through a recording) to f.
func WithProgress(ctx context.Context, f Progress) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

func progressOf(ctx context.Context) Progress {
	if f, ok := ctx.Value(progressKey{}).(Progress); ok {
		return f
	}
	return func(string, uint64, uint64) {}
}

// Replaying says whether the guest replays a recording.
func (s *Session) Replaying() bool { return s.cfg.Timeline != nil }

func (s *Session) timeline() (Timeline, error) {
	if s.cfg.Timeline == nil {
		return nil, ErrNotReplay
	}
	return s.cfg.Timeline, nil
}

// Tick is how often a running replay reports its progress (and is checked
// for progress at all).
const tick = 500 * time.Millisecond

// stall is how long a replay may make no progress before it is stopped and
// reported: a guest idle in wfi replays as slowly as it was recorded.
const stall = 60 * time.Second

// verifyWait bounds the one-instruction run of a double load.
const verifyWait = 3 * time.Second

// runTo resumes the replay and waits for its next stop, at instruction
// limit at the latest, offering the timeline a start point every Spacing
// of replay on the way. pos is where it stopped; a stop before limit is a
// breakpoint or watchpoint (or a pause from outside: SIGINT).
func (s *Session) runTo(ctx context.Context, c *gdb.Client, limit uint64) (gdb.Stop, uint64, error) {
	tl := s.cfg.Timeline
	if pos, err := tl.Position(ctx); err != nil || pos >= limit {
		// A break behind the replay never comes: it would run on.
		return gdb.Stop{Signal: gdb.SIGINT, Reason: gdb.ReasonSignal}, pos, err
	}
	have, err := armed(ctx, c)
	if err != nil {
		return gdb.Stop{}, 0, err
	}
	watching := slices.ContainsFunc(have, func(b gdb.Breakpoint) bool { return b.Kind >= gdb.WatchWrite })
	if err := tl.StopAt(ctx, limit); err != nil {
		return gdb.Stop{}, 0, fmt.Errorf("debugger: break the replay at %d: %w", limit, err)
	}
	r := s.newRun(ctx, c, limit)
	r.watching = watching
	for {
		if err := c.Continue(ctx); err != nil {
			return gdb.Stop{}, 0, err
		}
		st, pos, resume, err := r.untilStop(ctx)
		if !resume || err != nil {
			return st, pos, err
		}
	}
}

// replayRun is one runTo under way: the replay resumed toward limit,
// polled every tick for its progress, with start points offered on the
// way.
type replayRun struct {
	s        *Session
	tl       Timeline
	c        *gdb.Client
	limit    uint64
	spacing  time.Duration
	every    time.Duration
	progress Progress
	// lastPos is where the replay was last seen to move, at lastMove: a
	// replay that stays there past stall is stopped.
	lastPos  uint64
	lastMove time.Time
	// The replay's speed at the last poll: it changes with what the
	// guest did (busy code 400 M instructions a second, typed input a few
	// M, an idle guest less).
	prevPos uint64
	prevAt  time.Time
	// sinceCk is the replay time since the last start point.
	sinceCk time.Duration
	// watching says a watchpoint is armed: a break's stop is settled.
	watching bool
	// ckAt is a break set ahead to save a checkpoint at: a checkpoint is
	// taken where a replay break stopped the replay (one taken where an
	// interrupt stopped it does not reload: its first instruction never
	// comes).
	ckAt uint64
}

func (s *Session) newRun(ctx context.Context, c *gdb.Client, limit uint64) *replayRun {
	tl := s.cfg.Timeline
	r := &replayRun{s: s, tl: tl, c: c, limit: limit, progress: progressOf(ctx), spacing: tl.Spacing(), every: tick}
	if r.spacing > 0 && r.spacing < r.every {
		r.every = r.spacing
	}
	r.lastPos, _ = tl.Position(ctx)
	r.lastMove = time.Now()
	r.prevPos, r.prevAt = r.lastPos, time.Now()
	return r
}

// untilStop waits for the resumed replay to stop, polling it every
// r.every. resume says the stop was a checkpoint's, taken: the replay is
// to be resumed.
func (r *replayRun) untilStop(ctx context.Context) (st gdb.Stop, pos uint64, resume bool, err error) {
	for {
		t0 := time.Now()
		wctx, cancel := context.WithTimeout(ctx, r.every)
		st, err := r.c.Wait(wctx)
		cancel()
		r.sinceCk += time.Since(t0)
		if err == nil {
			if st.Signal == gdb.SIGINT && r.watching {
				var resume bool
				if st, resume, err = r.settle(ctx, st); err != nil || resume {
					return gdb.Stop{}, 0, resume, err
				}
			}
			return r.stopped(ctx, st)
		}
		if pos, err := r.poll(ctx, err); err != nil {
			return gdb.Stop{}, pos, false, err
		}
	}
}

// settle follows a replay break's stop (st) with a single step while a
// watchpoint is armed. QEMU (7.2 to 11.1; seen replaying x86) stops at
// the break without reporting a watched write that was the break's own
// instruction, and keeps the hit: the next stop it reports as a debug
// stop names that watchpoint, even once it is lifted (its freed memory:
// a watchpoint at a host address), and a watched write before that
// aborts QEMU ("Raised interrupt while not in I/O function"). A step is
// such a debug stop, taken while the watchpoint is still there: it
// reports and forgets the kept hit (or a write of the stepped
// instruction) as a watchpoint stop, else it is a step. At the
// recording's end there is no instruction left to step (resumed there, a
// replay runs off its log and QEMU exits), and a step from the
// instruction before it does not finish on QEMU 7.2 (riscv64): a hit
// kept by the recording's last two instructions stays. resume says
// the stop was a checkpoint's break, not taken there (a checkpoint is
// kept where a replay break stopped the replay, not a step): the replay
// is to be resumed.
func (r *replayRun) settle(ctx context.Context, st gdb.Stop) (gdb.Stop, bool, error) {
	pos, err := r.tl.Position(ctx)
	if err != nil || pos+1 >= r.tl.End() {
		return st, false, err
	}
	wctx, cancel := context.WithTimeout(ctx, stall)
	defer cancel()
	next, err := r.c.Step(wctx)
	if err != nil {
		if r.c.Running() {
			r.c.Interrupt(context.WithoutCancel(ctx))
		}
		return gdb.Stop{}, false, fmt.Errorf("debugger: the step after the replay's break at %d: %w", pos, err)
	}
	r.s.cfg.Logger.Debug("debugger: a break's stop settled", "icount", pos, "stop", next.Raw)
	switch next.Reason {
	case gdb.ReasonWatch, gdb.ReasonRWatch, gdb.ReasonAWatch:
		if r.ckAt != 0 {
			r.ckAt = 0
			return next, false, r.tl.StopAt(ctx, r.limit)
		}
		return next, false, nil
	}
	if r.ckAt == pos && pos+1 < r.limit {
		r.ckAt = 0
		return gdb.Stop{}, true, r.tl.StopAt(ctx, r.limit)
	}
	// As the break's own stop.
	return st, false, nil
}

// stopped handles a stop of the replay: the checkpoint's break, where
// the checkpoint is offered (resume), or any other stop, the run's end.
func (r *replayRun) stopped(ctx context.Context, st gdb.Stop) (gdb.Stop, uint64, bool, error) {
	r.tl.Sync()
	pos, err := r.tl.Position(ctx)
	if err != nil || r.ckAt == 0 || pos != r.ckAt || st.Signal != gdb.SIGINT {
		return st, pos, false, err
	}
	if r.s.armedAtPC(ctx, r.c) {
		// A breakpoint at the very place: it is this hit.
		st.Signal, st.Reason = gdb.SIGTRAP, gdb.ReasonBreakpoint
		return st, pos, false, nil
	}
	if err := r.tl.Checkpoint(ctx, pos, r.sinceCk); err != nil {
		r.s.cfg.Logger.Warn("debugger: keep a replay checkpoint", "icount", pos, "err", err)
	}
	r.ckAt, r.sinceCk = 0, 0
	if err := r.tl.StopAt(ctx, r.limit); err != nil {
		return gdb.Stop{}, 0, false, err
	}
	return gdb.Stop{}, 0, true, nil
}

// poll looks at a replay that has not stopped within r.every (werr is
// why the wait ended): it reports progress, stops a replay that made none
// for stall, and sets a checkpoint's break when one is due. An error ends
// the run; pos is where it ended, when known.
func (r *replayRun) poll(ctx context.Context, werr error) (uint64, error) {
	if ctx.Err() != nil {
		r.c.Interrupt(context.WithoutCancel(ctx))
		return 0, ctx.Err()
	}
	if !errors.Is(werr, context.DeadlineExceeded) {
		// Not the poll's time-out: the stub's connection failed.
		return 0, werr
	}
	pos, err := r.tl.Position(ctx)
	if err != nil {
		return 0, err
	}
	r.progress(fmt.Sprintf("replaying: instruction %d of %d", pos, r.limit), pos, r.limit)
	if pos != r.lastPos {
		r.lastPos, r.lastMove = pos, time.Now()
	} else if time.Since(r.lastMove) > stall {
		r.c.Interrupt(context.WithoutCancel(ctx))
		return pos, fmt.Errorf("debugger: the replay made no progress for %v at instruction %d: stopped there", stall, pos)
	}
	return 0, r.armCheckpoint(ctx, pos)
}

// armCheckpoint sets a checkpoint's break ahead of the replay, at pos,
// once Spacing of replay has passed since the last start point.
func (r *replayRun) armCheckpoint(ctx context.Context, pos uint64) error {
	ahead := checkpointAhead(pos, r.prevPos, time.Since(r.prevAt))
	r.prevPos, r.prevAt = pos, time.Now()
	if r.spacing <= 0 || r.sinceCk < r.spacing || r.ckAt != 0 && r.ckAt <= pos+2*ahead {
		return nil
	}
	at := pos + ahead
	if at >= r.limit || r.tl.StopAt(ctx, at) != nil {
		return nil
	}
	r.ckAt = at
	r.s.cfg.Logger.Debug("debugger: a checkpoint's break set", "icount", pos, "at", at, "since", r.sinceCk)
	// QEMU holds one replay break: the checkpoint's took the place of
	// limit's. A replay already past it (a busy host, a sudden fast
	// stretch) would never stop there, and then not at limit either: it
	// would run off the end of its log, where QEMU exits.
	if now, err := r.tl.Position(ctx); err == nil && now > at {
		if err := r.tl.StopAt(ctx, r.limit); err != nil {
			return err
		}
		r.ckAt = 0
		r.s.cfg.Logger.Debug("debugger: the replay passed the checkpoint's break before it was set", "at", at, "icount", now)
	}
	return nil
}

// checkpointAhead is how far ahead of the replay, at pos (prevPos
// elapsed ago), a checkpoint's break is set: far enough that the replay
// has not passed it by the time the break is set, what it replays in 20
// ms at its speed now. A break set when the replay ran faster is set
// again, nearer, so that a slow stretch (typed input, an idle guest)
// still gets its checkpoints.
func checkpointAhead(pos, prevPos uint64, elapsed time.Duration) uint64 {
	rate := float64(pos-min(prevPos, pos)) / max(elapsed, time.Millisecond).Seconds()
	return max(uint64(rate*0.02), minAhead)
}

// minAhead is the least distance ahead of the replay a checkpoint's break
// is set at.
const minAhead = 100_000

// armedAtPC says whether the stub holds a breakpoint at the stopped
// hart's pc.
func (s *Session) armedAtPC(ctx context.Context, c *gdb.Client) bool {
	have, err := armed(ctx, c)
	if err != nil {
		return false
	}
	pc, err := c.ReadRegister(ctx, s.regs.PC)
	if err != nil {
		return false
	}
	for _, b := range have {
		if b.Kind <= gdb.Hardware && b.Addr == pc {
			return true
		}
	}
	return false
}

// armed is what the stub holds now, through c.
func armed(ctx context.Context, c *gdb.Client) ([]gdb.Breakpoint, error) {
	return c.Breakpoints(ctx)
}

// arm makes the stub hold exactly want (every other breakpoint and
// watchpoint lifted).
func (s *Session) arm(ctx context.Context, c *gdb.Client, want []gdb.Breakpoint) error {
	have, err := armed(ctx, c)
	if err != nil {
		return err
	}
	for _, b := range have {
		if !slices.Contains(want, b) {
			if err := c.ClearBreakpoint(ctx, b.Kind, b.Addr, b.Length); err != nil {
				return err
			}
		}
	}
	for _, b := range want {
		if !slices.Contains(have, b) {
			if err := c.SetBreakpoint(ctx, b.Kind, b.Addr, b.Length); err != nil {
				return err
			}
		}
	}
	return nil
}

// userSet is what the agent set: every breakpoint and watchpoint.
func (s *Session) userSet() []gdb.Breakpoint {
	var out []gdb.Breakpoint
	for a, b := range s.breaks {
		out = append(out, gdb.Breakpoint{Kind: b.kind, Addr: a, Length: bpLength(b.Length)})
	}
	for a, w := range s.watches {
		out = append(out, gdb.Breakpoint{Kind: w.kind, Addr: a, Length: w.Length})
	}
	return out
}

func bpLength(n int) int {
	if n == 0 {
		return 4
	}
	return n
}

// refreshWatches reads the watched values where the replay is now: after
// a jump in time, the next write's old value is the value here.
func (s *Session) refreshWatches(ctx context.Context, c *gdb.Client, extra ...*watch) {
	all := extra
	for _, w := range s.watches {
		all = append(all, w)
	}
	for _, w := range all {
		a, _ := parseAddr(w.Addr)
		if v, err := s.readLoc(ctx, c, a, w.Length); err == nil {
			w.value = v
		}
	}
}

// rewind puts the guest at the latest faithful start point at or before
// target, stopped, with nothing armed; it returns the client (a new one
// when the replay restarted) and the start point. A start point that does
// not load faithfully is dropped and the replay starts over in a new QEMU
// (after a failed load the old one is not to be trusted, and a load after
// a load that ran nothing crashes QEMU 11), which then loads the next
// earlier point once it has run one instruction.
func (s *Session) rewind(ctx context.Context, c *gdb.Client, target uint64) (*gdb.Client, uint64, error) {
	tl := s.cfg.Timeline
	progressOf(ctx)(fmt.Sprintf("going back to a start point before instruction %d", target), 0, 0)
	if !tl.InPlace() || c == nil {
		return s.restart(ctx, c, target)
	}
	if err := s.arm(ctx, c, nil); err != nil {
		return nil, 0, err
	}
	fresh := false // a new QEMU at instruction 0
	for {
		starts := tl.Starts(target)
		if len(starts) == 0 || fresh && starts[0] == 0 {
			if fresh {
				return c, 0, nil
			}
			return s.restart(ctx, c, target)
		}
		st := starts[0]
		if fresh {
			// A load right after the start's own ran nothing: one
			// instruction first.
			if err := s.stepFresh(ctx, c); err != nil {
				return nil, 0, err
			}
		}
		t0 := time.Now()
		release := tl.Guard()
		ok, why, err := s.doubleLoad(ctx, c, st)
		if ok && err == nil {
			release()
			s.cfg.Logger.Debug("debugger: back to a replay checkpoint", "icount", st, "target", target, "took", time.Since(t0))
			return c, st, nil
		}
		if err != nil {
			why = err.Error()
		}
		tl.Failed(st, why)
		s.cfg.Logger.Warn("debugger: a replay start point did not load faithfully; the replay starts over in a new QEMU", "icount", st, "why", why)
		// Whatever happened to the call, the replay must be left whole.
		c, _, err = s.restart(context.WithoutCancel(ctx), c, target)
		release()
		if err != nil {
			return nil, 0, err
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		fresh = true
	}
}

// restart replays again from the start in a new QEMU, stopped there with
// nothing armed.
func (s *Session) restart(ctx context.Context, c *gdb.Client, target uint64) (*gdb.Client, uint64, error) {
	tl := s.cfg.Timeline
	if c != nil {
		c.Close()
	}
	s.c = nil
	t0 := time.Now()
	defer func() { s.cfg.Logger.Debug("debugger: replay started over", "target", target, "took", time.Since(t0)) }()
	if err := tl.Restart(ctx); err != nil {
		return nil, 0, fmt.Errorf("debugger: replay again from the start: %w", err)
	}
	// The new QEMU loaded the recording's start and ran nothing.
	var zero uint64
	s.loaded = &zero
	c, err := s.client(ctx)
	if err != nil {
		return nil, 0, err
	}
	if err := s.arm(ctx, c, nil); err != nil {
		return nil, 0, err
	}
	return c, 0, nil
}

// stepFresh runs a new replay's first instruction.
func (s *Session) stepFresh(ctx context.Context, c *gdb.Client) error {
	return s.runOne(ctx, c, 0)
}

// runOne runs the replay, at instruction pos, one instruction on.
func (s *Session) runOne(ctx context.Context, c *gdb.Client, pos uint64) error {
	tl := s.cfg.Timeline
	if err := tl.StopAt(ctx, pos+1); err != nil {
		return err
	}
	if err := c.Continue(ctx); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, verifyWait)
	defer cancel()
	if _, err := c.Wait(wctx); err != nil {
		return fmt.Errorf("debugger: the replay did not run one instruction from %d: %w", pos, err)
	}
	return nil
}

// doubleLoad loads start point n, runs one instruction and loads it
// again: the first load sets the replay's clock, the second its timers
// against it. ok says the guest is at n; otherwise why says what went
// wrong.
func (s *Session) doubleLoad(ctx context.Context, c *gdb.Client, n uint64) (ok bool, why string, err error) {
	tl := s.cfg.Timeline
	load := func() error {
		if err := tl.Load(ctx, n); err != nil {
			return err
		}
		c.StateReplaced()
		return nil
	}
	t0 := time.Now()
	if s.loaded != nil {
		// Two loads with nothing run between them, then a run, crash
		// QEMU 11 (SIGSEGV): one instruction first, here.
		if pos, err := tl.Position(ctx); err == nil && pos == *s.loaded && pos < tl.End() {
			if err := s.runOne(ctx, c, pos); err != nil {
				return false, fmt.Sprintf("one instruction after the last load: %v", err), nil
			}
		}
		s.loaded = nil
	}
	if err := load(); err != nil {
		return false, err.Error(), nil
	}
	t1 := time.Now()
	if err := tl.StopAt(ctx, n+1); err != nil {
		return false, "", err
	}
	if err := c.Continue(ctx); err != nil {
		return false, "", err
	}
	wctx, cancel := context.WithTimeout(ctx, verifyWait)
	_, werr := c.Wait(wctx)
	cancel()
	if werr != nil {
		if ctx.Err() != nil {
			return false, "", ctx.Err()
		}
		if wctx.Err() == nil {
			return false, fmt.Sprintf("the one-instruction run after loading it failed: %v", werr), nil
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c.Interrupt(ictx)
		cancel()
		return false, fmt.Sprintf("the replay made no progress in %v after loading it (%v)", time.Since(t1).Round(time.Millisecond), werr), nil
	}
	if pos, err := tl.Position(ctx); err != nil || pos != n+1 {
		return false, fmt.Sprintf("one instruction after loading it the replay was at %d, not %d", pos, n+1), nil
	}
	t2 := time.Now()
	if err := load(); err != nil {
		return false, err.Error(), nil
	}
	if pos, err := tl.Position(ctx); err != nil || pos != n {
		return false, fmt.Sprintf("the second load put the replay at %d, not %d", pos, n), nil
	}
	s.cfg.Logger.Debug("debugger: double load", "icount", n, "load", t1.Sub(t0), "step", t2.Sub(t1), "again", time.Since(t2))
	s.loaded = &n
	return true, "", nil
}

// goTo puts the replay at instruction n: back to a start point if n is
// behind it, then forward with nothing armed.
func (s *Session) goTo(ctx context.Context, c *gdb.Client, n uint64) (*gdb.Client, error) {
	tl := s.cfg.Timeline
	pos, err := tl.Position(ctx)
	if err != nil {
		return c, err
	}
	if pos == n {
		return c, nil
	}
	// Back, or ahead to a start point past the replay (a load costs less
	// than the replay time between start points).
	ahead := false
	if pos < n && tl.InPlace() {
		if st := tl.Starts(n); len(st) > 0 && st[0] > pos {
			ahead = true
		}
	}
	if pos > n || ahead {
		if c, _, err = s.rewind(ctx, c, n); err != nil {
			return c, err
		}
	} else if err := s.arm(ctx, c, nil); err != nil {
		return c, err
	}
	t0 := time.Now()
	for {
		_, at, err := s.runTo(ctx, c, n)
		if err != nil {
			return c, err
		}
		if at >= n {
			break
		}
	}
	s.cfg.Logger.Debug("debugger: replayed to", "icount", n, "took", time.Since(t0))
	s.refreshWatches(ctx, c)
	return c, nil
}

// replayClient is the client of a replaying guest, stopped, with a stop
// not yet reported consumed.
func (s *Session) replayClient(ctx context.Context) (Timeline, *gdb.Client, error) {
	tl, err := s.timeline()
	if err != nil {
		return nil, nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, nil, err
	}
	if c.Running() {
		if _, err := c.Interrupt(ctx); err != nil {
			return nil, nil, err
		}
	} else {
		s.pending(ctx, c)
	}
	return tl, c, nil
}

// restoreArmed puts the agent's breakpoints and watchpoints back.
func (s *Session) restoreArmed(ctx context.Context) {
	if s.c == nil {
		return
	}
	if err := s.arm(context.WithoutCancel(ctx), s.c, s.userSet()); err != nil {
		s.cfg.Logger.Warn("debugger: put the breakpoints back", "err", err)
	}
}

// here reports the replay stopped where it is, for reason.
func (s *Session) here(ctx context.Context, c *gdb.Client, reason string) (StopInfo, error) {
	s.lastReason = reason
	info := StopInfo{Stopped: true, Reason: reason}
	th, hart, err := s.on(ctx, c, LastHart)
	if err != nil {
		return info, err
	}
	return info, s.locate(ctx, c, th, hart, &info)
}

// GoTo puts the replay at instruction n, back or forward, and says where
// the guest is.
func (s *Session) GoTo(ctx context.Context, n uint64) (StopInfo, error) {
	defer s.begin()()
	tl, c, err := s.replayClient(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	if end := tl.End(); n > end {
		return StopInfo{}, fmt.Errorf("instruction %d is past the end of the recording (%d)", n, end)
	}
	defer s.restoreArmed(ctx)
	if c, err = s.goTo(ctx, c, n); err != nil {
		return StopInfo{}, err
	}
	return s.here(ctx, c, ReasonICount)
}

// ReverseStep goes back count instructions.
func (s *Session) ReverseStep(ctx context.Context, count int) (StopInfo, error) {
	if count <= 0 || count > 10000 {
		return StopInfo{}, fmt.Errorf("count %d: want 1 to 10000", count)
	}
	defer s.begin()()
	tl, c, err := s.replayClient(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	pos, err := tl.Position(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	if pos < uint64(count) {
		return StopInfo{}, fmt.Errorf("the replay is at instruction %d: it cannot go back %d", pos, count)
	}
	defer s.restoreArmed(ctx)
	if c, err = s.goTo(ctx, c, pos-uint64(count)); err != nil {
		return StopInfo{}, err
	}
	return s.here(ctx, c, gdb.ReasonStep)
}

// hit is a breakpoint or watchpoint stop a search met.
type hit struct {
	pos    uint64
	stop   gdb.Stop
	access *Access
}

// ReverseContinue goes back to the last breakpoint or watchpoint hit
// before the current position, or, if there is none, to the start of
// the recording.
func (s *Session) ReverseContinue(ctx context.Context) (StopInfo, error) {
	defer s.begin()()
	tl, c, err := s.replayClient(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	defer s.restoreArmed(ctx)
	hi, err := tl.Position(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	set := s.userSet()
	for hi > 0 && len(set) > 0 {
		var start uint64
		if c, start, err = s.rewind(ctx, c, hi-1); err != nil {
			return StopInfo{}, err
		}
		s.refreshWatches(ctx, c)
		var last *hit
		err = s.scan(ctx, c, hi, set, func(st gdb.Stop, pos uint64) error {
			h := &hit{pos: pos, stop: st}
			if st.Reason == gdb.ReasonWatch || st.Reason == gdb.ReasonRWatch || st.Reason == gdb.ReasonAWatch {
				th, _, err := s.stoppedHart(ctx, c, st)
				if err != nil {
					return err
				}
				if h.access, err = s.watchStop(ctx, th, st); err != nil {
					return err
				}
				if h.pos, err = tl.Position(ctx); err != nil {
					return err
				}
			}
			if h.pos < hi {
				last = h
			}
			return nil
		})
		if err != nil {
			return StopInfo{}, err
		}
		if last != nil {
			if c, err = s.goTo(ctx, c, last.pos); err != nil {
				return StopInfo{}, err
			}
			info, err := s.here(ctx, c, last.stop.Reason)
			if last.access != nil {
				info.WatchAddr, info.Access = hex(last.stop.Addr), last.access
				if th, _, err := s.on(ctx, c, LastHart); err == nil {
					if regs, err := th.ReadRegisters(ctx); err == nil {
						bt := s.unwind(ctx, th, regs, watchFrames)
						info.Backtrace = &bt
					}
				}
			}
			return info, err
		}
		hi = start
	}
	if c, err = s.goTo(ctx, c, 0); err != nil {
		return StopInfo{}, err
	}
	info, err := s.here(ctx, c, ReasonStart)
	info.Note = "no earlier breakpoint or watchpoint hit: at the start of the recording"
	if len(set) == 0 {
		info.Note = "no breakpoint or watchpoint is set: at the start of the recording"
	}
	return info, err
}

// scan replays forward to limit with the stub holding set (and nothing
// else), calling f for each stop before it.
func (s *Session) scan(ctx context.Context, c *gdb.Client, limit uint64, set []gdb.Breakpoint, f func(gdb.Stop, uint64) error) error {
	if err := s.arm(ctx, c, set); err != nil {
		return err
	}
	t0 := time.Now()
	defer func() { s.cfg.Logger.Debug("debugger: replayed forward", "to", limit, "took", time.Since(t0)) }()
	for {
		st, pos, err := s.runTo(ctx, c, limit)
		if err != nil {
			return err
		}
		if st.Reason == gdb.ReasonExited || st.Reason == gdb.ReasonTerminated {
			return fmt.Errorf("debugger: QEMU exited while it replayed (%s)", st)
		}
		if pos >= limit {
			return nil
		}
		if st.Signal == gdb.SIGINT {
			continue // a pause that is no hit
		}
		if err := f(st, pos); err != nil {
			return err
		}
	}
}

// readLoc reads a location as the kernel sees it, wherever the replay
// stopped: the stub reads through the hart's current mode, so a kernel
// address read while the hart runs user code (a shell's loop) fails; it is
// then read at the physical address the hart's page tables give it (the
// kernel's half is in every process's tables).
func (s *Session) readLoc(ctx context.Context, c *gdb.Client, a uint64, length int) ([]byte, error) {
	v, err := c.ReadMemory(ctx, a, length)
	if err == nil && len(v) == length {
		return v, nil
	}
	th, _, terr := s.on(ctx, c, LastHart)
	if terr != nil {
		return nil, err
	}
	w, terr := s.translate(ctx, th, a, nil)
	if terr != nil || w.PA == "" || w.Mode == "Bare" {
		return nil, err
	}
	if perr := c.SetPhysicalMemory(ctx, true); perr != nil {
		return nil, err
	}
	defer c.SetPhysicalMemory(context.WithoutCancel(ctx), false)
	return c.ReadMemory(ctx, w.Phys, length)
}

// continueReplay runs the replay forward to the next breakpoint or
// watchpoint hit, or to the end of the recording; past timeout it pauses
// the replay where it got to.
func (s *Session) continueReplay(ctx context.Context, c *gdb.Client, timeout time.Duration) (StopInfo, error) {
	tl := s.cfg.Timeline
	if c.Running() {
		if _, err := c.Interrupt(ctx); err != nil {
			return StopInfo{}, err
		}
	} else if st, ok := s.pending(ctx, c); ok {
		return s.stopInfo(ctx, c, st)
	}
	pos, err := tl.Position(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	end := tl.End()
	if pos >= end {
		info, err := s.here(ctx, c, ReasonEnd)
		info.Note = fmt.Sprintf("already at the end of the recording (instruction %d)", end)
		info.Next = NextBack
		return info, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, at, err := s.runTo(wctx, c, end)
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			info, err := s.here(ctx, c, "paused")
			if info.ICount != nil {
				info.Note = fmt.Sprintf("no stop within the timeout: the replay paused at instruction %d of %d", *info.ICount, end)
				info.Next = NextForward
			}
			return info, err
		}
		return StopInfo{}, err
	}
	if at >= end {
		info, err := s.here(ctx, c, ReasonEnd)
		info.Note = "the end of the recording"
		return info, err
	}
	return s.stopInfo(ctx, c, st)
}
