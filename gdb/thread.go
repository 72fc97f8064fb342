package gdb

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// QEMU's gdbstub shows each vCPU as a thread, "01" for the first; a
// multi-hart guest is debugged thread by thread. The target stops and
// resumes as a whole (all-stop mode): a stop stops every thread, Continue
// resumes them all, and a Thread's Step or Continue runs that thread
// alone while the others stay stopped.

// Threads lists the target's threads as the stub names them (qfThreadInfo
// and qsThreadInfo), ordered by number. A stub that does not list
// threads has one, "" (the current thread).
func (c *Client) Threads(ctx context.Context) ([]string, error) {
	var out []string
	err := c.command(ctx, func() error {
		cmd := []byte("qfThreadInfo")
		for range 1 << 16 {
			reply, err := c.roundTrip(ctx, cmd)
			if err != nil {
				return err
			}
			if len(reply) == 0 {
				out = []string{""}
				return nil
			}
			if err := replyError(cmd, reply); err != nil {
				return err
			}
			switch reply[0] {
			case 'l':
				return nil
			case 'm':
				for t := range strings.SplitSeq(string(reply[1:]), ",") {
					if t != "" {
						out = append(out, t)
					}
				}
			default:
				return fmt.Errorf("%s: %w: reply %.40q", cmd, errMalformed, reply)
			}
			cmd = []byte("qsThreadInfo")
		}
		return fmt.Errorf("%w: the thread list does not end", errMalformed)
	})
	if err != nil {
		return nil, fmt.Errorf("gdb: list threads: %w", err)
	}
	if len(out) == 0 {
		out = []string{""}
	}
	sortThreads(out)
	return out, nil
}

