// Package kept is what the server keeps after a guest is gone: console
// transcripts, packet captures and screenshots (later, snapshots). They live
// in a state directory, not on the runtime directory's tmpfs, and under a
// total size cap: when the files pass it, the oldest go first, and never a
// file still in use (the current boot's transcript, a running capture).
package kept

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
)

// Env names the variable that overrides the state directory.
const Env = "QEMU_MCP_STATE_DIR"

// DefaultCap is the total size kept by default.
const DefaultCap = 2 << 30

// Dir returns the state directory: $QEMU_MCP_STATE_DIR, else
// $XDG_STATE_HOME/qemu-mcp, else ~/.local/state/qemu-mcp, else (no home)
// the runtime directory. It does not create it.
func Dir(runtimeDir string) string {
	if d := os.Getenv(Env); d != "" {
		return filepath.Clean(d)
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "qemu-mcp")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		return filepath.Join(h, ".local", "state", "qemu-mcp")
	}
	return runtimeDir
}

// Ensure creates the state directory and its captures directory, private to
// this user (the same checks as the runtime directory's).
func Ensure(dir string) error {
	if err := runtimedir.Ensure(dir); err != nil {
		return fmt.Errorf("state dir: %w (set %s to a directory you own)", err, Env)
	}
	if err := os.MkdirAll(Captures(dir), 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	return nil
}

// Captures is where transcripts, captures and screenshots go.
func Captures(dir string) string { return runtimedir.CapturesDir(dir) }

// Snapshots is where saved guest states go (package snapshot), beside
// captures: they count towards the cap but are never removed for it.
func Snapshots(captures string) string { return filepath.Join(filepath.Dir(captures), "snapshots") }

// Recordings is where deterministic recordings of guests go (package
// recording), beside captures: they count towards the cap and are never
// removed for it (their checkpoints, a cache, are).
func Recordings(captures string) string {
	return filepath.Join(filepath.Dir(captures), "recordings")
}

// File is one kept file.
type File struct {
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

// List returns the regular files in dir, oldest first.
func List(dir string) ([]File, error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kept files: %w", err)
	}
	out := make([]File, 0, len(des))
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, File{Path: filepath.Join(dir, de.Name()), Size: fi.Size(), ModTime: fi.ModTime()})
	}
	slices.SortFunc(out, func(a, b File) int { return a.ModTime.Compare(b.ModTime) })
	return out, nil
}

// Total is the size of files.
func Total(files []File) int64 {
	var n int64
	for _, f := range files {
		n += f.Size
	}
	return n
}

// Enforce removes the oldest files of dir until they and other (bytes
// kept elsewhere that are never removed for the cap, such as snapshots)
// fit in limit, skipping those inUse says are still written or read. It
// returns what it removed; files in use can keep the total above the cap
// (one boot's transcript is never cut).
func Enforce(dir string, limit, other int64, inUse func(path string) bool) ([]File, error) {
	files, err := List(dir)
	if err != nil {
		return nil, err
	}
	total := Total(files) + other
	var removed []File
	var errs []error
	for _, f := range files {
		if total <= limit {
			break
		}
		if inUse(f.Path) {
			continue
		}
		if err := os.Remove(f.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		total -= f.Size
		removed = append(removed, f)
	}
	return removed, errors.Join(errs...)
}

// ParseSize reads a size such as 512M, 2G or 1048576 (bytes).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n <= 0 || n*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("size %q: want a positive size such as 512M or 2G", s)
	}
	return int64(n * float64(mult)), nil
}
