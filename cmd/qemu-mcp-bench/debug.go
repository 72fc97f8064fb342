package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
)

var (
	debugRuns = flag.Int("debug-runs", 50, "breakpoint stops and register reads per side (0 skips the debugger)")
	symbols   = flag.String("symbols", "testdata/images/tiny.elf", "the tiny kernel's ELF (breakpoint address for the raw runs)")
	vmlinux   = flag.String("vmlinux", "", "vmlinux for the symbol index time (default: the Linux guest scripts/build-linux caches; skipped without one)")
)

// debugRows measures the debugger through MCP against the bare gdbstub:
// a breakpoint stop (continue until the shell reaches cmd_echo again) and
// a register read, then the first symbol and line answers on vmlinux
// against addr2line's.
func debugRows(ctx context.Context, n int) ([]row, error) {
	ourStop, ourRegs, err := mcpDebug(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	rawStop, rawRegs, err := rawDebug(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}
	rows := []row{
		{fmt.Sprintf("breakpoint: debug_continue until the stop is reported, median of %d (raw: gdb client on the stub, continue and wait)", n),
			ms(median(ourStop)), ms(median(rawStop)), ratio(median(ourStop), median(rawStop)), ""},
		{fmt.Sprintf("debug_registers (pc, x1..x31, priv, %d CSRs), median of %d (raw: the same reads on the stub)", len(riscv64.Arch.Debugger().Registers().Trap), n),
			ms(median(ourRegs)), ms(median(rawRegs)), ratio(median(ourRegs), median(rawRegs)), ""},
	}
	ourWatch, rawWatch, err := watchStops(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("watchpoints: %w", err)
	}
	rows = append(rows, row{fmt.Sprintf("watchpoint: debug_continue until the write is reported with old and new value, median of %d (raw: gdb client, continue and wait)", n),
		ms(median(ourWatch)), ms(median(rawWatch)), ratio(median(ourWatch), median(rawWatch)), ""})
	path := *vmlinux
	if path == "" {
		if out, err := exec.Command("scripts/build-linux", "--print-dir").Output(); err == nil {
			path = filepath.Join(strings.TrimSpace(string(out)), "vmlinux")
		}
	}
	if _, err := os.Stat(path); err == nil {
		ours, raw, err := translations(ctx, filepath.Dir(path), n)
		if err != nil {
			return nil, fmt.Errorf("translations: %w", err)
		}
		rows = append(rows, row{fmt.Sprintf("debug_translate linux_banner (the kernel's page table), median of %d (raw: QEMU's own HMP gva2gpa through qmp_command)", n),
			ms(median(ours)), ms(median(raw)), ratio(median(ours), median(raw)), ""})
	}
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintf(os.Stderr, "bench: no vmlinux (run scripts/build-linux or pass -vmlinux): symbol index time skipped\n")
		return rows, nil
	}
	ours, raw, size, err := symbolIndex(path)
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{fmt.Sprintf("vmlinux (%s): open, first symbol, first symbolize with line, first file:line (raw: addr2line -f for one address)", mib(size)),
		ms(ours), ms(raw), ratio(ours, raw), "<= 2 s"})
	return rows, nil
}

// symbolIndex times what a first debugger query on vmlinux costs, cold
// index (the file itself is in the page cache after the first run), and
// addr2line's time for one address.
func symbolIndex(path string) (ours, raw time.Duration, size int64, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, 0, err
	}
	t := time.Now()
	f, err := debuginfo.Open(path)
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sym, err := f.Lookup("sys_newuname")
	if err != nil {
		return 0, 0, 0, err
	}
	loc, ok := f.Symbolize(sym.Addr + 8)
	if !ok || loc.Line == 0 {
		return 0, 0, 0, fmt.Errorf("no line for sys_newuname+8: %+v", loc)
	}
	if _, err := f.LineAddrs(loc.File, loc.Line); err != nil {
		return 0, 0, 0, err
	}
	ours = time.Since(t)
	t = time.Now()
	out, err := exec.Command("riscv64-linux-gnu-addr2line", "-f", "-e", path, fmt.Sprintf("%#x", sym.Addr+8)).Output()
	raw = time.Since(t)
	if err != nil || !strings.Contains(string(out), "sys.c") {
		return 0, 0, 0, fmt.Errorf("addr2line: %v: %s", err, out)
	}
	return ours, raw, fi.Size(), nil
}

