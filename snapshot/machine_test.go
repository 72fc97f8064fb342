package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func describe(t *testing.T, cfg qemu.Config) Machine {
	t.Helper()
	m, err := Describe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A snapshot is matched to a machine by its hash: files count by content
// (the same kernel under another path is the same machine, a rebuilt one
// at the same path is not), drives by path, and every other setting as it
// is. Diff names each difference as the user will read it.
func TestMachineHashAndDiff(t *testing.T) {
	dir := t.TempDir()
	kernel, copyK, initrd := filepath.Join(dir, "Image"), filepath.Join(dir, "Image.copy"), filepath.Join(dir, "initrd")
	writeFile(t, kernel, "kernel v1")
	writeFile(t, copyK, "kernel v1")
	writeFile(t, initrd, "initrd")
	base := qemu.NewConfig(qemu.WithKernel(kernel), qemu.WithInitrd(initrd), qemu.WithAppend("console=ttyS0"),
		qemu.WithDrive(qemu.Drive{Path: "/img/disk.qcow2", Format: "qcow2"}))
	saved := describe(t, base)
	if saved.Machine != "virt" || saved.Kernel == nil || saved.Kernel.SHA256 == "" || saved.Drives[0].Format != "qcow2" {
		t.Fatalf("Describe: %+v", saved)
	}
	if h := saved.Hash(); len(h) != 12 || h != describe(t, base).Hash() {
		t.Fatalf("hash %q is not a stable 12-digit name", h)
	}

	moved := base
	moved.Kernel = copyK
	if got := describe(t, moved); got.Hash() != saved.Hash() || len(Diff(saved, got)) != 0 {
		t.Errorf("the same kernel by another path: hash %s vs %s, diff %q", got.Hash(), saved.Hash(), Diff(saved, got))
	}

	for _, tc := range []struct {
		name   string
		change func(c *qemu.Config)
		want   string
	}{
		{"memory", func(c *qemu.Config) { c.Memory = "256M" }, "memory: saved 128M, now 256M"},
		{"harts", func(c *qemu.Config) { c.SMP = 2 }, "smp: saved 1, now 2"},
		{"append", func(c *qemu.Config) { c.Append = "console=ttyS0 quiet" }, `append: saved "console=ttyS0", now "console=ttyS0 quiet"`},
		{"no initrd", func(c *qemu.Config) { c.Initrd = "" }, "initrd: saved " + initrd + " (sha256 "},
		{"drive path", func(c *qemu.Config) { c.Drives = []qemu.Drive{{Path: "/img/other.qcow2", Format: "qcow2"}} }, "drives: saved /img/disk.qcow2 (qcow2), now /img/other.qcow2 (qcow2)"},
		{"drive readonly", func(c *qemu.Config) {
			c.Drives = []qemu.Drive{{Path: "/img/disk.qcow2", Format: "qcow2", ReadOnly: true}}
		}, "now /img/disk.qcow2 (qcow2, readonly)"},
		{"drive bus", func(c *qemu.Config) {
			c.Drives = []qemu.Drive{{Path: "/img/disk.qcow2", Format: "qcow2", Bus: "virtio-mmio-bus.0"}}
		}, "now /img/disk.qcow2 (qcow2, bus virtio-mmio-bus.0)"},
		{"modern virtio", func(c *qemu.Config) { c.VirtioModern = true }, "modern-only virtio: saved false, now true"},
		{"network", func(c *qemu.Config) { c.Network = "user" }, "network: saved none, now user"},
		{"bios", func(c *qemu.Config) { c.BIOS = "none" }, "bios: saved default, now none"},
		{"extra args", func(c *qemu.Config) { c.ExtraArgs = []string{"-device", "virtio-rng-device"} }, `extra arguments: saved none, now "-device", "virtio-rng-device"`},
		{"share", func(c *qemu.Config) { c.Shares = []qemu.Share{{Path: "/src", Tag: "src"}} }, "shares: saved none, now src=/src"},
	} {
		c := base
		c.Drives = append([]qemu.Drive(nil), base.Drives...)
		tc.change(&c)
		now := describe(t, c)
		d := Diff(saved, now)
		if now.Hash() == saved.Hash() {
			t.Errorf("%s: the hash did not change", tc.name)
		}
		if len(d) != 1 || !strings.Contains(d[0], tc.want) {
			t.Errorf("%s: diff %q, want one saying %q", tc.name, d, tc.want)
		}
	}
	// "none" and "" are the same network: no NIC.
	c := base
	c.Network = "none"
	if describe(t, c).Hash() != saved.Hash() {
		t.Error(`network "none" and "" hash differently`)
	}

	// The kernel rebuilt in place is another machine, though its path,
	// size and (to the second) time are the same: the hash cache must
	// not answer for it.
	fi, _ := os.Stat(kernel)
	writeFile(t, kernel, "kernel v2")
	os.Chtimes(kernel, fi.ModTime(), fi.ModTime())
	now := describe(t, base)
	d := Diff(saved, now)
	if now.Hash() == saved.Hash() || len(d) != 1 || !strings.HasPrefix(d[0], "kernel: saved "+kernel+" (sha256 ") || !strings.Contains(d[0], ", now "+kernel+" (sha256 ") {
		t.Errorf("a rebuilt kernel: hash %s (was %s), diff %q", now.Hash(), saved.Hash(), d)
	}
	if saved.Kernel.SHA256[:12] == now.Kernel.SHA256[:12] {
		t.Errorf("the diff shows the same content hash for two kernels")
	}
}

// Describe hashes a file through the descriptor QEMU will get, not the
// path (which may have changed since it was checked), and leaves the
// descriptor's offset where it was.
func TestDescribeHashesTheCheckedFile(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "Image")
	writeFile(t, kernel, "the checked kernel")
	f, err := os.Open(kernel)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Seek(4, 0)
	viaPath := describe(t, qemu.NewConfig(qemu.WithKernel(kernel)))
	// The path now names another file; the descriptor still the checked one.
	os.Remove(kernel)
	writeFile(t, kernel, "something else")
	cfg := qemu.NewConfig(qemu.WithKernel(kernel))
	cfg.Files = map[string]*os.File{kernel: f}
	viaFD := describe(t, cfg)
	if viaFD.Kernel.SHA256 != viaPath.Kernel.SHA256 {
		t.Errorf("hashed the path's new file, not the descriptor's")
	}
	if off, _ := f.Seek(0, 1); off != 4 {
		t.Errorf("the descriptor's offset moved to %d", off)
	}
	if _, err := Describe(qemu.NewConfig(qemu.WithKernel(filepath.Join(dir, "missing")))); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing kernel: %v", err)
	}
}

