package debugger

import (
	"context"
	"fmt"
	"time"

	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// LastWrite is the last write that changed a location before an
// instruction count.
type LastWrite struct {
	// Found says there is one; Note says so plainly when not.
	Found bool   `json:"found"`
	Note  string `json:"note,omitempty"`
	// Data is the location's address, Symbol what the symbols say of it,
	// Length the bytes compared.
	Data   string `json:"data"`
	Symbol string `json:"symbol,omitempty"`
	Length int    `json:"length"`
	// Before is the instruction count searched before.
	Before uint64 `json:"before"`
	// ICount is the instruction count right after the write; Hart the
	// hart that wrote.
	ICount *uint64 `json:"icount,omitempty"`
	Hart   *int    `json:"hart,omitempty"`
	// Access is the write: the instruction (function+offset, file:line),
	// the value before and after.
	Access    *Access    `json:"access,omitempty"`
	Backtrace *Backtrace `json:"backtrace,omitempty"`
	// Value is the location's value at Before, when nothing changed it.
	Value string `json:"value,omitempty"`
}

// LastWrite finds the last write that changed loc (length bytes; 0: the
// symbol's size, up to 8) before instruction before (0: the replay's
// position). As gdb's watch does, a write that leaves the value as it was
// does not count. The replay is back where it was afterwards.
func (s *Session) LastWrite(ctx context.Context, loc string, length int, before uint64) (res LastWrite, err error) {
	a, length, err := s.writeTarget(loc, length)
	if err != nil {
		return LastWrite{}, err
	}
	// The session stays held until the replay is back where the agent
	// left it: after the answer, in the background (the next operation
	// waits for it).
	s.mu.Lock()
	back, goBack := uint64(0), false
	defer func() { s.endWriteSearch(ctx, goBack, back) }()
	tl, c, err := s.replayClient(ctx)
	if err != nil {
		return LastWrite{}, err
	}
	here, err := tl.Position(ctx)
	if err != nil {
		return LastWrite{}, err
	}
	if before == 0 {
		before = here
	}
	if end := tl.End(); before > end {
		return LastWrite{}, fmt.Errorf("before %d is past the end of the recording (%d)", before, end)
	}
	q := s.newWriteSearch(tl, c, a, length, before)
	back, goBack = here, true
	return q.run(ctx, here)
}

// writeTarget is the address and length a last-write search compares.
func (s *Session) writeTarget(loc string, length int) (uint64, int, error) {
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return 0, 0, err
	}
	a := addrs[0]
	if length == 0 {
		length = s.dataSize(a)
	}
	if length < 1 || length > 8 {
		return 0, 0, fmt.Errorf("length %d: want 1 to 8 bytes", length)
	}
	return a, length, nil
}

// endWriteSearch ends a last-write search, whose operation holds s.mu:
// with goBack, the replay is put back at instruction back in the
// background, and the session let go after that.
func (s *Session) endWriteSearch(ctx context.Context, goBack bool, back uint64) {
	if !goBack || s.c == nil {
		s.restoreArmed(ctx)
		s.releaseIdle()
		s.mu.Unlock()
		return
	}
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := s.goTo(bctx, s.c, back); err != nil {
			s.cfg.Logger.Warn("debugger: back to where the replay was after a last-write search", "icount", back, "err", err)
		}
		s.restoreArmed(bctx)
		s.releaseIdle()
		s.mu.Unlock()
	}()
}

// writeSearch is one last-write search: back through the recording from
// Before, one interval at a time (from a start point to where the last
// interval began), each replayed with a write watchpoint on the location
// unless its two ends hold the same value.
type writeSearch struct {
	s      *Session
	tl     Timeline
	c      *gdb.Client
	a      uint64
	length int
	// w watches the location; its value is the location's as the replay
	// goes, the old value of the next write.
	w *watch
	// res is what every answer says: the location and the search.
	res LastWrite
	// vHi is the value at the end of the interval searched next, once
	// known.
	vHi []byte
	// pa is where the location is in physical memory, when phys: its
	// value at a start point can then be read out of the point's saved
	// state instead of loading the point; saved holds what was read so,
	// to be checked against the load if the interval is searched after
	// all.
	pa    uint64
	phys  bool
	saved map[uint64][]byte
	// lastNote is when progress was last reported for skipped intervals.
	lastNote time.Time
}

