// Package hostpath is the host-path policy: which host files a tool may
// have the server or QEMU read or write. Every path a tool takes (kernel,
// firmware, initrd, device tree, drives, capture files, debug symbols) goes
// through it, and so does the project root the paths are relative to.
//
// A file is allowed when its real path, after every symlink and "..", lies
// inside an allowed root: the project root and the server's captures
// directory (read and write), or, read-only, the server's own images, the
// firmware directories of Debian's QEMU, OpenSBI and U-Boot packages, and the
// directories the user adds (--allow-path, QEMU_MCP_ALLOW_PATHS). A project
// root must be the server's working directory, a directory below it, or a
// worktree of the same git repository, and is never "/". --allow-host-access
// (Policy.AllowAll) lifts all of it.
//
// The check is made on the file the server has opened, not on a name: Open
// opens the path, reads the real path of the open descriptor from
// /proc/self/fd, checks that, and returns the descriptor, which the caller
// hands on (QEMU gets /proc/self/fd/N). So no symlink swapped in after the
// check can redirect the use, and what was checked is what is used.
//
// Mounts are taken as the kernel presents them: a directory bind-mounted
// into the project is part of the project (only someone who can mount can
// make one). Writes are refused to a file with more than one hard link, one
// of which may lie outside the roots.
package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/lock"
)

