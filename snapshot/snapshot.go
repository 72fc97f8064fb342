// Package snapshot keeps guests' saved states. It saves a running guest
// through QMP jobs as one transaction, verifies every part of a snapshot
// before a load touches a guest, stages a snapshot for a new QEMU to load,
// and finds what killed saves left; it knows nothing of MCP or of
// instances.
//
// # The store
//
// Under the store directory, one directory per project
// (<base name>-<hash of the root>) and in it one per machine (Machine.Hash:
// a saved state loads only into the machine it was saved on). In a machine
// directory, for the snapshot NAME:
//
//   - NAME.json, the record (Meta): the machine, the QEMU version, the time,
//     the guest's mtime, and the parts: the image's file name (Image) and
//     size, the save's ID, the Tag the state and every drive's part carry,
//     and the writable qcow2 drives (Drives) that hold their part under
//     that tag. The record is the snapshot: written last, whole (a
//     temporary file, fsync, rename, fsync of the directory), and nothing
//     it names is ever changed afterwards.
//   - NAME.ID.qcow2, the image: a qcow2 of no disk content whose one
//     internal snapshot, Tag, holds the machine state (RAM, CPUs, devices).
//   - .NAME.ID.intent, while a save runs: the save's intent (Intent),
//     written and made durable before anything else, naming the image, the
//     tag, the drives it writes that tag into, and the snapshot it
//     replaces.
//   - .NAME.ID.json.tmp, for an instant: the record being written.
//
// ID is "<pid>-<start time>-<n>": the saving server's identity as the
// runtime directory's names carry it (package names) and a number, so a
// leftover tells by its name alone whether its server still runs. Tag is
// "qemu-mcp-NAME.ID"; records of the first version (no ID) have the image
// NAME.qcow2 and the tag "qemu-mcp-NAME".
//
// # A save is a transaction
//
// Saves into one machine directory run one at a time. Intent; new image
// and new tag on every writable drive, beside the old ones; the image
// closed and synced, its tag checked; the record switched in one rename;
// then the old image and the old tag removed, and the intent last. A kill or a failure at any point leaves the old snapshot or
// the new one whole, never a mix and never neither. A failed save removes
// what it wrote. What a killed save left (an image or a record no record
// names, an intent whose server is dead, a tag in a drive that no record
// names) is found by Leftovers and removed by Reap: a drive's tag through
// qemu-img when no QEMU holds the drive, else it is reported and left.
//
// Verify checks every part a record names (the image's size and tag, each
// drive's tag) without QEMU; a load calls it before it stops the running
// guest.
package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/durable"
	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// TagPrefix starts the tag of every snapshot this server makes, so that
// one never touches a user's own snapshots in a drive.
const TagPrefix = "qemu-mcp-"

// kind is what this store keeps, in its messages.
const kind store.Kind = "snapshot"

// CheckName accepts a snapshot name (see store.Kind.CheckName).
func CheckName(name string) error { return kind.CheckName(name) }

// File is a host file of the configuration, named by its path and known by
// its content.
type File struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// KernelIs says whether the machine boots the kernel image data (a
// server's built-in kernel, which a boot names by omitting its path).
func (m Machine) KernelIs(data []byte) bool {
	sum := sha256.Sum256(data)
	return m.Kernel != nil && m.Kernel.SHA256 == hex.EncodeToString(sum[:])
}

// Drive is a qemu.Drive as a saved machine records it. It is a type of its
// own because its JSON is the machine's identity: Machine.Hash hashes it,
// and the store files snapshots under that hash, so its keys, their order
// and an empty format written out must stay as they are (qemu.Drive omits
// an empty format, for profiles and results).
type Drive struct {
	Path     string `json:"path"`
	Format   string `json:"format"`
	ReadOnly bool   `json:"readonly,omitempty"`
	// Bus is the transport it sits on, if the boot named one: the
	// guest saw the disk at that address.
	Bus string `json:"bus,omitempty"`
}

// Machine is what a saved state needs of the QEMU that loads it: the same
// board, memory, harts, firmware, kernel and devices. The kernel, initrd
// and device tree are known by content, so a rebuilt kernel at the same
// path is a different machine.
type Machine struct {
	// Arch is the guest's architecture, empty for the default's: its
	// machines keep the identity (Hash) they had before the server knew
	// other architectures.
	Arch    string  `json:"arch,omitempty"`
	Machine string  `json:"machine"`
	CPU     string  `json:"cpu,omitempty"`
	BIOS    File    `json:"bios"`
	Kernel  *File   `json:"kernel,omitempty"`
	Initrd  *File   `json:"initrd,omitempty"`
	DTB     *File   `json:"dtb,omitempty"`
	Memory  string  `json:"memory"`
	SMP     int     `json:"smp"`
	Append  string  `json:"append,omitempty"`
	Drives  []Drive `json:"drives,omitempty"`
	Network string  `json:"network,omitempty"`
	GPU     bool    `json:"gpu,omitempty"`
	// VirtioModern: the virtio-mmio transports were modern-only, which
	// the guest's drivers negotiated with.
	VirtioModern bool     `json:"virtio_modern,omitempty"`
	ExtraArgs    []string `json:"extra_args,omitempty"`
	// Shares are the guest's 9p devices: a restore exports the same
	// directories under the same tags (their contents are the host's).
	Shares []qemu.Share `json:"shares,omitempty"`
}

