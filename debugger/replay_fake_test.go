package debugger

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// A fake replay for time travel: the fake guest runs a scripted
// recording, its position the count of instructions run, and fakeReplay
// is the Timeline its host would give the debugger. Every instruction is
// a hart's: one of the script's writes, or hart 0 idling. The stub
// breaks the replay where StopAt says (a pause), stops before a write
// that a watchpoint covers and at a breakpoint's pc, steps one
// instruction, and takes its state back to a start point on Load or to
// the recording's start on Restart, as QEMU does; it fails the test where
// QEMU would exit or crash.

// fakeWrite is a scripted write: the instruction at pos, of hart, in
// function fn, stores data at addr.
type fakeWrite struct {
	pos  uint64
	hart int
	fn   string
	addr uint64
	data []byte
}

// A writing function's stores, "sd a1,0(a0)" each followed by two
// c.nop, fill fakeStoreSlots slots of 8 bytes from fakeStoreOff; the
// write at pos runs slot pos%fakeStoreSlots, so successive writes are at
// different pcs, and a hart that wrote goes on to the nops after its
// store.
const (
	fakeStoreOff   = 0x40
	fakeStoreSlots = 16
)

var sdA1A0 = []byte{0x23, 0x30, 0xb5, 0x00} // sd a1,0(a0)

// fakeState is the guest's state at an instruction count: what a start
// point saves.
type fakeState struct {
	pos     uint64
	mem     map[uint64]byte
	regs    []map[string]uint64
	stopped int // the hart of the next instruction
}

func (st *fakeState) clone() *fakeState {
	c := &fakeState{pos: st.pos, mem: maps.Clone(st.mem), stopped: st.stopped}
	for _, r := range st.regs {
		c.regs = append(c.regs, maps.Clone(r))
	}
	return c
}

// restore puts from's state into st's maps (the guest's own).
func (st *fakeState) restore(from *fakeState) {
	st.pos, st.stopped = from.pos, from.stopped
	clear(st.mem)
	maps.Copy(st.mem, from.mem)
	for i, r := range st.regs {
		clear(r)
		maps.Copy(r, from.regs[i])
	}
}

// fakeReplay is the recording the fake guest replays, and its Timeline.
type fakeReplay struct {
	g      *fakeGuest
	end    uint64
	idle   uint64 // hart 0's pc while it writes nothing
	writes map[uint64]fakeWrite
	start  *fakeState // at instruction 0
	// cur is the guest's state as the stub serves it: g.mem and the
	// harts' registers.
	cur *fakeState
	// inPlace and spacing are what InPlace and Spacing say; perMS is how
	// many instructions the replay runs a millisecond, 0: all at once.
	inPlace bool
	spacing time.Duration
	perMS   int

	// The run, under g.mu: the replay break, whether it runs and was
	// interrupted, whether it is stuck (a bad load), and the loads since
	// it last ran an instruction.
	stopAt     uint64
	armed      bool
	running    bool
	intr       bool
	stuck      bool
	loadsNoRun int

	// The timeline's own, under mu: its start points and what was asked
	// of it.
	mu        sync.Mutex
	points    map[uint64]*fakeState
	failed    map[uint64]string
	badLoad   map[uint64]string // "error": the load fails; "stuck": the replay makes no progress after it
	lies      map[uint64]bool   // a saved state that reads wrong
	loads     []uint64
	restarts  int
	physReads []uint64
	offered   []uint64
	guards    int
}

// replay makes g replay a recording of end instructions: the writes,
// hart 0 idling in function idle between them. g's state now is the
// recording's start.
func (g *fakeGuest) replay(end uint64, idle string, writes ...fakeWrite) *fakeReplay {
	r := &fakeReplay{g: g, end: end, idle: g.at(idle), writes: map[uint64]fakeWrite{}, inPlace: true,
		points: map[uint64]*fakeState{}, failed: map[uint64]string{}, badLoad: map[uint64]string{}, lies: map[uint64]bool{}}
	for _, w := range writes {
		if w.pos >= end {
			g.t.Fatalf("a write at %d, past the recording's end %d", w.pos, end)
		}
		r.writes[w.pos] = w
		fn, ok := g.syms[w.fn]
		if !ok {
			g.t.Fatalf("fake kernel: no function %s", w.fn)
		}
		for k := range fakeStoreSlots {
			g.write(fn+fakeStoreOff+uint64(8*k), sdA1A0)
		}
	}
	r.cur = &fakeState{mem: g.mem}
	for _, h := range g.harts {
		r.cur.regs = append(r.cur.regs, h.regs)
	}
	r.enter(r.cur)
	g.stopped = r.cur.stopped
	r.start = r.cur.clone()
	g.rep = r
	return r
}

// variable adds a variable of size bytes to the kernel's .data.
func (g *fakeGuest) variable(name string, size uint64) uint64 {
	a := fakeData + uint64(len(g.data))*0x10
	g.data[name] = fakeDatum{addr: a, size: size}
	return a
}

