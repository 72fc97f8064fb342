package kept_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/kept"
)

func TestEnforce(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	mk := func(name string, size int, age time.Duration) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, now.Add(-age), now.Add(-age))
		return p
	}
	oldest := mk("a", 100, 4*time.Hour)
	inUse := mk("b", 100, 3*time.Hour)
	older := mk("c", 100, 2*time.Hour)
	newest := mk("d", 100, time.Hour)
	removed, err := kept.Enforce(dir, 250, 0, func(p string) bool { return p == inUse })
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 || removed[0].Path != oldest || removed[1].Path != older {
		t.Errorf("removed %+v, want the oldest two not in use", removed)
	}
	for _, p := range []string{inUse, newest} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// Bytes kept elsewhere (snapshots) count: with 100 of them, the
	// newest file goes too, the one in use stays.
	removed, _ = kept.Enforce(dir, 250, 100, func(p string) bool { return p == inUse })
	if len(removed) != 1 || removed[0].Path != newest {
		t.Errorf("removed %+v with 100 bytes kept elsewhere, want the newest", removed)
	}
	mk("d", 100, time.Hour)
	// Files in use may keep the total above the cap: nothing else to do.
	removed, _ = kept.Enforce(dir, 10, 0, func(string) bool { return true })
	if len(removed) != 0 {
		t.Errorf("removed files in use: %+v", removed)
	}
	files, _ := kept.List(dir)
	if kept.Total(files) != 200 {
		t.Errorf("total %d", kept.Total(files))
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "512M": 512 << 20, "2G": 2 << 30, "2GiB": 2 << 30, "1.5k": 1536, "1T": 1 << 40} {
		if got, err := kept.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1G", "G", "1X", "1e300G"} {
		if _, err := kept.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}
