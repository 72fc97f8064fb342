package debugger

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// counterRecording is a guest of two harts replaying 1,000 instructions
// that write the 8-byte counter: 7 at 100 (init_counter), 7 again at 300
// (hart 1's bump: no change), 2 at 500 (hart 1's bump) and 7 at 700
// (reset_counter); hart 0 idles between.
func counterRecording(t *testing.T) (*fakeGuest, *fakeReplay) {
	g := newFakeGuest(t, 2, "idle", "init_counter", "bump", "reset_counter", "kmain")
	counter := g.variable("counter", 8)
	g.stack(0, "idle", "kmain")
	g.stack(1, "bump", "kmain")
	r := g.replay(1000, "idle",
		write(100, 0, "init_counter", counter, 8, 7),
		write(300, 1, "bump", counter, 8, 7),
		write(500, 1, "bump", counter, 8, 2),
		write(700, 0, "reset_counter", counter, 8, 7))
	return g, r
}

// wantWrite checks a LastWrite that found the write at pos (its icount
// the one after) by hart in fn, from old to new.
func wantWrite(t *testing.T, r *fakeReplay, lw LastWrite, pos uint64, hart int, fn, old, new string) {
	t.Helper()
	if !lw.Found || lw.ICount == nil || *lw.ICount != pos+1 || lw.Hart == nil || *lw.Hart != hart {
		t.Fatalf("last write %+v (icount %v, hart %v), want the one at %d by hart %d", lw, deref(lw.ICount), deref(lw.Hart), pos, hart)
	}
	a := lw.Access
	if a == nil || a.Old != old || a.New != new || a.Insn.Function != fn || a.Insn.Addr != hex(r.storePC(pos)) || a.Text == "" {
		t.Errorf("the write at %d: access %+v, want %s at %s from %s to %s", pos, a, fn, hex(r.storePC(pos)), old, new)
	}
	if lw.Backtrace == nil || len(lw.Backtrace.Frames) < 2 || lw.Backtrace.Frames[0].Function != fn || lw.Backtrace.Frames[1].Function != "kmain" {
		t.Errorf("the write at %d: backtrace %+v, want %s called by kmain", pos, lw.Backtrace, fn)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// icountNow is where the replay is, as the next operation sees it: after
// a last-write search has put it back.
func icountNow(t *testing.T, ctx context.Context, s *Session) uint64 {
	t.Helper()
	info, err := s.Pause(ctx)
	if err != nil || info.ICount == nil {
		t.Fatalf("pause: %+v, %v", info, err)
	}
	return *info.ICount
}

// Going back through a recording with start points: each search finds
// the last write before where it starts that changed the counter (not
// the writes that left it as it was), and the one before it from its
// icount, down to none; the replay is back where it was after each. The
// start points are loaded, not the recording replayed from its start.
func TestLastWriteWithCheckpoints(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	r.offer(200, 400, 600, 800)
	s := g.sessionOn(r)
	if _, err := s.GoTo(ctx, 900); err != nil {
		t.Fatal(err)
	}
	lw, err := s.LastWrite(ctx, "counter", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if lw.Before != 900 || lw.Length != 8 || lw.Data != hex(fakeData) || lw.Symbol != "counter" {
		t.Errorf("searched %+v, want counter's 8 bytes before 900", lw)
	}
	wantWrite(t, r, lw, 700, 0, "reset_counter", "0x2", "0x7")
	if at := icountNow(t, ctx, s); at != 900 {
		t.Errorf("after the search the replay is at %d, want 900, where it was", at)
	}
	for _, tc := range []struct {
		before, pos uint64
		hart        int
		fn, old     string
		new         string
	}{
		{701, 500, 1, "bump", "0x7", "0x2"},
		{501, 100, 0, "init_counter", "0x0", "0x7"}, // 300 wrote 7 over 7
	} {
		lw, err := s.LastWrite(ctx, "counter", 0, tc.before)
		if err != nil {
			t.Fatal(err)
		}
		wantWrite(t, r, lw, tc.pos, tc.hart, tc.fn, tc.old, tc.new)
	}
	lw, err = s.LastWrite(ctx, "counter", 0, 101)
	if err != nil {
		t.Fatal(err)
	}
	if lw.Found || lw.Value != "0x0" || !strings.Contains(lw.Note, "held 0x0 from the start of the recording to instruction 101") {
		t.Errorf("before the first write: %+v, want none, 0x0 since the start", lw)
	}
	if at := icountNow(t, ctx, s); at != 900 {
		t.Errorf("after the searches the replay is at %d, want 900", at)
	}
	loads, restarts, _, failed := r.calls()
	if restarts != 0 || len(failed) != 0 || !slices.Contains(loads, 600) {
		t.Errorf("loads %v, restarts %d, failed %v: want start points loaded, no restart", loads, restarts, failed)
	}
	if n := r.guardsHeld(); n != 0 {
		t.Errorf("%d guards not released", n)
	}
}

// A start point's saved state is read instead of loading the point: an
// interval whose two ends hold the same value is not replayed. A saved
// state that disagrees with the point loaded is not read again, and the
// answer stays right.
func TestLastWriteSavedState(t *testing.T) {
	for _, lie := range []bool{false, true} {
		ctx := testContext(t)
		g, r := counterRecording(t)
		r.offer(200, 400, 600, 800)
		r.lies[800] = lie
		s := g.sessionOn(r)
		if _, err := s.GoTo(ctx, 900); err != nil {
			t.Fatal(err)
		}
		lw, err := s.LastWrite(ctx, "counter", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantWrite(t, r, lw, 700, 0, "reset_counter", "0x2", "0x7")
		loads, _, reads, _ := r.calls()
		// The GoTo loaded 800 (twice: a double load); the search
		// skipped its interval by its saved state unless that lied.
		loads800 := 0
		for _, n := range loads {
			if n == 800 {
				loads800++
			}
		}
		switch {
		case !lie && (!slices.Equal(reads, []uint64{800, 600}) || loads800 != 2):
			t.Errorf("saved states read at %v, loads %v: want 800 and 600 read, 800 loaded only to go there", reads, loads)
		case lie && (!slices.Equal(reads, []uint64{800}) || loads800 != 4):
			t.Errorf("a lying saved state: read at %v, loads %v: want 800 read once, then loaded", reads, loads)
		}
	}
}

// The one before the last write, when its interval ends at the last
// write's icount: the value at the interval's end is the one before the
// write, so an interval whose start holds the value after it is still
// searched.
func TestLastWriteBeforeAWrite(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	r.offer(200, 400, 600)
	s := g.sessionOn(r)
	lw, err := s.LastWrite(ctx, "counter", 0, 701)
	if err != nil {
		t.Fatal(err)
	}
	wantWrite(t, r, lw, 500, 1, "bump", "0x7", "0x2")
}

// Without in-place loads the search replays from the recording's start,
// in a new QEMU, and finds the same writes.
func TestLastWriteWithoutInPlace(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	r.inPlace = false
	s := g.sessionOn(r)
	if _, err := s.GoTo(ctx, 900); err != nil {
		t.Fatal(err)
	}
	lw, err := s.LastWrite(ctx, "counter", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantWrite(t, r, lw, 700, 0, "reset_counter", "0x2", "0x7")
	if lw, err = s.LastWrite(ctx, "counter", 4, 701); err != nil {
		t.Fatal(err)
	}
	if lw.Length != 4 {
		t.Errorf("length %d, want the 4 asked for", lw.Length)
	}
	wantWrite(t, r, lw, 500, 1, "bump", "0x7", "0x2")
	if at := icountNow(t, ctx, s); at != 900 {
		t.Errorf("after the searches the replay is at %d, want 900", at)
	}
	loads, restarts, _, _ := r.calls()
	if len(loads) != 0 || restarts < 2 {
		t.Errorf("loads %v, restarts %d: want no load, a restart for each search", loads, restarts)
	}
}

// A start point that does not load (its load fails, or the replay makes
// no progress after it) is marked failed, the replay starts over in a new
// QEMU, and the search still answers, from an earlier point.
func TestLastWriteFailedCheckpoint(t *testing.T) {
	for _, how := range []string{"error", "stuck"} {
		t.Run(how, func(t *testing.T) {
			ctx := testContext(t)
			g, r := counterRecording(t)
			r.offer(200, 400, 600)
			r.badLoad[600] = how
			s := g.sessionOn(r)
			lw, err := s.LastWrite(ctx, "counter", 0, 900)
			if err != nil {
				t.Fatal(err)
			}
			wantWrite(t, r, lw, 700, 0, "reset_counter", "0x2", "0x7")
			if at := icountNow(t, ctx, s); at != 0 {
				t.Errorf("after the search the replay is at %d, want 0, where it was", at)
			}
			loads, restarts, _, failed := r.calls()
			if why, ok := failed[600]; !ok || why == "" || restarts != 1 {
				t.Errorf("failed %v, restarts %d: want 600 failed, with why, and one restart", failed, restarts)
			}
			if !slices.Contains(loads, 400) {
				t.Errorf("loads %v: want the point before 600, 400", loads)
			}
			if starts := r.Starts(900); slices.Contains(starts, 600) {
				t.Errorf("start points %v still offer 600", starts)
			}
			if r.guards != 0 {
				t.Errorf("%d guards not released", r.guards)
			}
		})
	}
}

// Reverse steps go back exactly the instructions asked: from right after
// a write to the store itself, its value not yet written.
func TestReverseStep(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	r.offer(600)
	s := g.sessionOn(r)
	if _, err := s.GoTo(ctx, 701); err != nil {
		t.Fatal(err)
	}
	info, err := s.ReverseStep(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if info.ICount == nil || *info.ICount != 700 || info.PC != hex(r.storePC(700)) || info.Function != "reset_counter" || !strings.HasPrefix(info.Insn, "sd") {
		t.Errorf("one back from 701: %+v at %v, want the store of reset_counter at 700", info, deref(info.ICount))
	}
	m, err := s.Memory(ctx, LastHart, "counter", 8, false)
	if err != nil || binary.LittleEndian.Uint64(m.Data) != 2 {
		t.Errorf("counter at 700: % x, %v; want 2, the store not run", m.Data, err)
	}
	if info, err = s.ReverseStep(ctx, 99); err != nil || info.ICount == nil || *info.ICount != 601 || info.Function != "idle" {
		t.Errorf("99 back from 700: %+v at %v, %v; want 601 in idle", info, deref(info.ICount), err)
	}
	if _, err := s.GoTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReverseStep(ctx, 3); err == nil || !strings.Contains(err.Error(), "cannot go back 3") {
		t.Errorf("3 back from 2: %v", err)
	}
	if _, err := s.ReverseStep(ctx, 0); err == nil {
		t.Error("a reverse step of 0 instructions passed")
	}
}

// A search can be cancelled: it stops, says so, and the replay goes back
// where it was.
func TestLastWriteCancelled(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 1, "idle", "store", "kmain")
	v := g.variable("v", 4)
	g.stack(0, "idle", "kmain")
	r := g.replay(100_000, "idle", write(10, 0, "store", v, 4, 1), write(90_000, 0, "store", v, 4, 2))
	r.inPlace = false
	s := g.sessionOn(r)
	if _, err := s.GoTo(ctx, 95_000); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	r.perMS = 100 // 1 s from the start to 95,000
	g.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := s.LastWrite(cctx, "v", 0, 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a search cancelled: %v", err)
	}
	if took := time.Since(t0); took > 700*time.Millisecond {
		t.Errorf("the search took %v to stop", took)
	}
	if at := icountNow(t, ctx, s); at != 95_000 {
		t.Errorf("after the cancelled search the replay is at %d, want 95000", at)
	}
}

// A replay whose stub connection fails while it runs ends with that
// failure at once: it does not poll on until the replay stalls.
func TestReplayConnectionLost(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 1, "idle", "kmain")
	g.stack(0, "idle", "kmain")
	r := g.replay(600_000, "idle")
	r.perMS = 100 // 6 s to the end
	s := g.sessionOn(r)
	time.AfterFunc(200*time.Millisecond, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for c := range g.conns {
			c.Close()
		}
	})
	t0 := time.Now()
	if _, err := s.GoTo(ctx, 590_000); err == nil {
		t.Errorf("a replay that lost its stub reached its stop")
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("the lost connection ended the run after %v", took)
	}
}

// A long replay forward offers the timeline start points on the way, at
// replay breaks it set ahead (where the stub stopped the replay), and a
// later move back loads the latest of them.
func TestRunToOffersCheckpoints(t *testing.T) {
	ctx := testContext(t)
	g := newFakeGuest(t, 1, "idle", "kmain")
	g.stack(0, "idle", "kmain")
	r := g.replay(600_000, "idle")
	r.spacing, r.perMS = 20*time.Millisecond, 2000
	s := g.sessionOn(r)
	info, err := s.GoTo(ctx, 590_000)
	if err != nil || info.ICount == nil || *info.ICount != 590_000 || info.Reason != ReasonICount {
		t.Fatalf("go to 590000: %+v at %v, %v", info, deref(info.ICount), err)
	}
	r.mu.Lock()
	offered := slices.Clone(r.offered)
	r.mu.Unlock()
	if len(offered) == 0 || offered[0] < minAhead {
		t.Fatalf("checkpoints offered at %v: want some, a break ahead of the replay", offered)
	}
	latest := slices.Max(offered)
	if info, err = s.ReverseStep(ctx, 1); err != nil || *info.ICount != 589_999 {
		t.Fatalf("one back: %+v, %v", info, err)
	}
	if loads, restarts, _, _ := r.calls(); !slices.Contains(loads, latest) || restarts != 0 {
		t.Errorf("loads %v, restarts %d: want the latest checkpoint, %d, loaded", loads, restarts, latest)
	}
}

// Back to the last breakpoint hit, then to the start when there is none
// before; back to the last write a watchpoint caught, same value or not.
func TestReverseContinue(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	r.offer(200, 400, 600, 800)
	s := g.sessionOn(r)
	if _, err := s.GoTo(ctx, 900); err != nil {
		t.Fatal(err)
	}
	if info, err := s.ReverseContinue(ctx); err != nil || info.Reason != ReasonStart || !strings.Contains(info.Note, "no breakpoint or watchpoint is set") {
		t.Errorf("back with nothing set: %+v, %v", info, err)
	}
	if _, err := s.GoTo(ctx, 900); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Break(ctx, hex(r.storePC(700)), false, false); err != nil {
		t.Fatal(err)
	}
	info, err := s.ReverseContinue(ctx)
	if err != nil || info.Reason != "breakpoint" || info.ICount == nil || *info.ICount != 700 || info.Function != "reset_counter" {
		t.Errorf("back to the breakpoint: %+v at %v, %v", info, deref(info.ICount), err)
	}
	info, err = s.ReverseContinue(ctx)
	if err != nil || info.Reason != ReasonStart || info.ICount == nil || *info.ICount != 0 || !strings.Contains(info.Note, "no earlier") {
		t.Errorf("back past the only hit: %+v at %v, %v", info, deref(info.ICount), err)
	}
	if _, err := s.Break(ctx, hex(r.storePC(700)), false, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Watch(ctx, "counter", 0, "", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GoTo(ctx, 900); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		icount   uint64
		old, new string
	}{{701, "0x2", "0x7"}, {501, "0x7", "0x2"}, {301, "0x7", "0x7"}} {
		info, err := s.ReverseContinue(ctx)
		if err != nil || info.Reason != "watch" || info.ICount == nil || *info.ICount != want.icount || info.Access == nil ||
			info.Access.Old != want.old || info.Access.New != want.new || info.WatchAddr != hex(fakeData) {
			t.Errorf("back to the write at %d: %+v at %v, access %+v, %v", want.icount, info, deref(info.ICount), info.Access, err)
		}
	}
}

// Forward through a replay: a watchpoint stops at each write, a step
// runs one instruction, and the end of the recording is said as such.
func TestReplayForward(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	s := g.sessionOn(r)
	if _, err := s.Watch(ctx, "counter", 0, "", false); err != nil {
		t.Fatal(err)
	}
	info, err := s.Continue(ctx, 10*time.Second)
	if err != nil || info.Reason != "watch" || info.ICount == nil || *info.ICount != 101 || info.Access == nil || info.Access.New != "0x7" {
		t.Errorf("on to the first write: %+v at %v, access %+v, %v", info, deref(info.ICount), info.Access, err)
	}
	if info, err = s.Step(ctx, LastHart, 3, false, 10*time.Second); err != nil || info.ICount == nil || *info.ICount != 104 {
		t.Errorf("3 steps from 101: %+v at %v, %v", info, deref(info.ICount), err)
	}
	if _, err := s.Watch(ctx, "counter", 0, "", true); err != nil {
		t.Fatal(err)
	}
	if info, err = s.Continue(ctx, 10*time.Second); err != nil || info.Reason != ReasonEnd || info.ICount == nil || *info.ICount != 1000 {
		t.Errorf("on to the end: %+v at %v, %v", info, deref(info.ICount), err)
	}
	if info, err = s.Continue(ctx, 10*time.Second); err != nil || info.Next != NextBack || !strings.Contains(info.Note, "already at the end") {
		t.Errorf("on from the end: %+v, %v", info, err)
	}
	if _, err := s.Step(ctx, LastHart, 1, false, time.Second); !errors.Is(err, ErrAtEnd) {
		t.Errorf("a step at the end: %v", err)
	}
	if _, err := s.GoTo(ctx, 1001); err == nil || !strings.Contains(err.Error(), "past the end") {
		t.Errorf("go to past the end: %v", err)
	}
}

// What a last-write search refuses, before it replays anything.
func TestLastWriteRefused(t *testing.T) {
	ctx := testContext(t)
	g, r := counterRecording(t)
	s := g.sessionOn(r)
	for _, tc := range []struct {
		loc    string
		length int
		before uint64
		want   string
	}{
		{"counter", 9, 0, "length 9: want 1 to 8 bytes"},
		{"counter", 0, 1001, "before 1001 is past the end of the recording (1000)"},
		{"no_such_variable", 0, 0, "no_such_variable"},
	} {
		if _, err := s.LastWrite(ctx, tc.loc, tc.length, tc.before); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LastWrite(%s, %d, %d): %v, want %q", tc.loc, tc.length, tc.before, err, tc.want)
		}
	}
	live := newFakeGuest(t, 1, "idle")
	live.variable("counter", 8)
	if _, err := live.session().LastWrite(ctx, "counter", 0, 0); !errors.Is(err, ErrNotReplay) {
		t.Errorf("a live guest's last write: %v, want ErrNotReplay", err)
	}
}

// How far ahead a checkpoint's break goes: 20 ms of replay at its speed
// now, and never nearer than minAhead.
func TestCheckpointAhead(t *testing.T) {
	for _, tc := range []struct {
		pos, prev uint64
		elapsed   time.Duration
		want      uint64
	}{
		{10_000_000, 0, time.Second, 200_000},         // 10 M/s
		{1_000_000, 0, time.Second, minAhead},         // slow: at least minAhead
		{5_000_000, 5_000_000, time.Second, minAhead}, // not moving
		{4_000_000, 5_000_000, time.Second, minAhead}, // behind (a load): no speed
		{20_000_000, 0, 0, 400_000_000},               // no time: 1 ms
	} {
		if got := checkpointAhead(tc.pos, tc.prev, tc.elapsed); got != tc.want {
			t.Errorf("checkpointAhead(%d, %d, %v) = %d, want %d", tc.pos, tc.prev, tc.elapsed, got, tc.want)
		}
	}
}
