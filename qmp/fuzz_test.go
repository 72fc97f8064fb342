package qmp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
)

// Lines as QEMU 7.2 sends them, used as seeds by both fuzz targets.
var fuzzSeedLines = []string{
	`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}, "capabilities": ["oob"]}}`,
	`{"return": {}, "id": "2"}`,
	`{"return": {"status": "prelaunch", "singlestep": false, "running": false}, "id": "2"}`,
	`{"id": "2", "error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}}`,
	`{"error": {"class": "GenericError", "desc": "JSON parse error, expecting value"}}`,
	`{"timestamp": {"seconds": 1732195234, "microseconds": 502339}, "event": "STOP"}`,
	`{"timestamp": {"seconds": 1732195234, "microseconds": 513410}, "event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`,
	`{"return": [{"name": "query-status"}, {"name": "event"}], "id": "2"}`,
	`{"return": {}, "id": 2}`,
	`{"return": {}, "id": "18446744073709551616"}`,
	`{"event": 1}`,
	`{"event": "X", "data": 1}`,
	`{"EVENT": "x", "Return": {}}`,
	`{"return": null, "error": null, "id": null}`,
	`null`,
	`[]`,
	`not json`,
	"{\"return\": \"\xff\xfe\", \"id\": \"2\"}",
	`{"return": {}, "id": "2"}{"return": {}, "id": "2"}`,
}

// FuzzParseMessage: parseMessage never panics, accepts only valid JSON, and
// what dispatch does with its result is consistent with the line: an event
// has an "event" member, a response has "return" or "error", and ids this
// package assigned are decimal strings.
func FuzzParseMessage(f *testing.F) {
	for _, l := range fuzzSeedLines {
		f.Add([]byte(l))
	}
	f.Add([]byte(`{"return": "` + strings.Repeat("x", 1<<16) + `", "id": "2"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		msg, err := parseMessage(line)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "decode ") {
				t.Fatalf("unexpected error form: %v", err)
			}
			return
		}
		if !json.Valid(line) {
			t.Fatalf("accepted invalid JSON %q", line)
		}
		var members map[string]json.RawMessage
		isObject := json.Unmarshal(line, &members) == nil && members != nil
		has := func(name string) bool {
			for k := range members {
				if strings.EqualFold(k, name) { // encoding/json matches names case-insensitively
					return true
				}
			}
			return false
		}
		if msg.Event != "" {
			if !isObject || !has("event") {
				t.Fatalf("event %q from a line without an event member: %q", msg.Event, line)
			}
			// The hub decodes events again as go-qemu's Event. Its Data
			// and Timestamp are typed, so a line whose event name
			// parseMessage accepts can still fail there (and is then
			// dropped with a warning); the name itself must agree.
			var name struct {
				Event string `json:"event"`
			}
			if err := json.Unmarshal(line, &name); err != nil || name.Event != msg.Event {
				t.Fatalf("event name %q, re-decoded as %q (%v)", msg.Event, name.Event, err)
			}
			return
		}
		if bool(msg.Return) && (!isObject || !has("return")) {
			t.Fatalf("response without a return member: %q", line)
		}
		if msg.Error != nil && (!isObject || !has("error")) {
			t.Fatalf("error without an error member: %q", line)
		}
		if id, ok := msg.id(); ok {
			var s string
			if err := json.Unmarshal(msg.ID, &s); err != nil || s == "" || strings.TrimLeft(s, "0123456789") != "" {
				t.Fatalf("id() = %d from %s", id, msg.ID)
			}
		}
	})
}

// FuzzMonitorStream: a peer greets, answers qmp_capabilities, waits until a
// command is pending, then sends the fuzz input and hangs up. Whatever it
// sends, the monitor must not panic or hang: the pending command completes
// with a matching response, a QEMU error for its id, or ErrClosed; the event
// channel closes; Disconnect returns. With mode&1 the fuzz input replaces
// the whole handshake instead. Lines are split at '\n' as the reader splits
// them; mode&2 sends them in separate writes.
func FuzzMonitorStream(f *testing.F) {
	for _, l := range fuzzSeedLines {
		f.Add(byte(0), []byte(l+"\r\n"))
	}
	f.Add(byte(0), []byte(fuzzSeedLines[5]+"\n"+fuzzSeedLines[3]+"\n"))
	f.Add(byte(2), []byte(fuzzSeedLines[6]+"\n\n"+fuzzSeedLines[2]+"\n"))
	f.Add(byte(0), []byte(`{"return": "`+strings.Repeat("y", 1<<20)+`", "id": "2"}`+"\n"))
	f.Add(byte(0), []byte(strings.Repeat("garbage without newline ", 100)))
	f.Add(byte(1), []byte(fuzzSeedLines[0]+"\n"+`{"return": {}, "id": "1"}`+"\n"))
	f.Add(byte(1), []byte(fuzzSeedLines[0]+"\n"+fuzzSeedLines[5]+"\n"+`{"error": {"class": "GenericError", "desc": "no"}, "id": "1"}`+"\n"))
	f.Add(byte(1), []byte("{\"QMP\": null}\n"))
	f.Fuzz(func(t *testing.T, mode byte, data []byte) {
		rawHandshake := mode&1 != 0
		send := func(fc *fakeConn) {
			if mode&2 == 0 {
				fc.c.Write(data)
				return
			}
			for len(data) > 0 {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					i = len(data) - 1
				}
				if _, err := fc.c.Write(data[:i+1]); err != nil {
					return
				}
				data = data[i+1:]
			}
		}
		path := startFake(t, func(fc *fakeConn) {
			defer fc.c.Close()
			if rawHandshake {
				go func() { fc.r.WriteTo(discard{}) }()
				send(fc)
				return
			}
			if fc.handshake() != nil {
				return
			}
			if _, err := fc.read(); err != nil { // the pending command
				return
			}
			send(fc)
		})
		m := New(path, WithEventBuffer(4))
		defer m.Disconnect()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		events, err := m.Events(ctx)
		if err != nil {
			t.Fatal(err)
		}
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for range events {
			}
		}()

		err = m.ConnectContext(ctx)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("connect hung: %v", err)
		case err != nil && !rawHandshake:
			t.Fatalf("connect to a well-behaved peer: %v", err)
		case err == nil:
			resp, err := m.RunContext(ctx, []byte(`{"execute":"query-status"}`))
			var qerr *Error
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("command hung: %v", err)
			case errors.As(err, &qerr):
				if qerr.Command != "query-status" {
					t.Fatalf("error for another command: %v", qerr)
				}
			case err != nil:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("unexpected error: %v", err)
				}
			default:
				msg, perr := parseMessage(resp)
				id, ok := msg.id()
				if perr != nil || msg.Event != "" || !bool(msg.Return) || msg.Error != nil || !ok || id != 2 {
					t.Fatalf("response %q is not a successful reply to id 2", resp)
				}
			}
		}
		done := make(chan struct{})
		go func() { m.Disconnect(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Disconnect hung")
		}
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
			t.Fatal("event channel not closed after Disconnect")
		}
	})
}

// discard is io.Discard as an io.Writer for bufio.Reader.WriteTo.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

var _ goqmp.Monitor = (*Monitor)(nil)
