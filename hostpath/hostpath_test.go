package hostpath_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/hostpath"
)

// tree is a server's working directory with a project in it, a captures
// directory, a read-only allowed directory, and a secret outside all.
type tree struct {
	work, project, captures, allowed, outside, secret string
	policy                                            hostpath.Policy
}

func newTree(t testing.TB) tree {
	t.Helper()
	base := t.TempDir()
	tr := tree{
		work:     filepath.Join(base, "work"),
		captures: filepath.Join(base, "run", "captures"),
		allowed:  filepath.Join(base, "allowed"),
		outside:  filepath.Join(base, "outside"),
	}
	tr.project = filepath.Join(tr.work, "project")
	tr.secret = filepath.Join(tr.outside, "secret")
	for _, d := range []string{tr.project, tr.captures, tr.allowed, tr.outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, tr.secret, "SECRET")
	write(t, filepath.Join(tr.project, "kernel"), "KERNEL")
	write(t, filepath.Join(tr.allowed, "fw.bin"), "FIRMWARE")
	tr.policy = hostpath.Policy{WorkDir: tr.work, Captures: tr.captures, ReadOnly: []string{tr.allowed}}
	return tr
}

func write(t testing.TB, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (tr tree) scope(t testing.TB) *hostpath.Scope {
	t.Helper()
	s, err := tr.policy.Project(tr.project)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func read(t testing.TB, f *os.File) string {
	t.Helper()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantRefused(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("allowed, want a refusal containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q lacks %q", err, w)
		}
	}
}

func TestProjectRoot(t *testing.T) {
	tr := newTree(t)
	for _, ok := range []string{tr.work, tr.project, tr.project + "/."} {
		if _, err := tr.policy.Project(ok); err != nil {
			t.Errorf("Project(%s): %v", ok, err)
		}
	}
	_, err := tr.policy.Project("/")
	wantRefused(t, err, `project root / is refused`, `"/" would make every host file a project file`)
	_, err = tr.policy.Project(tr.outside)
	wantRefused(t, err, tr.outside, "neither the server's working directory", "rule project", "--allow-host-access")
	_, err = tr.policy.Project(tr.project + "/../../outside")
	wantRefused(t, err, "neither the server's working directory")
	// A symlink in the working directory that leads out is judged by
	// where it leads.
	link := filepath.Join(tr.work, "out")
	if err := os.Symlink(tr.outside, link); err != nil {
		t.Fatal(err)
	}
	_, err = tr.policy.Project(link)
	wantRefused(t, err, "neither the server's working directory")
	all := tr.policy
	all.AllowAll = true
	if _, err := all.Project("/"); err != nil {
		t.Errorf("--allow-host-access, project_root /: %v", err)
	}
}

// A worktree of the server's repository is a project root wherever it is;
// another repository is not.
func TestProjectRootWorktree(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found: run scripts/deps")
	}
	base := t.TempDir()
	repo, wt, other := filepath.Join(base, "repo"), filepath.Join(base, "wt"), filepath.Join(base, "other")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", repo)
	git("-C", repo, "commit", "-q", "--allow-empty", "-m", "x")
	git("-C", repo, "worktree", "add", "-q", wt)
	git("init", "-q", other)
	p := hostpath.Policy{WorkDir: repo}
	if _, err := p.Project(wt); err != nil {
		t.Errorf("worktree: %v", err)
	}
	if _, err := p.Project(filepath.Join(wt, ".git", "..")); err != nil {
		t.Errorf("worktree via ..: %v", err)
	}
	_, err := p.Project(other)
	wantRefused(t, err, "nor a worktree of its repository")
}

