package lock

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// EnvLockFile names the variable that overrides the lock file's path.
const EnvLockFile = "QEMU_MCP_LOCK_FILE"

// FileName is the lock file's name in the git common dir: the original
// server and its scripts use the same name, so they exclude each other.
const FileName = ".qemu.lock"

// ProjectFileName is the name of the lock of a project outside git, in the
// runtime dir: one per project root (by the hash of its real path), so that
// projects that are not git checkouts do not exclude each other.
func ProjectFileName(projectRoot string) string {
	abs, err := filepath.Abs(projectRoot)
	if err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
	}
	sum := sha256.Sum256([]byte(abs))
	return "qemu-" + hex.EncodeToString(sum[:8]) + ".lock"
}

// ErrNotRepo means no directory from the given one up to the root is inside a
// git repository.
var ErrNotRepo = errors.New("not inside a git repository")

// Path returns the lock file for projectRoot: $QEMU_MCP_LOCK_FILE if set,
// else .qemu.lock in the repository's git common dir, so that every worktree
// of one repository shares one lock (they share the disk images it
// protects), else a lock of the project's own in runtimeDir
// (ProjectFileName).
func Path(projectRoot, runtimeDir string) (string, error) {
	if p := os.Getenv(EnvLockFile); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("resolve %s=%s: %w", EnvLockFile, p, err)
		}
		return abs, nil
	}
	common, err := GitCommonDir(projectRoot)
	switch {
	case err == nil:
		return filepath.Join(common, FileName), nil
	case errors.Is(err, ErrNotRepo):
		if runtimeDir == "" {
			return "", fmt.Errorf("choose a QEMU lock file: %s is not in a git repository and no runtime dir was given (set %s)", projectRoot, EnvLockFile)
		}
		return filepath.Join(runtimeDir, ProjectFileName(projectRoot)), nil
	default:
		return "", fmt.Errorf("choose a QEMU lock file for %s: %w (or set %s to a lock file path)", projectRoot, err, EnvLockFile)
	}
}

// GitCommonDir returns the git common dir of the repository containing dir,
// the way git finds it but without running git: the nearest .git at or above
// dir is the git dir (a directory) or names it (a "gitdir: <path>" file, as in
// worktrees and submodules), and a commondir file in the git dir, when there
// is one, names the common dir shared by the main worktree and all linked
// ones. The result is absolute with symlinks resolved, so every worktree of a
// repository yields the same string. Outside a repository the error wraps
// ErrNotRepo.
func GitCommonDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("find git repository of %s: %w", dir, err)
	}
	for d := abs; ; {
		dotGit := filepath.Join(d, ".git")
		fi, err := os.Stat(dotGit)
		if err == nil {
			gitDir, err := resolveGitDir(dotGit, fi)
			if err != nil {
				return "", err
			}
			return commonDir(gitDir)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("find git repository of %s: %w", dir, err)
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("find git repository of %s: %w", abs, ErrNotRepo)
		}
		d = parent
	}
}

// resolveGitDir turns the .git found in a work tree into the git dir.
func resolveGitDir(dotGit string, fi fs.FileInfo) (string, error) {
	if fi.IsDir() {
		return dotGit, nil
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is neither a directory nor a gitdir file", dotGit)
	}
	f, err := os.Open(dotGit)
	if err != nil {
		return "", fmt.Errorf("read gitdir file: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read gitdir file %s: %w", dotGit, err)
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(line), "gitdir:")
	p = strings.TrimSpace(p)
	if !ok || p == "" {
		return "", fmt.Errorf("%s is a file but does not start with \"gitdir: <path>\"; is it a broken worktree or submodule?", dotGit)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(filepath.Dir(dotGit), p)
	}
	if err := isDir(p); err != nil {
		return "", fmt.Errorf("%s points to %s: %w (was the repository moved? try: git worktree repair)", dotGit, p, err)
	}
	return p, nil
}

// commonDir follows gitDir/commondir, present in linked worktrees' git dirs.
func commonDir(gitDir string) (string, error) {
	// Resolve symlinks before joining a relative commondir: ".." must go up
	// from where the git dir really is, as it does for git.
	real, err := filepath.EvalSymlinks(gitDir)
	if err != nil {
		return "", fmt.Errorf("resolve git dir %s: %w", gitDir, err)
	}
	b, err := os.ReadFile(filepath.Join(real, "commondir"))
	if errors.Is(err, fs.ErrNotExist) {
		return real, nil
	}
	if err != nil {
		return "", fmt.Errorf("read commondir of git dir %s: %w", real, err)
	}
	p := strings.TrimSpace(string(b))
	if p == "" {
		return "", fmt.Errorf("%s is empty; is the worktree broken? try: git worktree repair", filepath.Join(real, "commondir"))
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(real, p)
	}
	common, err := filepath.EvalSymlinks(p)
	if err == nil {
		err = isDir(common)
	}
	if err != nil {
		return "", fmt.Errorf("git common dir %s named by %s: %w", p, filepath.Join(real, "commondir"), err)
	}
	return common, nil
}

func isDir(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}
