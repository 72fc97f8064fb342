// Package debugger answers an agent's questions about a kernel under
// QEMU's gdbstub: where it stopped and why, its registers with the trap
// cause decoded, memory as a hexdump, a backtrace by frame pointers,
// disassembly, and breakpoints by symbol, address or file:line. It joins a
// gdb remote-protocol client (package gdb), the kernel's symbols and lines
// (package debuginfo) and what the guest's architecture knows (its
// arch.Debugger: registers, traps, page tables, instructions, trap
// frames); it knows nothing of MCP or of how the guest was started, and
// names no architecture's registers or instructions itself.
//
// Every operation leaves the guest in the run state it found: one that
// needs a stopped target (the stub answers nothing else) interrupts a
// running guest and resumes it afterwards. QEMU stops a guest when a
// debugger connects, so the first operation connects and, if the guest was
// running, resumes it at once.
package debugger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// Config is what a Session needs from its host.
type Config struct {
	// Arch is the guest's architecture; nil is archs.Default().
	Arch arch.Arch
	// Dial connects to the guest's gdbstub.
	Dial func(ctx context.Context) (*gdb.Client, error)
	// Running tells whether the guest runs (QMP query-status), asked
	// once, before connecting: QEMU stops the guest when a debugger
	// connects, and it must then be resumed.
	Running func(ctx context.Context) (bool, error)
	// Symbols are the kernel's symbols and lines; nil means addresses
	// only (no symbols, no file:line).
	Symbols *debuginfo.File
	// Timeline is the recording the guest replays; nil for a guest that
	// runs live.
	Timeline Timeline
	// Logger receives what the session drops; nil means slog.Default().
	Logger *slog.Logger
}

// Session is one guest's debugger. Its operations are serialised.
type Session struct {
	cfg Config
	// d is what the session knows of the guest's architecture, nil if it
	// does not support it (every operation on the guest then says so);
	// regs its registers.
	d    arch.Debugger
	regs arch.Registers

	mu sync.Mutex // one operation at a time
	c  *gdb.Client
	// live is c, for Disconnect, which does not wait for an operation.
	live atomic.Pointer[gdb.Client]
	// breaks are the breakpoints and watchpoints set, by address.
	breaks map[uint64]Breakpoint
	// watches are the watchpoints set, by address.
	watches map[uint64]*watch
	// lastReason is why the guest last stopped, as last reported, and
	// hart the hart that stopped: what per-hart operations act on by
	// default.
	lastReason string
	hart       int
	// threads are the stub's threads (one a hart) for client threadsOf.
	threads   []string
	threadsOf *gdb.Client
	// values are what a replay's memory held at its start points, by
	// start point and location: a replay is deterministic, so what was
	// read there once holds for every later search.
	values map[valueAt][]byte
	// loaded is the start point the replay was last loaded at, until
	// another load: QEMU 11 crashes on a run after two loads that ran
	// nothing between them.
	loaded *uint64
}

// valueAt is a location's bytes at a replay's instruction count.
type valueAt struct {
	icount, addr uint64
	length       int
}

// New returns a session that connects on first use.
func New(cfg Config) *Session {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Arch == nil {
		cfg.Arch = archs.Default()
	}
	s := &Session{cfg: cfg, breaks: map[uint64]Breakpoint{}, watches: map[uint64]*watch{}, values: map[valueAt][]byte{}}
	if s.d = cfg.Arch.Debugger(); s.d != nil {
		s.regs = s.d.Registers()
	}
	if cfg.Timeline != nil {
		// A replay starts loaded at instruction 0 (rrsnapshot).
		var zero uint64
		s.loaded = &zero
	}
	return s
}

// begin starts an operation; the function it returns ends it.
func (s *Session) begin() func() {
	s.mu.Lock()
	return func() {
		s.releaseIdle()
		s.mu.Unlock()
	}
}

// releaseIdle disconnects when the session holds nothing (no breakpoints,
// the guest running): the stub serves one client, and a person's gdb can
// then attach. The next operation connects again, in milliseconds.
func (s *Session) releaseIdle() {
	if s.c == nil || len(s.breaks) > 0 || len(s.watches) > 0 || !s.c.Running() {
		return
	}
	if err := s.c.Close(); err != nil {
		s.cfg.Logger.Debug("debugger: release the stub", "err", err)
	}
	s.setClient(nil)
}

