package qemumcp

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// The aarch64 tiny kernel (testdata/images/tiny-aarch64/README.md), booted
// by a plain qemu-system-aarch64: these tests check its output contract,
// the riscv64 tiny kernel's, on the other architecture.

const (
	tinyAarch64     = "testdata/images/tiny-aarch64.bin"
	tinyAarch64ELF  = "testdata/images/tiny-aarch64.elf"
	tinyBanner      = "qemu-mcp tiny kernel 1.0 (hart 0)\r\ntype 'help' for commands\r\n"
	tinyPrompt      = "tiny> "
	tinyHelpHeader  = "commands: help echo panic flood poweroff exit\r\n"
	tinyPoweroffMsg = "Powering off\r\n"
)

// qemuAarch64 is the tests' aarch64 QEMU (testguest.ArchQEMU): the test
// is QEMU-facing, and skips without one.
func qemuAarch64(t *testing.T) string { return testguest.ArchQEMU(t, arm64.Arch) }

// aarch64Guest is a running qemu-system-aarch64 whose serial console is
// its stdin and stdout.
type aarch64Guest struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{}
	qmp  *qmp.Monitor // nil unless started with QMP

	mu     sync.Mutex
	out    bytes.Buffer
	stderr bytes.Buffer
	grew   chan struct{} // closed and replaced whenever out grows
}

// bootAarch64 starts QEMU with the kernel and extra arguments; withQMP
// adds a QMP socket. QEMU is killed when the test ends.
func bootAarch64(t *testing.T, kernel string, withQMP bool, extra ...string) *aarch64Guest {
	t.Helper()
	args := append([]string{"-m", "128M", "-nodefaults", "-display", "none",
		"-serial", "stdio", "-kernel", kernel}, extra...)
	var sock string
	if withQMP {
		dir, err := os.MkdirTemp("", "tiny64")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		sock = filepath.Join(dir, "qmp.sock")
		args = append(args, "-qmp", "unix:"+sock+",server=on,wait=off")
	}
	g := startGuest(t, qemuAarch64(t), args)
	if withQMP {
		g.qmp = qmp.New(sock)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.qmp.ConnectContext(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.qmp.Disconnect() })
	}
	return g
}

type lockedWriter struct {
	g *aarch64Guest
	b *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.g.mu.Lock()
	defer w.g.mu.Unlock()
	w.b.Write(p)
	close(w.g.grew)
	w.g.grew = make(chan struct{})
	return len(p), nil
}

func (g *aarch64Guest) output() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.out.String()
}

func (g *aarch64Guest) stderrText() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stderr.String()
}

// waitFor waits until the console output from offset from on contains
// want, and returns the offset just after it.
func (g *aarch64Guest) waitFor(from int, want string) int {
	g.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		g.mu.Lock()
		s, grew := g.out.String(), g.grew
		g.mu.Unlock()
		if i := strings.Index(s[from:], want); i >= 0 {
			return from + i + len(want)
		}
		select {
		case <-grew:
		case <-g.done:
			if s := g.output(); !strings.Contains(s[from:], want) {
				g.t.Fatalf("QEMU exited before the console showed %q; after offset %d it shows %q", want, from, s[from:])
			}
		case <-deadline:
			g.t.Fatalf("the console did not show %q in 20s; after offset %d it shows %q", want, from, g.output()[from:])
		}
	}
}

// run types line and a CR, and returns the console output it causes up to
// the next prompt (the echoed line excluded), and the offset after it.
func (g *aarch64Guest) run(from int, line string) (string, int) {
	g.t.Helper()
	if _, err := io.WriteString(g.in, line+"\r"); err != nil {
		g.t.Fatal(err)
	}
	start := g.waitFor(from, line+"\r\n")
	end := g.waitFor(start, tinyPrompt)
	return g.output()[start : end-len(tinyPrompt)], end
}

// exit waits for QEMU to end and returns its exit status.
func (g *aarch64Guest) exit() int {
	g.t.Helper()
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		g.t.Fatalf("QEMU still runs 10s later; console: %q", g.output())
	}
	return g.cmd.ProcessState.ExitCode()
}

