package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
)

var archName = flag.String("arch", "riscv64", "the guests' architecture; given, only its boot, echo and Linux restores are measured (-qemu and -kernel default to its QEMU and tiny kernel)")

var (
	// guestArch is the architecture of -arch: of the tiny kernel, the
	// Linux guest and the QEMU measured.
	guestArch = archs.Default()
	// archOnly says -arch was given: only archRows are measured, so that
	// the architectures' figures compare row by row.
	archOnly bool
)

// setGuestArch resolves -arch, and gives -qemu and -kernel that
// architecture's defaults where they were not set.
func setGuestArch() error {
	a, err := archs.Lookup(*archName)
	if err != nil {
		return err
	}
	guestArch = a
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	archOnly = set["arch"]
	if a.Name() == archs.Default().Name() {
		return nil
	}
	if !set["qemu"] {
		*qemuBin = a.QEMU().Binary
	}
	if !set["kernel"] {
		*kernel = tinyKernel(a)
	}
	return nil
}

// tinyKernel is the file of a's built-in tiny kernel: its flat image
// where there is one, else its ELF (x86_64's, booted through its PVH note).
func tinyKernel(a arch.Arch) string {
	base := filepath.Join("testdata", "images", "tiny-"+a.Name())
	if _, err := os.Stat(base + ".bin"); err == nil {
		return base + ".bin"
	}
	return base + ".elf"
}

// withArch adds -arch to a qemu_boot's arguments, where it is not the
// default a boot without a kernel gets.
func withArch(args map[string]any) map[string]any {
	if guestArch.Name() != archs.Default().Name() {
		args["arch"] = guestArch.Name()
	}
	return args
}

// archRows are the figures of one architecture beside riscv64's targets:
// the tiny kernel's boot to its banner and echo round trip, each beside
// QEMU alone with the server's options, and the Linux guest's cold boot
// and restores (when it is built).
func archRows(ctx context.Context, fail func(string, error)) ([]row, error) {
	fmt.Fprintf(os.Stderr, "bench: %s guests on %s (tiny kernel %s)\n", guestArch.Name(), *qemuBin, *kernel)
	if err := learnServerOptions(ctx); err != nil {
		return nil, fmt.Errorf("the server's QEMU options: %w", err)
	}
	rows, _ := echoRows(ctx, fail)
	raw, err := rawBoot(*boots)
	if err != nil {
		return nil, fmt.Errorf("raw boot: %w", err)
	}
	ours, err := mcpBoot(ctx, *boots)
	if err != nil {
		return nil, fmt.Errorf("mcp boot: %w", err)
	}
	rows = append(rows, row{fmt.Sprintf("boot to banner, median of %d", *boots), ms(median(ours)), ms(median(raw)),
		"+" + ms(median(ours)-median(raw)), "<= +30 ms"})
	if *snapRuns > 0 {
		srows, err := snapshotRows(ctx, *snapRuns)
		if err != nil {
			return nil, fmt.Errorf("snapshots: %w", err)
		}
		rows = append(rows, srows...)
	}
	for i := range rows {
		rows[i].name = guestArch.Name() + ": " + rows[i].name
	}
	return rows, nil
}
