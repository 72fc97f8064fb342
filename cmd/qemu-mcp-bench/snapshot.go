package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qmp"
)

var snapRuns = flag.Int("snapshot-runs", 5, "cold boots, restores and boots from a snapshot of the Linux guest (0 skips)")

// snapshotRows times the Linux guest to its prompt answering a command:
// a cold boot, a restore of a snapshot saved at the prompt, and a boot of
// a new instance from that snapshot; with the snapshots' sizes.
func snapshotRows(ctx context.Context, n int) ([]row, error) {
	s, dir, err := linuxServer(ctx, "snapshot times")
	if s == nil {
		return nil, err
	}
	defer s.close()
	const prompt = "qemu-mcp-linux# "
	args := map[string]any{"kernel": filepath.Join(dir, "Image"), "initrd": filepath.Join(dir, "initramfs.cpio.gz"),
		"append": "console=" + guestArch.QEMU().Console, "memory": "256M", "wait_for": prompt, "timeout": 120, "restart": true}
	answer := func() error {
		var w struct {
			Matched bool `json:"matched"`
		}
		if err := s.call(ctx, "serial_send", map[string]any{"data": "true", "wait_for": prompt, "timeout": 30}, &w); err != nil {
			return err
		}
		if !w.Matched {
			return fmt.Errorf("the guest did not answer")
		}
		return nil
	}
	var cold, restore, restoreAnswer, fromSnap []time.Duration
	var b struct {
		Matched bool `json:"matched"`
	}
	for range n + 1 {
		t := time.Now()
		if err := s.call(ctx, "qemu_boot", args, &b); err != nil || !b.Matched {
			return nil, fmt.Errorf("cold boot: %v (matched %v)", err, b.Matched)
		}
		cold = append(cold, time.Since(t))
		if err := answer(); err != nil {
			return nil, err
		}
	}
	var si struct {
		Size int64 `json:"size"`
	}
	t := time.Now()
	if err := s.call(ctx, "qemu_snapshot_save", map[string]any{"name": "bench"}, &si); err != nil {
		return nil, err
	}
	save := time.Since(t)
	inPlace := true
	for range n + 1 {
		var lo struct {
			InPlace bool `json:"in_place"`
		}
		t := time.Now()
		if err := s.call(ctx, "qemu_snapshot_load", map[string]any{"name": "bench"}, &lo); err != nil {
			return nil, err
		}
		restore = append(restore, time.Since(t))
		inPlace = inPlace && lo.InPlace
		if err := answer(); err != nil {
			return nil, err
		}
		restoreAnswer = append(restoreAnswer, time.Since(t))
	}
	for range n + 1 {
		t := time.Now()
		if err := s.call(ctx, "qemu_boot", map[string]any{"snapshot": "bench", "restart": true}, nil); err != nil {
			return nil, err
		}
		if err := answer(); err != nil {
			return nil, err
		}
		fromSnap = append(fromSnap, time.Since(t))
	}
	cold, restore, restoreAnswer, fromSnap = cold[1:], restore[1:], restoreAnswer[1:], fromSnap[1:]
	raw, err := rawRestores(ctx, dir, n, inPlace)
	if err != nil {
		return nil, fmt.Errorf("raw restores: %w", err)
	}
	pct := func(a, b time.Duration) string { return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b)) }
	// In place (QEMU 11) the state loads into the running QEMU; elsewhere
	// a new QEMU starts from it.
	how, target, rawHow := "a new QEMU", "<= 25% of the cold boot", "-loadvm of an HMP savevm in a new QEMU"
	if inPlace {
		how, target, rawHow = "in place", "<= 10% of the cold boot", "HMP loadvm into the running QEMU"
	}
	return []row{
		{fmt.Sprintf("Linux guest: cold qemu_boot to its prompt, median of %d", n), ms(median(cold)), "-", "-", ""},
		{fmt.Sprintf("Linux guest: qemu_snapshot_load of a snapshot at the prompt (%s), median of %d (raw: the cold boot)", how, n),
			ms(median(restore)), ms(median(cold)), pct(median(restore), median(cold)), target},
		{fmt.Sprintf("Linux guest: the same restore until the restored guest has answered a command, median of %d (raw: QEMU alone, %s, until it answers)", n, rawHow),
			ms(median(restoreAnswer)), ms(median(raw)), ratio(median(restoreAnswer), median(raw)), ""},
		{fmt.Sprintf("Linux guest: qemu_boot from the snapshot until it has answered a command, median of %d (raw: the cold boot)", n),
			ms(median(fromSnap)), ms(median(cold)), pct(median(fromSnap), median(cold)), "faster than the cold boot"},
		{"Linux guest (256 MiB) at its prompt: qemu_snapshot_save, and the snapshot's size on disk", ms(save), mib(si.Size), "-", ""},
	}, nil
}