// The shell as the riscv64 contract has it, and the virtio-input and
// virtio-gpu drivers, driven over QMP as the server's tools drive them.
func TestTinyAarch64Shell(t *testing.T) {
	g := bootAarch64(t, tinyAarch64, true, "-M", "virt", "-cpu", "max",
		"-device", "virtio-keyboard-device", "-device", "virtio-tablet-device", "-device", "virtio-gpu-device")
	// QEMU fills the 32 transports from the top (0x0a003e00) down, in
	// command-line order; the kernel prints them in address order.
	boot := tinyBanner +
		"virtio-gpu: at 0xa003a00\r\n" +
		"virtio-input: tablet at 0xa003c00\r\n" +
		"virtio-input: keyboard at 0xa003e00\r\n" +
		tinyPrompt
	at := g.waitFor(0, tinyPrompt)
	if got := g.output(); got != boot {
		t.Fatalf("boot output %q\nwant %q", got, boot)
	}

	out, at := g.run(at, "help")
	if !strings.HasPrefix(out, tinyHelpHeader) || strings.Count(out, "\r\n") != 7 {
		t.Errorf("help printed %q", out)
	}
	if out, at = g.run(at, "echo  two  spaces"); out != " two  spaces\r\n" {
		t.Errorf("echo printed %q", out)
	}
	if out, at = g.run(at, "frobnicate now"); out != "unknown command: frobnicate\r\n" {
		t.Errorf("an unknown command printed %q", out)
	}
	if out, at = g.run(at, "flood 100"); out != "00000000 abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR\n00000001 abcdefghijklmnopqrstuvwxyz0\r\nflood done 100\r\n" {
		t.Errorf("flood 100 printed %q", out)
	}
	if out, at = g.run(at, "input"); out != "input: keyboard=yes tablet=yes\r\n" {
		t.Errorf("input printed %q", out)
	}

	// A key press and its release, each report ending in EV_SYN. They
	// come as one batch or two (QEMU 7.2 waits send-key's hold time
	// between them, 11.1 may hand both over before the kernel polls); a
	// batch starts with "\r\n" and ends with a new prompt.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := g.qmp.Execute(ctx, "send-key", map[string]any{
		"keys": []map[string]string{{"type": "qcode", "data": "a"}}}); err != nil {
		t.Fatal(err)
	}
	from := at
	at = g.waitFor(at, "input: EV_KEY code=30 value=0\r\ninput: EV_SYN\r\n"+tinyPrompt)
	batches := g.output()[from:at]
	events := strings.NewReplacer("\r\n"+tinyPrompt+"\r\n", "\r\n").Replace(batches)
	if want := "\r\ninput: EV_KEY code=30 value=1\r\ninput: EV_SYN\r\ninput: EV_KEY code=30 value=0\r\ninput: EV_SYN\r\n" + tinyPrompt; events != want {
		t.Errorf("send-key a printed %q, want the events of %q", batches, want)
	}

	// The tablet: absolute position, as input-send-event gives it.
	if _, err := g.qmp.Execute(ctx, "input-send-event", map[string]any{"events": []map[string]any{
		{"type": "abs", "data": map[string]any{"axis": "x", "value": 1000}},
		{"type": "abs", "data": map[string]any{"axis": "y", "value": 2000}}}}); err != nil {
		t.Fatal(err)
	}
	at = g.waitFor(at, "input: EV_ABS code=0 value=1000\r\ninput: EV_ABS code=1 value=2000\r\ninput: EV_SYN\r\ntiny> ")

	if out, at = g.run(at, "gfx"); out != "gfx: 640x480 quadrants red green blue white\r\n" {
		t.Fatalf("gfx printed %q", out)
	}
	shot := filepath.Join(t.TempDir(), "screen.png")
	if _, err := g.qmp.Execute(ctx, "screendump", map[string]any{"filename": shot, "format": "png"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 480 {
		t.Errorf("screendump is %v, want 640x480", b)
	}
	for _, p := range []struct {
		x, y    int
		r, g, b uint32
	}{{160, 120, 255, 0, 0}, {480, 120, 0, 255, 0}, {160, 360, 0, 0, 255}, {480, 360, 255, 255, 255}} {
		r, gr, b, _ := img.At(p.x, p.y).RGBA()
		if r>>8 != p.r || gr>>8 != p.g || b>>8 != p.b {
			t.Errorf("pixel (%d,%d) = (%d,%d,%d), want (%d,%d,%d)", p.x, p.y, r>>8, gr>>8, b>>8, p.r, p.g, p.b)
		}
	}

	io.WriteString(g.in, "poweroff\r")
	g.waitFor(at, "poweroff\r\n"+tinyPoweroffMsg)
	if code := g.exit(); code != 0 {
		t.Errorf("QEMU exited %d after poweroff, want 0", code)
	}
}

// The kernel runs at whatever EL QEMU enters it at, on either CPU, as the
// Image or as the ELF, and powers off through whichever PSCI conduit the
// board has; exit N ends QEMU with N only under -semihosting.
func TestTinyAarch64Boots(t *testing.T) {
	for _, c := range []struct {
		name    string
		kernel  string
		args    []string
		command string
		output  string // after the echoed command
		code    int
	}{
		{"cortex-a57 EL1 hvc", tinyAarch64, []string{"-M", "virt", "-cpu", "cortex-a57", "-smp", "2"},
			"poweroff", tinyPoweroffMsg, 0},
		{"EL2 smc", tinyAarch64, []string{"-M", "virt,virtualization=on", "-cpu", "max"},
			"poweroff", tinyPoweroffMsg, 0},
		{"elf at EL2", tinyAarch64ELF, []string{"-M", "virt,virtualization=on", "-cpu", "cortex-a57"},
			"poweroff", tinyPoweroffMsg, 0},
		{"secure Image at NS EL1", tinyAarch64, []string{"-M", "virt,secure=on", "-cpu", "max"},
			"poweroff", tinyPoweroffMsg, 0},
		{"exit without semihosting", tinyAarch64, []string{"-M", "virt", "-cpu", "max"},
			"exit 3", "Exiting with status 3\r\nexit: no semihosting (QEMU without -semihosting): powering off, QEMU exits 0\r\n", 0},
		{"exit with semihosting", tinyAarch64, []string{"-M", "virt", "-cpu", "max", "-semihosting"},
			"exit 3", "Exiting with status 3\r\n", 3},
		{"exit out of range", tinyAarch64, []string{"-M", "virt", "-cpu", "max", "-semihosting"},
			"exit 256", "Exiting with status 1\r\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := bootAarch64(t, c.kernel, false, c.args...)
			g.exits(c.command, c.output, c.code)
		})
	}
}

