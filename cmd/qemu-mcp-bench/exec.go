package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

var (
	execRuns  = flag.Int("exec-runs", 100, "guest_exec and echo round trips on the Linux guest (0 skips, with the share figures)")
	shareRuns = flag.Int("share-runs", 3, "reads of the 64 MiB file, from the share and from the guest's RAM, alternating")
)

// execRows times guest_exec of true on the Linux guest against the echo
// round trip on the same console (serial_send echo, waiting for the echoed
// word and the prompt), and a 9p share's read throughput against the guest
// reading the same file from its own RAM (tmpfs).
func execRows(ctx context.Context, n, reads int) ([]row, error) {
	dir := linuxGuestDir("guest_exec and share figures")
	if dir == "" {
		return nil, nil
	}
	share, err := os.MkdirTemp("", "qmb-share")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(share)
	const size = 64 << 20
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(share, "big"), data, 0o644); err != nil {
		return nil, err
	}
	s, err := startServer(ctx, "-allow-path", dir, "-allow-path", share)
	if err != nil {
		return nil, err
	}
	defer s.close()
	const prompt = "qemu-mcp-linux# "
	var b struct {
		Matched bool `json:"matched"`
		Shares  []struct {
			Mount string `json:"mount"`
		} `json:"shares"`
	}
	if err := s.call(ctx, "qemu_boot", map[string]any{"kernel": filepath.Join(dir, "Image"), "initrd": filepath.Join(dir, "initramfs.cpio.gz"),
		"append": "console=ttyS0", "memory": "256M", "wait_for": prompt, "timeout": 120,
		"shares": []map[string]any{{"path": share, "tag": "bench"}}}, &b); err != nil || !b.Matched || len(b.Shares) != 1 {
		return nil, fmt.Errorf("boot: %v (matched %v)", err, b.Matched)
	}
	type execOut struct {
		ExitStatus *int    `json:"exit_status"`
		Output     string  `json:"output"`
		DurationMS float64 `json:"duration_ms"`
	}
	run := func(cmd string) (execOut, error) {
		var o execOut
		if err := s.call(ctx, "guest_exec", map[string]any{"command": cmd, "timeout": 120}, &o); err != nil {
			return o, err
		}
		if o.ExitStatus == nil || *o.ExitStatus != 0 {
			return o, fmt.Errorf("%s: %+v", cmd, o)
		}
		return o, nil
	}
	var echo, ex []time.Duration
	for i := range n + 10 {
		// Alternate, so that drifts of the machine hit both.
		tok := "e" + strconv.Itoa(i)
		var w struct {
			Matched bool `json:"matched"`
		}
		t := time.Now()
		if err := s.call(ctx, "serial_send", map[string]any{"data": "echo " + tok, "wait_for": tok + `\r\n` + prompt + "$", "timeout": 10}, &w); err != nil || !w.Matched {
			return nil, fmt.Errorf("echo %s: %v", tok, err)
		}
		d := time.Since(t)
		t = time.Now()
		if _, err := run("true"); err != nil {
			return nil, err
		}
		d2 := time.Since(t)
		if i >= 10 {
			echo, ex = append(echo, d), append(ex, d2)
		}
	}

	if _, err := run(b.Shares[0].Mount + " && cp /mnt/bench/big /tmp/big"); err != nil {
		return nil, err
	}
	var fromShare, fromRAM []float64
	for range reads {
		for _, src := range []string{"/mnt/bench/big", "/tmp/big"} {
			o, err := run("dd if=" + src + " of=/dev/null bs=1M")
			if err != nil {
				return nil, err
			}
			mbs := float64(size) / 1e6 / (o.DurationMS / 1000)
			if src == "/tmp/big" {
				fromRAM = append(fromRAM, mbs)
			} else {
				fromShare = append(fromShare, mbs)
			}
		}
	}
	sh, ram := medianF(fromShare), medianF(fromRAM)
	over := median(ex) - median(echo)
	return []row{
		{fmt.Sprintf("Linux guest: guest_exec of true, median of %d (raw: the echo round trip on the same console, serial_send echo waiting for the prompt, alternating)", n),
			ms(median(ex)), ms(median(echo)), "+" + ms(over), "<= +2 ms"},
		{fmt.Sprintf("Linux guest: read a 64 MiB file from a 9p share (dd bs=1M, msize 512000), median of %d (raw: the same file from the guest's RAM, tmpfs)", reads),
			rate(sh * 1e6), rate(ram * 1e6), fmt.Sprintf("%.0f%%", 100*sh/ram), ""},
	}, nil
}
