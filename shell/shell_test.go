package shell

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// ptyShell is an interactive shell on a pseudo-terminal, the way a guest's
// shell sits on its console: what it prints goes into a serial.Buffer.
type ptyShell struct {
	master *os.File
	buf    *serial.Buffer
	cmd    *exec.Cmd
	done   chan struct{}
	mu     sync.Mutex
}

func (p *ptyShell) Write(ctx context.Context, b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.master.Write(b)
}

func (p *ptyShell) Buffer() *serial.Buffer { return p.buf }

// startShell runs argv on a new pty; ctty makes the pty its controlling
// terminal (job control, Ctrl-C), as a getty or cttyhack would.
func startShell(t *testing.T, ctty bool, argv ...string) *ptyShell {
	t.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		t.Skipf("%s not installed: run scripts/deps", argv[0])
	}
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var unlock int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	n, err := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A wide terminal, as the guest's init claims.
	unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 1000})
	master := os.NewFile(uintptr(mfd), "ptmx")
	buf, err := serial.OpenBuffer()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "PS1=guest$ ", "TERM=dumb", "ENV=", "INPUTRC=/dev/null"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: ctty, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	p := &ptyShell{master: master, buf: buf, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		b := make([]byte, 64<<10)
		for {
			n, err := master.Read(b)
			if n > 0 {
				buf.Write(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		// The shell leads its own process group (Setsid): a child
		// left running without job control is in it too.
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		cmd.Wait()
		master.Close()
		<-p.done
	})
	return p
}

func (p *ptyShell) run(t *testing.T, command string, timeout time.Duration) (Result, string) {
	t.Helper()
	res, err := Run(context.Background(), p, Request{Command: command, Timeout: timeout})
	if err != nil {
		t.Fatalf("%q: %v", command, err)
	}
	var out string
	if res.Started && res.OutputEnd > res.OutputStart {
		page, _ := p.buf.ReadPage(res.OutputStart, int(res.OutputEnd-res.OutputStart))
		out = strings.ReplaceAll(string(page.Data), "\r\n", "\n")
	}
	return res, out
}

var shells = map[string][]string{
	"dash":    {"dash", "-i"},
	"bash":    {"bash", "--norc", "--noprofile", "-i"},
	"busybox": {"busybox", "ash", "-i"},
}

// Every POSIX shell at its prompt: exit statuses, output verbatim and
// without the echo, state that persists, an empty stdin, commands that
// cannot be typed as they are, a syntax error, Ctrl-C after a timeout,
// and a command that ends the shell.
func TestShells(t *testing.T) {
	for name, argv := range shells {
		t.Run(name, func(t *testing.T) {
			p := startShell(t, true, argv...)
			for _, c := range []struct {
				cmd  string
				code int
			}{{"true", 0}, {"false", 1}, {"sh -c 'exit 7'", 7}} {
				res, out := p.run(t, c.cmd, 10*time.Second)
				if !res.Completed || res.ExitStatus != c.code || out != "" {
					t.Fatalf("%s: %+v %q", c.cmd, res, out)
				}
				if !res.JobControl {
					t.Errorf("%s: job control not seen in $-", c.cmd)
				}
			}
			// Text like the framing, and no newline at the end.
			_, out := p.run(t, `echo "qm0123456789ab:E0"; printf 'qm%s:S\n' x; printf "no newline"`, 10*time.Second)
			if out != "qm0123456789ab:E0\nqmx:S\nno newline" {
				t.Fatalf("framing-like output: %q", out)
			}
			p.run(t, "cd /tmp && X=42", 10*time.Second)
			if _, out := p.run(t, `pwd; echo "$X"; read line; echo "read: $?"`, 10*time.Second); out != "/tmp\n42\nread: 1\n" {
				t.Fatalf("state or stdin: %q", out)
			}
			// Quotes, a tab, UTF-8, several lines, and a line longer
			// than a line editor takes.
			long := strings.Repeat("x", 3000)
			cmd := "printf '%s|' \"it's\" 'a\tb' 'é'\necho\necho " + long + " | wc -c"
			if res, out := p.run(t, cmd, 10*time.Second); out != "it's|a\tb|é|\n3001\n" || res.ExitStatus != 0 {
				t.Fatalf("%+v %q", res, out)
			}
			if _, out := p.run(t, "echo '"+long+"'  | wc -c\necho two lines", 10*time.Second); strings.TrimSpace(out) != "3001\ntwo lines" {
				t.Fatalf("long printable: %q", out)
			}
			if res, _ := p.run(t, "echo 'unterminated", 10*time.Second); !res.Completed || res.ExitStatus == 0 {
				t.Fatalf("syntax error: %+v", res)
			}
			t0 := time.Now()
			res, _ := p.run(t, "echo before; sleep 60", time.Second)
			if !res.TimedOut || !res.Interrupted || time.Since(t0) > 3*time.Second {
				t.Fatalf("sleep 60 with a timeout of 1 s: %+v after %v", res, time.Since(t0))
			}
			if res, out := p.run(t, "echo after", 10*time.Second); out != "after\n" || !res.Completed {
				t.Fatalf("after the interrupt: %+v %q", res, out)
			}
			// A shell without the function (a new one) gets it again.
			p.run(t, "unset -f _qm", 10*time.Second)
			if res, out := p.run(t, "echo defined again", 10*time.Second); out != "defined again\n" || !res.Completed {
				t.Fatalf("after unset -f: %+v %q", res, out)
			}
			if res, _ := p.run(t, "exit 3", 10*time.Second); !res.ShellExited || res.ExitStatus != 3 {
				t.Fatalf("exit 3: %+v", res)
			}
		})
	}
}

// Without a controlling terminal Ctrl-C reaches nothing: the result says
// the command still runs, and that the shell has no job control.
func TestShellWithoutTerminal(t *testing.T) {
	p := startShell(t, false, "dash", "-i")
	res, _ := p.run(t, "sleep 30", 500*time.Millisecond)
	if !res.TimedOut || res.Interrupted || !res.StillRunning || res.JobControl {
		t.Fatalf("%+v", res)
	}
}

// Nothing answers (a console without a shell): said within the timeout.
func TestNoShell(t *testing.T) {
	p := startShell(t, true, "cat")
	t0 := time.Now()
	res, err := Run(context.Background(), p, Request{Command: "true", Timeout: 500 * time.Millisecond})
	if err != nil || res.Started || !res.TimedOut || time.Since(t0) > 2*time.Second {
		t.Fatalf("%+v %v after %v", res, err, time.Since(t0))
	}
}

func TestRefused(t *testing.T) {
	for _, c := range []string{"", "  ", "a\x00b"} {
		if _, err := Run(context.Background(), &ptyShell{}, Request{Command: c}); !errors.Is(err, ErrCommand) {
			t.Errorf("%q: %v", c, err)
		}
	}
}

func TestSplitKernel(t *testing.T) {
	out := []byte("line one\r\n[    1.000000] old dmesg line\r\npart[   12.500000] virtio: new device\r\nial\r\n[   12.600000] another\r\n")
	keep, msgs := SplitKernel(out, 100, 12.4)
	if string(keep) != "line one\r\n[    1.000000] old dmesg line\r\npartial\r\n" {
		t.Fatalf("kept %q", keep)
	}
	if len(msgs) != 2 || msgs[0].Text != "[   12.500000] virtio: new device" || msgs[0].Cursor != 100+int64(len("line one\r\n[    1.000000] old dmesg line\r\npart")) {
		t.Fatalf("messages %+v", msgs)
	}
	if keep, msgs := SplitKernel(out, 0, 0); string(keep) != string(out) || msgs != nil {
		t.Fatal("without the uptime nothing is told apart")
	}
}
