package reaper_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/registrytest"
	"golang.org/x/sys/unix"
)

// unusedPIDs returns n PIDs no process has now, checked one by one in /proc
// by number (no name is looked at). They are taken downwards from the last
// PID handed out, which the kernel allocates upwards: they stay free until
// the PID space wraps around, far beyond what the test starts meanwhile.
func unusedPIDs(tb testing.TB, n int) []int {
	tb.Helper()
	last := lastPID(tb)
	var pids []int
	add := func(from, to int) {
		for pid := from; pid > to && len(pids) < n; pid-- {
			if _, err := proc.Stat(pid); errors.Is(err, proc.ErrNotFound) {
				pids = append(pids, pid)
			}
		}
	}
	add(last-1, 1)
	// Just after a wrap-around there are few below: take the top of the
	// range then, well above what the test will hand out next.
	add(pidMax()-1, last+5000)
	if len(pids) < n {
		tb.Skipf("only %d unused PIDs", len(pids))
	}
	return pids
}

func pidMax() int {
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return v
		}
	}
	return 32768
}

// lastPID is the PID the kernel handed out last.
func lastPID(tb testing.TB) int {
	tb.Helper()
	if b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return v
		}
	}
	return registrytest.DeadProcess(tb).PID
}

// populate makes, for every PID, the two FIFOs, a bound socket and a record
// of a dead server: 4 entries each.
func populate(tb testing.TB, dir string, pids []int) {
	tb.Helper()
	for _, pid := range pids {
		for _, k := range []names.Kind{names.SerialIn, names.SerialOut} {
			if err := unix.Mkfifo(filepath.Join(dir, names.Name(k, names.Owner{PID: pid}, "")), 0o600); err != nil {
				tb.Fatal(err)
			}
		}
		if err := registrytest.MakeSocket(filepath.Join(dir, names.Name(names.QMPSocket, names.Owner{PID: pid}, ""))); err != nil {
			tb.Fatal(err)
		}
		b, err := registry.Marshal(registry.Record{PID: pid, StartTime: 1, Executable: "/usr/bin/qemu-mcp", Transport: "stdio"})
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(registry.Path(dir, names.Owner{PID: pid}), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
}

const staleServers = 2500 // × 4 entries = 10,000

func TestReap10000(t *testing.T) {
	dir := runtimeDir(t)
	// Plus a live server, whose entries must stay.
	live := registrytest.StartSleep(t, 30)
	pids := unusedPIDs(t, staleServers)
	populate(t, dir, pids)
	rec := registrytest.RecordOf(t, live, "stdio")
	livePaths := serverFiles(t, dir, live.ID.PID, &rec)
	start := time.Now()
	rep, err := reaper.Reap(dir, reaper.Options{})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reaped %d entries of %d dead servers in %v", len(rep.Removed), len(rep.DeadServers), elapsed)
	if len(rep.Removed) != 4*staleServers || len(rep.DeadServers) != staleServers || len(rep.Errors) != 0 || len(rep.Skipped) != 0 {
		t.Fatalf("report: %s", rep.String())
	}
	assertKept(t, livePaths...)
	des, err := os.ReadDir(dir)
	if err != nil || len(des) != len(livePaths) {
		t.Fatalf("%d entries left, want %d (%v)", len(des), len(livePaths), err)
	}
}

func BenchmarkReap10000(b *testing.B) {
	pids := unusedPIDs(b, staleServers)
	root := b.TempDir()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		populate(b, dir, pids)
		b.StartTimer()
		rep, err := reaper.Reap(dir, reaper.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Removed) != 4*staleServers {
			b.Fatalf("removed %d", len(rep.Removed))
		}
	}
	b.ReportMetric(float64(4*staleServers), "entries/op")
}
