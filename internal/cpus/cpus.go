// Package cpus decides how many CPUs the server's own goroutines run on:
// what the guests' virtual CPUs leave. Each running guest's vCPU thread
// (TCG) keeps a host CPU busy, and the server is an I/O multiplexer whose
// latency comes from wake-ups: with a scheduler P idle, every goroutine
// made ready (the console's drain woken by a byte, a waiting call woken by
// the drain) has the Go runtime wake a second thread to spin looking for
// work, on the CPU the emulator's I/O thread needs. Measured on two CPUs
// with one guest: GOMAXPROCS 1 took the server's CPU time per echo round
// trip from 0.77-0.88 ms to 0.48-0.57 ms and its context switches from 20
// to 12, and the echo 55-105 us closer to its ceiling.
package cpus

import (
	"os"
	"runtime"
	"sync"
)

var (
	mu    sync.Mutex
	fixed = func() bool { _, ok := os.LookupEnv("GOMAXPROCS"); return ok }()
	guest int // vCPUs of the guests that run
	// base is the runtime's own choice (CPUs, affinity, cgroup quota) as
	// it was when the first of the running guests started.
	base int
)

// Add counts n more vCPUs running (a guest's QEMU started, or n < 0: one
// ended) and sets GOMAXPROCS to the CPUs they leave, at least one. Once no
// guest runs, the runtime's default is back, and with it the runtime's own
// updates when the machine's CPUs or the cgroup's quota change (setting
// GOMAXPROCS turns them off). A GOMAXPROCS in the environment is the
// user's choice and is kept.
func Add(n int) {
	mu.Lock()
	defer mu.Unlock()
	was := guest
	guest = max(0, guest+n)
	if fixed || guest == was {
		return
	}
	if guest == 0 {
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	if was == 0 {
		base = runtime.GOMAXPROCS(0) // the default, while no guest ran
	}
	if want := max(1, base-guest); runtime.GOMAXPROCS(0) != want {
		runtime.GOMAXPROCS(want)
	}
}
