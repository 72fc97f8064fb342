package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/gdb"
	"github.com/qemu-mcp/qemu-mcp/qmp"
	"github.com/qemu-mcp/qemu-mcp/recording"
)

var (
	ttOnly   = flag.Bool("timetravel-only", false, "measure only recording and going back in a replay, on the Linux guest")
	ttRuns   = flag.Int("timetravel-runs", 3, "boots per side for the recording overhead, and runs of each going-back figure (0 skips them)")
	busyIter = flag.Int("busy-iterations", 60000, "iterations of the guest shell's loop in the long recordings (about 17,000 instructions each)")
	long     = flag.Bool("long", true, "the 10^9-instruction recordings (on a QEMU that reloads replay checkpoints)")
	longOnly = flag.String("long-only", "", "measure only these of the 10^9-instruction recordings (busy, idle: comma-separated), nothing else")
)

var (
	ttArch      = flag.String("timetravel-arch", "riscv64", "the Linux guest's architecture for the time-travel figures: riscv64, aarch64 (its QEMU: -qemu-aarch64) or x86_64 (-qemu-x86_64)")
	qemuAarch64 = flag.String("qemu-aarch64", "qemu-system-aarch64", "the aarch64 QEMU, for -timetravel-arch aarch64")
	qemuX86     = flag.String("qemu-x86_64", "qemu-system-x86_64", "the x86_64 QEMU, for -timetravel-arch x86_64")
)

const (
	linuxPrompt = "qemu-mcp-linux# "
	linuxAppend = "console=ttyS0 earlycon=sbi"
)

// ttServer is a server for the Linux guest, its state directory known.
type ttServer struct {
	*server
	dir string // the Linux guest
	// arch is the guest's architecture, qemu its QEMU and append its
	// kernel command line.
	arch   arch.Arch
	qemu   string
	append string
}

// ttLinuxServer starts a server for the Linux guest of -timetravel-arch;
// none (and no error) when that guest is not built.
func ttLinuxServer(ctx context.Context) (*ttServer, error) {
	a, err := archs.Lookup(*ttArch)
	if err != nil {
		return nil, err
	}
	if a.Name() == archs.Default().Name() {
		srv, dir, err := linuxServer(ctx, "time-travel figures")
		if srv == nil {
			return nil, err
		}
		return &ttServer{server: srv, dir: dir, arch: a, qemu: *qemuBin, append: linuxAppend}, nil
	}
	dir := archGuestDir(a, "time-travel figures")
	if dir == "" {
		return nil, nil
	}
	bin := ttQEMU()
	srv, err := startServer(ctx, "-qemu", a.Name()+"="+bin, "-allow-path", dir)
	if err != nil {
		return nil, err
	}
	// The options that keep its replays as fast as its recordings.
	line := strings.Join(append([]string{"console=" + a.QEMU().Console, a.QEMU().Earlycon}, a.QEMU().ReplayAppend...), " ")
	return &ttServer{server: srv, dir: dir, arch: a, qemu: bin, append: line}, nil
}

// ttQEMU is the QEMU of -timetravel-arch's guest.
func ttQEMU() string {
	a, err := archs.Lookup(*ttArch)
	if err != nil {
		return *qemuBin
	}
	switch a.Name() {
	case "aarch64":
		return *qemuAarch64
	case "x86_64":
		return *qemuX86
	}
	return *qemuBin
}

func (s *ttServer) boot(ctx context.Context, extra map[string]any) (time.Duration, error) {
	args := map[string]any{"kernel": filepath.Join(s.dir, "Image"), "initrd": filepath.Join(s.dir, "initramfs.cpio.gz"),
		"append": s.append, "memory": "256M", "wait_for": linuxPrompt + "$", "timeout": 120, "restart": true}
	for k, v := range extra {
		args[k] = v
	}
	var b struct {
		Matched bool `json:"matched"`
	}
	t := time.Now()
	if err := s.call(ctx, "qemu_boot", args, &b); err != nil {
		return 0, err
	}
	if _, ok := extra["replay"]; !ok && !b.Matched {
		return 0, fmt.Errorf("boot %v: no prompt", extra)
	}
	return time.Since(t), nil
}