// The images are what the debugger and an arm64 Image loader expect: an
// AArch64 ELF with the shell's symbols and DWARF lines for both source
// files, and a flat binary with the arm64 Image header whose image_size
// covers .bss.
func TestTinyAarch64Images(t *testing.T) {
	bin, err := os.ReadFile(tinyAarch64)
	if err != nil {
		t.Fatal(err)
	}
	if len(bin) < 64 || string(bin[56:60]) != "ARM\x64" {
		t.Fatalf("%s has no arm64 Image header", tinyAarch64)
	}
	ef, err := elf.Open(tinyAarch64ELF)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	if ef.Machine != elf.EM_AARCH64 || ef.Entry != 0x40200000 {
		t.Fatalf("%s: machine %v entry %#x, want EM_AARCH64 at 0x40200000", tinyAarch64ELF, ef.Machine, ef.Entry)
	}
	addr := symbolsOf(t, tinyAarch64ELF, ef, "_start", "cmd_echo", "cmd_gfx", "tk_probe", "tk_cmd_gfx", "__bss_end")
	if size := binary.LittleEndian.Uint64(bin[16:24]); size != addr["__bss_end"]-ef.Entry {
		t.Errorf("Image header image_size %#x, want %#x (to the end of .bss)", size, addr["__bss_end"]-ef.Entry)
	}
	d, err := ef.DWARF()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		if lr, err := d.LineReader(e); err == nil && lr != nil {
			for _, f := range lr.Files() {
				if f != nil {
					files[filepath.Base(f.Name)] = true
				}
			}
		}
		r.SkipChildren()
	}
	if !files["kernel.S"] || !files["virtio.c"] {
		t.Errorf("DWARF line tables name %v; want kernel.S and virtio.c", files)
	}
}

