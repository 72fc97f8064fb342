package registry_test

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/registry"
)

// FuzzParse: no input makes Parse panic, and whatever it accepts is a valid
// record that survives a round trip.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"pid": 12, "start_time": 5, "transport": "stdio", "qemu": null}`))
	f.Add([]byte(`{"pid": 12, "qemu": {"pid": 13, "start_time": 1, "executable": "/q"}, "started": "2026-01-02T03:04:05+01:00"}`))
	f.Add([]byte(`{"pid": 1e3}`))
	f.Add([]byte(`{"pid": 12, "exe_identity": {"dev": 1, "inode": 2, "size": -1, "mtime_ns": 3}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := registry.Parse(b)
		if err != nil {
			return
		}
		if err := rec.Validate(); err != nil {
			t.Fatalf("Parse accepted an invalid record: %v", err)
		}
		out, err := registry.Marshal(rec)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", rec, err)
		}
		back, err := registry.Parse(out)
		if err != nil {
			t.Fatalf("re-Parse(%s): %v", out, err)
		}
		if back.PID != rec.PID || back.StartTime != rec.StartTime || back.Executable != rec.Executable ||
			!back.Started.Equal(rec.Started) || (back.QEMU == nil) != (rec.QEMU == nil) {
			t.Fatalf("round trip changed %+v into %+v", rec, back)
		}
	})
}
