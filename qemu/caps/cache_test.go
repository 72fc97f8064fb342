package caps

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeQEMU writes a shell script that stands in for a QEMU binary: it
// answers --version as QEMU 99.1.0 (after versionDelay), and otherwise runs
// body. Every start appends its PID and arguments to the log returned.
func fakeQEMU(t *testing.T, versionDelay, body string) (bin, log string) {
	t.Helper()
	dir := t.TempDir()
	bin, log = filepath.Join(dir, "qemu-system-riscv64"), filepath.Join(dir, "starts.log")
	script := fmt.Sprintf("#!/bin/sh\necho \"$$ $*\" >> %s\n"+
		"if [ \"$1\" = --version ]; then sleep %s; echo 'QEMU emulator version 99.1.0'; exit 0; fi\n%s\n", log, versionDelay, body)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

// cannotBoot is a fake QEMU's body that fails at once, as a QEMU that
// cannot run the guest does.
const cannotBoot = "echo 'qemu-system-riscv64: fake: cannot run a guest' >&2; exit 1"

// startsOf are the lines of log whose arguments contain arg.
func startsOf(t *testing.T, log, arg string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if _, args, _ := strings.Cut(l, " "); l != "" && strings.Contains(args, arg) {
			out = append(out, l)
		}
	}
	return out
}

// fakeProber is a Prober whose probes boot kernel (nil: no kernel).
func fakeProber(t *testing.T, cache string, kernel []byte, timeout time.Duration) *Prober {
	t.Helper()
	p := New(Config{CacheDir: cache, WorkDir: t.TempDir(), Owner: "test", Kernel: kernel, Timeout: timeout,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))})
	t.Cleanup(p.Close)
	return p
}

// cacheFileOf is where the answers for bin are cached: one file per binary
// path under qemu-caps/ (a format that other servers of other versions
// read, so spelled out here rather than taken from the code).
func cacheFileOf(dir, bin string) string {
	sum := sha256.Sum256([]byte(bin))
	return filepath.Join(dir, "qemu-caps", hex.EncodeToString(sum[:])[:16]+".json")
}

// writeCached writes answers for bin as a server of probe version v
// would have cached them.
func writeCached(t *testing.T, dir, bin string, v int) { writeCachedAt(t, dir, bin, v, time.Now()) }