// write is the scripted write of v (size bytes) to a at pos.
func write(pos uint64, hart int, fn string, a uint64, size int, v uint64) fakeWrite {
	return fakeWrite{pos: pos, hart: hart, fn: fn, addr: a, data: binary.LittleEndian.AppendUint64(nil, v)[:size]}
}

// storePC is the pc of the write at pos.
func (r *fakeReplay) storePC(pos uint64) uint64 {
	return r.g.syms[r.writes[pos].fn] + fakeStoreOff + 8*(pos%fakeStoreSlots)
}

// insn is the instruction at pos: its hart and pc, and its write if it
// writes. Hart 0 runs the instruction after its store before it idles
// again.
func (r *fakeReplay) insn(pos uint64) (hart int, pc uint64, w *fakeWrite) {
	if x, ok := r.writes[pos]; ok {
		return x.hart, r.storePC(pos), &x
	}
	if x, ok := r.writes[pos-1]; ok && pos > 0 && x.hart == 0 {
		return 0, r.storePC(pos-1) + 4, nil
	}
	return 0, r.idle, nil
}

// offer gives the timeline start points at ns, as a recording's saved
// checkpoints.
func (r *fakeReplay) offer(ns ...uint64) {
	st := r.start.clone()
	for _, n := range slices.Sorted(slices.Values(ns)) {
		for st.pos < n {
			r.exec(st)
		}
		r.mu.Lock()
		r.points[n] = st.clone()
		r.mu.Unlock()
	}
}

// exec runs the instruction at st.pos: its write, and its hart moves on.
func (r *fakeReplay) exec(st *fakeState) {
	h, pc, w := r.insn(st.pos)
	if w != nil {
		for i, b := range w.data {
			st.mem[w.addr+uint64(i)] = b
		}
	}
	st.regs[h]["pc"] = pc + 4
	st.pos++
	r.enter(st)
}

// enter readies the instruction at st.pos: its hart's pc, and for a
// write the registers its store takes.
func (r *fakeReplay) enter(st *fakeState) {
	if st.pos >= r.end {
		return
	}
	h, pc, w := r.insn(st.pos)
	regs := st.regs[h]
	regs["pc"] = pc
	if w != nil {
		var v [8]byte
		copy(v[:], w.data)
		regs["a0"], regs["a1"] = w.addr, binary.LittleEndian.Uint64(v[:])
	}
	st.stopped = h
}

// execLive runs the guest's next instruction. g.mu is held.
func (r *fakeReplay) execLive() {
	if r.loadsNoRun >= 2 {
		r.g.t.Errorf("the replay ran after two loads with nothing run between them, at %d: QEMU 11 crashes", r.cur.pos)
	}
	r.loadsNoRun = 0
	r.exec(r.cur)
}

// stopLocked is the stop reply due before the replay runs its next
// instruction, "" for none. g.mu is held.
func (r *fakeReplay) stopLocked() string {
	st := r.cur
	th := thread(st.stopped)
	switch {
	case r.intr:
		r.intr = false
		return "T02thread:" + th + ";"
	case r.armed && st.pos == r.stopAt:
		r.armed = false // QEMU's replay break is spent once hit
		return "T02thread:" + th + ";"
	case st.pos >= r.end:
		r.g.t.Errorf("the replay ran off the end of its recording (%d): QEMU exits", r.end)
		return "W00"
	}
	_, pc, w := r.insn(st.pos)
	for bp := range r.g.bps {
		switch {
		case bp.kind <= 1 && bp.addr == pc:
			return "T05swbreak:;thread:" + th + ";"
		case (bp.kind == 2 || bp.kind == 4) && w != nil && w.addr < bp.addr+bp.size && bp.addr < w.addr+uint64(len(w.data)):
			return fmt.Sprintf("T05watch:%x;thread:%s;", w.addr, th)
		}
	}
	return ""
}

// resume runs the replay until its next stop, which it reports on fc.
func (r *fakeReplay) resume(fc *fakeConn) {
	r.g.mu.Lock()
	r.running, r.intr = true, false
	r.g.mu.Unlock()
	go func() { fc.send(r.run()) }()
}

// run runs the replay, perMS instructions a millisecond, to its next
// stop.
func (r *fakeReplay) run() string {
	g := r.g
	for {
		g.mu.Lock()
		reply := ""
		for n := 0; reply == "" && (r.perMS == 0 || n < r.perMS); n++ {
			if r.stuck && !r.intr {
				break
			}
			if reply = r.stopLocked(); reply == "" {
				r.execLive()
			}
		}
		if reply != "" {
			r.running = false
			g.stopped = r.cur.stopped
		}
		g.mu.Unlock()
		if reply != "" {
			return reply
		}
		if r.perMS > 0 || r.stuck {
			time.Sleep(time.Millisecond)
		}
	}
}

// interrupt has a running replay stop, which the run reports; a stopped
// replay ignores it.
func (r *fakeReplay) interrupt() {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if r.running {
		r.intr = true
	}
}

