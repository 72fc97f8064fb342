package qemu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

func TestArgv(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "k.bin")
	img := filepath.Join(dir, "a,b.img")
	os.WriteFile(k, []byte{0}, 0o644)
	os.WriteFile(img, []byte{0}, 0o644)
	cfg := NewConfig(WithKernel(k), WithMemory("256M"), WithSMP(2), WithAppend("console=ttyS0"),
		WithDrive(Drive{Path: img, ReadOnly: true}), WithExtraArgs("-device", "virtio-rng-device"))
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(cfg.Argv("/r/serial-1", 3), " ")
	want := "qemu-system-riscv64 -machine virt -nodefaults -display none -S -m 256M -smp 2 -bios default -kernel " + k +
		" -append console=ttyS0 -drive file=" + strings.ReplaceAll(img, ",", ",,") + ",format=raw,if=none,id=drive0,readonly=on" +
		" -device virtio-blk-device,drive=drive0 -chardev pipe,id=serial0,path=/r/serial-1 -serial chardev:serial0" +
		" -chardev socket,id=qmp0,fd=3,server=on,wait=off -qmp chardev:qmp0 -device virtio-rng-device"
	if got != want {
		t.Errorf("argv\n got %s\nwant %s", got, want)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "k.bin")
	os.WriteFile(k, []byte{0}, 0o644)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{NewConfig(WithKernel(filepath.Join(dir, "missing"))), "no such file"},
		{NewConfig(WithKernel(dir)), "not a regular file"},
		{NewConfig(WithKernel(k), WithMemory("12X")), "memory"},
		{NewConfig(WithKernel(k), WithSMP(0)), "smp"},
		{NewConfig(WithBIOS("none")), "needs a kernel"},
		{NewConfig(WithKernel(k), WithBIOS(filepath.Join(dir, "fw"))), "bios"},
		{NewConfig(WithKernel(k), WithDrive(Drive{})), "drives[0]"},
		{NewConfig(WithKernel(k), WithExtraArgs("-serial", "stdio")), "-serial is not allowed"},
		{NewConfig(WithKernel(k), WithExtraArgs("--chardev=x")), "--chardev=x is not allowed"},
		{NewConfig(WithKernel(k), WithExtraArgs("-readconfig", "f")), "-readconfig"},
		{NewConfig(WithKernel(k), WithExtraArgs("--preconfig")), "--preconfig is not allowed"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	// Values that merely look like managed options are fine.
	if err := CheckExtraArgs([]string{"-append", "serial=1", "-device", "virtio-serial-device"}); err != nil {
		t.Errorf("harmless args refused: %v", err)
	}
}

// The machines these tests start run the QEMU under test (see
// testguest.QEMUPath), found where the server finds its own.
func init() {
	if p := testguest.QEMUPath(); p != "" {
		lookPath = func(string) (string, error) { return p, nil }
	}
}

