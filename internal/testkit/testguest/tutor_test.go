package testguest

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The command make -n qemu prints in a built tutor kernel's directory:
// its README and the tests that boot it rely on it.
const tutorLine = "qemu-system-riscv64 -machine virt -bios none -kernel kernel/kernel -m 128M -smp 3 -nographic " +
	"-global virtio-mmio.force-legacy=false -drive file=fs.img,if=none,format=raw,id=x0 " +
	"-device virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0"

// tutorConsole is a tutor kernel this test booted, its serial console
// on QEMU's standard input and output.
type tutorConsole struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	start time.Time
	done  chan struct{} // closed once QEMU exited and was waited for
	more  chan struct{} // a token when output came

	mu     sync.Mutex
	out    []byte // the console's output, without \r
	next   int    // where expect looks from
	stderr bytes.Buffer
}

func (c *tutorConsole) Write(b []byte) (int, error) { // stderr
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(b)
}

// tutorArgs are QEMU's arguments from make -n qemu's line, with the
// console on standard input and output instead of -nographic's
// multiplexer; edit may change them.
func tutorArgs(t *testing.T, line string, edit func(string) string) []string {
	t.Helper()
	if edit != nil {
		line = edit(line)
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "qemu-system-riscv64" {
		t.Fatalf("make -n qemu: %q does not run qemu-system-riscv64", line)
	}
	var args []string
	for _, a := range f[1:] {
		if a == "-nographic" {
			args = append(args, "-display", "none", "-serial", "stdio", "-monitor", "none")
			continue
		}
		args = append(args, a)
	}
	return args
}

// bootTutor starts the QEMU under test on the tutor kernel in dir. QEMU
// is killed (by its PID) when the test ends.
func bootTutor(t *testing.T, dir string, args []string) *tutorConsole {
	t.Helper()
	cmd := exec.Command(QEMU(t), args...)
	cmd.Dir = dir
	c := &tutorConsole{t: t, cmd: cmd, done: make(chan struct{}), more: make(chan struct{}, 1)}
	cmd.Stderr = c
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := stdout.Read(b)
			if n > 0 {
				c.mu.Lock()
				c.out = append(c.out, bytes.ReplaceAll(b[:n], []byte("\r"), nil)...)
				c.mu.Unlock()
				select {
				case c.more <- struct{}{}:
				default:
				}
			}
			if err != nil {
				break
			}
		}
		cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			c.mu.Lock()
			t.Logf("console:\n%s\nqemu stderr:\n%s", c.out, c.stderr.String())
			c.mu.Unlock()
		}
	})
	return c
}

// expect waits until the output from where the last expect matched
// matches pattern, and returns the match's submatches.
func (c *tutorConsole) expect(pattern string) []string {
	c.t.Helper()
	re := regexp.MustCompile(pattern)
	timeout := time.After(30 * time.Second)
	for {
		c.mu.Lock()
		m := re.FindSubmatchIndex(c.out[c.next:])
		var sub []string
		if m != nil {
			for i := 0; i < len(m); i += 2 {
				if m[i] >= 0 {
					sub = append(sub, string(c.out[c.next+m[i]:c.next+m[i+1]]))
				} else {
					sub = append(sub, "")
				}
			}
			c.next += m[1]
		}
		c.mu.Unlock()
		if m != nil {
			return sub
		}
		select {
		case <-c.more:
		case <-c.done:
			select {
			case <-c.more: // the last output may match
				continue
			default:
			}
			c.t.Fatalf("QEMU exited (%v) before the console showed %q", c.cmd.ProcessState, pattern)
		case <-timeout:
			c.t.Fatalf("the console did not show %q in 30 s", pattern)
		}
	}
}

func (c *tutorConsole) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, s); err != nil {
		c.t.Fatalf("type %q: %v", s, err)
	}
}