// writeCachedAt is writeCached of answers probed at probed.
func writeCachedAt(t *testing.T, dir, bin string, v int, probed time.Time) {
	t.Helper()
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	f := cacheFileOf(dir, bin)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		t.Fatal(err)
	}
	cached := fmt.Sprintf(`{"binary": %q, "size": %d, "mtime": %q, "version": "99.1.0", "probed_at": %q,
		"probe_version": %d, "timer_kept": {"answer": "yes", "detail": "cached", "ms": 12},
		"in_place_load": {"answer": "no", "detail": "cached", "ms": 12}, "replay_checkpoint": {"answer": "failed", "ms": 3}}`,
		bin, fi.Size(), fi.ModTime().UTC().Format(time.RFC3339Nano), probed.UTC().Format(time.RFC3339Nano), v)
	if err := os.WriteFile(f, []byte(cached), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Answers in the cache file are taken as they are: no QEMU runs (this
// Prober has no kernel, so a probe could not even start), and the
// process-wide Known and TimerKept see them.
func TestCachedAnswersNeedNoProbe(t *testing.T) {
	bin, log := fakeQEMU(t, "0", cannotBoot)
	cache := t.TempDir()
	writeCached(t, cache, bin, probeVersion)
	if TimerKept(bin) {
		t.Fatal("TimerKept before any Prober read the cache")
	}
	p := fakeProber(t, cache, nil, 0)
	st, c, err := p.Status(bin)
	if st != Probed || err != nil || c == nil {
		t.Fatalf("Status with a cache file: %s, %v, %v", st, c, err)
	}
	got, err := p.Probe(t.Context(), bin)
	if err != nil {
		t.Fatal(err)
	}
	if got.TimerKept.Answer != Yes || got.InPlaceLoad.Answer != No || got.ReplayCheckpoint.Answer != Failed || got.Version != "99.1.0" {
		t.Errorf("answers from the cache: %+v", got)
	}
	if k, ok := Known(bin); !ok || k.TimerKept.Detail != "cached" || !TimerKept(bin) {
		t.Errorf("Known after the cache was read: %v %v, TimerKept %v", k, ok, TimerKept(bin))
	}
	if s := startsOf(t, log, ""); len(s) != 0 {
		t.Errorf("QEMU ran although the cache answered: %q", s)
	}
}

// A cache file that does not hold this binary's answers as this version
// probes them, or holds an answer the probe could not decide an hour ago,
// is ignored, and the binary probed again: the answers are then cached
// for the binary as it is now.
func TestCacheIgnoredAndReprobed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, cache, bin string)
	}{
		{"corrupt", func(t *testing.T, cache, bin string) {
			if err := os.WriteFile(cacheFileOf(cache, bin), []byte(`{"binary": "`+bin+`", "timer_k`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"older probe version", func(t *testing.T, cache, bin string) { writeCached(t, cache, bin, probeVersion-1) }},
		{"failed long ago", func(t *testing.T, cache, bin string) {
			writeCachedAt(t, cache, bin, probeVersion, time.Now().Add(-failedAge-time.Minute))
		}},
		{"newer probe version", func(t *testing.T, cache, bin string) { writeCached(t, cache, bin, probeVersion+1) }},
		{"binary rewritten", func(t *testing.T, cache, bin string) {
			f, err := os.OpenFile(bin, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(f, "# a new build")
			f.Close()
		}},
		{"binary touched", func(t *testing.T, cache, bin string) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(bin, later, later); err != nil {
				t.Fatal(err)
			}
		}},
		{"another binary's answers", func(t *testing.T, cache, bin string) {
			b, _ := os.ReadFile(cacheFileOf(cache, bin))
			other := strings.Replace(string(b), strconv.Quote(bin), strconv.Quote(bin+"-other"), 1)
			if err := os.WriteFile(cacheFileOf(cache, bin), []byte(other), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, log := fakeQEMU(t, "0", cannotBoot)
			cache := t.TempDir()
			writeCached(t, cache, bin, probeVersion)
			tc.spoil(t, cache, bin)
			p := fakeProber(t, cache, []byte("kernel"), 0)
			if st, c, err := p.Status(bin); st != NotProbed || c != nil || err != nil {
				t.Fatalf("Status: %s, %+v, %v", st, c, err)
			}
			c, err := p.Probe(t.Context(), bin)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(startsOf(t, log, "--version")); n != 1 {
				t.Errorf("QEMU asked for its version %d times, want 1 (one probe)", n)
			}
			// The fake QEMU boots nothing: each answer says so, in
			// QEMU's words.
			for name, r := range map[string]Result{"timer_kept": c.TimerKept, "in_place_load": c.InPlaceLoad} {
				if r.Answer != Failed || !strings.Contains(r.Detail, "fake: cannot run a guest") {
					t.Errorf("%s from a QEMU that cannot boot: %+v", name, r)
				}
			}
			if c.ReplayCheckpoint.Answer != Failed {
				t.Errorf("replay_checkpoint from a QEMU that cannot boot: %+v", c.ReplayCheckpoint)
			}
			var cached Caps
			b, err := os.ReadFile(cacheFileOf(cache, bin))
			if err == nil {
				err = json.Unmarshal(b, &cached)
			}
			k, _ := KeyOf(bin)
			if err != nil || !k.matches(&cached) || cached.TimerKept != c.TimerKept {
				t.Errorf("the cache after probing again: %v %s", err, b)
			}
		})
	}
}

// Servers that start together, and the callers within one, probe a new
// binary once: one Prober's callers share its probe, and another Prober on
// the same cache waits for it (the cache's lock) and reads its answers.
func TestConcurrentFirstUseProbesOnce(t *testing.T) {
	// The version answer is slow, so that everyone asks while the first
	// probe runs.
	bin, log := fakeQEMU(t, "0.5", cannotBoot)
	cache := t.TempDir()
	p, q := fakeProber(t, cache, []byte("kernel"), 0), fakeProber(t, cache, []byte("kernel"), 0)
	probeAtOnce(t, bin, log, p, q, p, q, p, q)

	// Without a cache file, the callers of one Prober share its probe.
	bin, log = fakeQEMU(t, "0.5", cannotBoot)
	r := fakeProber(t, "", []byte("kernel"), 0)
	probeAtOnce(t, bin, log, r, r, r, r)
}

// probeAtOnce probes bin through each of probers at once and checks that
// QEMU was probed once and everyone got its answers.
func probeAtOnce(t *testing.T, bin, log string, probers ...*Prober) {
	t.Helper()
	var wg sync.WaitGroup
	answers := make([]*Caps, len(probers))
	for i, p := range probers {
		wg.Go(func() {
			c, err := p.Probe(t.Context(), bin)
			if err != nil {
				t.Error(err)
			}
			answers[i] = c
		})
	}
	wg.Wait()
	if s := startsOf(t, log, "--version"); len(s) != 1 {
		t.Errorf("%d probes of one binary, want 1: %q", len(s), s)
	}
	for i, c := range answers {
		if c == nil || !c.Probed.Equal(answers[0].Probed) {
			t.Errorf("caller %d got other answers: %+v", i, c)
		}
	}
}

// Close stops a probe in progress: its QEMU is killed, its files go, and
// nothing is recorded or cached as failed (the binary is not probed, as
// far as the next server knows).
func TestCloseStopsProbe(t *testing.T) {
	bin, log := fakeQEMU(t, "0", "exec sleep 30")
	cache := t.TempDir()
	p := fakeProber(t, cache, []byte("kernel"), 0)
	done := p.Start(bin)
	var boot []string
	for deadline := time.Now().Add(20 * time.Second); len(boot) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		boot = startsOf(t, log, "-kernel")
	}
	if len(boot) != 1 {
		t.Fatalf("the probe's QEMU did not start: %q", startsOf(t, log, ""))
	}
	if st, _, _ := p.Status(bin); st != Probing {
		t.Errorf("Status while the probe runs: %s", st)
	}
	start := time.Now()
	p.Close()
	<-done
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Close took %v (the fake QEMU sleeps 30 s)", took)
	}
	pid, _ := strconv.Atoi(strings.Fields(boot[0])[0])
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("the probe's QEMU (pid %d) outlived Close: %v", pid, err)
	}
	if st, c, err := p.Status(bin); st != NotProbed || c != nil || err != nil {
		t.Errorf("Status after Close: %s, %+v, %v", st, c, err)
	}
	if _, err := os.Stat(cacheFileOf(cache, bin)); !os.IsNotExist(err) {
		t.Errorf("a stopped probe was cached: %v", err)
	}
	if ents, _ := os.ReadDir(p.cfg.WorkDir); len(ents) != 0 {
		t.Errorf("left in the work directory: %v", ents)
	}
	if _, err := p.Probe(t.Context(), bin); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Probe after Close: %v", err)
	}
}