// rawRestores is the ceiling: QEMU alone (no server), an HMP savevm at
// the prompt loaded n times, each until the guest answers: with inPlace
// by HMP loadvm into the running QEMU, else by a new QEMU's -loadvm from
// its start.
func rawRestores(ctx context.Context, dir string, n int, inPlace bool) ([]time.Duration, error) {
	tmp, err := os.MkdirTemp("", "qmrs")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	img := filepath.Join(tmp, "vm.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "64M").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img: %v: %s", err, out)
	}
	sock := filepath.Join(tmp, "q.sock")
	linux := []string{"-m", "256M", "-kernel", filepath.Join(dir, "Image"), "-initrd", filepath.Join(dir, "initramfs.cpio.gz"),
		"-append", "console=" + guestArch.QEMU().Console, "-qmp", "unix:" + sock + ",server=on,wait=off",
		"-blockdev", "driver=qcow2,node-name=snap,file.driver=file,file.filename=" + img}
	const prompt = "qemu-mcp-linux# "
	q, err := startRaw(linux...)
	if err != nil {
		return nil, err
	}
	if _, err := q.readUntil(prompt); err != nil {
		q.close()
		return nil, err
	}
	mon := qmp.New(sock)
	if err := mon.ConnectContext(ctx); err != nil {
		q.close()
		return nil, err
	}
	_, err = mon.Execute(ctx, "human-monitor-command", map[string]any{"command-line": "savevm base"})
	if err != nil {
		mon.Disconnect()
		q.close()
		return nil, err
	}
	if inPlace {
		defer q.close()
		defer mon.Disconnect()
		return rawLoadsInPlace(ctx, q, mon, n)
	}
	mon.Disconnect()
	q.close()
	var ds []time.Duration
	for range n + 1 {
		os.Remove(sock)
		t := time.Now()
		q, err := startRaw(append(linux, "-loadvm", "base")...)
		if err != nil {
			return nil, err
		}
		if _, err := q.type_("true\r"); err != nil {
			q.close()
			return nil, err
		}
		_, err = q.readUntil("true\r\n" + prompt)
		ds = append(ds, time.Since(t))
		q.close()
		if err != nil {
			return nil, err
		}
	}
	return ds[1:], nil
}

// rawLoadsInPlace loads the snapshot "base" into the running raw QEMU n
// times (after one for warm-up), each until the guest answers a command.
func rawLoadsInPlace(ctx context.Context, q *rawQEMU, mon *qmp.Monitor, n int) ([]time.Duration, error) {
	const prompt = "qemu-mcp-linux# "
	var ds []time.Duration
	for range n + 1 {
		t := time.Now()
		raw, err := mon.Execute(ctx, "human-monitor-command", map[string]any{"command-line": "loadvm base"})
		if err != nil {
			return nil, err
		}
		if out := strings.TrimSpace(string(raw)); out != `""` {
			return nil, fmt.Errorf("loadvm: %s", out)
		}
		if _, err := q.type_("true\r"); err != nil {
			return nil, err
		}
		if got, err := q.readUntil("true\r\n" + prompt); err != nil {
			return nil, fmt.Errorf("%w (the guest printed %q)", err, got[max(0, len(got)-200):])
		}
		ds = append(ds, time.Since(t))
	}
	return ds[1:], nil
}