// setClient makes c the session's connection. s.mu must be held.
func (s *Session) setClient(c *gdb.Client) {
	s.c = c
	s.live.Store(c)
}

// Hold lets go of the stub now, without waiting for an operation in
// progress (which ends as when the connection is lost), and holds off
// every operation until the hold is released. QEMU removes the
// breakpoints and lets the guest run, as when its debugger leaves; the
// session keeps them. Whoever changes the guest's state under the stub (a
// snapshot loaded) holds the session meanwhile: the stub's stop replies
// would otherwise tell it of stops and resumes it did not make. Before
// the changed guest runs, the holder arms the session (Held.Arm) so that
// its breakpoints are in place from the guest's first instruction; else
// the session's first operation after the hold connects again and sets
// them.
func (s *Session) Hold() *Held {
	if c := s.live.Swap(nil); c != nil {
		if err := c.Close(); err != nil {
			s.cfg.Logger.Debug("debugger: let go of the stub", "err", err)
		}
	}
	s.mu.Lock()
	if s.c != nil {
		// Connected again before the lock was ours.
		if err := s.c.Close(); err != nil {
			s.cfg.Logger.Debug("debugger: let go of the stub", "err", err)
		}
		s.setClient(nil)
	}
	return &Held{s: s, release: sync.OnceFunc(s.mu.Unlock)}
}

// Held is a session on hold (Session.Hold).
type Held struct {
	s       *Session
	release func()
}

// Release ends the hold; later calls do nothing.
func (h *Held) Release() { h.release() }

// Arm gives the session c, a new connection to the stub of the stopped
// guest the holder is about to resume, with its state replaced. The
// session sets its breakpoints and watchpoints there and resumes the
// guest itself, so that it meets them from its first instruction
// (waiting for the session's next operation to connect would let the
// guest pass them unseen); the holder's own resume (QMP "cont") then
// finds it running. The session resumes it because QEMU 8.1 and later
// report a stop only to a debugger that resumed the guest. A session that
// holds none leaves c without resuming the guest, and connects when next
// used. A breakpoint the stub refuses is dropped and logged, as on any
// reconnection.
func (h *Held) Arm(ctx context.Context, c *gdb.Client) error {
	s := h.s
	if s.c != nil {
		// Armed before, in a QEMU that has since gone.
		s.c.Close()
		s.setClient(nil)
	}
	if len(s.breaks) == 0 && len(s.watches) == 0 {
		return c.Leave()
	}
	if err := c.Err(); err != nil {
		return err
	}
	s.setAll(ctx, c)
	if err := c.Continue(ctx); err != nil {
		c.Close()
		return err
	}
	s.setClient(c)
	return nil
}

// Close disconnects from the stub (which lets the guest run, as QEMU does
// when its debugger leaves) and closes the symbols.
func (s *Session) Close() error {
	defer s.begin()()
	var errs []error
	if s.c != nil {
		errs = append(errs, s.c.Close())
		s.setClient(nil)
	}
	if s.cfg.Symbols != nil {
		errs = append(errs, s.cfg.Symbols.Close())
		s.cfg.Symbols = nil
	}
	return errors.Join(errs...)
}

// client connects on first use, resuming a guest the connection stopped.
// s.mu must be held.
func (s *Session) client(ctx context.Context) (*gdb.Client, error) {
	if s.d == nil {
		return nil, &arch.UnsupportedError{Arch: s.cfg.Arch.Name()}
	}
	if s.c != nil {
		select {
		case <-s.c.Done():
			s.setClient(nil) // lost (QEMU restarted its stub?): connect again
		default:
			return s.c, nil
		}
	}
	running, err := s.cfg.Running(ctx)
	if err != nil {
		return nil, fmt.Errorf("debugger: ask QEMU whether the guest runs: %w", err)
	}
	c, err := s.cfg.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("debugger: connect to the gdbstub: %w", err)
	}
	s.setAll(ctx, c)
	if !running {
		// The stop the connection caused is not news.
		s.pending(ctx, c)
	}
	if running {
		if err := c.Continue(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("debugger: resume the guest after connecting: %w", err)
		}
	}
	s.setClient(c)
	return c, nil
}