// The store lists each project's snapshots newest first, of every machine,
// finds a name across machines, shows an unreadable record as a snapshot
// that cannot load, and deletes the record before the image.
func TestStoreRecords(t *testing.T) {
	st := Store{Dir: t.TempDir()}
	put := func(root, mach, name string, created time.Time) Meta {
		dir := st.dir(root, mach)
		os.MkdirAll(dir, 0o700)
		m := Meta{Name: name, Tag: tagFor(name, "1-2-3"), ID: "1-2-3", Image: imageName(name, "1-2-3"), Created: created}
		writeJSON(t, filepath.Join(dir, name+".json"), m)
		writeFile(t, filepath.Join(dir, m.Image), strings.Repeat("x", 4096))
		return m
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	put("/p", "m1", "a", t0)
	put("/p", "m2", "a", t0.Add(time.Hour))
	put("/p", "m1", "b", t0.Add(2*time.Hour))
	put("/q", "m1", "a", t0)
	list, err := st.List("/p")
	if err != nil || len(list) != 3 || list[0].Name != "b" || !list[1].Created.Equal(t0.Add(time.Hour)) {
		t.Fatalf("list: %+v %v", list, err)
	}
	if found, _ := st.Find("/p", "a"); len(found) != 2 {
		t.Errorf("find a: %+v", found)
	}
	if list, _ := st.List("/nowhere"); len(list) != 0 {
		t.Errorf("a project without snapshots: %+v", list)
	}
	if _, err := st.Get("/p", "m1", "c"); err == nil || !strings.Contains(err.Error(), `no such snapshot "c"`) {
		t.Errorf("get a missing snapshot: %v", err)
	}
	if st.Total() <= 0 {
		t.Errorf("total %d with four images", st.Total())
	}

	// A damaged record is listed, and refused by Verify with the reason.
	writeFile(t, filepath.Join(st.dir("/p", "m1"), "c.json"), "{")
	list, _ = st.List("/p")
	var c *Meta
	for k := range list {
		if list[k].Name == "c" {
			c = &list[k]
		}
	}
	if c == nil {
		t.Fatalf("the unreadable record is not listed: %+v", list)
	}
	if err := Verify(*c); err == nil || !strings.Contains(err.Error(), "its record is unreadable") {
		t.Errorf("verify an unreadable record: %v", err)
	}
	// A record that names an image outside its directory is refused.
	writeJSON(t, filepath.Join(st.dir("/p", "m1"), "d.json"), Meta{Name: "d", Image: "../../escape.qcow2"})
	if _, err := st.Get("/p", "m1", "d"); err == nil || !strings.Contains(err.Error(), "outside its directory") {
		t.Errorf("a record naming ../../escape.qcow2: %v", err)
	}

	b, err := st.Get("/p", "m1", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(b); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{b.Path, filepath.Join(st.dir("/p", "m1"), "b.json")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after delete: %v", p, err)
		}
	}
	// Deleting a snapshot that a later save replaced removes only the
	// image it knew, not the newer record.
	a, _ := st.Get("/p", "m1", "a")
	put("/p", "m1", "a", t0.Add(3*time.Hour)) // same image name: write another record
	newer := Meta{Name: "a", Tag: tagFor("a", "4-5-6"), ID: "4-5-6", Image: imageName("a", "4-5-6")}
	writeJSON(t, filepath.Join(st.dir("/p", "m1"), "a.json"), newer)
	if err := st.Delete(a); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get("/p", "m1", "a"); err != nil || got.ID != "4-5-6" {
		t.Errorf("the newer record after deleting the older snapshot: %+v %v", got, err)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "boot-1", "v1.2_rc", strings.Repeat("x", 64)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "../a", "a b", strings.Repeat("x", 65), "é"} {
		if err := CheckName(bad); err == nil || !strings.Contains(err.Error(), "1 to 64 letters") {
			t.Errorf("CheckName(%q) = %v", bad, err)
		}
	}
}

// A save's image and intent carry its id, and so its server, so that a
// leftover says by its name alone whether its save may still run.
func TestSaveIDs(t *testing.T) {
	id := "1234-5678-abc"
	if name, got, o, ok := store.SplitName(imageName("my.snap", id), ".qcow2"); !ok || name != "my.snap" || got != id || o.PID != 1234 || o.StartTime != 5678 {
		t.Errorf("the image's name: %q %q %+v %v", name, got, o, ok)
	}
	if name, got, _, ok := store.SplitName(store.IntentName("a", id), ".intent"); !ok || name != "a" || got != id {
		t.Errorf("the intent's name: %q %q %v", name, got, ok)
	}
	if _, _, _, ok := store.SplitName("a.qcow2", ".qcow2"); ok {
		t.Errorf("a first-version image has no id")
	}
}

// A snapshot whose record cannot be read is listed, and deleting it
// removes that record from the store, and nothing else: not a file of the
// same name where the server runs (a snapshot "package" is not the
// project's package.json).
func TestDeleteUnreadableRecord(t *testing.T) {
	st := Store{Dir: t.TempDir()}
	dir := st.dir("/p", "m1")
	os.MkdirAll(dir, 0o700)
	writeFile(t, filepath.Join(dir, "package.json"), "{damaged")
	cwd := t.TempDir()
	t.Chdir(cwd)
	writeFile(t, filepath.Join(cwd, "package.json"), `{"name": "the user's"}`)

	found, err := st.Find("/p", "package")
	if err != nil || len(found) != 1 {
		t.Fatalf("find: %+v %v", found, err)
	}
	if err := st.Delete(found[0]); err != nil {
		t.Errorf("delete: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(cwd, "package.json")); err != nil || !strings.Contains(string(b), "the user's") {
		t.Errorf("the user's package.json after deleting snapshot \"package\": %q %v", b, err)
	}
	if found, _ := st.Find("/p", "package"); len(found) != 0 {
		t.Errorf("the unreadable record is still listed after its delete: %+v", found)
	}
	// A record that names no place is refused, not looked for here.
	if err := st.Delete(Meta{Name: "package"}); err == nil {
		t.Errorf("deleting a snapshot with no place in the store succeeded")
	}
	if _, err := os.Stat(filepath.Join(cwd, "package.json")); err != nil {
		t.Errorf("the user's package.json: %v", err)
	}
}

// The images of a snapshot whose record is unreadable stay (which one it
// names cannot be told), but only its own: a dead save's image of the
// snapshot "a.b" is reaped though the record of "a" is damaged.
func TestReapBesideUnreadableRecord(t *testing.T) {
	st := Store{Dir: t.TempDir()}
	dir := st.dir("/p", "m1")
	os.MkdirAll(dir, 0o700)
	dead := names.Owner{PID: names.MaxPID, StartTime: 1}.Tag() + "-1" // no process has it
	writeFile(t, filepath.Join(dir, "a.json"), "{damaged")
	own := filepath.Join(dir, imageName("a", dead))
	other := filepath.Join(dir, imageName("a.b", dead))
	writeFile(t, own, "state of a")
	writeFile(t, other, "partial state of a.b")
	rep, err := st.Reap()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(own); err != nil {
		t.Errorf("the image of the unreadable record went: %v", err)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("a dead save's image of a.b stayed beside a's unreadable record: %+v", rep)
	}
	if len(rep.Broken) != 1 || !strings.Contains(rep.Broken[0], "a: its record is unreadable") {
		t.Errorf("broken: %q", rep.Broken)
	}
}
