package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// tee runs the server for a client, logging every line each way to a file
// (what the server answered, to compare with what the model saw). It
// stands between the client and the server as little as it can: signals
// are passed on as they come, and the server dies with it (parent-death
// SIGKILL), so a client's SIGTERM then SIGKILL reach the server as both.
func tee(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: agents tee LOG SERVER [ARGS...]")
		return 2
	}
	logf, err := os.Create(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logf.Close()
	var mu sync.Mutex
	record := func(dir string, line []byte) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(map[string]any{"dir": dir, "line": json.RawMessage(validJSON(line))})
		logf.Write(append(b, '\n'))
	}
	// Parent-death signals go with the thread that started the child.
	runtime.LockOSThread()
	cmd := exec.Command(args[1], args[2:]...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if st, err := proc.Stat(cmd.Process.Pid); err == nil {
		b, _ := json.Marshal(map[string]any{"dir": "pid", "line": map[string]any{"pid": st.PID, "start_time": st.StartTime}})
		mu.Lock()
		logf.Write(append(b, '\n'))
		mu.Unlock()
	}
	go func() {
		for s := range sigs {
			// Passed on first: a SIGKILL may follow within a millisecond.
			cmd.Process.Signal(s)
			mu.Lock()
			fmt.Fprintf(logf, "{\"dir\":\"signal\",\"line\":%q}\n", s.String())
			mu.Unlock()
		}
	}()
	go func() {
		copyLines(stdin, os.Stdin, func(l []byte) { record("in", l) })
		stdin.Close()
	}()
	copyLines(os.Stdout, stdout, func(l []byte) { record("out", l) })
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return 0
}

// copyLines copies r to w line by line, handing each line to see.
func copyLines(w io.Writer, r io.Reader, see func([]byte)) {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			see(bytes.TrimSuffix(line, []byte("\n")))
			if _, werr := w.Write(line); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func validJSON(b []byte) []byte {
	if json.Valid(b) {
		return b
	}
	q, _ := json.Marshal(string(b))
	return q
}
