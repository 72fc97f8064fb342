package gdb

import (
	"context"
	"debug/elf"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

const (
	tinyBin = "../testdata/images/tiny.bin"
	tinyELF = "../testdata/images/tiny.elf"
	// ramEnd is the end of the guest's 128M of RAM on the virt board.
	ramEnd = 0x80000000 + 128<<20
)

// tinyImage is what the tests need to know about the tiny kernel's ELF.
type tinyImage struct {
	sym      map[string]uint64
	text     []byte
	textAddr uint64
}

var loadTiny = sync.OnceValues(func() (*tinyImage, error) {
	f, err := elf.Open(tinyELF)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, err
	}
	img := &tinyImage{sym: map[string]uint64{}}
	for _, s := range syms {
		img.sym[s.Name] = s.Value
	}
	text := f.Section(".text")
	if text == nil {
		return nil, errors.New("no .text")
	}
	if img.text, err = text.Data(); err != nil {
		return nil, err
	}
	img.textAddr = text.Addr
	return img, nil
})

// guest is a tiny kernel running under OpenSBI in a QEMU with a gdbstub.
type guest struct {
	t    *testing.T
	m    *qemu.Process
	sock string
	img  *tinyImage
	// cursor is where the next wait on the console starts.
	cursor int64
}

func bootTiny(t *testing.T, ctx context.Context) *guest {
	t.Helper()
	bin := testguest.QEMU(t)
	img, err := loadTiny()
	if err != nil {
		t.Fatalf("load %s: %v", tinyELF, err)
	}
	dir, err := os.MkdirTemp("", "gdbt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gdb.sock")
	// -chardev is reserved to the server (qemu.CheckExtraArgs), but -gdb
	// takes a chardev description of its own.
	cfg := qemu.NewConfig(qemu.WithBinary(bin), qemu.WithKernel(tinyBin), qemu.WithExtraArgs("-gdb", "unix:"+sock+",server=on,wait=off"))
	m, err := qemu.Start(ctx, qemu.Runtime{
		SerialBase: filepath.Join(dir, "serial-1"),
		QMPSocket:  filepath.Join(dir, "qmp-1.sock"),
		Logger:     slog.New(slog.DiscardHandler),
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Logf("close machine: %v", err)
		}
	})
	g := &guest{t: t, m: m, sock: sock, img: img}
	g.expect(ctx, `tiny> $`)
	return g
}

func (g *guest) sym(name string) uint64 {
	g.t.Helper()
	a, ok := g.img.sym[name]
	if !ok {
		g.t.Fatalf("no symbol %s in %s", name, tinyELF)
	}
	return a
}

func (g *guest) dial(ctx context.Context, opts ...Option) *Client {
	g.t.Helper()
	c, err := Dial(ctx, "unix", g.sock, opts...)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	return c
}

func (g *guest) typeIn(ctx context.Context, s string) {
	g.t.Helper()
	if _, err := g.m.Console().Write(ctx, []byte(s)); err != nil {
		g.t.Fatalf("type %q: %v", s, err)
	}
}