// A line typed before the kernel runs reaches its shell whole, on the
// Image and the ELF: the kernel keeps what the UART holds when it turns
// the FIFOs on.
func TestTinyAarch64EarlyInput(t *testing.T) {
	for _, kernel := range []string{tinyAarch64, tinyAarch64ELF} {
		t.Run(filepath.Base(kernel), func(t *testing.T) {
			g := bootAarch64(t, kernel, true, "-M", "virt,gic-version=3", "-cpu", "max", "-S")
			if _, err := io.WriteString(g.in, "echo typed before the kernel ran\r"); err != nil {
				t.Fatal(err)
			}
			// QEMU takes what it can of the input while the CPU stands.
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := g.qmp.Execute(ctx, "cont", nil); err != nil {
				t.Fatal(err)
			}
			want := tinyBanner + tinyPrompt + "echo typed before the kernel ran\r\ntyped before the kernel ran\r\n" + tinyPrompt
			g.waitFor(0, "ran\r\n"+tinyPrompt)
			if got := g.output(); got != want {
				t.Errorf("console %q\nwant    %q", got, want)
			}
		})
	}
}

// A recording QEMU hands the UART bytes typed together at once, whatever
// room it said it had: the kernel takes them all (the server types four
// at a time to a recording guest, each after the echo of the last).
func TestTinyAarch64RecordingTakesBursts(t *testing.T) {
	log := filepath.Join(t.TempDir(), "rec.bin")
	g := bootAarch64(t, tinyAarch64, false, "-M", "virt,gic-version=3", "-cpu", "max",
		"-icount", "shift=auto,rr=record,rrfile="+log)
	at := g.waitFor(0, tinyPrompt)
	line := "echo four bytes at a time"
	for i := 0; i < len(line); i += 4 {
		chunk := line[i:min(i+4, len(line))]
		if _, err := io.WriteString(g.in, chunk); err != nil {
			t.Fatal(err)
		}
		at = g.waitFor(at, chunk)
	}
	out, _ := g.run(at, "")
	if out != "four bytes at a time\r\n" {
		t.Errorf("the recording guest printed %q for %q, want its echo", g.output(), line)
	}
}

// startGuest starts the QEMU binary with args, its console on stdin and
// stdout; QEMU is killed when the test ends.
func startGuest(t *testing.T, binary string, args []string) *aarch64Guest {
	t.Helper()
	g := &aarch64Guest{t: t, cmd: exec.Command(binary, args...), done: make(chan struct{}), grew: make(chan struct{})}
	g.cmd.Stderr = &lockedWriter{g: g, b: &g.stderr}
	in, err := g.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	g.in = in
	if err := g.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", g.cmd.Path, err)
	}
	go func() {
		io.Copy(&lockedWriter{g: g, b: &g.out}, out)
		g.cmd.Wait()
		close(g.done)
	}()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.done
		if t.Failed() {
			t.Logf("qemu %q\nstderr: %s\nconsole: %q", args, g.stderrText(), g.output())
		}
	})
	return g
}

// exits types command at the prompt after the banner and checks that the
// console then shows output and that QEMU exits with code.
func (g *aarch64Guest) exits(command, output string, code int) {
	t := g.t
	t.Helper()
	g.waitFor(0, tinyPrompt)
	if got := g.output(); got != tinyBanner+tinyPrompt {
		t.Fatalf("boot output %q, want %q", got, tinyBanner+tinyPrompt)
	}
	io.WriteString(g.in, command+"\r")
	got := g.exit()
	if out, want := g.output(), tinyBanner+tinyPrompt+command+"\r\n"+output; out != want {
		t.Errorf("console %q\nwant    %q", out, want)
	}
	if got != code {
		t.Errorf("QEMU exited %d, want %d", got, code)
	}
}
