// Package settings makes a server's settings (its flags and environment)
// into the configuration of its guests and the security policies they run
// under, once, where the program starts: the MCP layer gets the guests'
// manager, not the settings.
package settings

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
)

// Settings are what a server is told by whoever starts it.
type Settings struct {
	// RuntimeDir holds the FIFOs and the QMP sockets; it must exist and be
	// private (see internal/runtimedir).
	RuntimeDir string
	// WorkDir is the default project root; empty means the working
	// directory.
	WorkDir string
	// Platforms are what each architecture's guests boot with, by its
	// name (package archs).
	Platforms map[string]instance.Platform
	// BuiltinKernel, BuiltinSymbols and QEMUBinary are the default
	// architecture's Platform (the server's -qemu flag), where Platforms
	// has none.
	BuiltinKernel  []byte
	BuiltinSymbols []byte
	QEMUBinary     string
	// Version, Transport ("stdio" or "http") and Address go into the
	// server's record.
	Version   string
	Transport string
	Address   string
	// LockFile overrides the repository lock path (see lock.Path).
	LockFile string
	// RingSize is the in-memory serial buffer; 0 means serial's default.
	RingSize int
	// AllowHostAccess lifts the boundary that keeps QMP and extra QEMU
	// options inside the guest (package boundary) and the host-path
	// policy (package hostpath).
	AllowHostAccess bool
	// MaxInstances bounds the guests that run at once; 0 means
	// instance.DefaultMaxInstances.
	MaxInstances int
	// AllowPaths are read-only directories added to the host-path policy.
	AllowPaths []string
	// Captures is where transcripts, captures and screenshots are kept;
	// empty means the runtime directory's. KeepCap bounds their total
	// size (0: kept.DefaultCap).
	Captures string
	KeepCap  int64
	// Snapshots and Recordings are the stores; empty means beside
	// Captures.
	Snapshots  string
	Recordings string
	// GDBTCP also serves gdbstubs on this loopback TCP address.
	GDBTCP string
	// CacheDir keeps what was probed of QEMU binaries; empty means
	// caps.DefaultCacheDir.
	CacheDir string
	Logger   *slog.Logger
}

// Guests is the configuration of the server's guests: the settings with
// every default filled in, the host-path policy and the host-access
// boundary.
func (s Settings) Guests() (instance.Config, error) {
	if s.WorkDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return instance.Config{}, fmt.Errorf("settings: working directory: %w", err)
		}
		s.WorkDir = wd
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	c, err := instance.Config{RuntimeDir: s.RuntimeDir, LockFile: s.LockFile,
		Transport: s.Transport, Address: s.Address, Version: s.Version,
		MaxInstances: s.MaxInstances, RingSize: s.RingSize, Logger: s.Logger,
		Captures: s.Captures, KeepCap: s.KeepCap, GDBTCP: s.GDBTCP, Snapshots: s.Snapshots, Recordings: s.Recordings,
		CacheDir: s.CacheDir, Platforms: s.platforms()}.Defaults()
	if err != nil {
		return instance.Config{}, err
	}
	c.HostPolicy = hostpath.Policy{
		AllowAll: s.AllowHostAccess, WorkDir: s.WorkDir,
		Captures: c.Captures, Images: instance.ImagesDir(c.RuntimeDir),
		ReadOnly: append(slices.Clone(hostpath.FirmwareDirs), s.AllowPaths...),
	}
	// The property types of the QEMU the server boots (asked of it when
	// a check first needs them, then cached) let device properties that
	// name no host resource pass.
	c.Boundary = boundary.Policy{AllowHostAccess: s.AllowHostAccess, CapturesDir: instance.QEMUFilesDir(c.Captures)}
	if !s.AllowHostAccess {
		c.Boundary.Props = caps.NewPropProber(caps.PropsConfig{CacheDir: c.CacheDir, Logger: s.Logger,
			Binary: c.Platforms[archs.Default().Name()].QEMU})
	}
	return c, nil
}

// platforms are s.Platforms with the default architecture's from the
// shorthand fields.
func (s Settings) platforms() map[string]instance.Platform {
	out := maps.Clone(s.Platforms)
	if out == nil {
		out = map[string]instance.Platform{}
	}
	def := archs.Default().Name()
	if _, ok := out[def]; !ok {
		out[def] = instance.Platform{QEMU: s.QEMUBinary, Kernel: s.BuiltinKernel, Symbols: s.BuiltinSymbols}
	}
	return out
}

// Manager makes the guests' configuration and policies now, and returns
// what makes their manager from it when the server first needs it (after
// answering initialize, so that the answer does not wait for it).
func (s Settings) Manager() (func() (*instance.Manager, error), error) {
	c, err := s.Guests()
	if err != nil {
		return nil, err
	}
	return func() (*instance.Manager, error) { return instance.New(c) }, nil
}