// timed runs step n times after 5 to warm up, prep (untimed) before each,
// and returns the times of step.
func timed(n int, prep func() error, step func(i int) error) ([]time.Duration, error) {
	return timedAfter(5, n, prep, step)
}

// timedAfter runs step warm+n times, prep (untimed) before each, and
// returns the times of the last n.
func timedAfter(warm, n int, prep func() error, step func(i int) error) ([]time.Duration, error) {
	var ds []time.Duration
	for i := range warm + n {
		if prep != nil {
			if err := prep(); err != nil {
				return nil, err
			}
		}
		t := time.Now()
		if err := step(i); err != nil {
			return nil, err
		}
		if i >= warm {
			ds = append(ds, time.Since(t))
		}
	}
	return ds, nil
}

// debugServer is a server with the built-in kernel booted under its
// debugger, at the prompt.
func debugServer(ctx context.Context) (*server, error) {
	s, err := startServer(ctx)
	if err != nil {
		return nil, err
	}
	var b struct {
		Matched bool `json:"matched"`
	}
	if err := s.call(ctx, "qemu_boot", map[string]any{"gdb": true, "wait_for": "tiny> ", "timeout": 60}, &b); err != nil || !b.Matched {
		s.close()
		return nil, fmt.Errorf("boot: %v (matched %v)", err, b.Matched)
	}
	return s, nil
}

// rawStub is QEMU alone with the built-in kernel at its prompt and a gdb
// client on its stub, with a breakpoint or watchpoint of kind and length
// set at addr, the address of symbol.
type rawStub struct {
	q    *rawQEMU
	c    *gdb.Client
	addr uint64
	dir  string
}

func startRawStub(ctx context.Context, symbol string, kind gdb.BreakKind, length int) (*rawStub, error) {
	syms, err := debuginfo.Open(*symbols)
	if err != nil {
		return nil, err
	}
	defer syms.Close()
	sym, err := syms.Lookup(symbol)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "qmg")
	if err != nil {
		return nil, err
	}
	r := &rawStub{addr: sym.Addr, dir: dir}
	sock := filepath.Join(dir, "gdb")
	if r.q, err = startRaw("-gdb", "unix:"+sock+",server=on,wait=off"); err != nil {
		r.close()
		return nil, err
	}
	if _, err := r.q.readUntil("tiny> "); err != nil {
		r.close()
		return nil, err
	}
	if r.c, err = gdb.Dial(ctx, "unix", sock); err != nil {
		r.close()
		return nil, err
	}
	if err := r.c.SetBreakpoint(ctx, kind, r.addr, length); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawStub) close() {
	if r.c != nil {
		r.c.Close()
	}
	if r.q != nil {
		r.q.close()
	}
	os.RemoveAll(r.dir)
}

// stop types a command that reaches the breakpoint or watchpoint set,
// continues, and waits for the stop.
func (r *rawStub) stops(ctx context.Context, n int) ([]time.Duration, error) {
	return timed(n, func() error {
		_, err := r.q.type_("echo x\r")
		return err
	}, func(int) error {
		if err := r.c.Continue(ctx); err != nil {
			return err
		}
		_, err := r.c.Wait(ctx)
		return err
	})
}

// mcpStops types a command that reaches the breakpoint or watchpoint set
// and times debug_continue until the stop; check judges each stop.
func mcpStops(ctx context.Context, s *server, n int, out any, check func(i int) error) ([]time.Duration, error) {
	return timed(n, func() error {
		return s.call(ctx, "serial_send", map[string]any{"data": "echo x"}, nil)
	}, func(i int) error {
		if err := s.call(ctx, "debug_continue", map[string]any{"timeout": 10}, out); err != nil {
			return err
		}
		return check(i)
	})
}

