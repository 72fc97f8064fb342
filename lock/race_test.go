package lock

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// Many servers racing for one lock, released at the same instant: exactly
// one wins and holds it, and every other one is told that winner holds it.
// The stale rounds are the hard case (each racer judges the old record stale
// and wants to rename its own inode in); the free rounds check the plain
// path. Several rounds give a broken design several chances to show.
func TestAcquireRace(t *testing.T) {
	const racers = 20
	dead := deadIdentity(t)
	for round, stale := range []bool{true, true, true, true, true, false, false} {
		t.Run(fmt.Sprintf("round%d-stale=%v", round, stale), func(t *testing.T) {
			path := lockPath(t)
			var old uint64
			if stale {
				h := startHelper(t, "hold", []string{
					helperPathEnv + "=" + path,
					helperRecEnv + "=" + fmt.Sprintf("pid=%d\ntarget=/old\nstart_time=%d\n", dead.PID, dead.StartTime),
				})
				h.expect("locked")
				old = inode(t, path)
			}
			winner, cs := race(t, path, racers)
			rec := readRecordFile(t, path)
			if rec.PID != winner.pid {
				t.Errorf("lock file names %d, winner is %d", rec.PID, winner.pid)
			}
			if stale && inode(t, path) == old {
				t.Error("stale inode still at the path")
			}
			if st, err := Inspect(path); err != nil || st.State != Held || st.Record.PID != winner.pid || st.Liveness != proc.Alive {
				t.Errorf("Inspect = %v, %v", st, err)
			}
			for _, c := range cs {
				c.stop()
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("winner's Release left the lock file: %v", err)
			}
		})
	}
}

// race starts racers acquirers of path at one instant and checks that
// exactly one wins and every other is told that winner holds the lock.
// The winner holds it until the racers are stopped.
func race(t *testing.T, path string, racers int) (*child, []*child) {
	t.Helper()
	gateR, gateW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer gateW.Close()
	cs := make([]*child, racers)
	for i := range cs {
		cs[i] = startHelper(t, "acquire", []string{helperPathEnv + "=" + path, helperGateEnv + "=1"}, gateR)
	}
	gateR.Close()
	for _, c := range cs {
		c.expect("ready")
	}
	gateW.Close() // go

	var winner *child
	heldBy := map[*child]int{}
	for _, c := range cs {
		l := c.line()
		word, arg, _ := strings.Cut(l, " ")
		n, _ := strconv.Atoi(arg)
		switch word {
		case "locked":
			if winner != nil {
				t.Fatalf("two winners: %d and %d", winner.pid, c.pid)
			}
			winner = c
		case "held":
			heldBy[c] = n
		default:
			t.Fatalf("racer %d: %q", c.pid, l)
		}
	}
	if winner == nil {
		t.Fatalf("no winner; holders reported: %v", heldBy)
	}
	for c, pid := range heldBy {
		if pid != winner.pid {
			t.Errorf("racer %d was told the holder is %d, but %d won", c.pid, pid, winner.pid)
		}
	}
	return winner, cs
}
