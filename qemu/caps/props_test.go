package caps

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

func newPropProber(t *testing.T, bin, cache string, timeout time.Duration) *PropProber {
	t.Helper()
	return NewPropProber(PropsConfig{Binary: bin, CacheDir: cache, Timeout: timeout,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
}

// The property probe on the QEMU under test: what it learns, how long it
// takes, and that a second prober reads the cache and starts no QEMU.
func TestPropProbe(t *testing.T) {
	bin := testguest.QEMU(t)
	cache := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p := newPropProber(t, bin, cache, 0)
	classes := []string{"virtio-mmio", "virtio-pci", "virtio-device", "virtio-blk-device", "virtio-blk-pci", "loader",
		"no-such-class", "memory-backend-file"}
	start := time.Now()
	pt, err := p.PropertyTypes(ctx, classes...)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	tab := pt.(*propTable)
	t.Logf("QEMU %s: %d classes and %d enumeration values learnt in %v (QEMU's part %d ms)",
		tab.Version, len(tab.Classes), len(tab.Enums), took.Round(time.Millisecond), tab.Millis)
	if took > 5*time.Second {
		t.Errorf("the probe took %v", took)
	}
	if n := p.started.Load(); n != 1 {
		t.Errorf("%d QEMUs started, want 1", n)
	}
	checkRealTypes(t, pt)
	checkCacheAcrossProbers(t, ctx, bin, cache, p, classes)
}

// checkRealTypes checks what QEMU 7.2 and 11.1 both say of the classes
// TestPropProbe asks about.
func checkRealTypes(t *testing.T, pt boundary.PropertyTypes) {
	t.Helper()
	tab := pt.(*propTable)
	for _, tc := range []struct {
		class, prop, typ string
	}{
		{"virtio-mmio", "force-legacy", "bool"},
		{"virtio-pci", "page-per-vq", "bool"},
		{"virtio-blk-pci", "disable-legacy", "OnOffAuto"},
		{"virtio-pci", "romfile", "str"},
		{"virtio-device", "packed", "bool"},
		{"virtio-blk-device", "queue-size", "uint16"},
		{"virtio-blk-device", "drive", "str"},
		{"virtio-blk-pci", "romfile", "str"},
		{"loader", "file", "str"},
		{"loader", "addr", "uint64"},
	} {
		if typ, _, ok := pt.Type(tc.class, tc.prop); !ok || typ != tc.typ {
			t.Errorf("%s.%s: type %q (%v), want %s", tc.class, tc.prop, typ, ok, tc.typ)
		}
	}
	for c, want := range map[string]bool{"virtio-mmio": true, "virtio-pci": true, "virtio-device": true, "loader": true,
		"no-such-class": false, "memory-backend-file": false, "never-asked": false} {
		if pt.Class(c) != want {
			t.Errorf("Class(%s) = %v", c, !want)
		}
	}
	if !tab.Classes["virtio-pci"].Abstract || tab.Classes["virtio-mmio"].Abstract {
		t.Errorf("abstract: virtio-pci %v, virtio-mmio %v", tab.Classes["virtio-pci"].Abstract, tab.Classes["virtio-mmio"].Abstract)
	}
	if _, _, ok := pt.Type("virtio-pci", "realized"); ok {
		t.Error("QOM's realized is listed as a property")
	}
	for v, want := range map[string]bool{"auto": true, "on": true, "report": true, "/etc/passwd": false, "": false} {
		if pt.EnumValue(v) != want {
			t.Errorf("EnumValue(%q) = %v", v, !want)
		}
	}
}

// checkCacheAcrossProbers checks that p answers again from memory, that
// other probers (servers) on the same cache start no QEMU for what it
// knows and add to it, and that another path is another binary.
func checkCacheAcrossProbers(t *testing.T, ctx context.Context, bin, cache string, p *PropProber, classes []string) {
	t.Helper()
	// Asked again: memory.
	if _, err := p.PropertyTypes(ctx, "virtio-mmio", "no-such-class"); err != nil || p.started.Load() != 1 {
		t.Errorf("asked again: %v, %d QEMUs started", err, p.started.Load())
	}
	// Another prober (another server) reads the cache file.
	q := newPropProber(t, bin, cache, 0)
	start := time.Now()
	pt2, err := q.PropertyTypes(ctx, classes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("from the cache in %v", time.Since(start).Round(time.Microsecond))
	if n := q.started.Load(); n != 0 {
		t.Errorf("the second prober started %d QEMUs, want 0 (the cache answers)", n)
	}
	if typ, _, _ := pt2.Type("virtio-mmio", "force-legacy"); typ != "bool" || !pt2.EnumValue("auto") {
		t.Errorf("from the cache: force-legacy %q", typ)
	}
	// A class not asked about yet: one QEMU for it, and the cache keeps
	// both what was there and it.
	if pt3, err := q.PropertyTypes(ctx, "virtio-rng-pci"); err != nil || !pt3.Class("virtio-rng-pci") || !pt3.Class("loader") {
		t.Errorf("a new class: %v", err)
	}
	if n := q.started.Load(); n != 1 {
		t.Errorf("%d QEMUs for a new class, want 1", n)
	}
	r := newPropProber(t, bin, cache, 0)
	if pt4, err := r.PropertyTypes(ctx, "virtio-rng-pci", "virtio-mmio"); err != nil || !pt4.Class("virtio-rng-pci") || r.started.Load() != 0 {
		t.Errorf("the merged cache: %v, %d QEMUs", err, r.started.Load())
	}
	// A replaced binary is asked again.
	link := filepath.Join(t.TempDir(), "qemu")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	s := newPropProber(t, link, cache, 0)
	if _, err := s.PropertyTypes(ctx, "virtio-mmio"); err != nil {
		t.Fatal(err)
	}
	if s.started.Load() != 1 {
		t.Errorf("another path is another binary: %d QEMUs", s.started.Load())
	}
}

// QEMU 7.2 exits when asked about its 128-bit CPU (it refuses multi-threaded
// TCG for it): that class fails, saying so, and the others are still
// learnt, from a new QEMU.
func TestPropProbeQEMUDies(t *testing.T) {
	bin := testguest.QEMU(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p := newPropProber(t, bin, t.TempDir(), 0)
	_, err := p.PropertyTypes(ctx, "x-rv128-riscv-cpu", "virtio-mmio")
	if err == nil {
		t.Logf("this QEMU describes x-rv128-riscv-cpu (QEMU 11 does)")
		return
	}
	t.Logf("QEMU died: %v", err)
	if !strings.Contains(err.Error(), "x-rv128-riscv-cpu") || !strings.Contains(err.Error(), "QEMU exited") {
		t.Errorf("the error does not say which class killed QEMU: %v", err)
	}
	if n := p.started.Load(); n != 2 {
		t.Errorf("%d QEMUs started, want 2", n)
	}
	if pt, err := p.PropertyTypes(ctx, "virtio-mmio"); err != nil || !pt.Class("virtio-mmio") || p.started.Load() != 2 {
		t.Errorf("virtio-mmio after the death: %v", err)
	}
	// Not asked again at once.
	if _, err := p.PropertyTypes(ctx, "x-rv128-riscv-cpu"); err == nil || p.started.Load() != 2 {
		t.Errorf("asked again at once: %v, %d QEMUs", err, p.started.Load())
	}
}

// A binary that is no QEMU, or a QEMU that does not answer: the probe
// fails in bounded time, says why, and is not tried again at once.
func TestPropProbeFails(t *testing.T) {
	dir := t.TempDir()
	write := func(name, script string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctx := t.Context()
	p := newPropProber(t, write("broken", "echo 'no such machine here' >&2; exit 1"), "", 0)
	_, err := p.PropertyTypes(ctx, "virtio-mmio")
	if err == nil || !strings.Contains(err.Error(), "no such machine here") {
		t.Errorf("broken binary: %v", err)
	}
	if _, err2 := p.PropertyTypes(ctx, "virtio-mmio"); err2 == nil || p.started.Load() != 1 {
		t.Errorf("tried again at once: %v, %d starts", err2, p.started.Load())
	}

	h := newPropProber(t, write("hung", "exec sleep 30"), "", 300*time.Millisecond)
	start := time.Now()
	_, err = h.PropertyTypes(ctx, "virtio-mmio")
	if err == nil || !strings.Contains(err.Error(), "no answer within") || time.Since(start) > 3*time.Second {
		t.Errorf("hung binary: %v after %v", err, time.Since(start))
	}

	m := newPropProber(t, filepath.Join(dir, "missing"), "", 0)
	if _, err := m.PropertyTypes(ctx, "virtio-mmio"); err == nil || m.started.Load() != 0 {
		t.Errorf("missing binary: %v", err)
	}
}