// FirmwareDirs are the read-only roots of Debian's QEMU (its ROMs) and of
// each architecture's firmware packages.
var FirmwareDirs = func() []string {
	dirs := []string{"/usr/share/qemu"}
	for _, a := range archs.All() {
		for _, d := range a.QEMU().FirmwareDirs {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}()

// EnvAllowPaths names the variable with more read-only roots, separated by
// colons.
const EnvAllowPaths = "QEMU_MCP_ALLOW_PATHS"

// The rules a path can be allowed by.
const (
	RuleProject  = "project"
	RuleCaptures = "captures"
	RuleServer   = "server"
	RuleFirmware = "firmware"
	RuleAllowed  = "allow-path"
)

// hint is what every refusal says the user can do.
const hint = "put the file inside the project root, or start qemu-mcp with --allow-path DIR (read-only; or " + EnvAllowPaths + "), or --allow-host-access to lift this policy"

// Root is a directory files may be used from.
type Root struct {
	Dir      string // absolute, symlinks resolved
	Writable bool
	Rule     string
}

// Policy is the server's half of the rules: everything but the project.
type Policy struct {
	// AllowAll lifts the policy (--allow-host-access).
	AllowAll bool
	// WorkDir is the server's working directory: project roots must be
	// inside it, or in a worktree of its repository.
	WorkDir string
	// Captures is the directory the server writes captures and
	// transcripts to: readable and writable.
	Captures string
	// Images is the server's own read-only directory (the built-in kernel).
	Images string
	// ReadOnly are more read-only roots: FirmwareDirs and the allowed
	// paths.
	ReadOnly []string
}

// Scope is the policy for one project root.
type Scope struct {
	allowAll bool
	project  string
	roots    []Root
}

// Project returns the scope of the project root root, or an error naming
// the rule it breaks.
func (p Policy) Project(root string) (*Scope, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, &ProjectError{Root: root, Err: err}
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, &ProjectError{Root: root, Err: unwrap(err)}
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return nil, &ProjectError{Root: root, Err: errNotDir}
	}
	s := &Scope{allowAll: p.AllowAll, project: real}
	if !p.AllowAll {
		if err := p.checkProject(real); err != nil {
			return nil, &ProjectError{Root: root, Err: err, Refused: true}
		}
	}
	s.roots = append(s.roots, Root{Dir: real, Writable: true, Rule: RuleProject})
	add := func(dir string, writable bool, rule string) {
		if dir == "" {
			return
		}
		r, err := filepath.EvalSymlinks(dir)
		if errors.Is(err, fs.ErrNotExist) {
			// Not made yet (the server makes its own directories on
			// first use): a path that is no symlink now.
			r, err = filepath.Abs(dir)
		}
		if err == nil {
			s.roots = append(s.roots, Root{Dir: r, Writable: writable, Rule: rule})
		}
	}
	add(p.Captures, true, RuleCaptures)
	add(p.Images, false, RuleServer)
	for _, d := range p.ReadOnly {
		rule := RuleAllowed
		if slices.Contains(FirmwareDirs, d) {
			rule = RuleFirmware
		}
		add(d, false, rule)
	}
	return s, nil
}

// checkProject: the server's working directory tree, or a worktree of the
// same repository; never "/".
func (p Policy) checkProject(real string) error {
	if real == "/" {
		return errors.New(`"/" would make every host file a project file; start qemu-mcp in your project directory, or use --allow-host-access`)
	}
	wd, err := filepath.EvalSymlinks(p.WorkDir)
	if err != nil {
		return fmt.Errorf("server working directory %s: %w", p.WorkDir, unwrap(err))
	}
	if real == wd || within(real, wd) {
		return nil
	}
	if mine, err := lock.GitCommonDir(wd); err == nil {
		if theirs, err := lock.GitCommonDir(real); err == nil && theirs == mine {
			return nil
		}
	}
	return fmt.Errorf("it is neither the server's working directory %s (or below it) nor a worktree of its repository (rule %s); %s",
		wd, RuleProject, "start qemu-mcp in that project, or use --allow-host-access")
}

// Dir is the project root, symlinks resolved.
func (s *Scope) Dir() string { return s.project }

// Resolve makes a tool's path absolute: relative paths are relative to the
// project root.
func (s *Scope) Resolve(path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(s.project, path)
}

// checkArg refuses a path argument no file can have: empty, or with a
// NUL byte. what names the argument.
func checkArg(what, path string) error {
	if path == "" {
		return fmt.Errorf("%s: empty path", what)
	}
	if strings.ContainsRune(path, 0) {
		return fmt.Errorf("%s: the path contains a NUL byte", what)
	}
	return nil
}

// Open opens a regular file for reading (write false) or reading and
// writing, and checks the opened file's real path against the roots (a
// root must be writable for write). what names the argument in errors.
// The caller owns the returned file.
func (s *Scope) Open(what, path string, write bool) (*os.File, error) {
	if err := checkArg(what, path); err != nil {
		return nil, err
	}
	full := s.Resolve(path)
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	// O_NONBLOCK: a FIFO planted at the path must not block the open; it
	// is refused below as not a regular file.
	fd, err := unix.Open(full, flags|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if !filepath.IsAbs(path) {
			return nil, &RelativeError{What: what, Path: path, Err: err, Project: s.project}
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	f := os.NewFile(uintptr(fd), full)
	if err := s.check(what, path, f, write); err != nil {
		f.Close()
		return nil, err
	}
	// Back to blocking I/O for whoever reads the file in the server.
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return f, nil
}

func (s *Scope) check(what, path string, f *os.File, write bool) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s %s is not a regular file (%v)", what, path, fi.Mode().Type())
	}
	if s.allowAll {
		return nil
	}
	real, err := Real(f)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if write {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			return fmt.Errorf("%s %s is refused for writing: it has %d hard links, and another may lie outside the allowed directories; copy it", what, path, st.Nlink)
		}
	}
	r, ok := s.rootOf(real)
	switch {
	case !ok:
		return fmt.Errorf("%s %s is refused: %s is outside the project root %s and the other allowed directories (rule host-path); %s",
			what, path, describe(path, real), s.project, hint)
	case write && !r.Writable:
		return &ReadOnlyError{What: what, Path: path, Real: describe(path, real), Dir: r.Dir, Rule: r.Rule}
	}
	return nil
}

// describe names the real path, and says when a symlink led there.
func describe(path, real string) string {
	if filepath.Clean(path) == real {
		return "it"
	}
	return "it resolves to " + real
}

