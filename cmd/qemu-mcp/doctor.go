package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/qemu-mcp/qemu-mcp/doctor"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/lock"
)

// doctorCmd lists what servers recorded about themselves and reaps what dead
// ones left. It never looks for processes by name: only registry records,
// verified by PID, start time and executable, are acted upon.
func doctorCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("qemu-mcp doctor", stderr,
		"usage: qemu-mcp doctor [flags]\n\nLists qemu-mcp servers of this user, their QEMU, leftovers of dead servers and the repository lock.\n")
	var (
		cleanup   = fs.Bool("cleanup", false, "reap what dead servers left: their FIFOs, sockets, records and surviving QEMU")
		terminate = fs.Bool("terminate-orphans", false, "send SIGTERM to live stdio servers whose client is gone (verified records only)")
		asJSON    = fs.Bool("json", false, "print one JSON document instead of text")
		root      = fs.String("project-root", ".", "project whose repository lock to show")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dir := runtimedir.Path()
	if _, err := os.Lstat(dir); err == nil {
		if err := runtimedir.Ensure(dir); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp doctor: %v\n", err)
			return 1
		}
	}
	opts := doctor.Options{
		Kept:             kept.Captures(kept.Dir(dir)),
		Snapshots:        kept.Snapshots(kept.Captures(kept.Dir(dir))),
		Recordings:       kept.Recordings(kept.Captures(kept.Dir(dir))),
		Cleanup:          *cleanup,
		TerminateOrphans: *terminate,
		JSON:             *asJSON,
		DeleteTAP:        instance.DeleteTAP,
		Logger:           slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Lock: func() (string, error) {
			path, err := lock.Path(*root, dir)
			if err != nil {
				return "", err
			}
			st, err := lock.Inspect(path)
			if err != nil {
				return "", err
			}
			return st.String(), nil
		},
	}
	if err := doctor.Run(dir, stdout, opts); err != nil {
		fmt.Fprintf(stderr, "qemu-mcp doctor: %v\n", err)
		return 1
	}
	return 0
}