func TestOpen(t *testing.T) {
	tr := newTree(t)
	s := tr.scope(t)
	// Inside: relative to the project, or absolute.
	for _, p := range []string{"kernel", filepath.Join(tr.project, "kernel"), "./sub/../kernel"} {
		f, err := s.Open("kernel", p, false)
		if err != nil {
			t.Fatalf("Open(%s): %v", p, err)
		}
		if got := read(t, f); got != "KERNEL" {
			t.Errorf("Open(%s) read %q", p, got)
		}
		f.Close()
	}
	os.Mkdir(filepath.Join(tr.project, "sub"), 0o755)
	f, err := s.Open("kernel", "sub/../kernel", true)
	if err != nil {
		t.Fatalf("writable in the project: %v", err)
	}
	f.Close()

	// Outside, by path, by "..", by symlink: refused, naming the path,
	// the rule and the flags.
	_, err = s.Open("kernel", tr.secret, false)
	wantRefused(t, err, "kernel "+tr.secret+" is refused", "outside the project root", "rule host-path", "--allow-path", "--allow-host-access")
	_, err = s.Open("initrd", "../../outside/secret", false)
	wantRefused(t, err, "initrd ../../outside/secret is refused", "resolves to "+tr.secret)
	if err := os.Symlink(tr.secret, filepath.Join(tr.project, "leak")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Open("drives[0]", "leak", false)
	wantRefused(t, err, "drives[0] leak is refused", "resolves to "+tr.secret)
	if err := os.Symlink(tr.outside, filepath.Join(tr.project, "outdir")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Open("dtb", "outdir/secret", false)
	wantRefused(t, err, "resolves to "+tr.secret)
	// A symlink that stays inside is fine.
	if err := os.Symlink("kernel", filepath.Join(tr.project, "vmlinuz")); err != nil {
		t.Fatal(err)
	}
	if f, err := s.Open("kernel", "vmlinuz", false); err != nil {
		t.Errorf("symlink inside: %v", err)
	} else {
		f.Close()
	}

	// Read-only roots: readable, not writable.
	if f, err := s.Open("bios", filepath.Join(tr.allowed, "fw.bin"), false); err != nil {
		t.Errorf("allowed path: %v", err)
	} else {
		f.Close()
	}
	_, err = s.Open("drives[0]", filepath.Join(tr.allowed, "fw.bin"), true)
	wantRefused(t, err, "refused for writing", "read-only", "rule allow-path")

	// The captures directory is writable.
	write(t, filepath.Join(tr.captures, "x.pcap"), "")
	if f, err := s.Open("path", filepath.Join(tr.captures, "x.pcap"), true); err != nil {
		t.Errorf("captures: %v", err)
	} else {
		f.Close()
	}

	// Not regular files: refused without blocking on a FIFO.
	fifo := filepath.Join(tr.project, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = s.Open("kernel", "fifo", false)
	wantRefused(t, err, "not a regular file")
	_, err = s.Open("kernel", ".", false)
	wantRefused(t, err, "not a regular file")
	_, err = s.Open("kernel", "a\x00b", false)
	wantRefused(t, err, "NUL")
	_, err = s.Open("kernel", "missing", false)
	wantRefused(t, err, "no such file", "relative to the project root "+tr.project)

	// A second hard link may lie outside: no writes through it.
	if err := os.Link(filepath.Join(tr.project, "kernel"), filepath.Join(tr.outside, "hardlink")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Open("drives[0]", "kernel", true)
	wantRefused(t, err, "2 hard links")
}

func TestCreate(t *testing.T) {
	tr := newTree(t)
	s := tr.scope(t)
	for _, p := range []string{"a.pcap", filepath.Join(tr.captures, "b.pcap")} {
		f, err := s.Create("path", p)
		if err != nil {
			t.Fatalf("Create(%s): %v", p, err)
		}
		f.Close()
	}
	_, err := s.Create("path", "a.pcap")
	wantRefused(t, err, "exists already")
	_, err = s.Create("path", filepath.Join(tr.outside, "new.pcap"))
	wantRefused(t, err, "is refused", "not inside the project root")
	_, err = s.Create("path", filepath.Join(tr.allowed, "new.pcap"))
	wantRefused(t, err, "is refused")
	if err := os.Symlink(tr.outside, filepath.Join(tr.project, "outdir")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Create("path", "outdir/new.pcap")
	wantRefused(t, err, "is refused")
	// A symlink at the name is not followed, even a dangling one.
	if err := os.Symlink(filepath.Join(tr.outside, "planted"), filepath.Join(tr.project, "planted.pcap")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Create("path", "planted.pcap")
	wantRefused(t, err, "exists already")
	if _, err := os.Lstat(filepath.Join(tr.outside, "planted")); err == nil {
		t.Error("Create wrote through a symlink")
	}
	for _, p := range []string{"new.pcap", "outdir/new.pcap", "planted"} {
		if _, err := os.Stat(filepath.Join(tr.outside, p)); err == nil {
			t.Errorf("%s appeared outside", p)
		}
	}
}

// A name flipped between a file inside and a file outside while it is
// opened: every open either fails or yields the inside file. What was
// checked is what the caller holds.
func TestOpenRace(t *testing.T) {
	tr := newTree(t)
	s := tr.scope(t)
	link := filepath.Join(tr.project, "flip")
	tmp := link + ".tmp"
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			target := filepath.Join(tr.project, "kernel")
			if i%2 == 1 {
				target = tr.secret
			}
			os.Remove(tmp)
			if err := os.Symlink(target, tmp); err == nil {
				os.Rename(tmp, link)
			}
		}
	})
	var opened, refused int
	for range 20000 {
		f, err := s.Open("kernel", "flip", false)
		if err != nil {
			refused++
			continue
		}
		opened++
		if got := read(t, f); got != "KERNEL" {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("read %q through a checked open", got)
		}
		f.Close()
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d opens allowed (all the inside file), %d refused", opened, refused)
	if opened == 0 || refused == 0 {
		t.Errorf("the race did not happen: %d opened, %d refused", opened, refused)
	}
}

// Mounts are taken as the kernel presents them: a directory bind-mounted
// into the project is part of it. Runs in a private mount namespace.
func TestBindMount(t *testing.T) {
	if os.Getenv("HOSTPATH_BIND_HELPER") != "" {
		bindHelper(t)
		return
	}
	if os.Getuid() != 0 {
		t.Skip("bind mounts need root: run the tests as root, as CI does")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not found (util-linux)")
	}
	tr := newTree(t)
	mnt := filepath.Join(tr.project, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("mount --bind %s %s && exec %s -test.run '^TestBindMount$' -test.v", tr.outside, mnt, os.Args[0])
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "HOSTPATH_BIND_HELPER=1", "HOSTPATH_WORK="+tr.work, "HOSTPATH_OUTSIDE="+tr.outside)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("helper in a private mount namespace: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "secret")); err == nil {
		t.Error("the bind mount leaked out of the test's mount namespace")
	}
}

func bindHelper(t *testing.T) {
	work, outside := os.Getenv("HOSTPATH_WORK"), os.Getenv("HOSTPATH_OUTSIDE")
	s, err := hostpath.Policy{WorkDir: work}.Project(filepath.Join(work, "project"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.Open("drives[0]", "mnt/secret", false)
	if err != nil {
		t.Fatalf("a file of a directory bind-mounted into the project: %v", err)
	}
	if got := read(t, f); got != "SECRET" {
		t.Fatalf("read %q", got)
	}
	f.Close()
	// The same file by its own path is still outside.
	_, err = s.Open("drives[0]", filepath.Join(outside, "secret"), false)
	wantRefused(t, err, "is refused")
}

func qcow2(t testing.TB, p string, version uint32, backing uint64, incompat uint64) {
	t.Helper()
	h := make([]byte, 512)
	binary.BigEndian.PutUint32(h[0:], 0x514649fb)
	binary.BigEndian.PutUint32(h[4:], version)
	binary.BigEndian.PutUint64(h[8:], backing)
	binary.BigEndian.PutUint64(h[72:], incompat)
	if err := os.WriteFile(p, h, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckImage(t *testing.T) {
	tr := newTree(t)
	s := tr.scope(t)
	qcow2(t, filepath.Join(tr.project, "plain.qcow2"), 3, 0, 0)
	qcow2(t, filepath.Join(tr.project, "backed.qcow2"), 3, 512, 0)
	qcow2(t, filepath.Join(tr.project, "v2backed.qcow2"), 2, 256, 0)
	qcow2(t, filepath.Join(tr.project, "datafile.qcow2"), 3, 0, 1<<2)
	write(t, filepath.Join(tr.project, "raw.img"), "raw")
	check := func(name, format string) error {
		f, err := s.Open("drives[0]", name, false)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return s.CheckImage("drives[0] "+name, f, format)
	}
	for _, ok := range [][2]string{{"plain.qcow2", "qcow2"}, {"raw.img", ""}, {"raw.img", "raw"}, {"backed.qcow2", "raw"}} {
		if err := check(ok[0], ok[1]); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	wantRefused(t, check("backed.qcow2", "qcow2"), "backing file", "qemu-img convert")
	wantRefused(t, check("v2backed.qcow2", "qcow2"), "backing file")
	wantRefused(t, check("datafile.qcow2", "qcow2"), "external file")
	wantRefused(t, check("raw.img", "qcow2"), "not a qcow2 image")
	wantRefused(t, check("plain.qcow2", "vmdk"), `format "vmdk" is refused`)
}

// FuzzOpen walks random paths through a tree of files and symlinks in and
// out of the project: whatever Open allows is a file inside an allowed
// root, and reads as one.
func FuzzOpen(f *testing.F) {
	tr := newTree(f)
	for _, l := range [][2]string{
		{"in", "kernel"}, {"out", tr.secret}, {"outdir", tr.outside}, {"up", ".."}, {"loop", "loop"},
		{"rel-out", "../../outside/secret"}, {"fw", filepath.Join(tr.allowed, "fw.bin")}, {"dir", "."},
	} {
		if err := os.Symlink(l[1], filepath.Join(tr.project, l[0])); err != nil {
			f.Fatal(err)
		}
	}
	s := tr.scope(f)
	for _, seed := range []string{"kernel", "in", "out", "outdir/secret", "up/project/kernel", "../outside/secret",
		"dir/dir/in", "/" + tr.secret, "fw", "rel-out", "loop", "up/../project/in"} {
		f.Add(seed, false)
	}
	inside := map[string]bool{"KERNEL": true, "FIRMWARE": true}
	f.Fuzz(func(t *testing.T, path string, write bool) {
		fh, err := s.Open("kernel", path, write)
		if err != nil {
			return
		}
		defer fh.Close()
		real, err := hostpath.Real(fh)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(real, tr.project+"/") && !strings.HasPrefix(real, tr.allowed+"/") && !strings.HasPrefix(real, tr.captures+"/") {
			t.Fatalf("Open(%q) allowed %s", path, real)
		}
		if write && strings.HasPrefix(real, tr.allowed+"/") {
			t.Fatalf("Open(%q) allowed writing read-only %s", path, real)
		}
		if got := read(t, fh); !inside[got] {
			t.Fatalf("Open(%q) read %q", path, got)
		}
	})
}
