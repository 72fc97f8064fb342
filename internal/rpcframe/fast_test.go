package rpcframe

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// What clients send all day takes the fast path, without allocating.
func TestFastPathTaken(t *testing.T) {
	for _, m := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"method":"tools/call","params":{"name":"serial_send","arguments":{"text":"ls -l\n","wait_for":"\\$ $","timeout":2.5,"raw":false,"x":null,"y":[1,-0.5,{"z":"é€😀"}]}},"jsonrpc":"2.0","id":"abc-7"}`,
		`{"jsonrpc":"2.0","id":-123456789012345,"result":{}}`,
		`{ "jsonrpc" : "2.0" , "id" : 0 , "method" : "ping" , "params" : { } , "_meta" : [ ] }`,
	} {
		if !fastAccept([]byte(m)) {
			t.Errorf("not on the fast path: %s", m)
		}
		if id, code, reason := checkFull([]byte(m)); code != 0 {
			t.Errorf("%s: the full check refuses it (id %s): %s", m, id, reason)
		}
		b := []byte(m)
		if n := testing.AllocsPerRun(10, func() { Check(b) }); n != 0 {
			t.Errorf("%s: %v allocations a check", m, n)
		}
	}
	// Unusual, left to the full check (which accepts some of them).
	for _, m := range []string{
		`{"jsonrpc":"2.0","id":1e3,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1.5,"method":"x"}`,
		`{"jsonrpc":"2.0","id":12345678901234567,"method":"x"}`,
		`{"JSONRPC":"2.0","id":1,"method":"x"}`,
		`{"jsonrpc":"2.0","Id":1,"method":"x"}`,
		`{"jsonrpc":"2.0","\u0069d":1,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\ud800"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"` + "\xff" + `"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1E2}}`,
		`{"jsonrpc":"2.0","id":null,"result":{}}`,
		`{"jsonrpc":"2.0","id":{},"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":null}`,
		`{"jsonrpc":"2.0","id":1}`,
		`{"jsonrpc":"2.0 ","id":1,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":"x"} `,
		`[{"jsonrpc":"2.0","id":1,"method":"x"}]`,
	} {
		if fastAccept([]byte(m)) {
			t.Errorf("on the fast path: %s", m)
		}
	}
}

// FuzzFastPath: the fast path accepts only what the full check and the
// SDK accept.
func FuzzFastPath(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`,
		`{"jsonrpc":"2.0","id":"a","result":{"x":[1,2.5,true,false,null]}}`,
		`{"jsonrpc":"2.0","id":-0,"method":"x","params":{"s":"\u00e9\n\"\\\/\b\f\r\t"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":[[[[[[[[[[]]]]]]]]]]}`,
		`{"jsonrpc":"2.0","id":1,"method":"","params":{"a":"` + "\u2028\U0001F600" + `"}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		if !fastAccept([]byte(msg)) {
			return
		}
		if _, code, reason := checkFull([]byte(msg)); code != 0 {
			t.Fatalf("fast path accepts %q, the full check refuses it: %s", msg, reason)
		}
		if _, err := jsonrpc.DecodeMessage([]byte(msg)); err != nil {
			t.Fatalf("fast path accepts %q, the SDK refuses it: %v", msg, err)
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	m := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"qemu_status","arguments":{}}}`)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Check(m)
		}
	})
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			checkFull(m)
		}
	})
}