// setAll sets the session's breakpoints and watchpoints through c, a new
// connection: one that was lost took them with it (QEMU removes them when
// its debugger leaves). What the stub refuses is dropped and logged.
func (s *Session) setAll(ctx context.Context, c *gdb.Client) {
	for a, b := range s.breaks {
		if err := c.SetBreakpoint(ctx, b.kind, a, b.Length); err != nil {
			s.cfg.Logger.Warn("debugger: breakpoint lost on reconnect", "at", b.Where.String(), "err", err)
			delete(s.breaks, a)
		}
	}
	for a, w := range s.watches {
		if err := c.SetBreakpoint(ctx, w.kind, a, w.Length); err != nil {
			s.cfg.Logger.Warn("debugger: watchpoint lost on reconnect", "at", hex(a), "err", err)
			delete(s.watches, a)
		}
	}
}

// stopped runs f with the guest stopped, and resumes it afterwards if it
// was running. s.mu must be held.
func (s *Session) stopped(ctx context.Context, f func(c *gdb.Client) error) error {
	return s.stoppedFrom(ctx, func(c *gdb.Client, _ bool) error { return f(c) })
}

// stoppedFrom is stopped, f also told whether the guest was running
// (and will run again afterwards). s.mu must be held.
func (s *Session) stoppedFrom(ctx context.Context, f func(c *gdb.Client, wasRunning bool) error) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	wasRunning := c.Running()
	var own *gdb.Stop
	if wasRunning {
		st, err := c.Interrupt(ctx)
		if err != nil {
			return fmt.Errorf("debugger: stop the guest: %w", err)
		}
		if st.Reason != gdb.ReasonSignal || st.Signal != gdb.SIGINT {
			// The guest stopped on its own (a breakpoint hit) before
			// the interrupt: it stays stopped there, and the stop is
			// the next call's to report, not resumed past unseen.
			own = &st
		}
	}
	ferr := f(c, wasRunning)
	if own != nil {
		c.Requeue(*own)
		return ferr
	}
	if wasRunning {
		if err := c.Continue(ctx); err != nil {
			return errors.Join(ferr, fmt.Errorf("debugger: resume the guest: %w", err))
		}
	}
	return ferr
}

// Paused runs f with the guest paused through the session, when it is
// connected, and resumes the guest afterwards if it ran: a pause made
// behind the session's back (QMP "stop", as a snapshot's save makes) is
// reported to it as a stop it did not make, and QEMU 8.1 and later then
// report no further stop, so a breakpoint hit would go unseen. Not
// connected, f runs as it is, and the caller pauses the guest its own
// way. A breakpoint hit the pause meets is kept: the guest stays stopped
// there, for the next call to report. Paused waits for an operation in
// progress (a debug_continue waiting for a stop) as long as ctx allows.
func (s *Session) Paused(ctx context.Context, f func() error) error {
	for !s.mu.TryLock() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("debugger: wait for the debugger's call in progress to end: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer func() {
		s.releaseIdle()
		s.mu.Unlock()
	}()
	if s.c == nil || s.cfg.Timeline != nil {
		return f()
	}
	select {
	case <-s.c.Done():
		s.setClient(nil)
		return f()
	default:
	}
	return s.stoppedFrom(ctx, func(*gdb.Client, bool) error { return f() })
}

