package timetravel

import (
	"bytes"
	"os"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// An aarch64 guest records and replays as the server runs them (its
// board, -cpu and the record's flags, typing paced by the echo): the
// replay prints what the recording printed, up to the recording's last
// instruction.
func TestRecordReplayAarch64(t *testing.T) {
	t.Parallel()
	ctx, r := newRig(t)
	r.guest = func(t *testing.T) qemu.Config {
		kernel, _, bin := testguest.ArchTiny(t, arm64.Arch)
		return qemu.NewConfig(qemu.WithArch(arm64.Arch), qemu.WithBinary(bin), qemu.WithKernel(kernel))
	}
	g := r.record(ctx, "arm")
	g.echo(t, ctx, "typed four bytes at a time")
	g.echo(t, ctx, "and again")
	meta := g.stop(t, ctx)
	printed, err := os.ReadFile(meta.Console())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(printed, []byte("and again\r\n")) {
		t.Fatalf("the recording printed %q", printed)
	}

	p := r.replay(ctx, meta, false)
	rep := p.rep
	if rep.End() != meta.Instructions-1 {
		t.Errorf("replays to %d, want %d", rep.End(), meta.Instructions-1)
	}
	mid := rep.End() / 2
	p.runTo(t, ctx, mid)
	rep.Sync()
	if got := p.shows(); !bytes.HasPrefix(printed, got) {
		t.Errorf("at %d the console shows %q, not the start of the recording's %q", mid, got, printed)
	}
	p.runTo(t, ctx, rep.End())
	rep.Sync()
	if got := p.shows(); !bytes.Equal(got, printed) {
		t.Errorf("at the end the console shows %q, want the recording's %q", got, printed)
	}
}