// step runs one instruction (of the thread cmd names, if it does) and is
// its stop reply.
func (r *fakeReplay) step(cmd string) string {
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	h := r.cur.stopped
	if r.cur.pos < r.end && !r.stuck {
		h, _, _ = r.insn(r.cur.pos)
		r.execLive()
	}
	if th, ok := cutThread(cmd); ok {
		h = th
	}
	g.stopped = h
	return "T05thread:" + thread(h) + ";"
}

// cutThread is the hart a vCont action names ("vCont;s:02").
func cutThread(cmd string) (int, bool) {
	var n int
	if _, err := fmt.Sscanf(cmd, "vCont;s:%x", &n); err != nil || n < 1 {
		return 0, false
	}
	return n - 1, true
}

// The Timeline.

func (r *fakeReplay) Position(context.Context) (uint64, error) {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	return r.cur.pos, nil
}

func (r *fakeReplay) End() uint64 { return r.end }

func (r *fakeReplay) StopAt(_ context.Context, n uint64) error {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if n < r.cur.pos {
		return fmt.Errorf("cannot set a replay break at %d, behind the replay at %d", n, r.cur.pos)
	}
	r.stopAt, r.armed = n, true
	return nil
}

func (r *fakeReplay) InPlace() bool { return r.inPlace }

func (r *fakeReplay) Starts(n uint64) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	if r.inPlace {
		for _, p := range slices.Backward(slices.Sorted(maps.Keys(r.points))) {
			if _, bad := r.failed[p]; p <= n && p > 0 && !bad {
				out = append(out, p)
			}
		}
	}
	if _, bad := r.failed[0]; !bad {
		out = append(out, 0)
	}
	return out
}

func (r *fakeReplay) Load(_ context.Context, n uint64) error {
	r.mu.Lock()
	r.loads = append(r.loads, n)
	st, ok := r.points[n]
	bad := r.badLoad[n]
	r.mu.Unlock()
	if !r.inPlace {
		r.g.t.Errorf("a load at %d of a timeline that does not load in place", n)
	}
	if n == 0 {
		st, ok = r.start, true
	}
	if !ok {
		return fmt.Errorf("no checkpoint at instruction %d any more (evicted)", n)
	}
	if bad == "error" {
		return fmt.Errorf("load the checkpoint at instruction %d: its image is damaged", n)
	}
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if r.running {
		r.g.t.Errorf("a load at %d while the replay runs", n)
	}
	r.cur.restore(st)
	r.g.stopped = r.cur.stopped
	r.stuck = bad == "stuck"
	r.loadsNoRun++
	return nil
}

func (r *fakeReplay) Failed(n uint64, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed[n] = why
}

// Restart is a new QEMU replaying from the start: the old one's
// connections and breakpoints go with it.
func (r *fakeReplay) Restart(context.Context) error {
	r.mu.Lock()
	r.restarts++
	r.mu.Unlock()
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.running {
		g.t.Errorf("a restart while the replay runs")
	}
	r.cur.restore(r.start)
	g.stopped = r.cur.stopped
	r.armed, r.stuck, r.running = false, false, false
	r.loadsNoRun = 1 // the new QEMU loaded the recording's start
	for c := range g.conns {
		c.Close()
	}
	clear(g.bps)
	return nil
}

func (r *fakeReplay) Guard() (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.guards++
	return sync.OnceFunc(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.guards--
	})
}

func (r *fakeReplay) Spacing() time.Duration { return r.spacing }

func (r *fakeReplay) Checkpoint(_ context.Context, n uint64, _ time.Duration) error {
	r.mu.Lock()
	r.offered = append(r.offered, n)
	r.mu.Unlock()
	if r.spacing == 0 || n == 0 {
		return nil
	}
	r.g.mu.Lock()
	if r.cur.pos != n || r.running {
		r.g.t.Errorf("a checkpoint offered at %d with the replay at %d (running %v)", n, r.cur.pos, r.running)
	}
	st := r.cur.clone()
	r.g.mu.Unlock()
	r.mu.Lock()
	r.points[n] = st
	r.mu.Unlock()
	return nil
}

func (r *fakeReplay) Sync() {}

func (r *fakeReplay) ReadPhysical(_ context.Context, n, pa uint64, length int) ([]byte, error) {
	r.mu.Lock()
	r.physReads = append(r.physReads, n)
	st, ok := r.points[n]
	lie := r.lies[n]
	r.mu.Unlock()
	if n == 0 {
		st, ok = r.start, true
	}
	if !ok {
		return nil, fmt.Errorf("no checkpoint at instruction %d any more (evicted)", n)
	}
	b := make([]byte, length)
	for i := range b {
		b[i] = st.mem[pa+uint64(i)] // no MMU: physical is virtual
	}
	if lie {
		b[0] ^= 0xff
	}
	return b, nil
}

// guardsHeld is how many guards are not released.
func (r *fakeReplay) guardsHeld() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.guards
}

// calls is what was asked of the timeline so far.
func (r *fakeReplay) calls() (loads []uint64, restarts int, physReads []uint64, failed map[uint64]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.loads), r.restarts, slices.Clone(r.physReads), maps.Clone(r.failed)
}
