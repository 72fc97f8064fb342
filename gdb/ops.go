package gdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Registers returns the registers of the target description, in regnum
// order.
func (c *Client) Registers() []Register { return slices.Clone(c.desc.regs) }

// Register looks a register up by name. Besides the description's names,
// a RISC-V target's general registers answer to x0..x31, and fp to s0.
func (c *Client) Register(name string) (Register, bool) {
	i, ok := c.index[name]
	if !ok {
		return Register{}, false
	}
	return c.desc.regs[i], true
}

func (c *Client) lookup(name string) (Register, error) {
	r, ok := c.Register(name)
	if !ok {
		return Register{}, fmt.Errorf("no register %q in the target description", name)
	}
	if r.Bitsize > 64 {
		return Register{}, fmt.Errorf("register %s is %d bits wide; only registers up to 64 bits are supported", name, r.Bitsize)
	}
	return r, nil
}

// ReadRegisters reads the registers the stub sends in one 'g' packet (for
// QEMU's riscv64: x0..x31 and pc) and returns them by name. Registers the
// stub marks unavailable, and any wider than 64 bits, are left out.
func (c *Client) ReadRegisters(ctx context.Context) (map[string]uint64, error) {
	return c.readRegisters(ctx, "")
}

func (c *Client) readRegisters(ctx context.Context, thread string) (map[string]uint64, error) {
	var data []byte
	err := c.commandOn(ctx, thread, func() error {
		cmd := []byte("g")
		reply, err := c.exchange(ctx, cmd)
		if err != nil {
			return err
		}
		if len(reply)%2 != 0 {
			return fmt.Errorf("%w: odd-length 'g' reply", errMalformed)
		}
		data = reply
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gdb: read registers: %w", err)
	}
	out := map[string]uint64{}
	off := 0
	for _, r := range c.desc.regs {
		n := 2 * ((r.Bitsize + 7) / 8)
		if off+n > len(data) {
			break
		}
		field := data[off : off+n]
		off += n
		if r.Bitsize > 64 || field[0] == 'x' {
			continue
		}
		b, err := decodeHex(field)
		if err != nil {
			return nil, fmt.Errorf("gdb: read registers: %s: %w", r.Name, err)
		}
		out[r.Name] = littleEndian(b)
	}
	return out, nil
}

// ReadRegister reads one register with 'p': any register of the
// description, CSRs such as sstatus, satp or mstatus and QEMU's virtual
// "priv" (the privilege level: 0 user, 1 supervisor, 3 machine) included.
func (c *Client) ReadRegister(ctx context.Context, name string) (uint64, error) {
	return c.readRegister(ctx, "", name)
}

func (c *Client) readRegister(ctx context.Context, thread, name string) (uint64, error) {
	r, err := c.lookup(name)
	if err != nil {
		return 0, fmt.Errorf("gdb: read register: %w", err)
	}
	var v uint64
	err = c.commandOn(ctx, thread, func() error {
		v, err = c.readReg(ctx, r)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("gdb: read register %s: %w", name, err)
	}
	return v, nil
}

func (c *Client) readReg(ctx context.Context, r Register) (uint64, error) {
	reply, err := c.exchange(ctx, fmt.Appendf(nil, "p%x", r.Regnum))
	if err != nil {
		return 0, err
	}
	if len(reply) > 0 && reply[0] == 'x' {
		return 0, errors.New("the stub says the register is unavailable")
	}
	b, err := decodeHex(reply)
	if err != nil {
		return 0, err
	}
	if len(b) != (r.Bitsize+7)/8 {
		return 0, fmt.Errorf("%w: %d bytes for a %d-bit register", errMalformed, len(b), r.Bitsize)
	}
	return littleEndian(b), nil
}

// WriteRegister sets one register with 'P'. Bits beyond the register's
// size are dropped.
func (c *Client) WriteRegister(ctx context.Context, name string, v uint64) error {
	return c.writeRegister(ctx, "", name, v)
}

func (c *Client) writeRegister(ctx context.Context, thread, name string, v uint64) error {
	r, err := c.lookup(name)
	if err != nil {
		return fmt.Errorf("gdb: write register: %w", err)
	}
	cmd := fmt.Appendf(nil, "P%x=", r.Regnum)
	cmd = appendLittleEndian(cmd, v, (r.Bitsize+7)/8)
	err = c.commandOn(ctx, thread, func() error { return c.expectOK(ctx, cmd) })
	if err != nil {
		return fmt.Errorf("gdb: write register %s: %w", name, err)
	}
	return nil
}

// ReadMemory reads n bytes at addr (a virtual address as the current
// hart sees it) in packet-sized pieces. When the stub refuses a piece
// (QEMU: E14, for memory nothing is mapped at), it returns the bytes read
// before it with a *MemoryError saying where reading failed; the
// connection stays usable.
func (c *Client) ReadMemory(ctx context.Context, addr uint64, n int) ([]byte, error) {
	return c.readMemory(ctx, "", addr, n)
}

func (c *Client) readMemory(ctx context.Context, thread string, addr uint64, n int) ([]byte, error) {
	if err := checkRange(addr, n); err != nil {
		return nil, fmt.Errorf("gdb: read memory: %w", err)
	}
	out := make([]byte, 0, n)
	err := c.commandOn(ctx, thread, func() error {
		for len(out) < n {
			a := addr + uint64(len(out))
			size := min(c.readChunk-int(a%uint64(c.readChunk)), n-len(out))
			reply, err := c.exchange(ctx, fmt.Appendf(nil, "m%x,%x", a, size))
			if err != nil {
				return &MemoryError{Op: "read", Addr: a, Done: len(out), Err: err}
			}
			b, err := decodeHex(reply)
			if err == nil && len(b) > size {
				err = fmt.Errorf("%w: %d bytes for %d asked", errMalformed, len(b), size)
			}
			if err != nil {
				return &MemoryError{Op: "read", Addr: a, Done: len(out), Err: err}
			}
			// A stub may answer with less than asked; what it gave
			// counts, and the rest is asked again.
			out = append(out, b...)
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("gdb: read %d bytes at 0x%x: %w", n, addr, err)
	}
	return out, nil
}

// WriteMemory writes data at addr in packet-sized pieces. On failure the
// *MemoryError says where, and how much was written before. QEMU 7.2
// acknowledges writes where nothing is mapped; they go nowhere.
func (c *Client) WriteMemory(ctx context.Context, addr uint64, data []byte) error {
	return c.writeMemory(ctx, "", addr, data)
}

func (c *Client) writeMemory(ctx context.Context, thread string, addr uint64, data []byte) error {
	if err := checkRange(addr, len(data)); err != nil {
		return fmt.Errorf("gdb: write memory: %w", err)
	}
	err := c.commandOn(ctx, thread, func() error {
		for done := 0; done < len(data); {
			a := addr + uint64(done)
			size := min(c.writeChunk-int(a%uint64(c.writeChunk)), len(data)-done)
			cmd := fmt.Appendf(nil, "M%x,%x:", a, size)
			for _, b := range data[done : done+size] {
				cmd = append(cmd, hexDigits[b>>4], hexDigits[b&0xf])
			}
			if err := c.expectOK(ctx, cmd); err != nil {
				return &MemoryError{Op: "write", Addr: a, Done: done, Err: err}
			}
			done += size
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gdb: write %d bytes at 0x%x: %w", len(data), addr, err)
	}
	return nil
}

func checkRange(addr uint64, n int) error {
	switch {
	case n < 0 || n > maxMemory:
		return fmt.Errorf("size %d: want 0 to %d bytes", n, maxMemory)
	case n > 0 && addr+uint64(n)-1 < addr:
		return fmt.Errorf("0x%x+%d wraps around the address space", addr, n)
	}
	return nil
}

// BreakKind is the kind of a breakpoint or watchpoint, numbered as the Z
// packets number them.
type BreakKind int

// The kinds. In QEMU (TCG) software and hardware breakpoints are the same
// thing and are unlimited, and so are watchpoints.
const (
	Software    BreakKind = iota // Z0
	Hardware                     // Z1
	WatchWrite                   // Z2: stops after a write to the range
	WatchRead                    // Z3: stops on a read
	WatchAccess                  // Z4: stops on a read or a write
)

func (k BreakKind) String() string {
	switch k {
	case Software:
		return "software"
	case Hardware:
		return "hardware"
	case WatchWrite:
		return "watch-write"
	case WatchRead:
		return "watch-read"
	case WatchAccess:
		return "watch-access"
	}
	return fmt.Sprintf("BreakKind(%d)", int(k))
}

// A Breakpoint is a breakpoint or watchpoint the client has set.
type Breakpoint struct {
	Kind   BreakKind `json:"kind"`
	Addr   uint64    `json:"addr"`
	Length int       `json:"length"`
}

// SetBreakpoint inserts a breakpoint or watchpoint. For breakpoints,
// length is the instruction's size (2 for a compressed RISC-V
// instruction, 4 otherwise; QEMU ignores it, and 0 means 4); for
// watchpoints it is the size of the watched range.
func (c *Client) SetBreakpoint(ctx context.Context, kind BreakKind, addr uint64, length int) error {
	bp, err := breakpoint(kind, addr, length)
	if err != nil {
		return fmt.Errorf("gdb: set breakpoint: %w", err)
	}
	err = c.command(ctx, func() error {
		if err := c.expectOK(ctx, fmt.Appendf(nil, "Z%d,%x,%x", bp.Kind, bp.Addr, bp.Length)); err != nil {
			return err
		}
		c.bps[bp]++
		return nil
	})
	if err != nil {
		return fmt.Errorf("gdb: set %s breakpoint at 0x%x: %w", kind, addr, err)
	}
	return nil
}

// ClearBreakpoint removes what SetBreakpoint inserted with the same
// arguments.
func (c *Client) ClearBreakpoint(ctx context.Context, kind BreakKind, addr uint64, length int) error {
	bp, err := breakpoint(kind, addr, length)
	if err != nil {
		return fmt.Errorf("gdb: clear breakpoint: %w", err)
	}
	err = c.command(ctx, func() error {
		if err := c.expectOK(ctx, fmt.Appendf(nil, "z%d,%x,%x", bp.Kind, bp.Addr, bp.Length)); err != nil {
			return err
		}
		if c.bps[bp]--; c.bps[bp] <= 0 {
			delete(c.bps, bp)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gdb: clear %s breakpoint at 0x%x: %w", kind, addr, err)
	}
	return nil
}

func breakpoint(kind BreakKind, addr uint64, length int) (Breakpoint, error) {
	switch {
	case kind < Software || kind > WatchAccess:
		return Breakpoint{}, fmt.Errorf("unknown kind %d", int(kind))
	case length < 0 || length > 1<<20:
		return Breakpoint{}, fmt.Errorf("length %d", length)
	case length == 0 && kind >= WatchWrite:
		return Breakpoint{}, errors.New("a watchpoint needs a length")
	case length == 0:
		length = 4
	}
	return Breakpoint{Kind: kind, Addr: addr, Length: length}, nil
}

// Breakpoints lists the breakpoints and watchpoints set through this
// client, once each.
func (c *Client) Breakpoints(ctx context.Context) ([]Breakpoint, error) {
	// The set belongs to cmdSem's holder; this waits its turn but does
	// not need a stopped target.
	select {
	case c.cmdSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer c.release()
	out := make([]Breakpoint, 0, len(c.bps))
	for bp := range c.bps {
		out = append(out, bp)
	}
	slices.SortFunc(out, func(a, b Breakpoint) int {
		if a.Addr != b.Addr {
			if a.Addr < b.Addr {
				return -1
			}
			return 1
		}
		return int(a.Kind) - int(b.Kind)
	})
	return out, nil
}

// putBack reinserts breakpoints a Continue removed to step over and could
// not put back because its context ended during the step.
func (c *Client) putBack(ctx context.Context) error {
	for len(c.reinsert) > 0 {
		bp := c.reinsert[0]
		if err := c.expectOK(ctx, fmt.Appendf(nil, "Z%d,%x,%x", bp.Kind, bp.Addr, bp.Length)); err != nil {
			return fmt.Errorf("put back %s breakpoint at 0x%x: %w", bp.Kind, bp.Addr, err)
		}
		c.reinsert = c.reinsert[1:]
	}
	return nil
}

// Continue resumes the target (every thread) and returns once the
// request is sent; Wait reports the next stop.
//
// QEMU would report some stops again at once: a breakpoint at the pc a
// thread stopped at, and (QEMU 7.2 reports watchpoints before the access)
// the watchpoint that just fired. So Continue first steps each thread
// that stopped there one instruction with those removed, then puts them
// back, as gdb does. Should such a step itself stop for another reason
// (another watchpoint), the target stays stopped and Wait returns that
// stop.
func (c *Client) Continue(ctx context.Context) error {
	return c.resumeAll(ctx, "continue", "")
}

// resumeAll steps the parked threads past what is in their way and
// resumes every thread, or with only set that thread alone.
func (c *Client) resumeAll(ctx context.Context, op, only string) error {
	err := c.command(ctx, func() error {
		threads := c.parkedThreads(only)
		for _, t := range threads {
			inTheWay, err := c.inTheWay(ctx, t, true)
			if err != nil {
				return err
			}
			if len(inTheWay) == 0 {
				continue
			}
			s, err := c.stepPast(ctx, t, inTheWay)
			if err != nil {
				return err
			}
			if s.exited() || s.Reason != ReasonBreakpoint || s.Signal != SIGTRAP {
				// Hand the stop to Wait, as if the target had run
				// and stopped.
				c.mu.Lock()
				c.consumed = false
				c.mu.Unlock()
				return nil
			}
		}
		pkt := []byte("c")
		if only != "" {
			pkt = []byte("vCont;c:" + only)
		}
		_, err := c.resume(ctx, pkt, only)
		return err
	})
	if err != nil {
		return fmt.Errorf("gdb: %s: %w", op, err)
	}
	return nil
}

// parkedThreads are the threads to step past breakpoints before a resume:
// those parked and the last to stop (which a stub without thread ids
// names ""); with only set, that thread alone, as no other moves.
func (c *Client) parkedThreads(only string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if only != "" {
		return []string{only}
	}
	set := maps.Clone(c.parked)
	if !c.replaced {
		set[c.last.Thread] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// inTheWay lists what would stop thread again without it moving: after
// its watchpoint stop every watchpoint and, when resuming rather than
// stepping (QEMU steps through breakpoints), the breakpoints at its pc.
// The caller holds cmdSem.
func (c *Client) inTheWay(ctx context.Context, thread string, resuming bool) ([]Breakpoint, error) {
	watchHit := c.isWatched(thread)
	var out, atPC []Breakpoint
	for bp, n := range c.bps {
		for range n {
			switch {
			case bp.Kind >= WatchWrite && watchHit:
				out = append(out, bp)
			case bp.Kind <= Hardware && resuming && c.pcIndex >= 0:
				atPC = append(atPC, bp)
			}
		}
	}
	if len(atPC) > 0 {
		if err := c.selectThread(ctx, thread); err != nil {
			return nil, err
		}
		pc, err := c.readReg(ctx, c.desc.regs[c.pcIndex])
		if err != nil {
			return nil, fmt.Errorf("read pc: %w", err)
		}
		for _, bp := range atPC {
			if bp.Addr == pc {
				out = append(out, bp)
			}
		}
	}
	return out, nil
}

// stepPast steps thread one instruction with the given breakpoints
// removed and puts them back. If ctx ends during the step, the step goes
// on; the next command puts them back once the target has stopped.
//
// QEMU (7.2 and 11.1, riscv64) now and then reports a single step done
// without executing the instruction: the pc is where it was, and a
// resume would meet the breakpoint just stepped past and report it again,
// as if hit twice. A step that left the pc in place is made again, up to
// stepAttempts times (an instruction that jumps to itself leaves it there
// too, and is merely run that many times).
func (c *Client) stepPast(ctx context.Context, thread string, remove []Breakpoint) (Stop, error) {
	for i, bp := range remove {
		if err := c.expectOK(ctx, fmt.Appendf(nil, "z%d,%x,%x", bp.Kind, bp.Addr, bp.Length)); err != nil {
			c.reinsert = append(c.reinsert, remove[:i]...)
			return Stop{}, fmt.Errorf("step past %s breakpoint at 0x%x: %w", bp.Kind, bp.Addr, err)
		}
	}
	c.reinsert = append(c.reinsert, remove...)
	before, known := c.threadPC(ctx, thread)
	var s Stop
	for attempt := 1; ; attempt++ {
		pkt, one, err := c.stepPacket(thread)
		if err != nil {
			return Stop{}, err
		}
		gen, err := c.resume(ctx, pkt, one)
		if err != nil {
			return Stop{}, err
		}
		if s, err = c.waitGen(ctx, gen, false); err != nil {
			return Stop{}, err
		}
		if !known || attempt == stepAttempts || s.exited() || s.Reason != ReasonBreakpoint || s.Signal != SIGTRAP {
			break
		}
		if pc, ok := c.threadPC(ctx, thread); !ok || pc != before {
			break
		}
		c.log.Debug("gdb: a step left the pc in place; stepping again", "pc", fmt.Sprintf("%#x", before), "attempt", attempt)
	}
	if !s.exited() {
		if err := c.putBack(ctx); err != nil {
			return Stop{}, err
		}
	}
	return s, nil
}

// stepAttempts bounds the steps stepPast makes for one instruction.
const stepAttempts = 3

// threadPC reads thread's pc, if the target description names one.
func (c *Client) threadPC(ctx context.Context, thread string) (uint64, bool) {
	if c.pcIndex < 0 || c.selectThread(ctx, thread) != nil {
		return 0, false
	}
	pc, err := c.readReg(ctx, c.desc.regs[c.pcIndex])
	return pc, err == nil
}

// stepPacket steps thread ("" for the last to stop) alone: vCont steps
// only that thread (vCPU), where plain 's' would let the others run
// meanwhile. one is the thread that runs, "" when all may.
func (c *Client) stepPacket(thread string) (pkt []byte, one string, err error) {
	c.mu.Lock()
	last := c.last.Thread
	c.mu.Unlock()
	explicit := thread != "" && thread != last
	if thread == "" {
		thread = last
	}
	switch {
	case c.vcont["s"] && thread != "":
		return []byte("vCont;s:" + thread), thread, nil
	case explicit:
		return nil, "", fmt.Errorf("%w: stepping thread %s alone needs vCont", ErrUnsupported, thread)
	}
	return []byte("s"), "", nil
}

// resume marks the target running and sends pkt, returning the run's
// generation; one is the only thread pkt lets run, "" for all. Running
// is set first, so that however fast the stop reply comes it ends this
// run.
func (c *Client) resume(ctx context.Context, pkt []byte, one string) (uint64, error) {
	if err := c.continueThread(ctx, one); err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.running = true
	c.replaced = false
	c.runGen++
	gen := c.runGen
	c.consumed = true
	parked, watched := maps.Clone(c.parked), maps.Clone(c.watched)
	if one == "" {
		clear(c.parked)
		clear(c.watched)
	} else {
		delete(c.parked, one)
		delete(c.watched, one)
	}
	c.mu.Unlock()
	if err := c.sendPacket(ctx, pkt); err != nil {
		c.mu.Lock()
		if c.runGen == gen && c.err == nil {
			// Nothing was sent (or the connection is gone anyway).
			c.running = false
			c.stopGen = gen
			c.parked, c.watched = parked, watched
		}
		c.mu.Unlock()
		return 0, err
	}
	return gen, nil
}

// waitGen waits for the stop that ends run gen and marks it reported.
func (c *Client) waitGen(ctx context.Context, gen uint64, step bool) (Stop, error) {
	var s Stop
	err := c.await(ctx, func() bool {
		if c.stopGen < gen {
			return false
		}
		s = c.last
		c.consumed = true
		return true
	})
	if err != nil {
		return Stop{}, err
	}
	if step && s.Reason == ReasonBreakpoint {
		s.Reason = ReasonStep
	}
	return s, nil
}

// Step executes one instruction on the thread that last stopped, the
// others staying stopped, and returns the stop (Reason "step", or "watch"
// and the like when the instruction fired a watchpoint). After a
// watchpoint stop, the watchpoints are lifted for the step, or it would
// stop on the same access again. If ctx ends first the step is still
// under way: Running is true and Wait gets its stop (or Interrupt ends
// it: a thread waiting for an interrupt never finishes a step, as QEMU
// masks interrupts while stepping).
func (c *Client) Step(ctx context.Context) (Stop, error) {
	return c.step(ctx, "")
}

func (c *Client) step(ctx context.Context, thread string) (Stop, error) {
	var s Stop
	var gen uint64
	err := c.command(ctx, func() error {
		inTheWay, err := c.inTheWay(ctx, thread, false)
		if err != nil {
			return err
		}
		if len(inTheWay) > 0 {
			s, err = c.stepPast(ctx, thread, inTheWay)
			if err == nil && s.Reason == ReasonBreakpoint {
				s.Reason = ReasonStep
			}
			return err
		}
		pkt, one, err := c.stepPacket(thread)
		if err != nil {
			return err
		}
		gen, err = c.resume(ctx, pkt, one)
		return err
	})
	if err == nil && gen != 0 {
		s, err = c.waitGen(ctx, gen, true)
	}
	if err != nil {
		return Stop{}, fmt.Errorf("gdb: step: %w", err)
	}
	return s, nil
}

// Wait waits for the running target to stop and returns why. If ctx ends
// first it returns ctx's error and the target keeps running; a later Wait
// gets the stop. On a stopped target it returns the stop not yet
// reported, if there is one (the target stopped on its own after
// Continue, before Wait), else ErrNotRunning.
func (c *Client) Wait(ctx context.Context) (Stop, error) {
	s, err := c.wait(ctx)
	if err != nil {
		return Stop{}, fmt.Errorf("gdb: wait: %w", err)
	}
	return s, nil
}

func (c *Client) wait(ctx context.Context) (Stop, error) {
	c.mu.Lock()
	if !c.running {
		defer c.mu.Unlock()
		if c.haveLast && !c.consumed {
			c.consumed = true
			return c.last, nil
		}
		if c.exit != nil {
			return Stop{}, fmt.Errorf("%w (%s)", ErrExited, c.exit)
		}
		if c.err != nil {
			return Stop{}, c.err
		}
		return Stop{}, ErrNotRunning
	}
	gen := c.runGen
	c.mu.Unlock()
	return c.waitGen(ctx, gen, false)
}

// Interrupt stops the running target (the 0x03 byte, gdb's Ctrl-C) and
// returns the stop, normally Signal SIGINT. On a target that is already
// stopped it returns the unreported stop if there is one, else asks the
// stub for the halt reason, which also stops a guest resumed behind the
// debugger's back.
func (c *Client) Interrupt(ctx context.Context) (Stop, error) {
	c.mu.Lock()
	running, gen := c.running, c.runGen
	if !running && c.haveLast && !c.consumed {
		c.consumed = true
		s := c.last
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()
	if !running {
		s, err := c.HaltReason(ctx)
		if err != nil {
			return Stop{}, fmt.Errorf("gdb: interrupt: %w", err)
		}
		return s, nil
	}
	for {
		if err := c.send(ctx, []byte{0x03}, false); err != nil {
			return Stop{}, fmt.Errorf("gdb: interrupt: %w", err)
		}
		tctx, cancel := context.WithTimeout(ctx, interruptResend)
		s, err := c.waitGen(tctx, gen, false)
		cancel()
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return Stop{}, fmt.Errorf("gdb: interrupt: %w", err)
		}
		c.log.Debug("gdb: no stop after interrupt; sending another", "after", interruptResend)
	}
}

// HaltReason asks the stub why the target is stopped ('?'). QEMU always
// answers SIGTRAP, with the thread; it does not remember the last stop's
// reason, so the stop Wait returned is the better record.
func (c *Client) HaltReason(ctx context.Context) (Stop, error) {
	var s Stop
	err := c.command(ctx, func() (err error) {
		s, err = c.haltReason(ctx)
		return err
	})
	if err != nil {
		return Stop{}, fmt.Errorf("gdb: halt reason: %w", err)
	}
	return s, nil
}

func (c *Client) haltReason(ctx context.Context) (Stop, error) {
	c.mu.Lock()
	seen := c.stops
	c.mu.Unlock()
	if err := c.sendPacket(ctx, []byte("?")); err != nil {
		return Stop{}, err
	}
	var s Stop
	cond := func() bool {
		if c.stops == seen {
			return false
		}
		s = c.last
		c.consumed = true
		return true
	}
	// QEMU 11 drops a "?" that arrives while the guest runs (see
	// roundTrip), pausing it: asked again, it answers.
	wctx, cancel := context.WithTimeout(ctx, silenceProbe)
	err := c.await(wctx, cond)
	cancel()
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		c.log.Debug("gdb: no reply to ?; asking again")
		if err := c.sendPacket(ctx, []byte("?")); err != nil {
			return Stop{}, err
		}
		err = c.await(ctx, cond)
	}
	if err == nil && s.Thread == "" && c.probe {
		// QEMU 11 answers "?" with the core and no thread ("T05core:01;"):
		// the current thread is what qC names.
		reply, err := c.roundTrip(ctx, probePacket)
		if err != nil {
			return s, err
		}
		if t, ok := bytes.CutPrefix(reply, []byte("QC")); ok {
			s.Thread = string(t)
			c.mu.Lock()
			if c.last.Thread == "" {
				c.last.Thread = s.Thread
			}
			c.mu.Unlock()
		}
	}
	return s, err
}

// SetPhysicalMemory switches what ReadMemory and WriteMemory address:
// with on, guest physical addresses (QEMU's Qqemu.PhyMemMode), else
// virtual ones through the hart's MMU. Only QEMU's stub has the mode; an
// empty reply (another stub, or an old QEMU) is ErrUnsupported.
func (c *Client) SetPhysicalMemory(ctx context.Context, on bool) error {
	mode := 0
	if on {
		mode = 1
	}
	err := c.command(ctx, func() error {
		return c.expectOK(ctx, fmt.Appendf(nil, "Qqemu.PhyMemMode:%d", mode))
	})
	if err != nil {
		return fmt.Errorf("gdb: physical memory mode: %w", err)
	}
	return nil
}

// AwaitStop waits until the target is stopped, at once if it is; it
// returns ctx's error if ctx ends first, and the connection's if it is
// lost.
func (c *Client) AwaitStop(ctx context.Context) error {
	return c.await(ctx, func() bool { return !c.running })
}

// Requeue makes st, the stop an Interrupt returned, unreported again, so
// that the next Wait returns it: for a caller that stopped the guest to
// act on it and found it stopped on its own first (a breakpoint hit),
// which is not that caller's to report. It does nothing once the target
// runs again.
func (c *Client) Requeue(st Stop) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running && c.err == nil {
		c.last, c.haveLast, c.consumed = st, true, false
	}
}

// StateReplaced tells the client the target's state was replaced behind
// the stub (a snapshot loaded into the stopped guest): which threads
// stopped where, and which thread the stub's commands act on, no longer
// hold. Breakpoints and watchpoints stay inserted.
func (c *Client) StateReplaced() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.parked)
	clear(c.watched)
	c.selThread = ""
	c.consumed = true
	c.replaced = true
}

// ReverseContinue runs a replaying target backwards ("bc", which a QEMU
// that replays a recording announces as ReverseContinue+) to the previous
// breakpoint or watchpoint hit, or to the recording's start; Wait
// reports the stop.
func (c *Client) ReverseContinue(ctx context.Context) error {
	return c.command(ctx, func() error {
		_, err := c.resume(ctx, []byte("bc"), "")
		return err
	})
}

// ReverseStep steps a replaying target one instruction back ("bs") and
// returns the stop.
func (c *Client) ReverseStep(ctx context.Context) (Stop, error) {
	var gen uint64
	err := c.command(ctx, func() (err error) {
		gen, err = c.resume(ctx, []byte("bs"), "")
		return err
	})
	if err != nil {
		return Stop{}, fmt.Errorf("gdb: reverse step: %w", err)
	}
	return c.waitGen(ctx, gen, true)
}
