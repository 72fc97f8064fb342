package lock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// realDir resolves symlinks (the temp dir may sit behind one), as
// GitCommonDir does.
func realDir(t *testing.T, dir string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// notInRepo returns a temp dir and skips the test if something above the
// temp dir is a git repository, which would make "not a repo" untestable.
func notInRepo(t *testing.T) string {
	t.Helper()
	dir := realDir(t, t.TempDir())
	if _, err := GitCommonDir(dir); !errors.Is(err, ErrNotRepo) {
		t.Skipf("temp dir %s is inside a git repository (%v)", dir, err)
	}
	return dir
}

func TestGitCommonDirLayouts(t *testing.T) {
	root := notInRepo(t)
	repo := filepath.Join(root, "repo")
	common := filepath.Join(repo, ".git")
	wtGitDir := filepath.Join(common, "worktrees", "wt")
	mkdirs(t, filepath.Join(repo, "src", "deep"), wtGitDir)
	if err := os.WriteFile(filepath.Join(wtGitDir, "commondir"), []byte("../..\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A linked worktree with a relative gitdir, and one with an absolute one.
	rel := filepath.Join(root, "wt-rel")
	abs := filepath.Join(root, "wt-abs", "sub")
	mkdirs(t, rel, abs)
	relLink, _ := filepath.Rel(rel, wtGitDir)
	os.WriteFile(filepath.Join(rel, ".git"), []byte("gitdir: "+relLink+"\n"), 0o644)
	os.WriteFile(filepath.Join(root, "wt-abs", ".git"), []byte("gitdir: "+wtGitDir), 0o644)
	// A submodule-style .git file: a gitdir without commondir is its own
	// common dir.
	modGitDir := filepath.Join(common, "modules", "m")
	mod := filepath.Join(repo, "m")
	mkdirs(t, modGitDir, mod)
	os.WriteFile(filepath.Join(mod, ".git"), []byte("gitdir: ../.git/modules/m\n"), 0o644)

	for _, tc := range []struct{ dir, want string }{
		{repo, common},
		{filepath.Join(repo, "src", "deep"), common},
		{rel, common},
		{abs, common},
		{mod, modGitDir},
	} {
		got, err := GitCommonDir(tc.dir)
		if err != nil || got != tc.want {
			t.Errorf("GitCommonDir(%s) = %q, %v; want %q", tc.dir, got, err, tc.want)
		}
	}

	_, err := GitCommonDir(filepath.Join(root, "wt-abs", "..", ".."))
	if !errors.Is(err, ErrNotRepo) {
		t.Errorf("outside a repo: %v, want ErrNotRepo", err)
	}

	// Broken layouts are errors that are not ErrNotRepo: falling back to
	// the runtime dir there would split one repository's lock in two.
	broken := filepath.Join(root, "broken")
	mkdirs(t, broken)
	os.WriteFile(filepath.Join(broken, ".git"), []byte("gitdir: /nonexistent/worktrees/x\n"), 0o644)
	if _, err := GitCommonDir(broken); err == nil || errors.Is(err, ErrNotRepo) {
		t.Errorf("gitdir pointing nowhere: %v", err)
	}
	garbage := filepath.Join(root, "garbage")
	mkdirs(t, garbage)
	os.WriteFile(filepath.Join(garbage, ".git"), []byte("hello\n"), 0o644)
	if _, err := GitCommonDir(garbage); err == nil || errors.Is(err, ErrNotRepo) {
		t.Errorf(".git file without gitdir: %v", err)
	}
}

func TestPath(t *testing.T) {
	root := notInRepo(t)
	repo := filepath.Join(root, "repo")
	mkdirs(t, filepath.Join(repo, ".git"), filepath.Join(root, "plain"))
	rt := filepath.Join(root, "run")

	t.Setenv(EnvLockFile, "")
	if got, err := Path(repo, rt); err != nil || got != filepath.Join(repo, ".git", FileName) {
		t.Errorf("in a repo: %q, %v", got, err)
	}
	// Outside git, each project has a lock of its own, named by its real
	// path: two projects do not exclude each other, and a symlink to a
	// project names the same lock.
	mkdirs(t, filepath.Join(root, "plain2"))
	plain, err := Path(filepath.Join(root, "plain"), rt)
	if err != nil || filepath.Dir(plain) != rt || !strings.HasPrefix(filepath.Base(plain), "qemu-") || !strings.HasSuffix(plain, ".lock") {
		t.Errorf("outside a repo: %q, %v", plain, err)
	}
	if other, _ := Path(filepath.Join(root, "plain2"), rt); other == plain {
		t.Errorf("two projects outside git share the lock %s", plain)
	}
	if err := os.Symlink(filepath.Join(root, "plain"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if via, _ := Path(filepath.Join(root, "link"), rt); via != plain {
		t.Errorf("through a symlink: %q, want %q", via, plain)
	}
	if _, err := Path(filepath.Join(root, "plain"), ""); err == nil || !strings.Contains(err.Error(), EnvLockFile) {
		t.Errorf("outside a repo without runtime dir: %v", err)
	}
	t.Setenv(EnvLockFile, "/somewhere/else.lock")
	if got, err := Path(repo, rt); err != nil || got != "/somewhere/else.lock" {
		t.Errorf("with %s: %q, %v", EnvLockFile, got, err)
	}
}

// gitRepoWithWorktree makes a real repository with one commit and a linked
// worktree, using git itself.
func gitRepoWithWorktree(t *testing.T) (repo, wt string) {
	t.Helper()
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed; skipping the real-worktree test (the layout tests cover resolution)")
	}
	root := realDir(t, t.TempDir())
	repo, wt = filepath.Join(root, "repo"), filepath.Join(root, "wt")
	mkdirs(t, repo)
	env := []string{"HOME=" + root, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "PATH=" + os.Getenv("PATH")}
	for _, args := range [][]string{
		{"-c", "init.defaultBranch=main", "init", "-q"},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init"},
		{"worktree", "add", "-q", wt},
	} {
		cmd := exec.Command(gitBin, args...)
		cmd.Dir, cmd.Env = repo, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return repo, wt
}

func TestRealWorktreeSharesLock(t *testing.T) {
	repo, wt := gitRepoWithWorktree(t)
	t.Setenv(EnvLockFile, "")
	want := filepath.Join(repo, ".git")
	for _, dir := range []string{repo, wt, filepath.Join(wt, ".")} {
		if got, err := GitCommonDir(dir); err != nil || got != want {
			t.Errorf("GitCommonDir(%s) = %q, %v; want %q", dir, got, err, want)
		}
	}
	// git agrees.
	cmd := exec.Command("git", "rev-parse", "--path-format=absolute", "--git-common-dir")
	cmd.Dir = wt
	if out, err := cmd.Output(); err == nil {
		if got := realDir(t, strings.TrimSpace(string(out))); got != want {
			t.Errorf("git says the common dir is %s, we say %s", got, want)
		}
	}

	// A server in the main worktree holds the lock; one in the linked
	// worktree finds the same file and is refused.
	h := startHelper(t, "acquire", []string{helperRootEnv + "=" + repo})
	h.expect("locked")
	path, err := Path(wt, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(want, FileName) {
		t.Fatalf("worktree lock path %s, want %s", path, filepath.Join(want, FileName))
	}
	_, err = Acquire(path, Record{Target: wt})
	held := mustHeld(t, err, h.pid)
	if held.Holder.Target != "helper" || held.Path != path {
		t.Errorf("HeldError %+v", held)
	}
	// And a second server in the same worktree as the holder too.
	h2 := startHelper(t, "acquire", []string{helperRootEnv + "=" + filepath.Join(repo, ".")})
	if got := h2.expect("held"); got != strconv.Itoa(h.pid) {
		t.Errorf("second acquirer in the main worktree: held by %s, want %d", got, h.pid)
	}
}
