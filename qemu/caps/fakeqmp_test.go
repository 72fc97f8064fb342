package caps

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQMPEnv names the canned answers (a fakeScript in JSON) that this test
// binary, started as QEMU through a script of fakeQMPBinary, gives on QMP
// over stdio instead of running tests.
const fakeQMPEnv = "QEMU_MCP_CAPS_FAKE_QMP"

func TestMain(m *testing.M) {
	if f := os.Getenv(fakeQMPEnv); f != "" {
		os.Exit(fakeQMP(f))
	}
	os.Exit(m.Run())
}

// fakeScript is what a fake QEMU answers.
type fakeScript struct {
	// Log gets a line "start" when QEMU starts, then one per command
	// ("command" or "command typename").
	Log string `json:"log"`
	// GreetDelay delays the greeting (milliseconds).
	GreetDelay int `json:"greet_delay"`
	// Answers are by "command" or "command typename": a QMP reply, or
	// {"die": "last words"} (QEMU writes them to stderr and exits), or
	// {"hang": true}. qmp_capabilities and quit answer {"return": {}};
	// other commands CommandNotFound.
	Answers map[string]json.RawMessage `json:"answers"`
}

// fakeQMP is the fake QEMU: it greets as QEMU 11.1.3, and sends an event
// before each reply, as a QEMU does that has something to report.
func fakeQMP(file string) int {
	var s fakeScript
	b, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake QEMU:", err)
		return 2
	}
	logf := func(line string) {
		if f, err := os.OpenFile(s.Log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	logf("start")
	time.Sleep(time.Duration(s.GreetDelay) * time.Millisecond)
	fmt.Println(`{"QMP": {"version": {"qemu": {"micro": 3, "minor": 1, "major": 11}, "package": "fake"}, "capabilities": ["oob"]}}`)
	dec := json.NewDecoder(os.Stdin)
	for {
		var req struct {
			Execute   string `json:"execute"`
			Arguments struct {
				Typename string `json:"typename"`
			} `json:"arguments"`
		}
		if dec.Decode(&req) != nil {
			return 0
		}
		key := strings.TrimSpace(req.Execute + " " + req.Arguments.Typename)
		logf(key)
		a, ok := s.Answers[key]
		switch {
		case ok:
		case key == "qmp_capabilities" || key == "quit":
			a = json.RawMessage(`{"return": {}}`)
		default:
			a = json.RawMessage(`{"error": {"class": "CommandNotFound", "desc": "The command ` + req.Execute + ` has not been found"}}`)
		}
		var special struct {
			Die  string `json:"die"`
			Hang bool   `json:"hang"`
		}
		json.Unmarshal(a, &special)
		switch {
		case special.Die != "":
			fmt.Fprintln(os.Stderr, "qemu-system-riscv64: warning: something\n"+special.Die)
			return 1
		case special.Hang:
			time.Sleep(time.Minute)
		}
		fmt.Println(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}`)
		fmt.Println(string(a))
		if key == "quit" {
			return 0
		}
	}
}

// fakeQMPBinary writes a script that runs this test binary as a fake QEMU
// answering answers; log gets its starts and commands (see fakeScript).
func fakeQMPBinary(t *testing.T, greetDelay int, answers map[string]string) (bin, log string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, log = filepath.Join(dir, "qemu-system-riscv64"), filepath.Join(dir, "qmp.log")
	s := fakeScript{Log: log, GreetDelay: greetDelay, Answers: map[string]json.RawMessage{}}
	for k, v := range answers {
		s.Answers[k] = json.RawMessage(v)
	}
	b, _ := json.Marshal(s)
	script := filepath.Join(dir, "answers.json")
	if err := os.WriteFile(script, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// A race-enabled binary sleeps a second at exit unless told not to.
	sh := fmt.Sprintf("#!/bin/sh\nGORACE=atexit_sleep_ms=0 %s=%s exec %s \"$@\"\n", fakeQMPEnv, script, self)
	if err := os.WriteFile(bin, []byte(sh), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

// asked counts the lines of a fake QEMU's log that are line.
func asked(t *testing.T, log, line string) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l == line {
			n++
		}
	}
	return n
}