// Timer is the board timer of m's architecture that a snapshot keeps the
// count of (arch.QEMU.Timer); nil for an architecture this server does
// not know.
func (m Machine) Timer() *arch.Timer {
	a, err := archs.Lookup(m.Arch)
	if err != nil {
		return nil
	}
	return a.QEMU().Timer
}

// Describe reads the machine of cfg, hashing its files through the
// descriptors in cfg.Files where it has them.
func Describe(cfg qemu.Config) (Machine, error) {
	file := func(p string) (*File, error) {
		if p == "" {
			return nil, nil
		}
		sum, err := hashFile(p, cfg.Files[p])
		if err != nil {
			return nil, err
		}
		return &File{Path: p, SHA256: sum}, nil
	}
	m := Machine{Machine: cfg.Machine, Memory: cfg.Memory, SMP: cfg.SMP, Append: cfg.Append,
		GPU: cfg.GPU, VirtioModern: cfg.VirtioModern, ExtraArgs: cfg.ExtraArgs, BIOS: File{Path: cfg.BIOS}}
	if m.Machine == "" {
		m.Machine = cfg.Platform().Machine
	}
	if a := cfg.Arch; a != nil && a.Name() != archs.Default().Name() {
		m.Arch, m.CPU = a.Name(), cfg.CPU
	}
	if cfg.Network != "none" {
		m.Network = cfg.Network
	}
	var err error
	if cfg.BIOS != "default" && cfg.BIOS != "none" && cfg.BIOS != "" {
		b, err := file(cfg.BIOS)
		if err != nil {
			return Machine{}, err
		}
		m.BIOS = *b
	}
	if m.Kernel, err = file(cfg.Kernel); err != nil {
		return Machine{}, err
	}
	if m.Initrd, err = file(cfg.Initrd); err != nil {
		return Machine{}, err
	}
	if m.DTB, err = file(cfg.DTB); err != nil {
		return Machine{}, err
	}
	for _, d := range cfg.Drives {
		f := d.Format
		if f == "" {
			f = "raw"
		}
		m.Drives = append(m.Drives, Drive{Path: d.Path, Format: f, ReadOnly: d.ReadOnly, Bus: d.Bus})
	}
	for _, sh := range cfg.Shares {
		m.Shares = append(m.Shares, qemu.Share{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable})
	}
	return m, nil
}

// hashes remembers file hashes by file identity and change time: hashing
// a kernel and initrd costs tens of milliseconds a boot.
var hashes sync.Map // fileKey -> string

type fileKey struct {
	dev, ino   uint64
	size       int64
	mtime, ctm int64
}

// hashFile hashes the file at p, through f when the caller opened it (the
// descriptor QEMU gets), without moving f's offset.
func hashFile(p string, f *os.File) (string, error) {
	if f == nil {
		o, err := os.Open(p)
		if err != nil {
			return "", fmt.Errorf("hash %s: %w", p, err)
		}
		defer o.Close()
		f = o
	}
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	var key fileKey
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key = fileKey{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctm: st.Ctim.Nano()}
		if v, ok := hashes.Load(key); ok {
			return v.(string), nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, fi.Size())); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if key.ino != 0 {
		hashes.Store(key, sum)
	}
	return sum, nil
}

