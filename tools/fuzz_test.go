package tools

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// FuzzBootArguments decodes arbitrary qemu_boot arguments the way a call
// does, up to the wait plan (the machine's part, up to the command line,
// is instance's FuzzMachineConfig). Whatever the input, decoding must not
// panic, and an error names the argument it is about.
func FuzzBootArguments(f *testing.F) {
	s := &Server{}
	for _, seed := range []string{
		`{}`,
		`{"kernel":"k.bin","bios":"fw.bin","wait_for":"tiny> $","timeout":0.5}`,
		`{"kernel":"k.bin","timeout":-1}`,
		`{"kernel":"k.bin","timeout":1e308}`,
		`{"kernel":"k.bin","wait_for":"(unclosed"}`,
		`{"kernel":"k.bin","wait_for":["a","(b"],"idle_ms":-1}`,
		`{"kernel":"k.bin","wait_for":[1,2],"panic_patterns":["("]}`,
		`{"kernel":"k.bin","wait_for":{"x":1}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in BootInput
		if json.Unmarshal(data, &in) != nil {
			return
		}
		if _, err := s.plan(nil, in.WaitOptions, in.Timeout, time.Minute, defaultMaxBytes, nil); err != nil && !strings.Contains(err.Error(), "wait_for") &&
			!strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "idle_ms") && !strings.Contains(err.Error(), "panic_patterns") {
			t.Fatalf("plan error %q does not name the argument", err)
		}
		if d, err := seconds("timeout", in.Timeout, time.Minute); err == nil && (d <= 0 || d > 24*time.Hour) {
			t.Fatalf("seconds(%v) = %v without error", in.Timeout, d)
		}
		if math.IsNaN(in.Timeout) {
			t.Fatal("NaN timeout decoded")
		}
	})
}