// A QEMU that never answers does not hang the probe: each probe gives up
// at the timeout and says so.
func TestProbeTimesOut(t *testing.T) {
	bin, _ := fakeQEMU(t, "0", "exec sleep 30")
	p := fakeProber(t, t.TempDir(), []byte("kernel"), 300*time.Millisecond)
	start := time.Now()
	c, err := p.Probe(t.Context(), bin)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the probe of a hung QEMU took %v (it sleeps 30 s)", took)
	}
	for name, r := range map[string]Result{"timer_kept": c.TimerKept, "in_place_load": c.InPlaceLoad} {
		if r.Answer != Failed || !strings.Contains(r.Detail, "no answer within 300ms") || r.Millis < 300 {
			t.Errorf("%s of a hung QEMU: %+v", name, r)
		}
	}
	if c.ReplayCheckpoint.Answer != Failed {
		t.Errorf("replay_checkpoint of a hung QEMU: %+v", c.ReplayCheckpoint)
	}
}

// A probe that cannot run says why, through Probe and Status, caches
// nothing, and is tried again on the next Start.
func TestProbeErrors(t *testing.T) {
	bin, log := fakeQEMU(t, "0", cannotBoot)
	cache := t.TempDir()
	p := fakeProber(t, cache, nil, 0)
	_, err := p.Probe(t.Context(), bin)
	if err == nil || !strings.Contains(err.Error(), "no kernel to boot") {
		t.Errorf("Probe without a kernel: %v", err)
	}
	if st, _, serr := p.Status(bin); st != NotProbed || serr == nil || serr.Error() != err.Error() {
		t.Errorf("Status after the failure: %s, %v", st, serr)
	}
	if _, err := os.Stat(cacheFileOf(cache, bin)); !os.IsNotExist(err) {
		t.Errorf("a failed probe was cached: %v", err)
	}
	p.cfg.Kernel = []byte("kernel")
	if _, err := p.Probe(t.Context(), bin); err != nil {
		t.Errorf("probing again: %v", err)
	}
	if n := len(startsOf(t, log, "--version")); n != 1 {
		t.Errorf("%d probes that ran QEMU, want 1", n)
	}

	missing := filepath.Join(t.TempDir(), "qemu-system-riscv64")
	if _, err := p.Probe(t.Context(), missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Probe of a missing binary: %v", err)
	}
	if st, _, err := p.Status(missing); st != NotProbed || err == nil {
		t.Errorf("Status of a missing binary: %s, %v", st, err)
	}
	if TimerKept(missing) {
		t.Error("TimerKept of a missing binary")
	}
}