func mcpDebug(ctx context.Context, n int) (stops, regs []time.Duration, err error) {
	s, err := debugServer(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer s.close()
	if err := s.call(ctx, "debug_break", map[string]any{"location": "cmd_echo"}, nil); err != nil {
		return nil, nil, err
	}
	var st struct {
		Stopped  bool   `json:"stopped"`
		Function string `json:"function"`
	}
	if stops, err = mcpStops(ctx, s, n, &st, func(i int) error {
		if !st.Stopped || st.Function != "cmd_echo" {
			return fmt.Errorf("continue %d: %+v", i, st)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	regs, err = timed(n, nil, func(int) error { return s.call(ctx, "debug_registers", nil, nil) })
	return stops, regs, err
}

func rawDebug(ctx context.Context, n int) (stops, regs []time.Duration, err error) {
	r, err := startRawStub(ctx, "cmd_echo", gdb.Software, 0)
	if err != nil {
		return nil, nil, err
	}
	defer r.close()
	if stops, err = r.stops(ctx, n); err != nil {
		return nil, nil, err
	}
	regs, err = timed(n, nil, func(int) error {
		if _, err := r.c.ReadRegisters(ctx); err != nil {
			return err
		}
		for _, name := range append([]string{"priv"}, riscv64.Arch.Debugger().Registers().Trap...) {
			if _, err := r.c.ReadRegister(ctx, name); err != nil {
				return err
			}
		}
		return nil
	})
	return stops, regs, err
}

// watchStops times a write watchpoint on the tiny kernel's line buffer,
// which the first character of every command line writes.
func watchStops(ctx context.Context, n int) (ours, raw []time.Duration, err error) {
	s, err := debugServer(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer s.close()
	if err := s.call(ctx, "debug_watch", map[string]any{"location": "line_buf", "length": 1}, nil); err != nil {
		return nil, nil, err
	}
	var st struct {
		Access *struct {
			New string `json:"new"`
		} `json:"access"`
	}
	if ours, err = mcpStops(ctx, s, n, &st, func(i int) error {
		if st.Access == nil || st.Access.New != "0x65" { // 'e'
			return fmt.Errorf("watch stop %d: %+v", i, st.Access)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	r, err := startRawStub(ctx, "line_buf", gdb.WatchWrite, 1)
	if err != nil {
		return nil, nil, err
	}
	defer r.close()
	raw, err = r.stops(ctx, n)
	return ours, raw, err
}

// translations times debug_translate against QEMU's own gva2gpa on the
// Linux guest, both through the server.
func translations(ctx context.Context, dir string, n int) (ours, raw []time.Duration, err error) {
	s, err := startServer(ctx, "-allow-path", dir)
	if err != nil {
		return nil, nil, err
	}
	defer s.close()
	var b struct {
		Matched bool `json:"matched"`
	}
	if err := s.call(ctx, "qemu_boot", map[string]any{"kernel": filepath.Join(dir, "Image"), "initrd": filepath.Join(dir, "initramfs.cpio.gz"),
		"append": "console=ttyS0", "memory": "256M", "gdb": true, "wait_for": "qemu-mcp-linux# ", "timeout": 120}, &b); err != nil || !b.Matched {
		return nil, nil, fmt.Errorf("boot Linux: %v (matched %v)", err, b.Matched)
	}
	var sym struct {
		Locations []struct {
			Addr string `json:"addr"`
		} `json:"locations"`
	}
	if err := s.call(ctx, "debug_symbolize", map[string]any{"address": "linux_banner"}, &sym); err != nil {
		return nil, nil, err
	}
	var w struct {
		PA string `json:"pa"`
	}
	var h struct {
		Return string `json:"return"`
	}
	for i := range n + 5 {
		t := time.Now()
		if err := s.call(ctx, "debug_translate", map[string]any{"address": "linux_banner"}, &w); err != nil {
			return nil, nil, err
		}
		d := time.Since(t)
		t = time.Now()
		if err := s.call(ctx, "qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "gva2gpa " + sym.Locations[0].Addr}}, &h); err != nil {
			return nil, nil, err
		}
		dr := time.Since(t)
		if w.PA == "" || !strings.Contains(h.Return, w.PA) {
			return nil, nil, fmt.Errorf("walk says %q, QEMU %q", w.PA, h.Return)
		}
		if i >= 5 {
			ours, raw = append(ours, d), append(raw, dr)
		}
	}
	return ours, raw, nil
}
