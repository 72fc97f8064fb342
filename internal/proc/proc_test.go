package proc

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseStatCommWithParens(t *testing.T) {
	line := "4242 (we ird) (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"
	info, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Info{PID: 4242, PPID: 1, State: 'S', StartTime: 987654, Comm: "we ird) (name"}
	if info != want {
		t.Fatalf("got %+v, want %+v", info, want)
	}
}

func TestParseStatMalformed(t *testing.T) {
	for _, in := range []string{"", "12", "12 (x", "12 (x) S 1", "x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, err := ParseStat([]byte(in)); err == nil {
			t.Errorf("ParseStat(%q) succeeded", in)
		}
	}
}

func TestSelfIsAlive(t *testing.T) {
	id, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	live, info, err := Check(id)
	if err != nil || live != Alive || info.PID != os.Getpid() {
		t.Fatalf("Check(self) = %v %+v %v", live, info, err)
	}
	if started := StartedAt(id.StartTime); time.Since(started) < 0 || time.Since(started) > time.Hour {
		t.Errorf("StartedAt = %v, not within the last hour", started)
	}
	if exe, err := Exe(id.PID); err != nil || exe == "" {
		t.Errorf("Exe = %q, %v", exe, err)
	}
}

// A child that exited but was not waited for is a zombie: kill(pid, 0)
// succeeds on it, Check must not call it alive, and Signal must not pretend.
func TestZombieReusedGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start true: %v", err)
	}
	pid := cmd.Process.Pid
	info, err := Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	id := Identity{PID: pid, StartTime: info.StartTime}
	deadline := time.Now().Add(5 * time.Second)
	for {
		live, _, _ := Check(id)
		if live == Zombie {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child never became a zombie (state %v)", live)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("kill(pid,0) on a zombie: %v (test premise)", err)
	}
	reused := Identity{PID: pid, StartTime: info.StartTime + 1}
	if live, _, _ := Check(reused); live != Reused {
		t.Errorf("Check with another start time = %v, want reused", live)
	}
	if err := Signal(reused, unix.SIGTERM); !errors.Is(err, ErrNotSame) {
		t.Errorf("Signal(reused) = %v, want ErrNotSame", err)
	}
	cmd.Wait()
	if live, _, _ := Check(id); live != Gone {
		t.Errorf("after wait: %v, want gone", live)
	}
	if err := Signal(id, unix.SIGTERM); !errors.Is(err, ErrNotFound) {
		t.Errorf("Signal(gone) = %v, want ErrNotFound", err)
	}
}

func TestSignalRequiresStartTime(t *testing.T) {
	if err := Signal(Identity{PID: os.Getpid()}, 0); !errors.Is(err, ErrNotSame) {
		t.Fatalf("Signal without start time = %v", err)
	}
}

func TestSignalDelivers(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	info, err := Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := Signal(Identity{PID: info.PID, StartTime: info.StartTime}, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(interface{ Signaled() bool }).Signaled() == false {
		t.Fatalf("sleep was not killed by the signal: %v", err)
	}
}

func TestCreds(t *testing.T) {
	c, err := ParseCreds([]byte("Name:\tx\nUid:\t1000\t1001\t1001\t1001\nGid:\t100\t101\t101\t101\nGroups:\t5 27 \n"))
	if err != nil || c.UID != 1001 || len(c.GIDs) != 3 || c.GIDs[0] != 101 || !c.InGroup(27) || c.InGroup(100) {
		t.Errorf("ParseCreds = %+v, %v", c, err)
	}
	if _, err := ParseCreds([]byte("Name:\tx\n")); err == nil {
		t.Error("no Uid line accepted")
	}
	self, err := ReadCreds(os.Getpid())
	if err != nil || self.UID != os.Geteuid() || !self.InGroup(os.Getegid()) {
		t.Errorf("ReadCreds(self) = %+v, %v", self, err)
	}
}
