package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"time"

	qemumcp "github.com/qemu-mcp/qemu-mcp"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
)

// probeCmd is `qemu-mcp probe`: what the QEMU binary can do with a guest's
// saved state (package qemu/caps), from the cache or probed now.
func probeCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("qemu-mcp probe", stderr,
		fmt.Sprintf("usage: qemu-mcp probe [flags]\n\nSays what the QEMU binary does with a guest's saved state (probed on the architecture's built-in kernel once per binary, then cached in %s).\n", caps.DefaultCacheDir()))
	var (
		bin    = fs.String("qemu", qemu.DefaultBinary, "qemu-system-riscv64 binary to probe, or ARCH=PATH another architecture's (aarch64=qemu-system-aarch64)")
		asJSON = fs.Bool("json", false, "print JSON")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	name, b, err := qemuFlag(*bin)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp probe: %v\n", err)
		return 2
	}
	a, _ := archs.Lookup(name)
	path, err := exec.LookPath(b)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp probe: %v\n", err)
		return 1
	}
	dir := runtimedir.Path()
	if err := runtimedir.Ensure(dir); err != nil {
		fmt.Fprintf(stderr, "qemu-mcp probe: %v\n", err)
		return 1
	}
	p := caps.New(caps.Config{CacheDir: caps.DefaultCacheDir(), WorkDir: dir, Arch: a, Kernel: qemumcp.Tiny(a.Name()).Kernel,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := p.Probe(ctx, path)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp probe: %s: %v\n", path, err)
		return 1
	}
	if *asJSON {
		b, _ := json.MarshalIndent(c, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	fmt.Fprintf(stdout, "%s: QEMU %s (probed %s)\n", c.Binary, c.Version, c.Probed.Format(time.RFC3339))
	for _, r := range []struct {
		name string
		r    caps.Result
	}{{"timer kept by a load", c.TimerKept}, {"in-place load", c.InPlaceLoad}, {"replay checkpoint", c.ReplayCheckpoint}} {
		fmt.Fprintf(stdout, "  %-21s %-6s %s\n", r.name, r.r.Answer, r.r.Detail)
	}
	return 0
}
