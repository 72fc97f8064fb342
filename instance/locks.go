package instance

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/lock"
)

// repoLocks are the repository locks the server's guests hold: one lock a
// repository, shared by every guest of it, released with the last.
type repoLocks struct {
	log        *slog.Logger
	lockFile   string // Config.LockFile
	runtimeDir string

	mu     sync.Mutex
	byPath map[string]*lockRef
}

type lockRef struct {
	l     *lock.Lock
	users []string // instance names, in boot order
}

// path is the repository lock for a project root.
func (l *repoLocks) path(root string) (string, error) {
	if l.lockFile != "" {
		return l.lockFile, nil
	}
	return lock.Path(root, l.runtimeDir)
}

// acquire adds instance name to the holders of root's repository lock,
// taking the lock if no instance holds it yet. The returned function undoes
// that.
func (l *repoLocks) acquire(root, name string) (string, func() error, error) {
	path, err := l.path(root)
	if err != nil {
		return "", nil, fmt.Errorf("find the repository lock for %s: %w", root, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ref := l.byPath[path]
	if ref == nil {
		lk, err := lock.Acquire(path, lock.Record{Target: root, Instances: []string{name}})
		if err != nil {
			var held *lock.HeldError
			if errors.As(err, &held) {
				return "", nil, fmt.Errorf("cannot boot: %w", err)
			}
			return "", nil, fmt.Errorf("take the repository lock: %w", err)
		}
		if r := lk.Reclaimed(); r != nil {
			l.log.Info("reclaimed a stale repository lock", "path", path, "stale_pid", r.Stale.PID, "why", r.Liveness.String())
		}
		ref = &lockRef{l: lk}
		l.byPath[path] = ref
	}
	ref.users = append(ref.users, name)
	if len(ref.users) > 1 {
		l.setInstancesLocked(ref)
	}
	return path, func() error { return l.release(path, name) }, nil
}

func (l *repoLocks) setInstancesLocked(ref *lockRef) {
	if err := ref.l.SetInstances(ref.users); err != nil {
		l.log.Warn("update repository lock record", "err", err)
	}
}

func (l *repoLocks) release(path, name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ref := l.byPath[path]
	if ref == nil {
		return nil
	}
	ref.users = slices.DeleteFunc(ref.users, func(u string) bool { return u == name })
	if len(ref.users) > 0 {
		l.setInstancesLocked(ref)
		return nil
	}
	delete(l.byPath, path)
	if err := ref.l.Release(); err != nil {
		return fmt.Errorf("release repository lock %s: %w", path, err)
	}
	return nil
}

// holds tells whether this server holds the lock at path, and for which
// instances.
func (l *repoLocks) holds(path string) ([]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ref := l.byPath[path]
	if ref == nil {
		return nil, false
	}
	return slices.Clone(ref.users), true
}
