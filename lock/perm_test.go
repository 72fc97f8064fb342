package lock

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// Lock and guard files are private to their user whatever the umask, and
// group-writable only in a repository shared with a group.
func TestLockFileModes(t *testing.T) {
	for _, c := range []struct {
		name   string
		config string
		umask  int
		want   os.FileMode
	}{
		{"private umask 0", "", 0, 0o600},
		{"private umask 077", "", 0o077, 0o600},
		{"shared group umask 022", "[core]\n\tsharedRepository = group\n", 0o022, 0o660},
		{"shared 0640 is not group-writable", "[core]\n\tsharedrepository = 0640\n", 0o022, 0o600},
		{"shared 0660", "[core]\nsharedRepository=0660\n", 0o077, 0o660},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.config != "" {
				if err := os.WriteFile(filepath.Join(dir, "config"), []byte(c.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			old := unix.Umask(c.umask)
			defer unix.Umask(old)
			path := filepath.Join(dir, FileName)
			l, err := Acquire(path, Record{Target: "/p"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			for _, p := range []string{path, path + guardSuffix} {
				if got := mode(t, p); got != c.want {
					t.Errorf("%s: mode %v, want %v", filepath.Base(p), got, c.want)
				}
			}
		})
	}
}

func TestSharedWithGroup(t *testing.T) {
	for config, want := range map[string]bool{
		"":                                     false,
		"[core]\n\tbare = false\n":             false,
		"[core]\n\tsharedRepository = group\n": true,
		"[core]\n\tsharedRepository = true\n":  true,
		"[core]\n\tSharedRepository = ALL\n":   true,
		"[core]\n\tsharedRepository = 1\n":     true,
		"[core]\n\tsharedRepository = umask\n": false,
		"[core]\n\tsharedRepository = false\n": false,
		"[core]\n\tsharedRepository = 0664\n":  true,
		"[core]\n\tsharedRepository = 0644\n":  false,
		"[user]\n\tsharedRepository = group\n": false,
		"[core]\n\tsharedRepository = group\n[core]\n\tsharedRepository = umask\n": false,
		"[core] sharedRepository = group ; comment\n":                              true,
	} {
		dir := t.TempDir()
		if config != "" {
			os.WriteFile(filepath.Join(dir, "config"), []byte(config), 0o644)
		}
		if got := SharedWithGroup(dir); got != want {
			t.Errorf("%q: %v, want %v", config, got, want)
		}
	}
}

// A free lock file and guard that others could open (as earlier versions
// left them) are replaced by private files, not chmod-ed: a descriptor
// opened on the old inode keeps nothing of ours.
func TestLooseFreeFilesReplaced(t *testing.T) {
	path := lockPath(t)
	for _, p := range []string{path, path + guardSuffix} {
		if err := os.WriteFile(p, []byte("pid=1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantReplaced := replacedPrivate(t, path)
	early, err := os.Open(path) // what another user might have opened
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	l, err := Acquire(path, Record{Target: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if r := l.Reclaimed(); r != nil {
		t.Errorf("a free file replaced reports a reclaim: %+v", r)
	}
	wantReplaced()
	if rec := readRecordFile(t, path); rec.Target != "/p" {
		t.Errorf("record %+v", rec)
	}
	// The early descriptor is on the old inode: its flock holds nothing.
	if err := unix.Flock(int(early.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock on the replaced inode: %v", err)
	}
	if _, err := os.Lstat(path + guardSuffix + newSuffix); !os.IsNotExist(err) {
		t.Errorf("the guard's replacement left %s", path+guardSuffix+newSuffix)
	}
}

// A replacer that died between creating <guard>.new and renaming it leaves
// the file behind; the next replacer removes it and goes on.
func TestStaleGuardTempRemoved(t *testing.T) {
	path := lockPath(t)
	os.WriteFile(path+guardSuffix, nil, 0o644)
	os.WriteFile(path+guardSuffix+newSuffix, nil, 0o600)
	l, err := Acquire(path, Record{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if got := mode(t, path+guardSuffix); got != 0o600 {
		t.Errorf("guard mode %v", got)
	}
	if _, err := os.Lstat(path + guardSuffix + newSuffix); !os.IsNotExist(err) {
		t.Error("the dead replacer's file is still there")
	}
}

func TestParseLocks(t *testing.T) {
	dev := unix.Mkdev(0xfe, 0)
	in := []byte("1: FLOCK  ADVISORY  WRITE 3480 fe:00:10035207 0 EOF\n" +
		"1: -> FLOCK  ADVISORY  WRITE 3481 fe:00:10035207 0 EOF\n" +
		"2: POSIX  ADVISORY  WRITE 3482 fe:00:10035207 0 EOF\n" +
		"3: FLOCK  ADVISORY  READ 3483 fe:00:99 0 EOF\n" +
		"4: FLOCK  ADVISORY  READ 3484 fe:00:10035207 0 EOF\n")
	hs := parseLocks(in, dev, 10035207)
	if len(hs) != 2 || hs[0].PID != 3480 || hs[1].PID != 3484 {
		t.Errorf("holders %+v, want pids 3480 and 3484", hs)
	}
}
