package cpus

import (
	"runtime"
	"testing"
)

// The server's goroutines get the CPUs the running guests leave, never
// fewer than one, and all of them again once the guests end.
func TestAddLeavesGuestsTheirCPUs(t *testing.T) {
	if fixed {
		t.Skip("GOMAXPROCS is set in the environment: the user's choice is kept, nothing to test")
	}
	base := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		mu.Lock()
		guest = 0
		mu.Unlock()
		runtime.SetDefaultGOMAXPROCS()
	})
	Add(1)
	if got, want := runtime.GOMAXPROCS(0), max(1, base-1); got != want {
		t.Fatalf("one vCPU running on %d CPUs: GOMAXPROCS %d, want %d", base, got, want)
	}
	Add(base + 3)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("more vCPUs than CPUs: GOMAXPROCS %d, want 1", got)
	}
	Add(-(base + 4))
	if got := runtime.GOMAXPROCS(0); got != base {
		t.Fatalf("every guest ended: GOMAXPROCS %d, want the default %d", got, base)
	}
	Add(-1) // an undo run twice must not leave a negative count behind
	Add(1)
	if got, want := runtime.GOMAXPROCS(0), max(1, base-1); got != want {
		t.Fatalf("after a surplus end, one vCPU: GOMAXPROCS %d, want %d", got, want)
	}
}