// A binary is its path (a symlink's own: the link to a new QEMU is a new
// binary), size and modification time.
func TestKeyOf(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("qemu 1"), 0o755)
	os.WriteFile(b, []byte("qemu 2.0"), 0o755)
	link := filepath.Join(dir, "qemu")
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	k1, err := KeyOf("qemu")
	if err != nil || k1.Path != link || k1.Size != 6 {
		t.Fatalf("KeyOf(qemu) = %+v, %v", k1, err)
	}
	os.Remove(link)
	os.Symlink(b, link)
	k2, _ := KeyOf(link)
	if k2 == k1 || k2.Size != 8 {
		t.Errorf("the link to another QEMU: %+v, before %+v", k2, k1)
	}
	if _, err := KeyOf(filepath.Join(dir, "none")); err == nil {
		t.Error("KeyOf of a missing file")
	}
}

// The cache file is replaced whole: a reader sees the old answers or the
// new, never a part, even one that opened the file before the write; it is
// private to the user, and a write that fails leaves the old file and no
// temporary one.
func TestWriteJSONAtomic(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "qemu-caps", "x.json")
	if err := writeJSONAtomic(f, map[string]string{"v": "old"}); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(f)
	reader, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := writeJSONAtomic(f, map[string]string{"v": strings.Repeat("new", 1000)}); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(reader); string(b) != string(old) {
		t.Errorf("a reader of the old file read %.60q", b)
	}
	var v map[string]string
	if b, err := os.ReadFile(f); err != nil || json.Unmarshal(b, &v) != nil || len(v["v"]) != 3000 {
		t.Errorf("the new file: %v %.40q", err, b)
	}
	fi, err := os.Stat(f)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the cache file: %v, %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(f)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the cache directory: %v, %v", fi.Mode(), err)
	}

	// A value that is no JSON, and a directory where the file goes.
	before, _ := os.ReadFile(f)
	if err := writeJSONAtomic(f, map[string]any{"v": make(chan int)}); err == nil {
		t.Error("writing a channel succeeded")
	}
	if after, _ := os.ReadFile(f); string(after) != string(before) {
		t.Error("a failed write changed the file")
	}
	blocked := filepath.Join(dir, "qemu-caps", "blocked.json")
	if err := os.MkdirAll(filepath.Join(blocked, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSONAtomic(blocked, v); err == nil {
		t.Error("writing over a directory succeeded")
	}
	ents, _ := os.ReadDir(filepath.Dir(f))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// The cache directory: $QEMU_MCP_CACHE, else $XDG_CACHE_HOME/qemu-mcp,
// else ~/.cache/qemu-mcp.
func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("HOME", "/home/someone")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	t.Setenv(CacheEnv, "/explicit")
	if d := DefaultCacheDir(); d != "/explicit" {
		t.Errorf("with %s: %s", CacheEnv, d)
	}
	t.Setenv(CacheEnv, "")
	if d := DefaultCacheDir(); d != "/xdg/qemu-mcp" {
		t.Errorf("with XDG_CACHE_HOME: %s", d)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	if d := DefaultCacheDir(); d != "/home/someone/.cache/qemu-mcp" {
		t.Errorf("with HOME only: %s", d)
	}
}