func needQEMU(t *testing.T) string {
	t.Helper()
	testguest.NeedQEMU(t)
	k, err := filepath.Abs("../testdata/images/tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func shortDir(t *testing.T) string { t.Helper(); return testguest.SocketDir(t, "qm") }

// A QEMU that refuses its command line fails the start with QEMU's own
// words, at once, and leaves nothing behind.
func TestStartFailureCarriesQEMUStderr(t *testing.T) {
	k := needQEMU(t)
	dir := shortDir(t)
	start := time.Now()
	_, err := Start(context.Background(), Runtime{SerialBase: testSerial(dir, 1), QMPSocket: testSocket(dir, 1)}, NewConfig(WithKernel(k), WithExtraArgs("-device", "no-such-device")))
	if err == nil || !strings.Contains(err.Error(), "no-such-device") || !strings.Contains(err.Error(), "exited with status 1") {
		t.Fatalf("Start = %v, want QEMU's complaint about no-such-device", err)
	}
	// The server's own options draw no warning to read past (QEMU 11
	// deprecated -mon).
	if strings.Contains(err.Error(), "warning") {
		t.Errorf("Start = %v: a warning about the server's own options", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("failed start took %v; it should not wait for the connect timeout", el)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// With QMP never answering (QEMU frozen), the start fails after the connect
// timeout and the partial start is undone: QEMU killed, files removed.
func TestPartialStartIsUndone(t *testing.T) {
	k := needQEMU(t)
	dir := shortDir(t)
	// A wrapper that stops QEMU right after exec: its socket never answers.
	wrapper := filepath.Join(dir, "frozen-qemu")
	qemu := testguest.QEMU(t)
	os.WriteFile(wrapper, []byte("#!/bin/sh\nkill -STOP $$\nexec "+qemu+" \"$@\"\n"), 0o755)
	_, err := Start(context.Background(), Runtime{SerialBase: testSerial(dir, 2), QMPSocket: testSocket(dir, 2), ConnectTimeout: 300 * time.Millisecond},
		NewConfig(WithBinary(wrapper), WithKernel(k)))
	if err == nil || !strings.Contains(err.Error(), "connect to QMP") {
		t.Fatalf("Start = %v, want a QMP connect failure", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "frozen-qemu" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// QEMU must die with the server even when the server is SIGKILLed. The
// helper process below plays the server.
func TestQEMUDiesWithKilledParent(t *testing.T) {
	k := needQEMU(t)
	dir := shortDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$")
	cmd.Env = append(os.Environ(), "QEMU_MCP_TEST_HELPER=1", "HELPER_DIR="+dir, "HELPER_KERNEL="+k)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var pid int
	var st uint64
	if _, err := fmt.Sscanf(line, "qemu %d %d", &pid, &st); err != nil {
		t.Fatalf("helper said %q", line)
	}
	id := proc.Identity{PID: pid, StartTime: st}
	if live, _, _ := proc.Check(id); live != proc.Alive {
		t.Fatalf("qemu %d not running before the kill: %v", pid, live)
	}
	// Let the helper's Go runtime start and retire threads for a while:
	// QEMU must survive that (Go issue 27505).
	time.Sleep(500 * time.Millisecond)
	if live, _, _ := proc.Check(id); live != proc.Alive {
		t.Fatalf("qemu %d died while its server lived: %v", pid, live)
	}
	cmd.Process.Kill()
	cmd.Wait()
	testguest.AwaitGone(t, id, 2*time.Second, false, "its server was killed")
}

func TestHelperServer(t *testing.T) {
	if os.Getenv("QEMU_MCP_TEST_HELPER") != "1" {
		t.Skip("helper process for TestQEMUDiesWithKilledParent")
	}
	m, err := Start(context.Background(), Runtime{SerialBase: testSerial(os.Getenv("HELPER_DIR"), os.Getpid()), QMPSocket: testSocket(os.Getenv("HELPER_DIR"), os.Getpid())},
		NewConfig(WithKernel(os.Getenv("HELPER_KERNEL"))))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	id := m.Identity()
	fmt.Println("qemu", id.PID, id.StartTime)
	// Churn goroutines and threads so idle threads get retired.
	for i := 0; ; i++ {
		done := make(chan bool)
		for j := 0; j < 8; j++ {
			go func() { time.Sleep(time.Millisecond); done <- true }()
		}
		for j := 0; j < 8; j++ {
			<-done
		}
		_ = slices.Contains([]string{strconv.Itoa(i)}, "")
	}
}

// Shutdown escalates: a guest that ignores powerdown is stopped by quit.
func TestShutdownEscalates(t *testing.T) {
	k := needQEMU(t)
	dir := shortDir(t)
	m, err := Start(context.Background(), Runtime{SerialBase: testSerial(dir, 3), QMPSocket: testSocket(dir, 3)}, NewConfig(WithKernel(k)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	end, err := m.Shutdown(context.Background(), Powerdown, 200*time.Millisecond)
	if err != nil || end.How != "quit" || end.Exit.Code != 0 {
		t.Fatalf("Shutdown(powerdown) = %+v, %v; want quit after the ignored powerdown", end, err)
	}
	if end, _ := m.Shutdown(context.Background(), Quit, 0); end.How != "already-exited" {
		t.Errorf("second Shutdown = %+v", end)
	}
	m.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}

	m, err = Start(context.Background(), Runtime{SerialBase: testSerial(dir, 3), QMPSocket: testSocket(dir, 3)}, NewConfig(WithKernel(k)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	end, err = m.Shutdown(context.Background(), Kill, 0)
	if err != nil || end.How != "sigkill" || end.Exit.Signal != "SIGKILL" || end.Exit.Code != 137 {
		t.Fatalf("Shutdown(kill) = %+v, %v", end, err)
	}
}

// A host file handed as a descriptor is what QEMU uses, whatever its name
// says: the name here names nothing, and the guest still boots from the
// file the server opened; Start closes the server's copy.
func TestStartHandsFiles(t *testing.T) {
	k := needQEMU(t)
	f, err := os.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	name := filepath.Join(dir, "no-such-kernel.bin")
	cfg := NewConfig(WithKernel(name))
	cfg.Files = map[string]*os.File{name: f}
	m, err := Start(context.Background(), Runtime{SerialBase: testSerial(dir, 4), QMPSocket: testSocket(dir, 4)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := strings.Join(m.Argv(), " "); !strings.Contains(got, "-kernel /proc/self/fd/4") {
		t.Errorf("argv %s", got)
	}
	if files := m.Files(); len(files) != 1 || files[0] != (File{FD: 4, Path: name}) {
		t.Errorf("Files() = %+v", files)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := m.Console().Buffer().WaitFor(ctx, 0, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile(`tiny> $`)}, Timeout: 10 * time.Second})
	if err != nil || !res.Matched {
		t.Fatalf("the guest did not boot from the handed file: %+v %v", res, err)
	}
	if _, err := f.Stat(); err == nil {
		t.Error("Start left the server's copy of the file open")
	}
}

// testSerial and testSocket are the paths of test machine n in dir.
func testSerial(dir string, n int) string { return filepath.Join(dir, fmt.Sprintf("serial-%d", n)) }

func testSocket(dir string, n int) string { return filepath.Join(dir, fmt.Sprintf("qmp-%d.sock", n)) }
