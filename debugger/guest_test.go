package debugger

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// tinyGuest is the built-in kernel under OpenSBI with a gdbstub, and a
// debugger session on it with the kernel's symbols.
type tinyGuest struct {
	t      *testing.T
	m      *qemu.Process
	s      *Session
	syms   *debuginfo.File
	cursor int64
}

func bootTiny(t *testing.T, ctx context.Context) *tinyGuest {
	t.Helper()
	bin := testguest.QEMU(t)
	tiny := testguest.Tiny(t)
	dir, err := os.MkdirTemp("", "dbg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := qemu.Start(ctx, qemu.Runtime{
		SerialBase: filepath.Join(dir, "serial"),
		QMPSocket:  filepath.Join(dir, "qmp.sock"),
		GDBSocket:  filepath.Join(dir, "gdb.sock"),
		Logger:     slog.New(slog.DiscardHandler),
	}, qemu.NewConfig(qemu.WithBinary(bin), qemu.WithKernel(tiny)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	g := &tinyGuest{t: t, m: m}
	g.expect(ctx, `tiny> $`)
	return g
}

// debug starts the session, with the symbols of tiny.elf or those of path.
func (g *tinyGuest) debug(path ...string) *Session {
	g.t.Helper()
	path = append(path, filepath.Join(testguest.Repo(), "testdata", "images", "tiny.elf"))
	syms, err := debuginfo.Open(path[0])
	if err != nil {
		g.t.Fatal(err)
	}
	g.syms = syms
	g.s = New(Config{
		Arch: riscv64.Arch,
		Dial: func(ctx context.Context) (*gdb.Client, error) {
			return gdb.Dial(ctx, "unix", g.m.Paths().GDBSocket)
		},
		Running: func(ctx context.Context) (bool, error) { return g.m.Monitor().Running(ctx) },
		Symbols: syms,
		Logger:  slog.New(slog.DiscardHandler),
	})
	g.t.Cleanup(func() { g.s.Close() })
	return g.s
}

func (g *tinyGuest) sym(name string) uint64 {
	g.t.Helper()
	s, err := g.syms.Lookup(name)
	if err != nil {
		g.t.Fatalf("symbol %s: %v", name, err)
	}
	return s.Addr
}

func (g *tinyGuest) typeIn(ctx context.Context, s string) {
	g.t.Helper()
	if _, err := g.m.Console().Write(ctx, []byte(s)); err != nil {
		g.t.Fatalf("type %q: %v", s, err)
	}
}

func (g *tinyGuest) expect(ctx context.Context, re string) {
	g.t.Helper()
	res, err := g.m.Console().Buffer().Wait(ctx, g.cursor, regexp.MustCompile(re), 10*time.Second)
	if err != nil || !res.Matched {
		g.t.Fatalf("console: waiting for %q: %v; got %q", re, err, res.Output)
	}
	g.cursor = res.Cursor
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A backtrace by frame pointers through the built-in kernel: from a C leaf
// at its first instruction (ra live, no frame yet), and past its prologue
// (its frame set up), to the assembly that called it; a bound on the
// frames says where it cut.
func TestBacktraceTiny(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	s := g.debug()
	if _, err := s.Break(ctx, "tk_cmd_input", false, false); err != nil {
		t.Fatal(err)
	}
	g.typeIn(ctx, "input\r")
	st, err := s.Continue(ctx, 10*time.Second)
	if err != nil || st.Reason != "breakpoint" || st.Function != "tk_cmd_input" {
		t.Fatalf("continue to tk_cmd_input: %+v %v", st, err)
	}
	check := func(when string) {
		t.Helper()
		bt, on, err := s.Backtrace(ctx, LastHart, 16)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if on != 0 || len(bt.Frames) < 2 || bt.Frames[0].Function != "tk_cmd_input" || bt.Frames[1].Function != "cmd_input" || bt.Frames[1].Offset != "0x8" {
			t.Errorf("%s: hart %d, %+v", when, on, bt)
		}
		for _, f := range bt.Frames {
			if f.Trap != nil || f.User {
				t.Errorf("%s: a trap frame in a kernel without traps: %+v", when, f)
			}
		}
		t.Logf("%s: %d frames, end %q", when, len(bt.Frames), bt.End)
	}
	check("at the leaf's entry")
	if _, err := s.Step(ctx, LastHart, 3, false, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	check("past the prologue")
	bt, _, err := s.Backtrace(ctx, LastHart, 1)
	if err != nil || len(bt.Frames) != 1 || !strings.Contains(bt.End, "1") {
		t.Errorf("one frame: %+v %v", bt, err)
	}
	for _, max := range []int{0, 257} {
		if _, _, err := s.Backtrace(ctx, LastHart, max); err == nil || !strings.Contains(err.Error(), "want 1 to 256") {
			t.Errorf("max %d: %v", max, err)
		}
	}
	if _, _, err := s.Backtrace(ctx, 5, 4); err == nil || !strings.Contains(err.Error(), "5") {
		t.Errorf("a hart the guest does not have: %v", err)
	}
	// Removing the breakpoint and continuing lets the shell answer.
	if _, err := s.Break(ctx, "tk_cmd_input", false, true); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Continue(ctx, 200*time.Millisecond); err != nil || !st.Running {
		t.Fatalf("continue: %+v %v", st, err)
	}
	g.expect(ctx, `input: keyboard=no tablet=no\r\ntiny> $`)
}

// A data watchpoint: set on a symbol (its size, up to 8 bytes, or a
// length), it stops the guest at the write with the instruction that
// wrote and the value before and after; a second write reports the first
// one's value as old. Bad lengths, kinds, addresses and duplicates are
// refused with what to do, and removing one that is not set says so.
func TestWatchTiny(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	g := bootTiny(t, ctx)
	s := g.debug()
	w, err := s.Watch(ctx, "line_buf", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if w.Kind != "write" || w.Length != 1 || w.Function != "line_buf" || w.File != "" {
		t.Errorf("watch: %+v", w)
	}
	if bs := s.Breakpoints(); len(bs) != 1 || bs[0].Addr != w.Addr {
		t.Errorf("breakpoints: %+v", bs)
	}
	for _, tc := range []struct {
		loc    string
		length int
		kind   string
		want   string
	}{
		{"line_buf", 1, "", "already set"},
		{"line_buf+8", 9, "", "want 1 to 8 bytes"},
		{"line_buf+8", 1, "exec", "want write, read or access"},
		{"0xc0000000", 8, "", "cannot be read"},
		{"no_such_symbol", 8, "", "no_such_symbol"},
	} {
		if _, err := s.Watch(ctx, tc.loc, tc.length, tc.kind, false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("watch %s/%d/%q: %v, want %q", tc.loc, tc.length, tc.kind, err, tc.want)
		}
	}
	if _, err := s.Watch(ctx, "line_buf+16", 1, "", true); err == nil || !strings.Contains(err.Error(), "no watchpoint at") {
		t.Errorf("remove one that is not set: %v", err)
	}

	for k, c := range []string{"e", "x"} {
		if k == 1 {
			g.typeIn(ctx, "\x08") // erase: line_buf[0] is written again by the next key
		}
		g.typeIn(ctx, c)
		st, err := s.Continue(ctx, 10*time.Second)
		if err != nil || st.Access == nil {
			t.Fatalf("write %q: %+v %v", c, st, err)
		}
		a := st.Access
		want := map[int][2]string{0: {"0x0", "0x65"}, 1: {"0x65", "0x78"}}[k]
		if !strings.HasPrefix(st.Reason, "watch") || a.Kind != "write" || a.Old != want[0] || a.New != want[1] || !strings.HasPrefix(a.Text, "sb") || a.Insn.Function == "" {
			t.Errorf("write %q: reason %s, access %+v", c, st.Reason, a)
		}
		if st.Backtrace == nil || len(st.Backtrace.Frames) == 0 {
			t.Errorf("write %q: no backtrace of the writer", c)
		}
		t.Logf("write %q caught at %s: %s, %s -> %s", c, a.Insn, a.Text, a.Old, a.New)
	}
	if _, err := s.Watch(ctx, "line_buf", 1, "", true); err != nil {
		t.Fatal(err)
	}
	// A read watchpoint: the shell reads the line when it ends.
	if w, err := s.Watch(ctx, "line_buf", 1, "read", false); err != nil || w.Kind != "read" {
		t.Fatalf("read watchpoint: %+v %v", w, err)
	}
	g.typeIn(ctx, "\r")
	st, err := s.Continue(ctx, 10*time.Second)
	if err != nil || st.Access == nil || st.Access.Kind != "read" || st.Access.Old != "0x78" || st.Access.New != "0x78" || st.Access.Text == "" {
		t.Fatalf("read of the line: %+v %v", st, err)
	}
	t.Logf("read caught at %s: %s", st.Access.Insn, st.Access.Text)
	if _, err := s.Watch(ctx, "line_buf", 1, "read", true); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Continue(ctx, 200*time.Millisecond); err != nil || !st.Running {
		t.Fatalf("continue without the watchpoint: %+v %v", st, err)
	}
	g.expect(ctx, `unknown command: x\r\ntiny> $`)
}

// The built-in kernel takes no traps of its own: the tests make it take
// one. With the guest held by a plain gdb client, the trap vector (stvec)
// is pointed at a loop and the pc at one instruction, both written into
// the framebuffer's RAM; the client leaves, and the guest traps into the
// loop through OpenSBI as a kernel would.
func (g *tinyGuest) trap(ctx context.Context, insn uint32, regs map[string]uint64) (at uint64) {
	g.t.Helper()
	c, err := gdb.Dial(ctx, "unix", g.m.Paths().GDBSocket)
	if err != nil {
		g.t.Fatal(err)
	}
	at = g.sym("fb")
	code := binary.LittleEndian.AppendUint32(nil, insn)
	code = binary.LittleEndian.AppendUint32(code, 0x0000006f) // j .
	if err := c.WriteMemory(ctx, at, code); err != nil {
		g.t.Fatal(err)
	}
	regs["stvec"], regs["pc"] = at+4, at
	for n, v := range regs {
		if err := c.WriteRegister(ctx, n, v); err != nil {
			g.t.Fatalf("write %s: %v", n, err)
		}
	}
	if err := c.Close(); err != nil { // detaching lets the guest run
		g.t.Fatal(err)
	}
	return at
}

// Why a trap happened, decoded from scause, stval and the walk of the
// address, on a hart stopped in the trap vector: a load from where
// nothing is, and a CSR that S-mode may not read.
func TestVerdictTiny(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		insn    uint32
		regs    map[string]uint64
		cause   string
		tval    string
		verdict string
	}{
		// ld a0,0(a0) with a0 past the end of RAM
		{"load access fault", 0x00053503, map[string]uint64{"a0": 0xc0000000}, "load access fault", "0xc0000000",
			"load access fault at 0xc0000000: no memory or device there"},
		// csrr a0,mstatus
		{"illegal csr", 0x30002573, map[string]uint64{}, "illegal instruction", "0x30002573",
			"accesses a CSR that does not exist or that S-mode may not use"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			ctx := testContext(t)
			g := bootTiny(t, ctx)
			g.debug()
			at := g.trap(ctx, tc.insn, tc.regs)
			// The guest runs into the trap and spins in the loop; each
			// look stops it, and lets it run on.
			var r Registers
			for deadline := time.Now().Add(10 * time.Second); r.PC.Addr != hex(at+4); {
				var err error
				if r, err = g.s.Registers(ctx, LastHart); err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("the guest did not reach the trap vector: pc %+v", r.PC)
				}
			}
			if r.Priv != "supervisor" || r.SCause == nil || r.SCause.Cause != tc.cause || r.SCause.TVal != tc.tval || r.SCause.EPC == nil || r.SCause.EPC.Addr != hex(at) {
				t.Fatalf("registers: priv %s, scause %+v, pc %+v", r.Priv, r.SCause, r.PC)
			}
			if !strings.Contains(r.Verdict, tc.verdict) {
				t.Errorf("registers' verdict %q does not say %q", r.Verdict, tc.verdict)
			}
			tr, err := g.s.Triage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Trap == nil || tr.Trap.Cause != tc.cause || !strings.HasPrefix(tr.TrapSource, "scause") || !strings.Contains(tr.Verdict, tc.verdict) ||
				tr.Culprit == nil || tr.Culprit.Addr != hex(at) || tr.Culprit.Function != "fb" {
				t.Errorf("triage: trap %+v from %q, verdict %q, culprit %+v", tr.Trap, tr.TrapSource, tr.Verdict, tr.Culprit)
			}
			if tc.cause == "load access fault" && (tr.Walk == nil || tr.Walk.Mode != "Bare") {
				t.Errorf("triage's walk: %+v", tr.Walk)
			}
			t.Logf("verdict: %s", tr.Verdict)
		})
	}
}

// The Linux guest, where frames pass through the kernel's trap entry: a
// backtrace from a system call's handler reads the pt_regs the entry code
// saved and ends in the user program's ecall; a kernel fault's triage
// finds the faulting function in the trap frame under panic's frames, with
// the fault's verdict.
func TestLinuxTrapFramesAndTriage(t *testing.T) {
	t.Parallel()
	lin := testguest.LinuxGuest(t)
	bin := testguest.QEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "dbg")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	m, err := qemu.Start(ctx, qemu.Runtime{
		SerialBase: filepath.Join(dir, "serial"),
		QMPSocket:  filepath.Join(dir, "qmp.sock"),
		GDBSocket:  filepath.Join(dir, "gdb.sock"),
		Logger:     slog.New(slog.DiscardHandler),
	}, qemu.NewConfig(qemu.WithBinary(bin), qemu.WithKernel(lin.Kernel), qemu.WithInitrd(lin.Initrd),
		qemu.WithAppend(testguest.LinuxAppend), qemu.WithMemory("256M")))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g := &tinyGuest{t: t, m: m}
	res, err := m.Console().Buffer().Wait(ctx, 0, regexp.MustCompile(testguest.LinuxPrompt), 60*time.Second)
	if err != nil || !res.Matched {
		t.Fatalf("Linux did not boot: %v; %q", err, res.Output)
	}
	g.cursor = res.Cursor
	s := g.debug(lin.Vmlinux)

	if _, err := s.Break(ctx, "sys_newuname", false, false); err != nil {
		t.Fatal(err)
	}
	g.typeIn(ctx, "uname -sr\n")
	st, err := s.Continue(ctx, 30*time.Second)
	if err != nil || st.Function != "sys_newuname" || st.File != "kernel/sys.c" {
		t.Fatalf("continue to sys_newuname: %+v %v", st, err)
	}
	bt, _, err := s.Backtrace(ctx, LastHart, 32)
	if err != nil {
		t.Fatal(err)
	}
	last := bt.Frames[len(bt.Frames)-1]
	if bt.Frames[0].Function != "sys_newuname" || bt.Frames[0].Line != st.Line || bt.End != "" ||
		!last.User || last.Trap == nil || last.Trap.Cause != "environment call from U-mode" {
		t.Errorf("backtrace of a system call: %+v", bt)
	}
	for _, f := range bt.Frames {
		t.Logf("  %s%s", f.Where, map[bool]string{true: " [trap]"}[f.Trap != nil])
	}
	if _, err := s.Break(ctx, "sys_newuname", false, true); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Continue(ctx, 200*time.Millisecond); err != nil || !st.Running {
		t.Fatalf("continue: %+v %v", st, err)
	}
	g.expect(ctx, `Linux 6\.[^\r\n]*\r\n`)

	// A NULL dereference in the kernel (LKDTM), an oops made a panic.
	g.typeIn(ctx, "mount -t debugfs none /sys/kernel/debug; echo 1 > /proc/sys/kernel/panic_on_oops\n")
	g.expect(ctx, testguest.LinuxPrompt)
	g.typeIn(ctx, "echo ACCESS_NULL > /sys/kernel/debug/provoke-crash/DIRECT\n")
	res, err = m.Console().Buffer().Wait(ctx, g.cursor, regexp.MustCompile(`Kernel panic[^\r\n]*`), 30*time.Second)
	if err != nil || !res.Matched {
		t.Fatalf("no panic: %v %q", err, res.Output)
	}
	tr, err := s.Triage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Culprit == nil || tr.Culprit.Function != "lkdtm_ACCESS_NULL" || tr.Culprit.File == "" ||
		tr.Trap == nil || tr.Trap.Cause != "load page fault" || tr.Trap.TVal != "0x0" || tr.TrapSource != "trap frame" ||
		!strings.Contains(tr.Verdict, "load page fault at 0x0 from S-mode: no mapping") || tr.Walk == nil {
		t.Fatalf("triage: culprit %+v, trap %+v from %q, verdict %q", tr.Culprit, tr.Trap, tr.TrapSource, tr.Verdict)
	}
	t.Logf("triage: %s in %s: %s", tr.Trap.Cause, tr.Culprit, tr.Verdict)
}
