package boundary

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkCapture refuses command's writing path unless checkCapturePath
// finds it inside capturesDir.
func checkCapture(command, path, capturesDir string) *refusal {
	if why := checkCapturePath(path, capturesDir); why != "" {
		return refuse(RuleCapturesOnly, "%s writes a host file: %s", command, why)
	}
	return nil
}

// checkCapturePath reports why QEMU must not create or truncate path, or ""
// if path is a file inside capturesDir. QEMU opens such paths with
// O_CREAT|O_TRUNC, following symlinks, relative to its own working directory.
func checkCapturePath(path, capturesDir string) string {
	if capturesDir == "" {
		return "it writes a host file and no captures directory is configured"
	}
	want := fmt.Sprintf("the file must be an absolute path inside the captures directory %s", capturesDir)
	switch {
	case path == "":
		return "no file name; " + want
	case strings.ContainsRune(path, 0):
		return "the file name contains a NUL byte"
	case !strings.HasPrefix(path, "/"):
		return fmt.Sprintf("%q is relative to QEMU's working directory; %s", path, want)
	}
	for _, elem := range strings.Split(path, "/") {
		if elem == ".." {
			return fmt.Sprintf("%q contains \"..\"; %s", path, want)
		}
	}
	root, err := filepath.Abs(capturesDir)
	if err != nil {
		return fmt.Sprintf("captures directory %s: %v", capturesDir, err)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return fmt.Sprintf("captures directory %s: %v", capturesDir, err)
	}
	clean := filepath.Clean(path)
	if !within(clean, root) && !within(clean, realRoot) {
		return fmt.Sprintf("%q is outside the captures directory; %s", path, want)
	}
	dir, base := filepath.Split(clean)
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Sprintf("%q: directory %s: %v", path, dir, unwrapPathError(err))
	}
	if realDir != realRoot && !within(realDir, realRoot) {
		return fmt.Sprintf("%q resolves to %s, outside the captures directory (symlink); %s", path, filepath.Join(realDir, base), want)
	}
	target := filepath.Join(realDir, base)
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ""
	case err != nil:
		return fmt.Sprintf("%q: %v", path, unwrapPathError(err))
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Sprintf("%q is a symlink; QEMU would write through it", path)
	}
	// QEMU opens with O_TRUNC: an existing file would be overwritten.
	return fmt.Sprintf("%q exists; QEMU would overwrite it: give a new file name", path)
}

// within reports whether path is strictly below dir; both are clean.
func within(path, dir string) bool {
	if dir == "/" {
		return path != "/" && strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, dir+"/") && len(path) > len(dir)+1
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