// expect waits for re on the console after what earlier expects matched.
func (g *guest) expect(ctx context.Context, re string) {
	g.t.Helper()
	m, err := g.m.Console().Buffer().Wait(ctx, g.cursor, regexp.MustCompile(re), 10*time.Second)
	if err != nil || !m.Matched {
		g.t.Fatalf("console: waiting for %q: %v; got %q", re, err, m.Output)
	}
	g.cursor = m.Cursor
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func readPC(t *testing.T, ctx context.Context, c *Client) uint64 {
	t.Helper()
	pc, err := c.ReadRegister(ctx, "pc")
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

func TestQEMUHandshakeAndRegisters(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	start := time.Now()
	c := g.dial(ctx)
	t.Logf("Dial (handshake, %d registers) took %v", len(c.Registers()), time.Since(start))

	if got := c.Arch(); got != "riscv:rv64" {
		t.Errorf("Arch = %q", got)
	}
	f := c.Supported()
	if f["PacketSize"] == "" || f["qXfer:features:read"] != "+" {
		t.Errorf("Supported = %v", f)
	}
	t.Logf("qSupported: %v", f)
	if c.Running() {
		t.Error("Running after Dial: QEMU stops the guest when a debugger connects")
	}

	regs := c.Registers()
	for i, want := range riscv64.Arch.Debugger().Registers().GDB.Fallback[:32] {
		if regs[i].Name != want || regs[i].Regnum != i || regs[i].Bitsize != 64 || regs[i].Group != "general" {
			t.Errorf("register %d = %+v, want %s", i, regs[i], want)
		}
	}
	if regs[32].Name != "pc" || regs[32].Regnum != 32 {
		t.Errorf("register 32 = %+v, want pc", regs[32])
	}
	for i := 1; i < len(regs); i++ {
		if regs[i].Regnum <= regs[i-1].Regnum {
			t.Fatalf("registers out of order at %d: %+v after %+v", i, regs[i], regs[i-1])
		}
	}
	for _, name := range []string{"sstatus", "satp", "scause", "mstatus", "priv", "ft0", "x2", "s0"} {
		r, ok := c.Register(name)
		if !ok {
			t.Errorf("no register %s", name)
			continue
		}
		t.Logf("%s: %+v", name, r)
	}
	if r, _ := c.Register("x2"); r.Name != "sp" {
		t.Errorf("x2 is %+v, want sp", r)
	}

	all, err := c.ReadRegisters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 33 {
		t.Errorf("ReadRegisters returned %d registers, want 33: %v", len(all), all)
	}
	if all["zero"] != 0 {
		t.Errorf("zero = %#x", all["zero"])
	}
	textEnd := g.img.textAddr + uint64(len(g.img.text))
	if pc := all["pc"]; pc < g.img.textAddr || pc >= textEnd {
		t.Errorf("pc = %#x, outside the kernel's text", pc)
	}
	if pc := readPC(t, ctx, c); pc != all["pc"] {
		t.Errorf("p says pc = %#x, g says %#x", pc, all["pc"])
	}
	if priv, err := c.ReadRegister(ctx, "priv"); err != nil || priv != 1 {
		t.Errorf("priv = %d, %v; want 1 (supervisor, under OpenSBI)", priv, err)
	}
	if satp, err := c.ReadRegister(ctx, "satp"); err != nil || satp != 0 {
		t.Errorf("satp = %#x, %v; want 0 (the MMU stays off)", satp, err)
	}
	for _, csr := range []string{"sstatus", "scause", "mstatus", "mhartid"} {
		v, err := c.ReadRegister(ctx, csr)
		if err != nil {
			t.Errorf("read %s: %v", csr, err)
		}
		t.Logf("%s = %#x", csr, v)
	}
	if _, err := c.ReadRegister(ctx, "nosuch"); err == nil {
		t.Error("read of an unknown register succeeded")
	}

	old := all["t0"]
	if err := c.WriteRegister(ctx, "x5", 0x1122334455667788); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ReadRegister(ctx, "t0"); err != nil || v != 0x1122334455667788 {
		t.Errorf("t0 after write = %#x, %v", v, err)
	}
	if err := c.WriteRegister(ctx, "t0", old); err != nil {
		t.Fatal(err)
	}

	s, err := c.HaltReason(ctx)
	if err != nil || s.Signal != SIGTRAP || s.Thread == "" {
		t.Errorf("HaltReason = %+v, %v", s, err)
	}

	const n = 200
	start = time.Now()
	for range n {
		if _, err := c.ReadRegisters(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("ReadRegisters round trip: %v average over %d", time.Since(start)/n, n)
	start = time.Now()
	for range n {
		if _, err := c.ReadRegister(ctx, "sstatus"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("ReadRegister(sstatus) round trip: %v average over %d", time.Since(start)/n, n)
}

func TestQEMUInterrupt(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.Running() {
		t.Fatal("not Running after Continue")
	}
	if _, err := c.ReadRegisters(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("ReadRegisters while running: %v, want ErrRunning", err)
	}
	if err := c.Continue(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("Continue while running: %v, want ErrRunning", err)
	}
	// The guest really runs: it answers on its console.
	g.typeIn(ctx, "echo running\r")
	g.expect(ctx, `running\r\ntiny> $`)

	start := time.Now()
	s, err := c.Interrupt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Interrupt took %v: %+v", time.Since(start), s)
	if s.Reason != ReasonSignal || s.Signal != SIGINT || s.Thread == "" {
		t.Errorf("stop = %+v, want SIGINT", s)
	}
	if c.Running() {
		t.Error("Running after Interrupt")
	}
	pc := readPC(t, ctx, c)
	if pc < g.img.textAddr || pc >= g.img.textAddr+uint64(len(g.img.text)) {
		t.Errorf("pc = %#x, outside the kernel's text", pc)
	}
	// Interrupting a stopped target is harmless.
	if _, err := c.Interrupt(ctx); err != nil {
		t.Errorf("Interrupt of a stopped target: %v", err)
	}
	if _, err := c.Wait(ctx); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Wait on a stopped target: %v, want ErrNotRunning", err)
	}
}

func TestQEMUMemory(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)

	start := g.sym("_start")
	got, err := c.ReadMemory(ctx, start, len(g.img.text))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(g.img.text) {
		t.Errorf("memory at _start (%#x) differs from the ELF's .text", start)
	}

	// Nothing is mapped at 0 on the virt board: an error, and the
	// connection survives.
	got, err = c.ReadMemory(ctx, 0, 16)
	var me *MemoryError
	if !errors.As(err, &me) || me.Addr != 0 || len(got) != 0 {
		t.Errorf("read at 0: %q, %v; want a MemoryError at 0", got, err)
	} else {
		t.Logf("read at 0: %v", err)
	}
	var se *StubError
	if !errors.As(err, &se) {
		t.Errorf("read at 0: %v is not a StubError", err)
	}
	readPC(t, ctx, c)

	// A read running off the end of RAM returns what was readable.
	got, err = c.ReadMemory(ctx, ramEnd-16, 64)
	if !errors.As(err, &me) || me.Addr != ramEnd || len(got) != 16 {
		t.Errorf("read across the end of RAM: %d bytes, %v; want 16 and a MemoryError at %#x", len(got), err, ramEnd)
	} else {
		t.Logf("read across the end of RAM: %v", err)
	}

	buf := g.sym("line_buf")
	old, err := c.ReadMemory(ctx, buf, 3000)
	if err != nil {
		t.Fatal(err)
	}
	pattern := make([]byte, len(old))
	for i := range pattern {
		pattern[i] = byte(i * 7)
	}
	if err := c.WriteMemory(ctx, buf, pattern); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadMemory(ctx, buf, len(pattern)); err != nil || string(got) != string(pattern) {
		t.Errorf("read back after write: %v, equal=%v", err, string(got) == string(pattern))
	}
	if err := c.WriteMemory(ctx, buf, old); err != nil {
		t.Fatal(err)
	}
	// QEMU 7.2 acknowledges debug writes to unmapped addresses; they
	// just go nowhere.
	t.Logf("write at 0: %v", c.WriteMemory(ctx, 0, []byte{1}))

	// Physical mode reads the same bytes here (the tiny kernel runs
	// without translation), and the mode switches back.
	if err := c.SetPhysicalMemory(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadMemory(ctx, start, 64); err != nil || string(got) != string(g.img.text[:64]) {
		t.Errorf("physical read at _start: %v, equal=%v", err, string(got) == string(g.img.text[:64]))
	}
	if err := c.SetPhysicalMemory(ctx, false); err != nil {
		t.Fatal(err)
	}
}

func TestQEMUBreakpoints(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)
	echo := g.sym("cmd_echo")

	for _, kind := range []BreakKind{Software, Hardware} {
		t.Run(kind.String(), func(t *testing.T) {
			if err := c.SetBreakpoint(ctx, kind, echo, 4); err != nil {
				t.Fatal(err)
			}
			if bps, err := c.Breakpoints(ctx); err != nil || len(bps) != 1 || bps[0] != (Breakpoint{kind, echo, 4}) {
				t.Errorf("Breakpoints = %v, %v", bps, err)
			}
			if err := c.Continue(ctx); err != nil {
				t.Fatal(err)
			}
			g.typeIn(ctx, "echo hi\r")
			s, err := c.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Reason != ReasonBreakpoint || s.Signal != SIGTRAP {
				t.Errorf("stop = %+v, want a breakpoint", s)
			}
			if pc := readPC(t, ctx, c); pc != echo {
				t.Fatalf("pc = %#x, want cmd_echo %#x", pc, echo)
			}
			if kind == Software {
				// Stepping from the breakpoint moves on by one
				// instruction (QEMU steps through its own breakpoint).
				s, err := c.Step(ctx)
				if err != nil || s.Reason != ReasonStep {
					t.Fatalf("Step = %+v, %v", s, err)
				}
				if pc := readPC(t, ctx, c); pc != echo+4 {
					t.Errorf("pc after step = %#x, want %#x", pc, echo+4)
				}
			}
			// Continue from the breakpoint itself must not stop on it
			// again: the client steps over it.
			if err := c.Continue(ctx); err != nil {
				t.Fatal(err)
			}
			g.expect(ctx, `hi\r\ntiny> $`)
			if !c.Running() {
				t.Error("not running after Continue")
			}
			if _, err := c.Interrupt(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.ClearBreakpoint(ctx, kind, echo, 4); err != nil {
				t.Fatal(err)
			}
			if bps, _ := c.Breakpoints(ctx); len(bps) != 0 {
				t.Errorf("Breakpoints after clear = %v", bps)
			}
			if err := c.Continue(ctx); err != nil {
				t.Fatal(err)
			}
			g.typeIn(ctx, "echo free\r")
			g.expect(ctx, `free\r\ntiny> $`)
			if _, err := c.Interrupt(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}

	// Break, continue, stop again: tk_input_idle runs on every poll of
	// the UART, so each Continue (with its step-over) stops there at once.
	idle := g.sym("tk_input_idle")
	if err := c.SetBreakpoint(ctx, Software, idle, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 50
	start := time.Now()
	for range n {
		if err := c.Continue(ctx); err != nil {
			t.Fatal(err)
		}
		s, err := c.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Reason != ReasonBreakpoint {
			t.Fatalf("stop = %+v", s)
		}
	}
	t.Logf("break -> continue -> stop (with step-over): %v average over %d", time.Since(start)/n, n)
	if pc := readPC(t, ctx, c); pc != idle {
		t.Errorf("pc = %#x, want tk_input_idle %#x", pc, idle)
	}
	if err := c.ClearBreakpoint(ctx, Software, idle, 4); err != nil {
		t.Fatal(err)
	}
}

func TestQEMUWatchpoints(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)
	buf := g.sym("line_buf")
	lineByte := func() byte {
		t.Helper()
		b, err := c.ReadMemory(ctx, buf, 1)
		if err != nil {
			t.Fatal(err)
		}
		return b[0]
	}

	// read_loop stores each typed character in line_buf.
	if err := c.SetBreakpoint(ctx, WatchWrite, buf, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	g.typeIn(ctx, "x")
	s, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reason != ReasonWatch || s.Addr != buf {
		t.Errorf("stop = %+v, want watch at line_buf %#x", s, buf)
	}
	pc := readPC(t, ctx, c)
	t.Logf("write watchpoint: %v, pc %#x, line_buf[0] = %q (QEMU 7.2 stops before the store)", s, pc, lineByte())

	// Stepping lifts the watchpoint for one instruction, or it would
	// fire on the same store again.
	s, err = c.Step(ctx)
	if err != nil || s.Reason != ReasonStep {
		t.Fatalf("Step = %+v, %v", s, err)
	}
	if got := readPC(t, ctx, c); got == pc {
		t.Errorf("pc did not move: %#x", got)
	}
	if b := lineByte(); b != 'x' {
		t.Errorf("line_buf[0] = %q after the step, want 'x'", b)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	g.expect(ctx, `x$`)

	// Erase and retype: the watchpoint fires again, and Continue right
	// away must not stop on the same store.
	g.typeIn(ctx, "\by")
	if s, err := c.Wait(ctx); err != nil || s.Reason != ReasonWatch {
		t.Fatalf("stop = %+v, %v", s, err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	g.expect(ctx, `y$`)
	if !c.Running() {
		s, err := c.Wait(ctx)
		t.Fatalf("stopped again: %+v, %v", s, err)
	}
	if _, err := c.Interrupt(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ClearBreakpoint(ctx, WatchWrite, buf, 1); err != nil {
		t.Fatal(err)
	}

	// Parsing the line reads it back.
	if err := c.SetBreakpoint(ctx, WatchRead, buf, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	g.typeIn(ctx, "\r")
	s, err = c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reason != ReasonRWatch || s.Addr != buf {
		t.Errorf("stop = %+v, want rwatch at %#x", s, buf)
	}
	if err := c.ClearBreakpoint(ctx, WatchRead, buf, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	g.expect(ctx, `unknown command: y\r\ntiny> $`)
}

func TestQEMUWaitTimeoutKeepsRunning(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := c.Wait(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want a deadline error", err)
	}
	if !c.Running() {
		t.Error("not Running after an abandoned Wait")
	}
	g.typeIn(ctx, "echo still\r")
	g.expect(ctx, `still\r\ntiny> $`)
	s, err := c.Interrupt(ctx)
	if err != nil || s.Signal != SIGINT {
		t.Fatalf("Interrupt = %+v, %v", s, err)
	}
	readPC(t, ctx, c)
}

func TestQEMUCloseUnblocksWait(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	c := g.dial(ctx)
	echo := g.sym("cmd_echo")
	if err := c.SetBreakpoint(ctx, Software, echo, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background())
		waited <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(start))
	select {
	case err := <-waited:
		t.Logf("Wait returned %v", err)
	case <-time.After(2 * time.Second):
		t.Fatal("Wait still blocked 2s after Close")
	}
	if _, err := c.ReadRegisters(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadRegisters after Close: %v, want ErrClosed", err)
	}
	// Close detached: the breakpoint is gone and the guest runs.
	g.typeIn(ctx, "echo free\r")
	g.expect(ctx, `free\r\ntiny> $`)
	// And the stub takes the next debugger.
	c2 := g.dial(ctx)
	readPC(t, ctx, c2)
}

// A guest resumed through QMP while the debugger thinks it stopped: the
// next command's first byte stops it and QEMU drops the command.
func TestQEMUResumedBehindTheDebuggersBack(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	var log lockedBuffer
	c := g.dial(ctx, WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	for i := range 3 {
		if _, err := g.m.Monitor().Execute(ctx, "cont", nil); err != nil {
			t.Fatal(err)
		}
		g.typeIn(ctx, "echo behind\r")
		g.expect(ctx, `behind\r\ntiny> $`)
		var err error
		switch i {
		case 0:
			_, err = c.ReadRegisters(ctx)
		case 1:
			_, err = c.ReadMemory(ctx, g.sym("_start"), 4096)
		case 2:
			_, err = c.HaltReason(ctx)
		}
		if err != nil {
			t.Fatalf("command %d after QMP cont: %v", i, err)
		}
		if c.Running() {
			t.Error("Running")
		}
		// The stream is in step: the next answers are the right ones.
		got, err := c.ReadMemory(ctx, g.sym("_start"), 64)
		if err != nil || string(got) != string(g.img.text[:64]) {
			t.Fatalf("read after resync: %v", err)
		}
	}
	if n := strings.Count(log.String(), "dropped by a running target"); n < 2 {
		t.Errorf("the client resent %d dropped commands, want at least 2 (ReadRegisters, ReadMemory); log:\n%s", n, log.String())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestQEMUExit(t *testing.T) {
	t.Run("guest", func(t *testing.T) {
		// The guest makes QEMU exit (sifive_test): QEMU 7.2 closes the
		// connection without a stop reply, QEMU 11 reports the exit
		// status first (W07). Either way the debugger says so.
		ctx := testContext(t)
		g := bootTiny(t, ctx)
		c := g.dial(ctx)
		if err := c.Continue(ctx); err != nil {
			t.Fatal(err)
		}
		g.typeIn(ctx, "exit 7\r")
		s, err := c.Wait(ctx)
		reported := err == nil && s.Reason == ReasonExited && s.ExitStatus == 7
		if !errors.Is(err, ErrClosed) && !reported {
			t.Errorf("Wait = %+v, %v; want ErrClosed or the exit with status 7", s, err)
		}
		t.Logf("Wait: %+v, %v", s, err)
		if _, err := c.ReadRegisters(ctx); !errors.Is(err, ErrClosed) && !(reported && errors.Is(err, ErrExited)) {
			t.Errorf("ReadRegisters after exit: %v, want ErrClosed (or ErrExited after the exit's report)", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	t.Run("quit", func(t *testing.T) {
		// QMP quit: QEMU says W00 before it goes.
		ctx := testContext(t)
		g := bootTiny(t, ctx)
		c := g.dial(ctx)
		if err := c.Continue(ctx); err != nil {
			t.Fatal(err)
		}
		go g.m.Monitor().Execute(ctx, "quit", nil)
		s, err := c.Wait(ctx)
		if err != nil || s.Reason != ReasonExited || s.ExitStatus != 0 {
			t.Fatalf("Wait = %+v, %v; want exited", s, err)
		}
		if _, err := c.ReadRegisters(ctx); !errors.Is(err, ErrExited) {
			t.Errorf("ReadRegisters after exit: %v, want ErrExited", err)
		}
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Error("connection still open 5s after QEMU quit")
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func TestQEMUSecondDebugger(t *testing.T) {
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	g.dial(ctx)
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	c, err := Dial(dctx, "unix", g.sock)
	if err == nil {
		c.Close()
		t.Fatal("a second debugger connected")
	}
	t.Logf("second Dial: %v", err)
}