func (s *Session) newWriteSearch(tl Timeline, c *gdb.Client, a uint64, length int, before uint64) *writeSearch {
	w := &watch{Breakpoint: Breakpoint{Where: s.Where(a), Kind: "write", Length: length, kind: gdb.WatchWrite}}
	q := &writeSearch{s: s, tl: tl, c: c, a: a, length: length, w: w, saved: map[uint64][]byte{}, lastNote: time.Now(),
		res: LastWrite{Data: hex(a), Length: length, Before: before}}
	if w.Function != "" {
		q.res.Symbol = w.Where.String()
	}
	return q
}

// run searches back from Before; here is the replay's position.
func (q *writeSearch) run(ctx context.Context, here uint64) (LastWrite, error) {
	hi := q.res.Before
	if hi == here {
		// The value at hi is read as it is.
		if v, err := q.s.readLoc(ctx, q.c, q.a, q.length); err == nil && len(v) == q.length {
			q.vHi = v
		}
	}
	q.pa, q.phys = q.s.physical(ctx, q.c, q.a, q.length)
	for hi > 0 {
		if err := ctx.Err(); err != nil {
			return q.res, err
		}
		if st, ok := q.unchangedSince(ctx, hi); ok {
			hi = st
			continue
		}
		var start uint64
		var err error
		if q.c, start, err = q.s.rewind(ctx, q.c, hi-1); err != nil {
			return q.res, err
		}
		v := q.valueAtStart(ctx, start)
		if q.vHi != nil && len(v) == q.length && string(v) == string(q.vHi) && start > 0 {
			q.s.cfg.Logger.Debug("debugger: the same value at both ends of an interval: skipped", "from", start, "to", hi)
			hi = start
			continue
		}
		last, err := q.scanInterval(ctx, start, hi)
		if err != nil {
			return q.res, err
		}
		if last != nil {
			return *last, nil
		}
		if q.vHi == nil || len(q.w.value) == q.length {
			q.vHi = q.w.value
		}
		hi = start
	}
	return q.none(), nil
}

// unchangedSince says whether the location held, at the start point the
// interval ending at hi begins at, the value it holds at hi, as an
// earlier search read it there or as the point's saved state holds it:
// an interval whose ends hold the same value is skipped without going
// there (a value changed and changed back within it is not seen). st is
// that start point.
func (q *writeSearch) unchangedSince(ctx context.Context, hi uint64) (st uint64, ok bool) {
	starts := q.tl.Starts(hi - 1)
	if len(starts) == 0 || starts[0] == 0 || q.vHi == nil {
		return 0, false
	}
	st = starts[0]
	v, how, ok := q.valueAtPoint(ctx, st)
	if !ok || string(v) != string(q.vHi) {
		return 0, false
	}
	q.s.cfg.Logger.Debug("debugger: the same value at both ends of an interval: skipped", "from", st, "to", hi, "read", how)
	if time.Since(q.lastNote) >= tick {
		progressOf(ctx)(fmt.Sprintf("looking for the last change of %s: unchanged back to instruction %d", hex(q.a), st), q.res.Before-st, q.res.Before)
		q.lastNote = time.Now()
	}
	return st, true
}

// valueAtPoint is the location's value at start point st without loading
// it, if known: how says where from.
func (q *writeSearch) valueAtPoint(ctx context.Context, st uint64) (v []byte, how string, ok bool) {
	if v, ok := q.s.values[valueAt{st, q.a, q.length}]; ok {
		return v, "read before", true
	}
	if !q.phys {
		return nil, "", false
	}
	t0 := time.Now()
	v, err := q.tl.ReadPhysical(ctx, st, q.pa, q.length)
	if err != nil || len(v) != q.length {
		q.s.cfg.Logger.Debug("debugger: a start point's saved state is not readable: it is loaded", "icount", st, "err", err)
		return nil, "", false
	}
	q.saved[st] = v
	q.s.cfg.Logger.Debug("debugger: read a start point's saved state", "icount", st, "pa", hex(q.pa), "value", number(v), "took", time.Since(t0))
	return v, "its saved state", true
}

