package caps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

// clock is the probed architecture's board timer (arch.TimerProbe) as
// the probe reads and arms it through the gdbstub of a stopped guest.
type clock struct {
	*arch.TimerProbe
	hz uint64 // the count's frequency, once known
	// stepped is how long the guest may have run in the steps of
	// instructions so far: its count runs then.
	stepped time.Duration
}

// read reads the value a gives access to.
func (k *clock) read(ctx context.Context, c *gdb.Client, a arch.Access) (uint64, error) {
	switch {
	case a.Insn != 0:
		return k.step(ctx, c, a, nil)
	case a.Addr != 0:
		b, err := physical(ctx, c, func() ([]byte, error) { return c.ReadMemory(ctx, a.Addr, 8) })
		if err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint64(b), nil
	default:
		return c.ReadRegister(ctx, a.Reg)
	}
}

// write writes v to the value a gives access to.
func (k *clock) write(ctx context.Context, c *gdb.Client, a arch.Access, v uint64) error {
	switch {
	case a.Insn != 0:
		_, err := k.step(ctx, c, a, &v)
		return err
	case a.Addr != 0:
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		_, err := physical(ctx, c, func() ([]byte, error) { return nil, c.WriteMemory(ctx, a.Addr, b[:]) })
		return err
	default:
		return c.WriteRegister(ctx, a.Reg, v)
	}
}

// physical runs f in the stub's physical memory mode.
func physical(ctx context.Context, c *gdb.Client, f func() ([]byte, error)) ([]byte, error) {
	if err := c.SetPhysicalMemory(ctx, true); err != nil {
		return nil, err
	}
	b, err := f()
	if perr := c.SetPhysicalMemory(ctx, false); err == nil {
		err = perr
	}
	return b, err
}

// step runs a's instruction at Scratch, with a.Reg set to *in first if
// in is set, and returns a.Reg after it; the guest's register, program
// counter and memory there are put back.
func (k *clock) step(ctx context.Context, c *gdb.Client, a arch.Access, in *uint64) (v uint64, err error) {
	pc, ok := pcName(c)
	if !ok {
		return 0, errors.New("the gdbstub names no program counter")
	}
	oldPC, err := c.ReadRegister(ctx, pc)
	if err != nil {
		return 0, err
	}
	oldReg, err := c.ReadRegister(ctx, a.Reg)
	if err != nil {
		return 0, err
	}
	oldMem, err := c.ReadMemory(ctx, k.Scratch, 4)
	if err != nil {
		return 0, err
	}
	defer func() {
		for _, perr := range []error{c.WriteMemory(ctx, k.Scratch, oldMem), c.WriteRegister(ctx, a.Reg, oldReg), c.WriteRegister(ctx, pc, oldPC)} {
			if err == nil && perr != nil {
				err = fmt.Errorf("put the guest back after a step: %w", perr)
			}
		}
	}()
	insn := binary.LittleEndian.AppendUint32(nil, a.Insn)
	if err := c.WriteMemory(ctx, k.Scratch, insn); err != nil {
		return 0, err
	}
	if in != nil {
		if err := c.WriteRegister(ctx, a.Reg, *in); err != nil {
			return 0, err
		}
	}
	if err := c.WriteRegister(ctx, pc, k.Scratch); err != nil {
		return 0, err
	}
	start := time.Now()
	_, err = c.Step(ctx)
	k.stepped += time.Since(start)
	if err != nil {
		return 0, err
	}
	if at, err := c.ReadRegister(ctx, pc); err != nil {
		return 0, err
	} else if at != k.Scratch+4 {
		return 0, fmt.Errorf("the instruction %#08x stepped at %#x went to %#x (it trapped?)", a.Insn, k.Scratch, at)
	}
	return c.ReadRegister(ctx, a.Reg)
}

// pcName is the stub's name of the program counter.
func pcName(c *gdb.Client) (string, bool) {
	for _, n := range []string{"pc", "PC"} {
		if _, ok := c.Register(n); ok {
			return n, true
		}
	}
	return "", false
}

// count reads the timer's count, learning its frequency on the first.
func (k *clock) count(ctx context.Context, c *gdb.Client) (uint64, error) {
	if k.hz == 0 {
		k.hz = k.Hz
		if k.hz == 0 {
			hz, err := c.ReadRegister(ctx, k.FreqReg)
			if err != nil {
				return 0, fmt.Errorf("read the count's frequency: %w", err)
			}
			if hz == 0 {
				return 0, fmt.Errorf("%s is 0", k.FreqReg)
			}
			k.hz = hz
		}
	}
	return k.read(ctx, c, k.Count)
}