func (s *ttServer) send(ctx context.Context, cmd, waitFor string) error {
	var w struct {
		Matched bool `json:"matched"`
	}
	if err := s.call(ctx, "serial_send", map[string]any{"data": cmd, "wait_for": waitFor, "timeout": 300}, &w); err != nil {
		return err
	}
	if !w.Matched {
		return fmt.Errorf("%s: %q not seen", cmd, waitFor)
	}
	return nil
}

// record records the Linux guest running cmds then crashing (sysrq), and
// returns the recording's record.
func (s *ttServer) record(ctx context.Context, name string, cmds []string) (recording.Meta, error) {
	if _, err := s.boot(ctx, map[string]any{"record": name}); err != nil {
		return recording.Meta{}, err
	}
	for _, c := range cmds {
		if err := s.send(ctx, c, linuxPrompt+"$"); err != nil {
			return recording.Meta{}, err
		}
	}
	if err := s.send(ctx, "echo c > /proc/sysrq-trigger", "Kernel panic"); err != nil {
		return recording.Meta{}, err
	}
	if err := s.call(ctx, "qemu_shutdown", nil, nil); err != nil {
		return recording.Meta{}, err
	}
	// The server's project is where it runs, which qemu_recordings names.
	var list struct {
		Project string `json:"project"`
	}
	if err := s.call(ctx, "qemu_recordings", nil, &list); err != nil {
		return recording.Meta{}, err
	}
	return recording.Store{Dir: filepath.Join(s.server.dir, "state", "recordings")}.Get(list.Project, name)
}

type ttStop struct {
	Reason string  `json:"reason"`
	ICount *uint64 `json:"icount"`
}

type ttWrite struct {
	Found  bool    `json:"found"`
	ICount *uint64 `json:"icount"`
	Access *struct {
		Old string `json:"old"`
		New string `json:"new"`
	} `json:"access"`
}

// replayToEnd boots the recording's replay and runs it to its end (which
// leaves checkpoints on a QEMU that reloads them).
func (s *ttServer) replayToEnd(ctx context.Context, name string) (end uint64, took time.Duration, err error) {
	if _, err := s.boot(ctx, map[string]any{"replay": name}); err != nil {
		return 0, 0, err
	}
	var st ttStop
	t := time.Now()
	if err := s.call(ctx, "debug_continue", map[string]any{"timeout": 600}, &st); err != nil {
		return 0, 0, err
	}
	if st.Reason != "end" || st.ICount == nil {
		return 0, 0, fmt.Errorf("replay of %s did not reach its end: %+v", name, st)
	}
	return *st.ICount, time.Since(t), nil
}

// lastWrite times debug_last_write of panic_timeout from the replay's
// position.
func (s *ttServer) lastWrite(ctx context.Context, runs int) ([]time.Duration, ttWrite, error) {
	var lw ttWrite
	d, err := timedOnce(runs, nil, func() error {
		if err := s.call(ctx, "debug_last_write", map[string]any{"location": "panic_timeout"}, &lw); err != nil {
			return err
		}
		if !lw.Found {
			return fmt.Errorf("no last write found")
		}
		return nil
	})
	return d, lw, err
}