// Where is a code address with what the symbols say of it.
type Where struct {
	Addr     string `json:"addr"`
	Function string `json:"function,omitempty"`
	Offset   string `json:"offset,omitempty"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
}

// String is "function+0x8 (file.c:12)" or the address.
func (w Where) String() string {
	if w.Function == "" {
		return w.Addr
	}
	s := w.Function
	if w.Offset != "" && w.Offset != "0x0" {
		s += "+" + w.Offset
	}
	if w.File != "" {
		s += fmt.Sprintf(" (%s:%d)", w.File, w.Line)
	}
	return s
}

func hex(a uint64) string { return "0x" + strconv.FormatUint(a, 16) }

// Where symbolizes addr.
func (s *Session) Where(addr uint64) Where { return s.whereBy(addr, addr) }

// whereBy names addr by the symbol and source line of lookup, at or
// before it.
func (s *Session) whereBy(addr, lookup uint64) Where {
	w := Where{Addr: hex(addr)}
	if s.cfg.Symbols == nil {
		return w
	}
	if loc, ok := s.cfg.Symbols.Symbolize(lookup); ok {
		w.Function, w.Offset, w.File, w.Line = loc.Function, hex(loc.Offset+(addr-lookup)), loc.File, loc.Line
	}
	return w
}

// Resolve turns a location into addresses: "0xADDRESS", "symbol",
// "symbol+OFFSET" or "file.c:LINE" (which may have several addresses, one
// per function that has code for the line). desc says what was resolved.
func (s *Session) Resolve(loc string) (addrs []uint64, desc string, err error) {
	loc = strings.TrimSpace(loc)
	if loc == "" {
		return nil, "", errors.New("empty location: give a symbol, symbol+offset, 0xADDRESS or file.c:LINE")
	}
	if a, ok := parseAddr(loc); ok {
		return []uint64{a}, s.Where(a).String(), nil
	}
	syms := s.cfg.Symbols
	if syms == nil {
		return nil, "", fmt.Errorf("location %q needs symbols: boot with symbols (an ELF of the kernel), or give an address such as 0x80200000", loc)
	}
	if file, line, ok := strings.Cut(loc, ":"); ok {
		n, err := strconv.Atoi(line)
		if err != nil || n <= 0 {
			return nil, "", fmt.Errorf("location %q: want file.c:LINE with a line number", loc)
		}
		m, err := syms.LineAddrs(file, n)
		if err != nil {
			return nil, "", err
		}
		desc := fmt.Sprintf("%s:%d", m.File, m.Line)
		if m.Line != n {
			desc += fmt.Sprintf(" (line %d has no code; the next line that has)", n)
		}
		return m.Addrs, desc, nil
	}
	name, offS, hasOff := strings.Cut(loc, "+")
	var off uint64
	if hasOff {
		if off, err = strconv.ParseUint(strings.TrimSpace(offS), 0, 64); err != nil {
			return nil, "", fmt.Errorf("location %q: the offset %q is not a number", loc, offS)
		}
	}
	sym, err := syms.Lookup(strings.TrimSpace(name))
	if err != nil {
		return nil, "", err
	}
	a := sym.Addr + off
	return []uint64{a}, s.Where(a).String(), nil
}

func parseAddr(s string) (uint64, bool) {
	if !strings.HasPrefix(s, "0x") && !strings.HasPrefix(s, "0X") {
		return 0, false
	}
	a, err := strconv.ParseUint(s[2:], 16, 64)
	return a, err == nil
}

// Breakpoint is a breakpoint or watchpoint the session set.
type Breakpoint struct {
	Where
	// Kind is software, hardware, or a watchpoint: write, read, access.
	Kind   string `json:"kind"`
	Length int    `json:"length,omitempty"`
	kind   gdb.BreakKind
}

// Break sets (or with remove clears) a breakpoint at every address loc
// resolves to; hardware asks for a hardware breakpoint. It returns the
// breakpoints now set at those addresses (or cleared).
func (s *Session) Break(ctx context.Context, loc string, hardware, remove bool) ([]Breakpoint, error) {
	addrs, _, err := s.Resolve(loc)
	if err != nil {
		return nil, err
	}
	if len(addrs) > 16 {
		return nil, fmt.Errorf("location %q has code in %d places: give a function or an address", loc, len(addrs))
	}
	kind := gdb.Software
	if hardware {
		kind = gdb.Hardware
	}
	defer s.begin()()
	var out []Breakpoint
	err = s.stopped(ctx, func(c *gdb.Client) error {
		for _, a := range addrs {
			b := Breakpoint{Where: s.Where(a), Kind: kind.String(), kind: kind}
			if remove {
				old, ok := s.breaks[a]
				if !ok {
					return &NoBreakpointError{Where: b.Where.String()}
				}
				if err := c.ClearBreakpoint(ctx, old.kind, a, old.Length); err != nil {
					return err
				}
				delete(s.breaks, a)
				out = append(out, old)
				continue
			}
			if err := c.SetBreakpoint(ctx, kind, a, 0); err != nil {
				return err
			}
			s.breaks[a] = b
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// Breakpoints lists what is set.
func (s *Session) Breakpoints() []Breakpoint {
	defer s.begin()()
	out := make([]Breakpoint, 0, len(s.breaks)+len(s.watches))
	for _, a := range slices.Sorted(maps.Keys(s.breaks)) {
		out = append(out, s.breaks[a])
	}
	for _, a := range slices.Sorted(maps.Keys(s.watches)) {
		out = append(out, s.watches[a].Breakpoint)
	}
	return out
}

// StopInfo is where and why the guest stopped, or that it still runs:
// what every stop reports, in one place.
type StopInfo struct {
	Stopped bool `json:"stopped"`
	Running bool `json:"running"`
	// Reason is breakpoint, step, watch/rwatch/awatch, paused (by
	// debug_pause), signal or exited.
	Reason string `json:"reason,omitempty"`
	// Hart is the hart that stopped (or was stepped): its mhartid, and
	// Processor the kernel's CPU number for it (Linux's /proc/cpuinfo
	// "processor") on a guest with several harts.
	Hart      *int   `json:"hart,omitempty"`
	Processor *int   `json:"processor,omitempty"`
	PC        string `json:"pc,omitempty"`
	Function  string `json:"function,omitempty"`
	Offset    string `json:"offset,omitempty"`
	File      string `json:"file,omitempty"`
	Line      int    `json:"line,omitempty"`
	// Insn is the instruction at pc, the next to execute.
	Insn string `json:"insn,omitempty"`
	// WatchAddr is the data address a watchpoint fired on; Access what
	// it caught, and Backtrace how the accessing code was reached.
	WatchAddr string     `json:"watch_addr,omitempty"`
	Access    *Access    `json:"access,omitempty"`
	Backtrace *Backtrace `json:"backtrace,omitempty"`
	// Exited says QEMU ended while the debugger waited.
	Exited bool `json:"exited,omitempty"`
	// Incomplete says why a step did not finish (it timed out): the
	// hart is stopped where it got to.
	Incomplete string `json:"incomplete,omitempty"`
	// ICount is the replay's position in its recording (instructions
	// executed), on a guest that replays one.
	ICount *uint64 `json:"icount,omitempty"`
	// Note says what else there is to know of the stop.
	Note string `json:"note,omitempty"`
	// Next says which way a replay goes on from a stop its note is about
	// (the caller names the calls that do); not part of the result.
	Next Next `json:"-"`
}

// Next is the way a replay can go on from a stop.
type Next int

const (
	// NextNone: the stop needs no word on where to go.
	NextNone Next = iota
	// NextBack: the replay is at its end, and only goes back.
	NextBack
	// NextForward: the replay paused short of a stop, and goes on forward.
	NextForward
)

// watchFrames bounds the backtrace of a watchpoint stop.
const watchFrames = 12

// Where is the stop's location.
func (i StopInfo) Where() Where {
	return Where{Addr: i.PC, Function: i.Function, Offset: i.Offset, File: i.File, Line: i.Line}
}

// Holding says whether the session holds the guest stopped (a
// breakpoint or watchpoint hit while the agent waited on the console, or
// a stop reported earlier and not resumed), and where and why. A stop not
// yet reported is reported in full, and the next Continue resumes. It does
// not wait for an operation in progress; ok is false then, as when the
// guest runs.
func (s *Session) Holding(ctx context.Context) (info StopInfo, ok bool) {
	if !s.mu.TryLock() {
		return StopInfo{}, false
	}
	defer func() {
		s.releaseIdle()
		s.mu.Unlock()
	}()
	if s.c == nil || s.c.Running() {
		return StopInfo{}, false
	}
	var err error
	if st, pending := s.pending(ctx, s.c); pending {
		info, err = s.stopInfo(ctx, s.c, st)
	} else {
		info, err = s.held(ctx, s.c)
	}
	return info, err == nil
}

// Stops returns a channel closed once the guest is stopped under the
// session (a breakpoint or watchpoint hit, a pause, a stop not yet
// resumed), at once if it is: a console wait ends there, as a stopped
// guest prints nothing more. It is nil when the session is not connected,
// and never closes after ctx ends.
func (s *Session) Stops(ctx context.Context) <-chan struct{} {
	c := s.live.Load()
	if c == nil || s.cfg.Timeline != nil {
		return nil
	}
	ch := make(chan struct{})
	go func() {
		if c.AwaitStop(ctx) == nil {
			close(ch)
		}
	}()
	return ch
}

// HoldsStopped says whether the session holds the guest stopped, without
// reporting the stop (see Holding); false while an operation is in
// progress.
func (s *Session) HoldsStopped() bool {
	if !s.mu.TryLock() {
		return false
	}
	defer s.mu.Unlock()
	return s.c != nil && !s.c.Running() && s.c.Err() == nil
}

// pending returns the stop of a stopped guest that no call has reported
// yet (it hit a breakpoint between calls).
func (s *Session) pending(ctx context.Context, c *gdb.Client) (gdb.Stop, bool) {
	if c.Running() {
		return gdb.Stop{}, false
	}
	st, err := c.Wait(ctx)
	return st, err == nil
}

func (s *Session) stopInfo(ctx context.Context, c *gdb.Client, st gdb.Stop) (StopInfo, error) {
	info := StopInfo{Stopped: true, Reason: st.Reason}
	switch st.Reason {
	case gdb.ReasonExited, gdb.ReasonTerminated:
		return StopInfo{Exited: true, Reason: gdb.ReasonExited}, nil
	case gdb.ReasonWatch, gdb.ReasonRWatch, gdb.ReasonAWatch:
		info.WatchAddr = hex(st.Addr)
	case gdb.ReasonSignal:
		if st.Signal == gdb.SIGINT {
			info.Reason = "paused"
		}
	}
	s.lastReason = info.Reason
	th, hart, err := s.stoppedHart(ctx, c, st)
	if err != nil {
		return info, err
	}
	if info.WatchAddr != "" {
		// First, as it may step the access to its end.
		if info.Access, err = s.watchStop(ctx, th, st); err != nil {
			return info, fmt.Errorf("debugger: read what the watchpoint caught: %w", err)
		}
		if regs, err := th.ReadRegisters(ctx); err == nil {
			bt := s.unwind(ctx, th, regs, watchFrames)
			info.Backtrace = &bt
		}
	}
	return info, s.locate(ctx, c, th, hart, &info)
}

// held describes a guest the session holds stopped whose stop was
// reported already: where it is and why it stopped, without handling the
// stop again (a watchpoint's access is stepped once, when reported).
func (s *Session) held(ctx context.Context, c *gdb.Client) (StopInfo, error) {
	info := StopInfo{Stopped: true, Reason: s.lastReason}
	if info.Reason == "" {
		info.Reason = "paused"
	}
	th, hart, err := s.on(ctx, c, LastHart)
	if err != nil {
		return info, err
	}
	return info, s.locate(ctx, c, th, hart, &info)
}

// locate fills in which hart th is and where, and its next instruction.
func (s *Session) locate(ctx context.Context, c *gdb.Client, th *gdb.Thread, hart int, info *StopInfo) error {
	info.Hart = &hart
	info.Processor = s.processor(ctx, c, th, hart)
	regs, err := th.ReadRegisters(ctx)
	if err != nil {
		return fmt.Errorf("debugger: read pc: %w", err)
	}
	pc := regs[s.regs.PC]
	w, mode := s.at(regs)
	info.PC, info.Function, info.Offset, info.File, info.Line = w.Addr, w.Function, w.Offset, w.File, w.Line
	if tl := s.cfg.Timeline; tl != nil {
		tl.Sync()
		if n, err := tl.Position(ctx); err == nil {
			info.ICount = &n
		}
	}
	if code, _ := th.ReadMemory(ctx, pc, s.d.MaxInstruction()); len(code) >= 2 && mode == "" {
		if in := s.d.Disassemble(code, pc, 1, s.symbolizer()); len(in) == 1 {
			info.Insn = in[0].Text
			if in[0].Target != "" {
				info.Insn += " <" + in[0].Target + ">"
			}
		}
	}
	return nil
}

// Continue resumes a stopped guest and waits up to timeout for the next
// stop. Past the timeout the guest keeps running, and the result says so.
func (s *Session) Continue(ctx context.Context, timeout time.Duration) (StopInfo, error) {
	defer s.begin()()
	c, err := s.client(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	if s.cfg.Timeline != nil {
		return s.continueReplay(ctx, c, timeout)
	}
	if !c.Running() {
		// A breakpoint hit since the last call is this call's answer:
		// resuming would pass it by unreported.
		if st, ok := s.pending(ctx, c); ok {
			return s.stopInfo(ctx, c, st)
		}
		if err := c.Continue(ctx); err != nil {
			return StopInfo{}, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := c.Wait(wctx)
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return StopInfo{Running: true}, nil
		}
		return StopInfo{}, err
	}
	return s.stopInfo(ctx, c, st)
}

// Pause stops a running guest (a stopped one stays stopped) and says where.
func (s *Session) Pause(ctx context.Context) (StopInfo, error) {
	defer s.begin()()
	c, err := s.client(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	if c.Running() {
		st, err := c.Interrupt(ctx)
		if err != nil {
			return StopInfo{}, err
		}
		return s.stopInfo(ctx, c, st)
	}
	if st, ok := s.pending(ctx, c); ok {
		return s.stopInfo(ctx, c, st)
	}
	return s.held(ctx, c) // already stopped: say where and why
}

// Step executes count instructions of one hart (LastHart: the hart of
// the last stop), the others staying stopped; the guest is paused first
// if it runs. With over, a call is stepped over as one: the hart alone
// runs until it returns. A step that has not finished within timeout (a
// hart waiting in wfi, or in a call that waits for a hart that is
// stopped) is ended there, and the result says why.
func (s *Session) Step(ctx context.Context, hart, count int, over bool, timeout time.Duration) (StopInfo, error) {
	if count <= 0 || count > 10000 {
		return StopInfo{}, fmt.Errorf("count %d: want 1 to 10000", count)
	}
	defer s.begin()()
	c, err := s.client(ctx)
	if err != nil {
		return StopInfo{}, err
	}
	if c.Running() {
		if _, err := c.Interrupt(ctx); err != nil {
			return StopInfo{}, err
		}
	} else {
		s.pending(ctx, c) // a step from a breakpoint hit between calls
	}
	if tl := s.cfg.Timeline; tl != nil {
		pos, err := tl.Position(ctx)
		if err != nil {
			return StopInfo{}, err
		}
		if end := tl.End(); pos+uint64(count) > end {
			return StopInfo{}, &AtEndError{At: pos, End: end}
		}
	}
	th, hart, err := s.on(ctx, c, hart)
	if err != nil {
		return StopInfo{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var st gdb.Stop
	for i := range count {
		inCall := false
		if over {
			st, err = s.stepOver(sctx, th, &inCall)
		} else {
			st, err = th.Step(sctx)
		}
		if err != nil {
			if sctx.Err() != nil && ctx.Err() == nil {
				return s.stuck(ctx, c, th, hart, i, count, inCall, timeout)
			}
			return StopInfo{}, err
		}
		if st.Reason != gdb.ReasonStep && st.Reason != gdb.ReasonBreakpoint {
			break // exited, or a watchpoint fired
		}
	}
	return s.stopInfo(ctx, c, st)
}

// stepOver steps one instruction, or, when it is a call (jal/jalr that
// links ra), runs the hart alone until the call returns to the next
// instruction (or stops at a breakpoint or watchpoint on the way), which
// inCall then says.
func (s *Session) stepOver(ctx context.Context, th *gdb.Thread, inCall *bool) (gdb.Stop, error) {
	pc, err := th.ReadRegister(ctx, s.regs.PC)
	if err != nil {
		return gdb.Stop{}, err
	}
	code, err := th.ReadMemory(ctx, pc, s.d.MaxInstruction())
	if err != nil || len(code) < 2 {
		return th.Step(ctx)
	}
	n, call := s.d.Call(code)
	if !call {
		return th.Step(ctx)
	}
	c := th.Client()
	next := pc + uint64(n)
	_, had := s.breaks[next]
	if !had {
		if err := c.SetBreakpoint(ctx, gdb.Software, next, 0); err != nil {
			return gdb.Stop{}, err
		}
		defer c.ClearBreakpoint(context.WithoutCancel(ctx), gdb.Software, next, 0)
	}
	*inCall = true
	if err := th.Continue(ctx); err != nil {
		return gdb.Stop{}, err
	}
	st, err := c.Wait(ctx)
	if err != nil {
		// Leave no guest running behind a step.
		c.Interrupt(context.WithoutCancel(ctx))
		return gdb.Stop{}, err
	}
	if st.Reason == gdb.ReasonBreakpoint {
		st.Reason = gdb.ReasonStep
	}
	return st, nil
}

// stuck ends a step that did not finish within timeout (inCall: running
// a call to its return): it stops the guest, and says where the hart got
// to and why it could not go on.
func (s *Session) stuck(ctx context.Context, c *gdb.Client, th *gdb.Thread, hart, done, count int, inCall bool, timeout time.Duration) (StopInfo, error) {
	if c.Running() {
		if _, err := c.Interrupt(ctx); err != nil {
			return StopInfo{}, fmt.Errorf("debugger: stop hart %d after its step timed out: %w", hart, err)
		}
	}
	s.hart, s.lastReason = hart, "paused"
	info := StopInfo{Stopped: true, Reason: "paused"}
	if err := s.locate(ctx, c, th, hart, &info); err != nil {
		return info, err
	}
	what := "the step"
	if count > 1 {
		what = fmt.Sprintf("step %d of %d", done+1, count)
	}
	halted := false
	if ti, err := c.ThreadInfo(ctx, th.ID()); err == nil {
		halted = gdb.Halted(ti)
	}
	var why string
	switch {
	case inCall:
		hs := s.hartState(ctx, th, hart, 6)
		why = fmt.Sprintf("a call did not return: only hart %d runs while stepping, and it waits for what a stopped hart holds or must do (a lock, an IPI, an RCU grace period); it is %s: %s",
			hart, stateWords[hs.State], strings.Join(hs.Backtrace, " < "))
	case halted:
		why = fmt.Sprintf("hart %d waits in %s for an interrupt, and QEMU masks interrupts while stepping, so none can wake it", hart, s.regs.Wait)
	default:
		why = fmt.Sprintf("hart %d did not complete the instruction", hart)
	}
	info.Incomplete = fmt.Sprintf("%s did not finish in %v: %s", what, timeout, why)
	return info, nil
}

// Listing formats instructions as objdump does, with a label line where
// a symbol starts and => at the pc.
func (s *Session) Listing(insts []arch.Instruction, pc uint64) []string {
	var out []string
	for k, in := range insts {
		if w := s.Where(in.Addr); w.Function != "" && (k == 0 || w.Offset == "0x0") {
			label := "<" + w.Function
			if w.Offset != "0x0" {
				label += "+" + w.Offset
			}
			label += ">:"
			if w.File != "" {
				label += fmt.Sprintf(" %s:%d", w.File, w.Line)
			}
			out = append(out, label)
		}
		mark := "  "
		if in.Addr == pc {
			mark = "=>"
		}
		line := fmt.Sprintf("%s %x: %-8s %s", mark, in.Addr, in.Encoding, in.Text)
		if in.Target != "" {
			line += " <" + in.Target + ">"
		}
		out = append(out, line)
	}
	return out
}

// Disassemble decodes count instructions at loc ("" means the pc) as
// hart sees them (LastHart: the hart of the last stop); pc is the hart's
// pc, and on the hart.
func (s *Session) Disassemble(ctx context.Context, hart int, loc string, count int) (insts []arch.Instruction, pc uint64, on int, err error) {
	if count <= 0 || count > 256 {
		return nil, 0, 0, fmt.Errorf("count %d: want 1 to 256", count)
	}
	on, err = s.onHart(ctx, hart, func(th *gdb.Thread) (err error) {
		regs, err := th.ReadRegisters(ctx)
		if err != nil {
			return err
		}
		pc = regs[s.regs.PC]
		addr := pc
		if _, mode := s.at(regs); mode != "" && loc == "" {
			return fmt.Errorf("the hart runs %s: the disassembler decodes 64-bit code only; give an address in 64-bit code (the hart's registers read in any mode)", mode)
		}
		if loc != "" {
			addrs, _, err := s.Resolve(loc)
			if err != nil {
				return err
			}
			addr = addrs[0]
		}
		code, rerr := th.ReadMemory(ctx, addr, count*s.d.MaxInstruction())
		if len(code) == 0 {
			return fmt.Errorf("read code at %s: %w", hex(addr), rerr)
		}
		insts = s.d.Disassemble(code, addr, count, s.symbolizer())
		return nil
	})
	return insts, pc, on, err
}

// at is where a hart with regs is: its pc named by the kernel's symbols,
// unless the hart runs code the architecture does not read (mode, from
// foreign), whose pc is no kernel address.
func (s *Session) at(regs map[string]uint64) (w Where, mode string) {
	pc := regs[s.regs.PC]
	if mode = s.foreign(regs); mode != "" {
		return Where{Addr: hex(pc)}, mode
	}
	return s.Where(pc), ""
}

// foreign names the mode a hart with regs runs in where the architecture
// reads no code in it (arch.CodeModes), else "".
func (s *Session) foreign(regs map[string]uint64) string {
	cm, ok := s.d.(arch.CodeModes)
	if !ok {
		return ""
	}
	return cm.Foreign(func(n string) (uint64, bool) { v, ok := regs[n]; return v, ok })
}

func (s *Session) symbolizer() arch.Symbolizer {
	if s.cfg.Symbols == nil {
		return nil
	}
	return func(a uint64) (string, uint64, bool) {
		loc, ok := s.cfg.Symbols.Symbolize(a)
		return loc.Function, loc.Offset, ok
	}
}