// Hash names the machine: snapshots of the same name and another machine
// live apart.
func (m Machine) Hash() string {
	// Files count by content: the same kernel by another path is the
	// same machine. Drives count by path: they hold the disk's part.
	for _, f := range []**File{&m.Kernel, &m.Initrd, &m.DTB} {
		if *f != nil {
			c := **f
			c.Path = ""
			*f = &c
		}
	}
	if m.BIOS.SHA256 != "" {
		m.BIOS.Path = ""
	}
	b, _ := json.Marshal(m)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// Diff lists how now differs from saved, one "what: saved X, now Y" each.
func Diff(saved, now Machine) []string {
	var d []string
	add := func(what string, a, b any) {
		as, bs := fmt.Sprint(a), fmt.Sprint(b)
		if as != bs {
			d = append(d, fmt.Sprintf("%s: saved %s, now %s", what, as, bs))
		}
	}
	file := func(what string, a, b *File) {
		str := func(f *File) string {
			if f == nil {
				return "none"
			}
			if len(f.SHA256) < 12 {
				return f.Path
			}
			return f.Path + " (sha256 " + f.SHA256[:12] + ")"
		}
		switch {
		case a == nil && b == nil:
		case a == nil || b == nil || a.SHA256 != b.SHA256:
			d = append(d, fmt.Sprintf("%s: saved %s, now %s", what, str(a), str(b)))
		}
	}
	add("machine", saved.Machine, now.Machine)
	if saved.BIOS.SHA256 != "" || now.BIOS.SHA256 != "" {
		file("bios", &saved.BIOS, &now.BIOS)
	} else {
		add("bios", saved.BIOS.Path, now.BIOS.Path)
	}
	file("kernel", saved.Kernel, now.Kernel)
	file("initrd", saved.Initrd, now.Initrd)
	file("dtb", saved.DTB, now.DTB)
	add("memory", saved.Memory, now.Memory)
	add("smp", saved.SMP, now.SMP)
	add("append", fmt.Sprintf("%q", saved.Append), fmt.Sprintf("%q", now.Append))
	add("drives", list(saved.Drives, Drive.String), list(now.Drives, Drive.String))
	add("network", orNone(saved.Network), orNone(now.Network))
	add("gpu", saved.GPU, now.GPU)
	add("modern-only virtio", saved.VirtioModern, now.VirtioModern)
	add("extra arguments", list(saved.ExtraArgs, strconv.Quote), list(now.ExtraArgs, strconv.Quote))
	add("shares", list(saved.Shares, qemu.Share.String), list(now.Shares, qemu.Share.String))
	return d
}

// list is how Diff shows a list: its items, or "none".
func list[T any](items []T, str func(T) string) string {
	if len(items) == 0 {
		return "none"
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = str(it)
	}
	return strings.Join(out, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// String is "PATH (FORMAT)" or "PATH (FORMAT, readonly)".
func (d Drive) String() string {
	s := d.Path + " (" + d.Format
	if d.ReadOnly {
		s += ", readonly"
	}
	if d.Bus != "" {
		s += ", bus " + d.Bus
	}
	return s + ")"
}

// Meta is a snapshot's record (see the package comment).
type Meta struct {
	Name    string    `json:"name"`
	Project string    `json:"project"`
	Machine Machine   `json:"machine"`
	Tag     string    `json:"tag"`
	Created time.Time `json:"created"`
	// Size is the disk space the machine state takes (not stored: read
	// from the image).
	Size int64 `json:"size"`
	// QEMU is the version that saved it; a snapshot loads into the same
	// version only.
	QEMU string `json:"qemu"`
	// Mtime is the count of the guest's board timer at the save
	// (Machine.Timer; riscv64's ACLINT mtime), which some QEMUs do not
	// restore by themselves; 0 where the board's QEMU keeps its timer.
	Mtime uint64 `json:"mtime,omitempty"`
	// Drives are the writable qcow2 drives that hold their part of the
	// snapshot under Tag.
	Drives []string `json:"drives,omitempty"`
	// ID is the save's id; empty for records of the first version.
	ID string `json:"id,omitempty"`
	// Image is the image's file name in the record's directory (first
	// version: NAME.qcow2), ImageSize its size in bytes when saved.
	Image     string `json:"image,omitempty"`
	ImageSize int64  `json:"image_size,omitempty"`
	// Path is the image's path (not stored: where it was found).
	Path string `json:"-"`
	// unreadable says why the record could not be read.
	unreadable string
	// record is the record's path (not stored: where it was found).
	record string
}

// Store is the snapshots directory.
type Store struct {
	Dir string
	// Owner is the server whose saves these are; zero means this process.
	Owner names.Owner
	// QEMUImg is the qemu-img binary Reap uses on drives; "" means
	// "qemu-img" from PATH.
	QEMUImg string
	// Logger receives each step of a save (debug) and what could not be
	// undone; nil discards.
	Logger *slog.Logger
}

func (s Store) owner() names.Owner { return store.Self(s.Owner) }

func (s Store) dir(root, machineHash string) string {
	return filepath.Join(s.Dir, names.Project(root), machineHash)
}

func (s Store) recordPath(root, machineHash, name string) string {
	return filepath.Join(s.dir(root, machineHash), name+".json")
}

// List returns the project's snapshots, newest first.
func (s Store) List(root string) ([]Meta, error) {
	var out []Meta
	var errs []error
	err := store.Walk(filepath.Join(s.Dir, names.Project(root)), 1, nil, func(dir string) {
		ms, err := records.In(dir)
		out, errs = append(out, ms...), append(errs, err)
	})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Meta) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// records reads the records of a machine directory.
var records = store.Reader[Meta]{Kind: kind, Read: read,
	Name: func(m Meta) string { return m.Name },
	// Listed, as what it is: a snapshot that cannot load.
	Unreadable: func(name, path string, err error) Meta {
		return Meta{Name: name, unreadable: err.Error(), record: path}
	},
}

func read(metaPath string) (Meta, error) {
	var m Meta
	if err := kind.ReadRecord(metaPath, &m); err != nil {
		return Meta{}, err
	}
	if m.Image == "" {
		m.Image = m.Name + ".qcow2"
	}
	if m.Image != filepath.Base(m.Image) || !names.ValidUserName(m.Name) {
		return Meta{}, fmt.Errorf("snapshot record %s: names an image %q outside its directory", metaPath, m.Image)
	}
	m.Path = filepath.Join(filepath.Dir(metaPath), m.Image)
	m.record = metaPath
	m.Size = 0
	if fi, err := os.Stat(m.Path); err == nil {
		m.Size = store.Allocated(fi)
	}
	return m, nil
}

// Get returns the snapshot name of the machine machineHash.
func (s Store) Get(root, machineHash, name string) (Meta, error) {
	m, err := read(s.recordPath(root, machineHash, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("%w %q for this machine", ErrNotFound, name)
	}
	return m, err
}

// Find returns the snapshots called name, of any machine of the project.
func (s Store) Find(root, name string) ([]Meta, error) {
	all, err := s.List(root)
	if err != nil {
		return nil, err
	}
	var out []Meta
	for _, m := range all {
		if m.Name == name {
			out = append(out, m)
		}
	}
	return out, nil
}

// Delete removes a snapshot's record, then its image (not its part in
// drives, which the caller removes through QEMU or qemu-img). The record
// goes first: from then on the snapshot no longer exists, whatever is
// left.
func (s Store) Delete(m Meta) error {
	rec := m.record
	if rec == "" && m.Path != "" {
		rec = filepath.Join(filepath.Dir(m.Path), m.Name+".json")
	}
	if rec == "" {
		// A path relative to nothing would name a file where the
		// server runs.
		return fmt.Errorf("delete snapshot %q: the record names no place in the store", m.Name)
	}
	if m.unreadable != "" {
		// Which image it names cannot be told: the record goes, and
		// the reaper judges the images no record names. A record a
		// save wrote meanwhile is another snapshot: it stays.
		if _, err := read(rec); err == nil {
			return fmt.Errorf("delete snapshot %q: it was saved again meanwhile; list the snapshots and delete it again if you meant the new one", m.Name)
		}
		err := store.Remove(rec)
		durable.SyncDir(filepath.Dir(rec))
		return err
	}
	// Only the record that names this image: a save may have replaced it.
	if cur, err := read(rec); err == nil && cur.Image != m.Image {
		return os.Remove(m.Path)
	}
	err := store.Remove(rec, m.Path)
	durable.SyncDir(filepath.Dir(m.Path))
	return err
}

// Total is the disk space all complete snapshots take, every project's:
// what a killed save left is not a snapshot, and Reap removes it.
func (s Store) Total() int64 {
	var n int64
	store.Walk(s.Dir, 2, nil, func(dir string) {
		ms, _ := records.In(dir)
		for _, m := range ms {
			n += m.Size
		}
	})
	return n
}

// CheckStage reports what would make Stage fail for a copy in dir, without
// copying: the image unreadable, or too little room for it in dir.
func (s Store) CheckStage(m Meta, dir string) error {
	in, size, err := openImage(m)
	if err != nil {
		return err
	}
	in.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; free < size {
			return fmt.Errorf("stage snapshot %q: its image is %d bytes and %s has %d free: free some space there first", m.Name, size, dir, free)
		}
	}
	return nil
}

// openImage opens m's image to stage it, and says how large it is.
func openImage(m Meta) (*os.File, int64, error) {
	in, err := os.Open(m.Path)
	if err != nil {
		return nil, 0, fmt.Errorf("stage snapshot %q: %w", m.Name, err)
	}
	fi, err := in.Stat()
	if err != nil {
		in.Close()
		return nil, 0, fmt.Errorf("stage snapshot %q: %w", m.Name, err)
	}
	return in, fi.Size(), nil
}

// Stage copies m's image to dst for a QEMU to load from: QEMU opens a
// snapshot's image read-write, so each load gets a copy of its own and the
// kept image stays as saved, however many guests load it at once.
func (s Store) Stage(m Meta, dst string) error {
	in, _, err := openImage(m)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("stage snapshot %q: %w", m.Name, err)
	}
	// io.Copy between files uses copy_file_range: a reflink where the file
	// system has them, an in-kernel copy elsewhere.
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("stage snapshot %q: %w", m.Name, err)
	}
	return nil
}