// timeTravelRows measures recording and going back in a replay on the
// Linux guest, each beside what raw QEMU and a gdb client do on the same
// recording.
func timeTravelRows(ctx context.Context, runs int) ([]row, error) {
	s, err := ttLinuxServer(ctx)
	if s == nil {
		return nil, err
	}
	defer s.close()
	dir := s.dir
	var rows []row
	if *longOnly != "" {
		return s.longRows(ctx, runs, dir, rows)
	}

	// Recording's cost: boot to the prompt, recorded and not, alternating.
	var plain, recorded []time.Duration
	for i := range runs {
		d, err := s.boot(ctx, nil)
		if err != nil {
			return nil, err
		}
		plain = append(plain, d)
		if d, err = s.boot(ctx, map[string]any{"record": "boot" + strconv.Itoa(i)}); err != nil {
			return nil, err
		}
		recorded = append(recorded, d)
	}
	s.call(ctx, "qemu_shutdown", nil, nil)
	rows = append(rows, row{fmt.Sprintf("Linux boot to its prompt, recorded (qemu_boot record), median of %d (raw: the same boot not recorded, alternating)", runs),
		ms(median(recorded)), ms(median(plain)), fmt.Sprintf("%+.0f%%", 100*(float64(median(recorded))/float64(median(plain))-1)), ""})

	// The recording the tests make: boot, two sysctl writes, uname, a
	// crash.
	meta, err := s.record(ctx, "crash", []string{"echo 7 > /proc/sys/kernel/panic", "echo 9 > /proc/sys/kernel/panic", "uname -a"})
	if err != nil {
		return nil, err
	}
	logSize := fileSize(meta.Log())
	rows = append(rows, row{fmt.Sprintf("recording's log: bytes per second recorded (boot, 3 commands, a crash: %.2e instructions in %.1f s, log %s, image %s)",
		float64(meta.Instructions), meta.Seconds, kib(logSize), kib(fileSize(meta.Image()))),
		fmt.Sprintf("%.0f KB/s", float64(logSize)/meta.Seconds/1e3), "-", "-", ""})
	end, forward, err := s.replayToEnd(ctx, "crash")
	if err != nil {
		return nil, err
	}
	ourWrite, lw, err := s.lastWrite(ctx, runs)
	if err != nil {
		return nil, err
	}
	raw, err := newRawReplay(ctx, s, meta, dir)
	if err != nil {
		return nil, err
	}
	defer raw.close()
	rawWrite, rawHow, err := raw.lastWrite(ctx, end, runs)
	if err != nil {
		return nil, fmt.Errorf("raw last write: %w", err)
	}
	rows = append(rows, row{fmt.Sprintf("debug_last_write panic_timeout from the crash (%.2e instructions in; found %s -> %s at %d), the first call (%s) (raw: %s, median of %d)",
		float64(end), lw.Access.Old, lw.Access.New, *lw.ICount, repeats(ourWrite), rawHow, runs),
		ms(ourWrite[0]), ms(median(rawWrite)), ratio(ourWrite[0], median(rawWrite)), ""})
	ourStep, err := timedOnce(runs, func() error {
		return s.call(ctx, "debug_continue", map[string]any{"icount": end}, nil)
	}, func() error {
		var st ttStop
		if err := s.call(ctx, "debug_step", map[string]any{"reverse": true}, &st); err != nil {
			return err
		}
		if st.ICount == nil || *st.ICount != end-1 {
			return fmt.Errorf("reverse step from %d: %+v", end, st)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rawStep, rawStepHow, err := raw.reverseStep(ctx, end, runs)
	if err != nil {
		return nil, fmt.Errorf("raw reverse step: %w", err)
	}
	rows = append(rows, row{fmt.Sprintf("debug_step reverse: true from the crash, median of %d (raw: %s)", runs, rawStepHow),
		ms(median(ourStep)), ms(median(rawStep)), ratio(median(ourStep), median(rawStep)), ""})
	rows = append(rows, row{"replay from the start to the crash (debug_continue; checkpoints saved on the way where QEMU reloads them)", ms(forward), "-", "-", ""})
	raw.close()
	s.call(ctx, "qemu_shutdown", nil, nil)

	if !*long {
		return rows, nil
	}
	return s.longRows(ctx, runs, dir, rows)
}

// longRows adds the last write 10^9 instructions back, in a busy loop and
// with idle stretches, to rows.
func (s *ttServer) longRows(ctx context.Context, runs int, dir string, rows []row) ([]row, error) {
	if *longOnly != "" {
		// The probe runs after a first boot.
		if _, err := s.boot(ctx, nil); err != nil {
			return nil, err
		}
		s.call(ctx, "qemu_shutdown", nil, nil)
	}
	if !s.checkpoints(ctx) {
		fmt.Fprintln(os.Stderr, "bench: this QEMU does not reload replay checkpoints (server_info): the 10^9-instruction figures are for one that does (QEMU 11)")
		return rows, nil
	}
	n := *busyIter
	loop := func(k int) string {
		return "i=0; while [ $i -lt " + strconv.Itoa(k) + " ]; do i=$((i+1)); done"
	}
	for _, c := range []struct {
		name, what string
		cmds       []string
	}{
		{"busy", "a busy loop", []string{"echo 5 > /proc/sys/kernel/panic", loop(n)}},
		{"idle", "idle stretches (sleep 2, four times) between four busy loops", []string{"echo 5 > /proc/sys/kernel/panic",
			"sleep 2", loop(n / 4), "sleep 2", loop(n / 4), "sleep 2", loop(n / 4), "sleep 2", loop(n / 4)}},
	} {
		if *longOnly != "" && !slices.Contains(strings.Split(*longOnly, ","), c.name) {
			continue
		}
		meta, err := s.record(ctx, c.name, c.cmds)
		if err != nil {
			return nil, err
		}
		end, forward, err := s.replayToEnd(ctx, c.name)
		if err != nil {
			return nil, err
		}
		ours, lw, err := s.lastWrite(ctx, runs)
		if err != nil {
			return nil, err
		}
		back := end - *lw.ICount
		raw, err := newRawReplay(ctx, s, meta, dir)
		if err != nil {
			return nil, err
		}
		rawD, rawHow, err := raw.lastWrite(ctx, end, 1)
		raw.close()
		if err != nil {
			return nil, fmt.Errorf("raw last write: %w", err)
		}
		var list struct {
			Recordings []struct {
				Name        string `json:"name"`
				Checkpoints int64  `json:"checkpoints"`
			} `json:"recordings"`
		}
		s.call(ctx, "qemu_recordings", nil, &list)
		var cks int64
		for _, r := range list.Recordings {
			if r.Name == c.name {
				cks = r.Checkpoints
			}
		}
		rows = append(rows, row{fmt.Sprintf("debug_last_write %.2e instructions back, %s (recorded in %.1f s, replayed to the end in %s leaving %s of checkpoints), the first call (%s) (raw: %s)",
			float64(back), c.what, meta.Seconds, ms(forward), mib(cks), repeats(ours), rawHow),
			ms(ours[0]), ms(rawD[0]), ratio(ours[0], rawD[0]), "<= 2 s"})
		s.call(ctx, "qemu_shutdown", nil, nil)
	}
	return rows, nil
}

// checkpoints says whether the server's QEMU reloads replay checkpoints,
// once it is probed (it is, in the background, after the first boot).
func (s *ttServer) checkpoints(ctx context.Context) bool {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		type capsOf struct {
			State  string `json:"state"`
			Replay *struct {
				Answer string `json:"answer"`
			} `json:"replay_checkpoint"`
		}
		var info struct {
			Arches []struct {
				Name string `json:"name"`
				Caps capsOf `json:"capabilities"`
			} `json:"architectures"`
		}
		if err := s.call(ctx, "server_info", nil, &info); err != nil {
			return false
		}
		for _, a := range info.Arches {
			if a.Name == s.arch.Name() && a.Caps.State == "probed" {
				return a.Caps.Replay != nil && a.Caps.Replay.Answer == "yes"
			}
		}
	}
	return false
}

// repeats describes the calls after the first: the same question again
// (the values read at checkpoints are remembered).
func repeats(ds []time.Duration) string {
	if len(ds) < 2 {
		return "asked once"
	}
	return fmt.Sprintf("asked again: median %s of %d", ms(median(ds[1:])), len(ds)-1)
}

// timedOnce times step n times, prep (untimed) before each: going back in
// a replay costs seconds, and there is nothing to warm up but the page
// cache, which the runs before each figure fill.
func timedOnce(n int, prep, step func() error) ([]time.Duration, error) {
	return timedAfter(0, n, prep, func(int) error { return step() })
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func kib(n int64) string { return fmt.Sprintf("%.0f KiB", float64(n)/1024) }

// rawReplay is QEMU replaying the same recording with the same options as
// the server's replay, driven by a gdb client and QMP as a person would.
type rawReplay struct {
	meta        recording.Meta
	dir, linux  string
	cmd         *exec.Cmd
	c           *gdb.Client
	mon         *qmp.Monitor
	addr        uint64
	checkpoints bool // QEMU's own reverse execution works
	s           *ttServer
}

func newRawReplay(ctx context.Context, s *ttServer, meta recording.Meta, linux string) (*rawReplay, error) {
	dir, err := os.MkdirTemp("", "qmrr")
	if err != nil {
		return nil, err
	}
	r := &rawReplay{meta: meta, dir: dir, linux: linux, s: s}
	syms, err := debuginfo.Open(filepath.Join(linux, "vmlinux"))
	if err != nil {
		return nil, err
	}
	defer syms.Close()
	sym, err := syms.Lookup("panic_timeout")
	if err != nil {
		return nil, err
	}
	r.addr = sym.Addr
	// QEMU's own reverse execution loads its snapshots during a replay:
	// it works where the server's probe found replay checkpoints reload.
	r.checkpoints = s.checkpoints(ctx)
	return r, nil
}

// start starts a new QEMU at the recording's start, halted.
func (r *rawReplay) start(ctx context.Context) error {
	r.stop()
	img := filepath.Join(r.dir, "init.qcow2")
	os.Remove(img)
	if err := copyTo(r.meta.Image(), img); err != nil {
		return err
	}
	gdbSock, qmpSock := filepath.Join(r.dir, "gdb"), filepath.Join(r.dir, "qmp")
	os.Remove(gdbSock)
	os.Remove(qmpSock)
	q := r.s.arch.QEMU()
	args := []string{"-machine", q.Machine, "-nodefaults", "-display", "none", "-S", "-m", "256M", "-smp", "1"}
	if q.CPU != "" {
		args = append(args, "-cpu", q.CPU)
	}
	if q.Firmware != "" {
		args = append(args, "-bios", q.Firmware)
	}
	args = append(args, q.Args...)
	r.cmd = exec.Command(r.s.qemu, append(args,
		"-kernel", filepath.Join(r.linux, "Image"), "-initrd", filepath.Join(r.linux, "initramfs.cpio.gz"), "-append", r.s.append,
		"-chardev", "file,id=serial0,path=/dev/null", "-serial", "chardev:serial0",
		"-qmp", "unix:"+qmpSock+",server=on,wait=off", "-gdb", "unix:"+gdbSock+",server=on,wait=off",
		"-icount", "shift=auto,rr=replay,rrfile="+r.meta.Log()+",rrsnapshot=init",
		"-drive", "file="+img+",format=qcow2,if=none,id=rr")...)
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		return err
	}
	var err error
	if r.c, err = gdb.Dial(ctx, "unix", gdbSock, gdb.WithArch(r.s.arch)); err != nil {
		return err
	}
	r.mon = qmp.New(qmpSock)
	return r.mon.ConnectContext(ctx)
}

func (r *rawReplay) stop() {
	if r.c != nil {
		r.c.Close()
		r.c = nil
	}
	if r.mon != nil {
		r.mon.Disconnect()
		r.mon = nil
	}
	if r.cmd != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *rawReplay) close() {
	r.stop()
	os.RemoveAll(r.dir)
}

// runTo replays forward to instruction n.
func (r *rawReplay) runTo(ctx context.Context, n uint64) error {
	if _, err := r.mon.Execute(ctx, "replay-break", map[string]any{"icount": n}); err != nil {
		return err
	}
	if err := r.c.Continue(ctx); err != nil {
		return err
	}
	_, err := r.c.Wait(ctx)
	return err
}

func (r *rawReplay) icount(ctx context.Context) (uint64, error) {
	raw, err := r.mon.Execute(ctx, "query-replay", nil)
	if err != nil {
		return 0, err
	}
	var q struct {
		ICount uint64 `json:"icount"`
	}
	return q.ICount, json.Unmarshal(raw, &q)
}

// lastWrite finds the last write to panic_timeout before end as a person
// would with gdb: on a QEMU whose reverse execution works, from end with
// reverse-continue and a write watchpoint; else (QEMU 7.2, where it
// hangs) a forward replay from the start with the watchpoint, keeping the
// last hit that changed the value.
func (r *rawReplay) lastWrite(ctx context.Context, end uint64, runs int) ([]time.Duration, string, error) {
	if r.checkpoints {
		d, err := timedOnce(runs, func() error {
			if err := r.start(ctx); err != nil {
				return err
			}
			if err := r.runTo(ctx, end); err != nil {
				return err
			}
			return r.c.SetBreakpoint(ctx, gdb.WatchWrite, r.addr, 4)
		}, func() error {
			if err := r.c.ReverseContinue(ctx); err != nil {
				return err
			}
			// QEMU 11 reports the stop at the write as a plain SIGTRAP
			// (no watch field): where it stopped tells.
			st, err := r.c.Wait(ctx)
			if err != nil {
				return err
			}
			n, err := r.icount(ctx)
			if err == nil && (n == 0 || n >= end) {
				err = fmt.Errorf("reverse-continue stopped for %s at instruction %d (from %d)", st, n, end)
			}
			return err
		})
		return d, "QEMU's reverse-continue with a write watchpoint, gdb client on the same recording", err
	}
	d, err := timedOnce(runs, nil, func() error {
		if err := r.start(ctx); err != nil {
			return err
		}
		if err := r.c.SetBreakpoint(ctx, gdb.WatchWrite, r.addr, 4); err != nil {
			return err
		}
		if _, err := r.mon.Execute(ctx, "replay-break", map[string]any{"icount": end}); err != nil {
			return err
		}
		hits := 0
		for {
			if err := r.c.Continue(ctx); err != nil {
				return err
			}
			st, err := r.c.Wait(ctx)
			if err != nil {
				return err
			}
			if st.Reason != gdb.ReasonWatch {
				break
			}
			hits++
		}
		if hits == 0 {
			return fmt.Errorf("no write seen")
		}
		return nil
	})
	return d, "a new QEMU replaying from the start with a write watchpoint to the crash, gdb client, the last hit (QEMU 7.2's reverse execution hangs)", err
}

// reverseStep steps one instruction back from end as a person would:
// gdb's reverse-stepi where QEMU's reverse execution works, else a new
// QEMU replaying to the instruction before.
func (r *rawReplay) reverseStep(ctx context.Context, end uint64, runs int) ([]time.Duration, string, error) {
	if r.checkpoints {
		d, err := timedOnce(runs, func() error {
			if err := r.start(ctx); err != nil {
				return err
			}
			return r.runTo(ctx, end)
		}, func() error {
			_, err := r.c.ReverseStep(ctx)
			if err != nil {
				return err
			}
			if n, err := r.icount(ctx); err != nil || n != end-1 {
				return fmt.Errorf("reverse-stepi from %d reached %d (%v)", end, n, err)
			}
			return nil
		})
		return d, "QEMU's reverse-stepi, gdb client on the same recording", err
	}
	d, err := timedOnce(runs, nil, func() error {
		if err := r.start(ctx); err != nil {
			return err
		}
		return r.runTo(ctx, end-1)
	})
	return d, "a new QEMU replaying from the start to the instruction before (QEMU 7.2's reverse-stepi hangs)", err
}

func copyTo(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