// ThreadInfo is what the stub says of a thread (qThreadExtraInfo): for
// QEMU the vCPU's model and name, and "[halted ]" while it waits for an
// interrupt (wfi) or "[running]". A stub without it says "".
func (c *Client) ThreadInfo(ctx context.Context, thread string) (string, error) {
	var info string
	err := c.command(ctx, func() error {
		cmd := []byte("qThreadExtraInfo," + thread)
		reply, err := c.roundTrip(ctx, cmd)
		if err != nil || len(reply) == 0 {
			return err
		}
		if err := replyError(cmd, reply); err != nil {
			return err
		}
		b, err := hex.DecodeString(string(reply))
		if err != nil {
			return fmt.Errorf("%s: %w: %v", cmd, errMalformed, err)
		}
		info = string(bytes.TrimRight(b, "\x00"))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("gdb: thread %s info: %w", thread, err)
	}
	return info, nil
}

// Halted reports whether a ThreadInfo says the thread waits for an
// interrupt.
func Halted(info string) bool { return strings.Contains(info, "[halted") }

// ThreadNumber is the number of a thread id ("03", or "p1.03" with
// multiprocess ids): QEMU numbers vCPUs from 1, so a RISC-V hart's ID on
// the virt board is the number minus one.
func ThreadNumber(thread string) (int, bool) {
	if i := strings.LastIndexByte(thread, '.'); i >= 0 {
		thread = thread[i+1:]
	}
	n, err := strconv.ParseInt(thread, 16, 32)
	return int(n), err == nil && n > 0
}

// A Thread is one thread of the target (a QEMU vCPU): its registers and
// memory as it sees them (virtual addresses go through its MMU), and
// stepping or running it alone.
type Thread struct {
	c  *Client
	id string
}

// Thread returns a handle on thread id ("" is the thread that last
// stopped). It does not check that the thread exists; the stub refuses
// commands on one that does not.
func (c *Client) Thread(id string) *Thread { return &Thread{c: c, id: id} }

// ID is the thread's id as the stub names it.
func (t *Thread) ID() string { return t.id }

// Client is the connection the thread belongs to.
func (t *Thread) Client() *Client { return t.c }

// Register looks a register up by name (see Client.Register).
func (t *Thread) Register(name string) (Register, bool) { return t.c.Register(name) }

// ReadRegisters is Client.ReadRegisters for this thread.
func (t *Thread) ReadRegisters(ctx context.Context) (map[string]uint64, error) {
	return t.c.readRegisters(ctx, t.id)
}

// ReadRegister is Client.ReadRegister for this thread.
func (t *Thread) ReadRegister(ctx context.Context, name string) (uint64, error) {
	return t.c.readRegister(ctx, t.id, name)
}

// ReadMemory is Client.ReadMemory through this thread's MMU.
func (t *Thread) ReadMemory(ctx context.Context, addr uint64, n int) ([]byte, error) {
	return t.c.readMemory(ctx, t.id, addr, n)
}

// Step executes one instruction of this thread alone (see Client.Step).
func (t *Thread) Step(ctx context.Context) (Stop, error) { return t.c.step(ctx, t.id) }

// Continue resumes this thread alone, the others staying stopped, and
// returns once the request is sent; Wait reports its stop. A thread that
// waits for something a stopped thread holds never stops by itself:
// Interrupt stops it.
func (t *Thread) Continue(ctx context.Context) error {
	id := t.c.threadOrLast(t.id)
	if id == "" || !t.c.vcont["c"] {
		return fmt.Errorf("gdb: continue thread %q alone: %w (needs vCont with thread ids)", t.id, ErrUnsupported)
	}
	return t.c.resumeAll(ctx, "continue thread "+id, id)
}

// threadOrLast is thread, or for "" the thread of the last stop.
func (c *Client) threadOrLast(thread string) string {
	if thread != "" {
		return thread
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Thread
}

// isWatched reports whether thread ("" for the last to stop) stopped on a
// watchpoint before the access.
func (c *Client) isWatched(thread string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if thread == "" {
		thread = c.last.Thread
	}
	return c.watched[thread]
}

// commandOn is command with the stub's register and memory commands
// pointed at thread ("" for the thread of the last stop).
func (c *Client) commandOn(ctx context.Context, thread string, f func() error) error {
	return c.command(ctx, func() error {
		if err := c.selectThread(ctx, thread); err != nil {
			return err
		}
		return f()
	})
}

// selectThread points register and memory commands at thread ("" for the
// thread of the last stop) with Hg, unless they already are. A stub that
// knows no Hg (or names no threads) serves the thread that stopped only.
// The caller holds cmdSem.
func (c *Client) selectThread(ctx context.Context, thread string) error {
	c.mu.Lock()
	last, sel := c.last.Thread, c.selThread
	c.mu.Unlock()
	if thread == "" {
		thread = last
	}
	if thread == "" || thread == sel {
		return nil
	}
	cmd := []byte("Hg" + thread)
	reply, err := c.roundTrip(ctx, cmd)
	if err != nil {
		return err
	}
	if err := replyError(cmd, reply); err != nil {
		if errors.Is(err, ErrUnsupported) && thread == last {
			return nil // the stub's current thread is the one that stopped
		}
		var se *StubError
		if errors.As(err, &se) {
			return fmt.Errorf("no thread %s: %w", thread, err)
		}
		return err
	}
	if string(reply) != "OK" {
		return fmt.Errorf("%s: %w: reply %.40q", cmd, errMalformed, reply)
	}
	c.mu.Lock()
	c.selThread = thread
	c.mu.Unlock()
	return nil
}

// continueThread points QEMU's "current" thread at one (Hc) before it is
// resumed alone. An interrupt then stops it as the thread reported, and
// takes it out of single-step mode: a step that never finished (a thread
// in wfi) would otherwise leave it stepping, to stop again on its own at
// its next instruction, long after. The caller holds cmdSem.
func (c *Client) continueThread(ctx context.Context, one string) error {
	c.mu.Lock()
	cur := c.cThread
	c.mu.Unlock()
	if one == "" || one == cur || c.noHc {
		return nil
	}
	cmd := []byte("Hc" + one)
	reply, err := c.roundTrip(ctx, cmd)
	if err != nil {
		return err
	}
	if err := replyError(cmd, reply); err != nil {
		if errors.Is(err, ErrUnsupported) {
			c.noHc = true
			return nil
		}
		return fmt.Errorf("no thread %s: %w", one, err)
	}
	c.mu.Lock()
	c.cThread = one
	c.mu.Unlock()
	return nil
}

// LastStop is the latest stop the stub reported (reported to a caller or
// not), and false before any.
func (c *Client) LastStop() (Stop, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.haveLast
}

// sortThreads orders thread ids by number, ids that are not numbers last.
func sortThreads(ts []string) {
	slices.SortStableFunc(ts, func(a, b string) int {
		na, oka := ThreadNumber(a)
		nb, okb := ThreadNumber(b)
		switch {
		case oka && okb:
			return na - nb
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
}