// ticks is d in counts.
func (k *clock) ticks(d time.Duration) uint64 { return uint64(d.Seconds() * float64(k.hz)) }

// arm programs the alarms (those whose registers the stub has) to fire
// d of guest time after now, and returns them as a mask (bit i: Alarms[i]).
// None may be pending then: the tiny kernel uses no timer and enables no
// interrupt, so a fired timer stays pending for the probe to see.
func (k *clock) arm(ctx context.Context, c *gdb.Client, now uint64, d time.Duration) (uint64, error) {
	at := now + k.ticks(d)
	var armed uint64
	for i, al := range k.Alarms {
		if al.Optional {
			if _, ok := c.Register(al.Compare.Reg); !ok {
				continue
			}
		}
		if err := k.write(ctx, c, al.Compare, at); err != nil {
			return 0, fmt.Errorf("arm the %s timer: %w", al.Name, err)
		}
		if al.Control != (arch.Access{}) {
			if err := k.write(ctx, c, al.Control, al.ControlValue); err != nil {
				return 0, fmt.Errorf("enable the %s timer: %w", al.Name, err)
			}
		}
		armed |= 1 << i
	}
	fired, err := k.fired(ctx, c)
	if err != nil {
		return 0, err
	}
	if fired&armed != 0 {
		return 0, fmt.Errorf("a timer is still pending after arming it for later (%s)", k.names(fired&armed))
	}
	return armed, nil
}

// fired is the mask of the alarms that are pending.
func (k *clock) fired(ctx context.Context, c *gdb.Client) (uint64, error) {
	var mask uint64
	for i, al := range k.Alarms {
		if al.Optional {
			if _, ok := c.Register(al.Compare.Reg); !ok {
				continue
			}
		}
		v, err := k.read(ctx, c, al.Pending)
		if err != nil {
			return 0, fmt.Errorf("read whether the %s timer fired: %w", al.Name, err)
		}
		if v&al.PendingBit != 0 {
			mask |= 1 << i
		}
	}
	return mask, nil
}

// names are the alarms of mask: "machine timer", "machine and
// supervisor (Sstc) timers".
func (k *clock) names(mask uint64) string {
	var n []string
	for i, al := range k.Alarms {
		if mask&(1<<i) != 0 {
			n = append(n, al.Name)
		}
	}
	if len(n) == 1 {
		return n[0] + " timer"
	}
	return strings.Join(n, " and ") + " timers"
}

// restored says No unless a load put the count back where the save left
// it (the guest had not run yet): ran is how long the guest may have run
// in between, in the steps that read the count and armed the timers
// (none where the count is read from memory).
func (k *clock) restored(loaded, saved uint64, ran time.Duration) (Result, bool) {
	if loaded < saved || loaded-saved > k.ticks(ran) {
		return no("%s after the load is %#x, the save left %#x (%+.3f s): the timer's offset is not restored", k.Counter, loaded, saved, float64(int64(loaded-saved))/float64(k.hz)), false
	}
	return Result{}, true
}

// verdict decides from the count (now) and the alarms pending (fired)
// read after the loaded guest (its count loaded after the load) ran past
// the deadline of the alarms armed before the save: its time must run,
// and every armed alarm must fire.
func (k *clock) verdict(saved, loaded, now, fired, armed uint64) Result {
	if now <= loaded {
		return no("the loaded guest's time does not run: %s %#x, saved %#x", k.Counter, now, saved)
	}
	deadline := saved + k.ticks(timerDelay)
	if now < deadline {
		return failed("wait for the timer", fmt.Errorf("%s %#x has not reached the deadline %#x yet", k.Counter, now, deadline))
	}
	if fired&armed != armed {
		return no("%s restored, but the timers armed before the save did not fire %.0f ms of guest time after their deadline (not fired: %s)",
			k.Counter, float64(now-deadline)/float64(k.hz)*1000, k.names(armed&^fired))
	}
	return Result{Answer: Yes, Detail: k.Counter + " restored and running, the " + k.names(armed) + " armed before the save fired on time, the guest answered"}
}
