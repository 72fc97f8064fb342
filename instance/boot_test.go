package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/lock"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// A boot that fails right after any one of its steps leaves nothing
// behind: no QEMU, no lock, no drive claim, no record, nothing in the
// runtime directory; what the guest printed stays in its transcript; and
// the name boots again at once. The steps run in their order and each
// runs once.
func TestBootFailsAfterEachStep(t *testing.T) {
	t.Parallel()
	for k, step := range bootSteps() {
		t.Run(strings.ReplaceAll(step.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			failAfterStep(t, k, step.name)
		})
	}
}

var errInjected = errors.New("injected failure")

func failAfterStep(t *testing.T, k int, name string) {
	ctx := testContext(t)
	lockFile := filepath.Join(t.TempDir(), "qemu-mcp.lock")
	var ran []string
	m := newManager(t, lockFile)
	m.steps = func(steps []bootStep) []bootStep {
		out := make([]bootStep, len(steps))
		for n, s := range steps {
			out[n] = bootStep{s.name, func(b *booting, ctx context.Context) error {
				ran = append(ran, s.name)
				if err := s.do(b, ctx); err != nil {
					return err
				}
				if n == k {
					return fmt.Errorf("%s: %w", s.name, errInjected)
				}
				return nil
			}}
		}
		return out
	}
	root := t.TempDir()
	spec := tinySpec(t, "a", root, qemu.WithDrive(qemu.Drive{Path: rawDisk(t, root)}))
	spec.Debug = &DebugSpec{Symbols: tinySymbols(t)}

	i, _, err := m.Boot(ctx, spec)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), name) {
		t.Fatalf("a boot failing after %q: %v", name, err)
	}
	if i != nil {
		t.Errorf("a failed boot returned an instance")
	}
	if want := bootSteps()[:k+1]; len(ran) != len(want) || ran[k] != name {
		t.Errorf("steps run: %v", ran)
	}
	got, err := m.Get("a")
	if err != nil || got.State() != Stopped {
		t.Fatalf("the failed instance: %v %v", got, err)
	}
	if mch := got.Process(); mch != nil {
		if l, _, err := proc.Check(mch.Identity()); err != nil || l == proc.Alive {
			t.Errorf("QEMU pid %d: %v %v", mch.PID(), l, err)
		}
	}
	if _, held := m.locks.holds(lockFile); held {
		t.Errorf("the repository lock is still held")
	}
	if st, _ := lock.Inspect(lockFile); st.State != lock.Absent {
		t.Errorf("the lock file: %v", st)
	}
	if release, err := m.claimDrives("probe", spec.QEMU.Drives); err != nil {
		t.Errorf("the drive is still claimed: %v", err)
	} else {
		release()
	}
	if len(m.Record().Instances) != 0 {
		t.Errorf("the record names %+v", m.Record().Instances)
	}
	if left := runtimeLeft(t, m); len(left) > 0 {
		t.Errorf("the runtime directory holds %v", left)
	}
	if tr := got.Transcript(); tr != "" {
		if _, err := os.Stat(tr); err != nil {
			t.Errorf("the transcript: %v", err)
		}
	}
	// The name boots again, the drive and lock free.
	m.steps = nil
	i, _, err = m.Boot(ctx, spec2(t, root, spec))
	if err != nil {
		t.Fatalf("boot again after the failure: %v", err)
	}
	if _, err := i.Stop(ctx, qemu.Kill, time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// spec2 is spec again, with fresh symbols (a boot's are closed with it).
func spec2(t *testing.T, root string, spec Spec) Spec {
	s := tinySpec(t, "a", root, qemu.WithDrive(spec.QEMU.Drives[0]))
	s.Debug = &DebugSpec{Symbols: tinySymbols(t)}
	return s
}

// tinySymbols opens the tiny kernel's ELF.
func tinySymbols(t *testing.T) *debuginfo.File {
	t.Helper()
	path := filepath.Join(testguest.Repo(), "testdata", "images", "tiny.elf")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	df, err := debuginfo.OpenKernel(f, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return df
}
