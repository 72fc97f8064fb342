package lock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

// Lock files are made so that no other user can open them: flock needs only
// a descriptor, and a read-only one will do, so any user who can open a
// lock file can hold it and block every acquirer. Older versions made them
// 0644; such a file is replaced by a new inode (see replaceGuard and
// tryAcquire), never just chmod-ed, since a descriptor opened earlier
// keeps its flock on the old inode whatever its mode becomes.
const (
	privateMode = 0o600
	// groupMode is for a repository shared with a group
	// (core.sharedRepository): its members share the disk images, so each
	// of them must be able to take the lock.
	groupMode = 0o660
)

// permFor is the mode of the lock files at path: groupMode for the lock in
// the git dir of a repository shared with a group, else privateMode.
func permFor(path string) uint32 {
	if filepath.Base(path) == FileName && SharedWithGroup(filepath.Dir(path)) {
		return groupMode
	}
	return privateMode
}

// loose reports whether a lock file's mode lets someone open it who should
// not: any permission bit beyond perm.
func loose(st *unix.Stat_t, perm uint32) bool {
	return st.Mode&0o777&^perm != 0
}

// SharedWithGroup reports whether the repository whose git dir is gitDir is
// shared with a group: core.sharedRepository is group, true, all, world,
// everybody, 1, 2 or an octal mode with the group's write bit. Anything
// unreadable counts as not shared (lock files then stay private).
func SharedWithGroup(gitDir string) bool {
	f, err := os.Open(filepath.Join(gitDir, "config"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<10)
	section := ""
	value := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			end := strings.IndexByte(line, ']')
			if end < 0 {
				continue
			}
			section = strings.ToLower(strings.TrimSpace(line[1:end]))
			line = strings.TrimSpace(line[end+1:])
			if line == "" {
				continue
			}
		}
		if section != "core" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "sharedrepository") {
			continue
		}
		v, _, _ = strings.Cut(v, "#")
		v, _, _ = strings.Cut(v, ";")
		value = strings.Trim(strings.TrimSpace(v), `"`) // the last one wins, as in git
	}
	switch strings.ToLower(value) {
	case "group", "true", "yes", "on", "all", "world", "everybody", "1", "2":
		return true
	case "", "umask", "false", "no", "off", "0":
		return false
	}
	m, err := strconv.ParseUint(value, 8, 32)
	return err == nil && m&0o020 != 0
}

// holder is a process that holds a flock on a lock file, from /proc/locks.
type holder struct {
	PID int
	// Creds are its user and groups; zero with Err set when they could
	// not be read.
	Creds proc.Creds
	Err   error
}

// flockHolders lists the processes holding a flock on the file open as fd
// (waiters not included). /proc/locks names the process that took each
// lock; the kernel shows every lock whoever owns it.
func flockHolders(fd int) ([]holder, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil, err
	}
	return parseLocks(b, uint64(st.Dev), st.Ino), nil
}

// parseLocks picks the FLOCK holders of one inode out of /proc/locks:
// "1: FLOCK  ADVISORY  WRITE 3480 fe:00:10035207 0 EOF", the device as
// major:minor in hex. Blocked waiters ("1: -> FLOCK ...") hold nothing.
func parseLocks(b []byte, dev, ino uint64) []holder {
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	var hs []holder
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil {
			continue
		}
		h := holder{PID: pid}
		if pid <= 0 {
			h.Err = errors.New("its process is in another PID namespace")
		} else {
			h.Creds, h.Err = proc.ReadCreds(pid)
		}
		hs = append(hs, h)
	}
	return hs
}

// ours reports whether h may be a legitimate acquirer or holder: a live
// process of our own user or, for a lock file shared with a group, of a
// member of the file's group. A process of another user, one that /proc
// hides from us, and one that is gone (its descriptor lives on in a child
// that inherited it; no acquirer forks) are not.
func (h holder) ours(st *unix.Stat_t, perm uint32) bool {
	if h.Err != nil {
		return false
	}
	if h.Creds.UID == os.Geteuid() {
		return true
	}
	return perm&0o060 != 0 && h.Creds.InGroup(int(st.Gid))
}

// foreignHeld reports whether every holder of the flock on fd is foreign
// (see holder.ours), and describes them. With no holder found (the lock
// was dropped meanwhile) it reports false: there is nothing to take over.
func foreignHeld(fd int, perm uint32) (bool, []holder) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, nil
	}
	hs, err := flockHolders(fd)
	if err != nil || len(hs) == 0 {
		return false, hs
	}
	for _, h := range hs {
		if h.ours(&st, perm) {
			return false, hs
		}
	}
	return true, hs
}

// describeHolders names the holders for a message: "process 123 of uid
// 1001", "process 123 (hidden from you by hidepid)".
func describeHolders(hs []holder) string {
	var parts []string
	for _, h := range hs {
		switch {
		case errors.Is(h.Err, proc.ErrHidden):
			parts = append(parts, fmt.Sprintf("process %d of another user (hidden from you by /proc's hidepid)", h.PID))
		case h.Err != nil:
			parts = append(parts, fmt.Sprintf("process %d (%v)", h.PID, h.Err))
		default:
			parts = append(parts, fmt.Sprintf("process %d of %s", h.PID, userName(h.Creds.UID)))
		}
	}
	return strings.Join(parts, ", ")
}

// userName is "alice (uid 1001)", or "uid 1001" when the name is unknown.
func userName(uid int) string {
	id := strconv.Itoa(uid)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return u.Username + " (uid " + id + ")"
	}
	return "uid " + id
}
