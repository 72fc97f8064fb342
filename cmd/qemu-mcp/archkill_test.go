package main

import (
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/mcptest"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// A server SIGKILLed with a guest of another architecture than riscv64
// leaves nothing that blocks: its QEMU goes within 2 s, and the next
// server's reaper removes its record, FIFOs and socket before that
// server boots the same architecture again.
func TestKilledServerOtherArch(t *testing.T) {
	for _, a := range archs.All()[1:] {
		t.Run(a.Name(), func(t *testing.T) {
			q := testguest.ArchQEMU(t, a)
			dir := runtimeDir(t)
			boot := func(s *server) bootWithReap {
				t.Helper()
				var b bootWithReap
				res := s.call(t, "qemu_boot", map[string]any{"arch": a.Name(), "wait_for": `tiny> $`, "timeout": 30}, &b)
				if res.IsError || !b.Matched {
					t.Fatalf("boot %s: %s", a.Name(), mcptest.Text(res))
				}
				return b
			}
			cmd := serverCmd(dir, "-qemu", a.Name()+"="+q)
			cmd.Dir = t.TempDir()
			s := startServerCmd(t, cmd, cmd.Env)
			b := boot(s)
			info, err := proc.Stat(b.PID)
			if err != nil {
				t.Fatal(err)
			}
			s.cmd.Process.Kill()
			<-s.done
			dead := s.cmd.Process.Pid
			waitGone(t, proc.Identity{PID: info.PID, StartTime: info.StartTime}, 2*time.Second)

			cmd = serverCmd(dir, "-qemu", a.Name()+"="+q)
			cmd.Dir = t.TempDir()
			s2 := startServerCmd(t, cmd, cmd.Env)
			b = boot(s2)
			if b.Reaped == nil || len(b.Reaped.DeadServers) != 1 || b.Reaped.DeadServers[0] != dead || len(b.Reaped.Removed) == 0 {
				t.Errorf("reaped %+v, want the killed server %d and its files", b.Reaped, dead)
			}
			assertNoEntriesOf(t, dir, dead)
			s2.call(t, "qemu_shutdown", nil, nil)
		})
	}
}
