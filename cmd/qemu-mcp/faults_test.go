package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// rawSession speaks JSON-RPC lines to a server over its real stdio.
type rawSession struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
	id  int
}

func (r *rawSession) send(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// next reads the next line the server writes, skipping notifications.
func (r *rawSession) next() map[string]any {
	r.t.Helper()
	type line struct {
		b   []byte
		err error
	}
	for {
		ch := make(chan line, 1)
		go func() { b, err := r.out.ReadBytes('\n'); ch <- line{b, err} }()
		select {
		case l := <-ch:
			if l.err != nil {
				r.t.Fatalf("read: %v (the server ended the session)", l.err)
			}
			var m map[string]any
			if err := json.Unmarshal(l.b, &m); err != nil {
				r.t.Fatalf("the server wrote a line that is not JSON: %q", l.b)
			}
			if _, isNote := m["method"]; isNote {
				continue
			}
			return m
		case <-time.After(30 * time.Second):
			r.t.Fatal("no answer within 30 s")
		}
	}
}

// call sends a request and returns its answer.
func (r *rawSession) call(method string, params any) map[string]any {
	r.t.Helper()
	r.id++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": r.id, "method": method, "params": params})
	r.send(string(b))
	m := r.next()
	if id, _ := m["id"].(float64); int(id) != r.id {
		r.t.Fatalf("answer %v to request %d", m, r.id)
	}
	return m
}

func (r *rawSession) tool(name string, args map[string]any) map[string]any {
	r.t.Helper()
	res, _ := r.call("tools/call", map[string]any{"name": name, "arguments": args})["result"].(map[string]any)
	return res
}

// Hostile input on stdio: garbage, wrong shapes, a batch, an id the SDK
// cannot decode, a line of 10 MB. Each gets its JSON-RPC error (short) and
// the session and the guest go on.
func TestHostileStdio(t *testing.T) {
	needQEMU(t)
	dir := runtimeDir(t)
	cmd, stdin, stdout := startPiped(t, dir)
	r := &rawSession{t: t, in: stdin, out: bufio.NewReaderSize(stdout, 1<<20)}
	r.call("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "1"}})
	r.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	boot := r.tool("qemu_boot", map[string]any{"wait_for": `tiny> $`})
	pid := boot["structuredContent"].(map[string]any)["pid"].(float64)

	for _, c := range []struct {
		line string
		code float64
	}{
		{"this is not json", -32700},
		{"{\"jsonrpc\":\"2.0\",\"id\":", -32700},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, -32600},
		{`{"jsonrpc":"2.0","id":1e400,"method":"ping"}`, -32600},
		{`{"jsonrpc":"2.0","id":5,"error":"x"}`, -32600},
		{`{"method":"ping","id":6}`, -32600},
		{"\x00\xff\xfe binary", -32700},
		// 10 MB, its id after params as the TypeScript SDK writes it: the
		// answer carries the id, or the client would wait for its timeout.
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"qmp_command","arguments":{"command":"` + strings.Repeat("x", 10<<20) + `"}},"id":7}`, -32600},
	} {
		r.send(c.line)
		m := r.next()
		e, _ := m["error"].(map[string]any)
		if e == nil || e["code"].(float64) != c.code {
			t.Errorf("%.40q: answer %.200v, want error %v", c.line, m, c.code)
		}
		if len(c.line) > 1<<20 && m["id"] != float64(7) {
			t.Errorf("the 10 MB line was answered with id %v, want 7", m["id"])
		}
		if b, _ := json.Marshal(m); len(b) > 1024 {
			t.Errorf("%.40q: an answer of %d bytes", c.line, len(b))
		}
	}
	// A 1 MB tool name and a 1 MB command name: short tool errors.
	for _, args := range []map[string]any{{"name": strings.Repeat("q", 1<<20)}, {"name": "qmp_command", "arguments": map[string]any{"command": strings.Repeat("x", 1<<20)}}} {
		m := r.call("tools/call", args)
		b, _ := json.Marshal(m)
		if len(b) > 4096 {
			t.Errorf("an answer of %d bytes to a 1 MB name", len(b))
		}
	}
	// The guest still runs, and the session works.
	st := r.tool("qemu_status", map[string]any{})["structuredContent"].(map[string]any)
	if st["state"] != "running" || st["pid"].(float64) != pid {
		t.Errorf("after the hostile input: %v", st)
	}
	echo := r.tool("serial_send", map[string]any{"data": "echo still-here", "wait_for": `still-here\r\n`})["structuredContent"].(map[string]any)
	if echo["matched"] != true {
		t.Errorf("echo after the hostile input: %v", echo)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
}