// The kernel boots every hart, the shell runs its commands, and ticks
// count while it waits for input.
func TestTutorShell(t *testing.T) {
	dir := Tutor(t, nil)
	line := TutorQEMULine(t, dir)
	if line != tutorLine {
		t.Errorf("make -n qemu printed\n%s\nwant\n%s", line, tutorLine)
	}
	c := bootTutor(t, dir, tutorArgs(t, line, nil))
	c.expect(`tutor kernel 1\.0 booting\n`)
	for _, h := range []string{"0", "1", "2"} {
		c.expect(`hart ` + h + ` starting\n`)
	}
	c.expect(`\$ $`)
	t.Logf("booted to the first prompt in %v", time.Since(c.start).Round(time.Millisecond))

	c.send("ls\n")
	ls := c.expect(`ls\n((?:.*\n)*?)\$ $`)[1]
	for _, f := range []string{"README.txt", "hello.txt", "poem.txt"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(f) + ` +` + strconv.Itoa(len(b)) + `$`).MatchString(ls) {
			t.Errorf("ls shows no line %q with size %d:\n%s", f, len(b), ls)
		}
	}

	c.send("cat hello.txt\n")
	c.expect(`cat hello\.txt\nhello from the tutor kernel's disk\n\$ $`)
	poem, err := os.ReadFile(filepath.Join(dir, "poem.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(poem) <= 512 {
		t.Fatalf("poem.txt has %d bytes: it is to span sectors", len(poem))
	}
	c.send("cat poem.txt\r") // CR ends a line too
	c.expect(`cat poem\.txt\n` + regexp.QuoteMeta(string(poem)) + `\$ $`)

	c.send("echo one  two three\n")
	c.expect(`echo one  two three\none two three\n\$ $`)
	c.send("frobnicate now\n")
	c.expect(`sh: unknown command: frobnicate\n\$ $`)
	c.send("cat nothing\n")
	c.expect(`cat: no such file: nothing\n\$ $`)
	c.send("ecjo\b\x7fho typo\n") // backspace and DEL erase
	c.expect(`ho typo\ntypo\n\$ $`)

	c.send("ticks\n")
	t1, _ := strconv.Atoi(c.expect(`ticks\n(\d+)\n\$ $`)[1])
	// Ticks count while the shell waits for input (in wfi).
	for try := 0; ; try++ {
		time.Sleep(200 * time.Millisecond)
		c.send("ticks\r\n") // CR LF is one line end
		t2, _ := strconv.Atoi(c.expect(`ticks\n(\d+)\n\$ $`)[1])
		if t2 > t1 {
			break
		}
		if t2 < t1 || try == 50 {
			t.Fatalf("ticks went from %d to %d in %d tries 200 ms apart", t1, t2, try+1)
		}
	}

	c.send("halt\n")
	select {
	case <-c.done:
		if !c.cmd.ProcessState.Success() {
			t.Errorf("QEMU exited with %v after halt, want 0", c.cmd.ProcessState)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("QEMU did not exit after halt")
	}
}

// insertBefore is a Tutor patch that puts text before line, which the
// source file (a slash-separated path in the tutor's directory) must hold
// once.
func insertBefore(t *testing.T, file, line, text string) func(dir string) error {
	return func(dir string) error {
		p := filepath.Join(dir, filepath.FromSlash(file))
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if n := bytes.Count(b, []byte(line)); n != 1 {
			t.Fatalf("%s has %d lines %q, want 1", file, n, line)
		}
		return os.WriteFile(p, bytes.Replace(b, []byte(line), []byte(text+line), 1), 0o644)
	}
}

// A hart that comes late (on a loaded host, QEMU's thread for it may not
// run for a while) still says it started before the shell's first
// prompt: the kernel waits for every hart the machine has, not only for
// those that reached it by the time hart 0 was ready.
func TestTutorLateHart(t *testing.T) {
	// Hart 2 spends a second in start(), longer than a boot to the prompt
	// takes.
	dir := Tutor(t, insertBefore(t, "kernel/start.c", "\tcsr_write(mepc, main);\n",
		"\tif (hart == 2) {\n"+
			"\t\tuint64 t0 = *(volatile uint64 *)CLINT_MTIME;\n"+
			"\t\twhile (*(volatile uint64 *)CLINT_MTIME - t0 < 10000000)\n"+
			"\t\t\t;\n"+
			"\t}\n"))
	c := bootTutor(t, dir, tutorArgs(t, TutorQEMULine(t, dir), nil))
	if next := c.expect(`hart 1 starting\n(\$ |hart 2 starting\n)`)[1]; next != "hart 2 starting\n" {
		t.Fatalf("after hart 1 the console showed %q, want hart 2's line before the prompt", next)
	}
	c.expect(`^\$ $`)
}

// The driver wants the modern virtio-mmio transport, in the first slot.
func TestTutorDiskErrors(t *testing.T) {
	dir := Tutor(t, nil)
	line := TutorQEMULine(t, dir)
	for _, tc := range []struct {
		name, drop, panic string
	}{
		{"legacy", " -global virtio-mmio.force-legacy=false", `panic: virtio disk: legacy transport \(add -global virtio-mmio\.force-legacy=false\)\n`},
		// Without bus= QEMU puts the device in the last free slot.
		{"last slot", ",bus=virtio-mmio-bus.0", `panic: could not find virtio disk\n`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edit := func(l string) string {
				if !strings.Contains(l, tc.drop) {
					t.Fatalf("%q is not in %q", tc.drop, l)
				}
				return strings.Replace(l, tc.drop, "", 1)
			}
			c := bootTutor(t, dir, tutorArgs(t, line, edit))
			c.expect(`tutor kernel 1\.0 booting\n`)
			c.expect(tc.panic)
		})
	}
}

// A NULL store planted in sys_ticks faults in the kernel: kerneltrap
// reports the trap and panics.
func TestTutorNullStore(t *testing.T) {
	dir := Tutor(t, insertBefore(t, "kernel/syscall.c", "  return ticks;\n", "  *(volatile int *)0 = 1;\n"))
	c := bootTutor(t, dir, tutorArgs(t, TutorQEMULine(t, dir), nil))
	c.expect(`\$ $`)
	c.send("ticks\n")
	c.expect(`scause=0xf sepc=0x[0-9a-f]+ stval=0x0\npanic: kerneltrap\n`)
}