// valueAtStart reads the location at start, where the replay was just
// put, as the old value of the interval's first write, and keeps it for
// later searches. Unreadable (not mapped yet, early in boot), there is
// nothing to compare: the interval is searched.
func (q *writeSearch) valueAtStart(ctx context.Context, start uint64) []byte {
	v, _ := q.s.readLoc(ctx, q.c, q.a, q.length)
	q.w.value = v
	if len(v) != q.length {
		return v
	}
	q.s.values[valueAt{start, q.a, q.length}] = v
	if fv, ok := q.saved[start]; ok && string(fv) != string(v) {
		// The saved state and the loaded machine disagree: the physical
		// address is not the location's here. Loads only, from now on.
		q.s.cfg.Logger.Warn("debugger: a start point's saved state disagrees with the point loaded: its states are no longer read",
			"icount", start, "location", hex(q.a), "pa", hex(q.pa), "saved", number(fv), "loaded", number(v))
		q.phys = false
	}
	return v
}

// scanInterval replays from start, where the replay is, to hi with the
// location watched: the last write in it that changed the value, or nil.
func (q *writeSearch) scanInterval(ctx context.Context, start, hi uint64) (*LastWrite, error) {
	var last *LastWrite
	progressOf(ctx)(fmt.Sprintf("looking for writes to %s between instructions %d and %d", hex(q.a), start, hi), start, hi)
	set := []gdb.Breakpoint{{Kind: gdb.WatchWrite, Addr: q.a, Length: q.length}}
	err := q.s.scan(ctx, q.c, hi, set, func(st gdb.Stop, _ uint64) error {
		lw, err := q.write(ctx, st, hi)
		if lw != nil {
			last = lw
		}
		return err
	})
	return last, err
}

// write describes the write the watchpoint stopped the replay on: nil
// when it left the value as it was, or was at hi or past it.
func (q *writeSearch) write(ctx context.Context, st gdb.Stop, hi uint64) (*LastWrite, error) {
	th, hart, err := q.s.stoppedHart(ctx, q.c, st)
	if err != nil {
		return nil, err
	}
	prev := q.w.value
	acc, err := q.s.accessOf(ctx, th, q.w)
	if err != nil {
		return nil, err
	}
	if acc.Old == acc.New {
		return nil, nil
	}
	at, err := q.tl.Position(ctx)
	if err != nil {
		return nil, err
	}
	if at >= hi {
		// The write that ends at hi (a search before an earlier
		// answer's icount) is not in the interval: the value the
		// interval ends with, which the next interval is compared with,
		// is the one before it.
		q.w.value = prev
		return nil, nil
	}
	lw := q.res
	lw.Found, lw.ICount, lw.Hart, lw.Access = true, &at, &hart, acc
	if regs, err := th.ReadRegisters(ctx); err == nil {
		bt := q.s.unwind(ctx, th, regs, watchFrames)
		lw.Backtrace = &bt
	}
	return &lw, nil
}

// none is the answer when no write changed the location.
func (q *writeSearch) none() LastWrite {
	res := q.res
	res.Value = number(q.vHi)
	res.Note = fmt.Sprintf("no earlier write changed it: it held %s from the start of the recording to instruction %d", res.Value, res.Before)
	return res
}

// physical is the guest-physical address of the length bytes at a, when
// their value at a start point can be read out of the point's saved
// state: a location in the kernel image (its global and static data),
// whose mapping the kernel fixes in its first instructions and keeps,
// translated once here through the stopped hart's page tables (the
// kernel's half is in every process's). Elsewhere (the heap, vmalloc
// areas, modules, user space) what a physical address holds at another
// point in time may be another location: those start points are loaded.
func (s *Session) physical(ctx context.Context, c *gdb.Client, a uint64, length int) (uint64, bool) {
	if s.cfg.Symbols == nil || !s.cfg.Symbols.Loaded(a, length) || a>>12 != (a+uint64(length)-1)>>12 {
		return 0, false
	}
	th, _, err := s.on(ctx, c, LastHart)
	if err != nil {
		return 0, false
	}
	w, err := s.translate(ctx, th, a, nil)
	if err != nil || w.PA == "" {
		s.cfg.Logger.Debug("debugger: no physical address for a location: start points are loaded", "location", hex(a), "err", err, "fault", w.Fault)
		return 0, false
	}
	return w.Phys, true
}

// dataSize is the size of the symbol at a (up to 8), else 8.
func (s *Session) dataSize(a uint64) int {
	if syms := s.cfg.Symbols; syms != nil {
		if l, ok := syms.Symbolize(a); ok && l.Offset == 0 {
			if sym, err := syms.Lookup(l.Function); err == nil && sym.Addr == a && sym.Size > 0 {
				return int(min(sym.Size, 8))
			}
		}
	}
	return 8
}