// rootOf finds the root that holds real.
func (s *Scope) rootOf(real string) (Root, bool) {
	for _, r := range s.roots {
		if real == r.Dir || within(real, r.Dir) {
			return r, true
		}
	}
	return Root{}, false
}

// Create makes a new file (it must not exist) in a writable root, for the
// server to write. The directory is opened and checked first and the file
// is created relative to it, not following a symlink, so nothing can
// redirect the creation.
func (s *Scope) Create(what, path string) (*os.File, error) {
	if path == "" || strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("%s: want a file name", what)
	}
	full := s.Resolve(path)
	dir, base := filepath.Split(full)
	if base == "" || base == "." || base == ".." {
		return nil, fmt.Errorf("%s %s: want a file name, not a directory", what, path)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s %s: directory: %w", what, path, err)
	}
	defer unix.Close(dfd)
	if !s.allowAll {
		realDir, err := readlinkFD(dfd)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, path, err)
		}
		r, ok := s.rootOf(realDir)
		if !ok || !r.Writable {
			return nil, fmt.Errorf("%s %s is refused: its directory %s is not inside the project root %s or the captures directory (rule host-path); write it there, or use --allow-host-access",
				what, path, realDir, s.project)
		}
	}
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%s %s exists already; not overwriting it", what, path)
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return os.NewFile(uintptr(fd), full), nil
}

// Real returns the real path of an open file, as the kernel names it.
func Real(f *os.File) (string, error) {
	return readlinkFD(int(f.Fd()))
}

func readlinkFD(fd int) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", fmt.Errorf("real path of an open file: %w", err)
	}
	if strings.HasSuffix(p, " (deleted)") {
		return "", errors.New("the file was deleted while it was opened")
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("the file has no path in this mount namespace (%s)", p)
	}
	return p, nil
}

// within reports whether path is strictly below dir; both are clean.
func within(path, dir string) bool {
	if dir == "/" {
		return path != "/" && strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, dir+"/")
}

func unwrap(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// AllowPaths splits QEMU_MCP_ALLOW_PATHS-style lists and checks that every
// entry is an absolute directory.
func AllowPaths(lists ...string) ([]string, error) {
	var out []string
	for _, l := range lists {
		for _, d := range strings.Split(l, ":") {
			if d == "" {
				continue
			}
			if !filepath.IsAbs(d) {
				return nil, fmt.Errorf("allowed path %q is not absolute", d)
			}
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				return nil, fmt.Errorf("allowed path %s is not a directory", d)
			}
			out = append(out, filepath.Clean(d))
		}
	}
	return out, nil
}

// maxShareEntries bounds the walk that looks for a .git in a writable
// directory.
const maxShareEntries = 500000

// OpenDir opens a directory to share with the guest, and checks the
// opened directory's real path like Open does a file's: inside a root,
// a writable one for write. A directory given for writing must hold no
// git repository's metadata (.git, a file or a directory, at any depth)
// and lie in none: hooks and config there run code on the host when git
// runs. The caller owns the returned directory.
func (s *Scope) OpenDir(what, path string, write bool) (*os.File, error) {
	if err := checkArg(what, path); err != nil {
		return nil, err
	}
	full := s.Resolve(path)
	fd, err := unix.Open(full, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s %s is not a directory: share a directory", what, path)
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	f := os.NewFile(uintptr(fd), full)
	fail := func(err error) (*os.File, error) {
		f.Close()
		return nil, err
	}
	real, err := Real(f)
	if err != nil {
		return fail(fmt.Errorf("%s %s: %w", what, path, err))
	}
	if !s.allowAll {
		r, ok := s.rootOf(real)
		switch {
		case !ok:
			return fail(fmt.Errorf("%s %s is refused: %s is outside the project root %s and the other allowed directories (rule host-path); %s",
				what, path, describe(path, real), s.project, hint))
		case write && !r.Writable:
			return fail(fmt.Errorf("%s %s is refused for writing: %s is in %s, which is read-only (rule %s); share it read-only, or share a directory of the project",
				what, path, describe(path, real), r.Dir, r.Rule))
		}
	}
	if write {
		if err := checkNoGit(real); err != nil {
			return fail(fmt.Errorf("%s %s is refused for writing: %w", what, path, err))
		}
	}
	return f, nil
}

// checkNoGit refuses a directory inside a git directory, or holding one.
func checkNoGit(dir string) error {
	const why = "a guest that writes there could change hooks or config that git runs on the host; share it read-only, or share a directory without one (a build or output directory)"
	for d := dir; ; d = filepath.Dir(d) {
		if filepath.Base(d) == ".git" {
			return fmt.Errorf("it lies in the git directory %s: %s", d, why)
		}
		if d == "/" || d == "." {
			break
		}
	}
	if common, err := lock.GitCommonDir(dir); err == nil {
		if real, err := filepath.EvalSymlinks(common); err == nil && (real == dir || within(dir, real)) {
			return fmt.Errorf("it lies in the repository's git directory %s: %s", real, why)
		}
	}
	n := 0
	var found string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // unreadable below: the guest cannot write it either
		}
		if d.Name() == ".git" && p != dir {
			found = p
			return filepath.SkipAll
		}
		if n++; n > maxShareEntries {
			return fmt.Errorf("it holds more than %d entries, too many to check for a .git", maxShareEntries)
		}
		return nil
	})
	if found != "" {
		return fmt.Errorf("it holds %s: %s", found, why)
	}
	return err
}

// ReadOnlyError is a file opened for writing in a directory the policy
// allows only reading from.
type ReadOnlyError struct {
	// What and Path are the file as asked for; Real says where it is.
	What, Path, Real string
	// Dir is the read-only directory, Rule the rule that allows it.
	Dir, Rule string
}

func (e *ReadOnlyError) Error() string {
	return fmt.Sprintf("%s %s is refused for writing: %s is in %s, which is read-only (rule %s)", e.What, e.Path, e.Real, e.Dir, e.Rule)
}

var errNotDir = errors.New("is not a directory")

// ProjectError is a project root that cannot be one.
type ProjectError struct {
	Root string
	Err  error
	// Refused says the policy refuses it (Err says by which rule).
	Refused bool
}

func (e *ProjectError) Error() string {
	switch {
	case e.Err == errNotDir:
		return fmt.Sprintf("project root %s %v", e.Root, e.Err)
	case e.Refused:
		return fmt.Sprintf("project root %s is refused: %v", e.Root, e.Err)
	}
	return fmt.Sprintf("project root %s: %v", e.Root, e.Err)
}

func (e *ProjectError) Unwrap() error { return e.Err }

// RelativeError is a path relative to the project root that cannot be
// opened there.
type RelativeError struct {
	What, Path string
	Err        error
	Project    string
}

func (e *RelativeError) Error() string {
	return fmt.Sprintf("%s %s: %v (relative paths are relative to the project root %s)", e.What, e.Path, e.Err, e.Project)
}

func (e *RelativeError) Unwrap() error { return e.Err }

// Advice names the project as the caller gives it.
func (e *ProjectError) Advice() advice.Advice {
	return advice.Advice{Action: advice.ProjectArgument, Keep: strings.TrimPrefix(e.Error(), "project root")}
}

// Advice says what relative paths are relative to.
func (e *RelativeError) Advice() advice.Advice {
	return advice.Advice{Action: advice.RelativeToProject, Keep: fmt.Sprintf("%s %s: %v", e.What, e.Path, e.Err), Name: e.Project}
}

// Advice is what a caller can do: attach the file read-only.
func (e *ReadOnlyError) Advice() advice.Advice { return advice.Advice{Action: advice.AttachReadOnly} }
