package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"golang.org/x/sys/unix"
)

// DefaultBinary is the emulator of the default architecture's guests.
var DefaultBinary = archs.Default().QEMU().Binary

// Drive is a disk image attached as a virtio block device on the board's
// transport: virtio-mmio on the virt boards (what bare-metal kernels for
// them usually probe), virtio-pci on q35.
type Drive struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"readonly,omitempty"`
	// Format is QEMU's image format; empty means raw.
	Format string `json:"format,omitempty"`
	// Bus is the virtio-mmio transport the drive sits on, such as
	// "virtio-mmio-bus.0" (the lowest address, 0x10001000 on riscv64's
	// virt, the only one small kernels probe), or on a PCI board a bus
	// and optionally a slot ("pcie.0:5"). Empty leaves the choice to QEMU,
	// which fills virtio-mmio transports from the highest address down,
	// in command-line order.
	Bus string `json:"bus,omitempty"`
}

// Share is a host directory exported to the guest through virtio-9p
// (QEMU's own 9p server, "-fsdev local"): the guest mounts it with
// mount -t 9p -o trans=virtio,version=9p2000.L TAG DIR.
type Share struct {
	// Path is the directory; like a drive's path it should be a key of
	// Config.Files (the server's checked descriptor).
	Path string `json:"path"`
	// Tag is the mount tag the guest names it by; a profile may leave it
	// out (the boot names the share by its directory).
	Tag string `json:"tag,omitempty"`
	// Writable lets the guest write; a read-only share refuses writes
	// in QEMU itself.
	Writable bool `json:"writable,omitempty"`
	// Model is QEMU's security model for a writable share: "mapped-xattr"
	// (default) or "mapped-file"; both keep the guest's owners, modes,
	// symlinks and device nodes as metadata of plain host files, so
	// nothing the guest creates becomes a host symlink or device node.
	Model string `json:"-"`
}

// String is "TAG=PATH", with ", writable" for a writable share.
func (s Share) String() string {
	if s.Writable {
		return s.Tag + "=" + s.Path + " (writable)"
	}
	return s.Tag + "=" + s.Path
}

// Config is everything that goes on a QEMU command line. The server-managed
// plumbing (serial FIFOs, QMP socket) is added by Start, not set here.
type Config struct {
	// Arch is the guest's architecture; nil means archs.Default().
	Arch arch.Arch
	// Binary is the emulator to run; empty means Arch's from PATH.
	Binary string
	// Machine is the -machine value and CPU the -cpu value; NewConfig
	// gives Arch's defaults (an empty CPU leaves QEMU's).
	Machine, CPU string
	// BIOS is "default" (QEMU's bundled firmware), "none", a firmware
	// path, or empty for no -bios (the board loads the kernel itself);
	// NewConfig gives Arch's default.
	BIOS string
	// Kernel is the -kernel image; may be empty when firmware boots alone.
	Kernel string
	// Initrd is the -initrd image (an initramfs), DTB a -dtb device tree
	// replacing the one QEMU generates; both need a kernel.
	Initrd string
	DTB    string
	// Memory is the -m value, such as "128M".
	Memory string
	// SMP is the number of harts.
	SMP int
	// Append is the kernel command line.
	Append string
	Drives []Drive
	// Shares are host directories exported to the guest (virtio-9p).
	Shares []Share
	// VirtioModern makes every virtio-mmio transport modern-only
	// (virtio 1.0, register layout version 2) instead of QEMU's legacy
	// default, as -global virtio-mmio.force-legacy=false does: kernels
	// written to the virtio 1.0 specification (xv6 and its kin) refuse a
	// legacy transport.
	VirtioModern bool
	// ExtraArgs are passed through after validation by CheckExtraArgs.
	ExtraArgs []string
	// GPU adds a virtio-gpu display with a virtio keyboard and tablet. The
	// display stays headless; screenshots go through QMP.
	GPU bool
	// VNC adds a VNC server on a unix socket (Runtime.VNCSocket): a
	// loopback port would let every local user watch the display and
	// type into it.
	VNC bool
	// Network is "" or "none" (no NIC), "user" (QEMU's slirp: no
	// privileges) or "tap" (TAPName, created by the caller).
	Network string
	// TAPName is the host TAP device for Network "tap".
	TAPName string
	// TAPPlainFrames turns the TAP's virtio-net header off (vnet_hdr=off),
	// so that frames pass as plain Ethernet: QEMU before 8.0 writes that
	// header into every frame a filter-dump captures.
	TAPPlainFrames bool
	// MAC is the guest NIC's address; empty lets QEMU choose.
	MAC string
	// Files are host files the server opened and checked itself (see
	// package hostpath), keyed by the path a field above uses:
	// QEMU gets each through an inherited descriptor (/proc/self/fd/N), so
	// it uses exactly the file that was checked, whatever happens to the
	// path meanwhile. Start closes them once QEMU has its copies.
	Files map[string]*os.File

	// LoadVM, if set, attaches the qcow2 holding a snapshot as a block
	// node with no device (SnapshotNode), for the caller to load before
	// the guest runs (QMP snapshot-load; -loadvm would look for the
	// machine state in the first drive instead).
	LoadVM *LoadVM

	// RR, if set, records the guest's run deterministically, or replays
	// such a recording (QEMU's record/replay). Drives must then be
	// read-only: a replay must read what the recording read.
	RR *RR

	// ConsoleFile, if set, is where the serial console's output goes
	// instead of the console's FIFO (appended, written synchronously as the
	// guest prints); nothing reaches the guest's input. A replay takes its
	// input from its log, and a file tells exactly how much it printed.
	ConsoleFile string

	// fds numbers the Files as QEMU inherits them, and gdbFD is the
	// gdbstub's listening socket (set by Start).
	fds   map[string]int
	gdbFD int
	// vncSocket is where the VNC server listens (set by Start).
	vncSocket string
}

// LoadVM is a saved state to start from.
type LoadVM struct {
	// Path is the qcow2 holding the machine state: a file of the
	// server's own, opened read-write by QEMU (a snapshot is loaded
	// from a writable image only).
	Path string
}

// RR is a record or a replay of a run.
type RR struct {
	// Replay replays Log; else the run is recorded into it.
	Replay bool
	// Log is QEMU's log of the run.
	Log string
	// Image is a qcow2 that holds (or, recording, gets) the machine at
	// the first instruction, as the snapshot RRSnapshot; it is the node
	// RRNode.
	Image string
}

// RR's names: the snapshot of the machine at the first instruction, and
// the block node of the image holding it.
const (
	RRSnapshot = "init"
	RRNode     = "qmcp-rr"
)

// ModernVirtio is the -global that makes the virt board's virtio-mmio
// transports modern-only (Config.VirtioModern).
const ModernVirtio = "virtio-mmio.force-legacy=false"

// SnapshotNode is the block node name of LoadVM's image.
const SnapshotNode = "qmcp-snapshot"

// SnapshotCache is the cache mode of LoadVM's image, a copy nobody keeps:
// never flushed to disk.
var SnapshotCache = map[string]any{"no-flush": true}

// ref is how QEMU is told about path: its inherited descriptor if the
// server opened it, else the path itself.
func (c Config) ref(path string) string {
	if fd, ok := c.fds[path]; ok {
		return "/proc/self/fd/" + strconv.Itoa(fd)
	}
	return path
}

// Option changes a Config: the functional-options style lets callers name
// only what differs from the defaults.
type Option func(*Config)

// WithBinary runs another emulator binary.
func WithBinary(path string) Option { return func(c *Config) { c.Binary = path } }

// WithArch sets the guest architecture.
func WithArch(a arch.Arch) Option { return func(c *Config) { c.Arch = a } }

// WithBIOS sets the firmware: "default", "none" or a path.
func WithBIOS(bios string) Option { return func(c *Config) { c.BIOS = bios } }

// WithKernel sets the -kernel image.
func WithKernel(path string) Option { return func(c *Config) { c.Kernel = path } }

// WithInitrd sets the -initrd image.
func WithInitrd(path string) Option { return func(c *Config) { c.Initrd = path } }

// WithDTB sets the -dtb device tree blob.
func WithDTB(path string) Option { return func(c *Config) { c.DTB = path } }

// WithMemory sets the guest RAM size, such as "256M".
func WithMemory(m string) Option { return func(c *Config) { c.Memory = m } }

// WithSMP sets the number of harts.
func WithSMP(n int) Option { return func(c *Config) { c.SMP = n } }

// WithAppend sets the kernel command line.
func WithAppend(s string) Option { return func(c *Config) { c.Append = s } }

// WithDrive attaches a disk image.
func WithDrive(d Drive) Option { return func(c *Config) { c.Drives = append(c.Drives, d) } }

// WithShare exports a host directory to the guest.
func WithShare(sh Share) Option { return func(c *Config) { c.Shares = append(c.Shares, sh) } }

// WithExtraArgs appends raw QEMU arguments (validated by CheckExtraArgs).
func WithExtraArgs(args ...string) Option {
	return func(c *Config) { c.ExtraArgs = append(c.ExtraArgs, args...) }
}

// WithVirtioModern makes the virtio-mmio transports modern-only.
func WithVirtioModern(on bool) Option { return func(c *Config) { c.VirtioModern = on } }

// WithGPU adds a display, keyboard and tablet.
func WithGPU(on bool) Option { return func(c *Config) { c.GPU = on } }

// WithVNC serves the display over VNC on a unix socket.
func WithVNC(on bool) Option { return func(c *Config) { c.VNC = on } }

// WithNetwork selects the guest network: "none", "user" or "tap".
func WithNetwork(kind, tap, mac string) Option {
	return func(c *Config) { c.Network, c.TAPName, c.MAC = kind, tap, mac }
}

// NewConfig returns the defaults (virt board, OpenSBI, 128M, one hart) with
// opts applied.
func NewConfig(opts ...Option) Config {
	c := Config{Memory: "128M", SMP: 1}
	for _, o := range opts {
		o(&c)
	}
	q := c.Platform()
	if c.Machine == "" {
		c.Machine = q.Machine
	}
	if c.CPU == "" {
		c.CPU = q.CPU
	}
	if c.BIOS == "" {
		c.BIOS = q.Firmware
	}
	return c
}

// BinaryName is the emulator c runs: Binary, else its architecture's,
// looked up on PATH when started.
func (c Config) BinaryName() string {
	if c.Binary != "" {
		return c.Binary
	}
	return c.Platform().Binary
}

// ArchName is the name of c's architecture.
func (c Config) ArchName() string {
	if c.Arch == nil {
		return archs.Default().Name()
	}
	return c.Arch.Name()
}

// Platform is what the command line of c's architecture needs.
func (c Config) Platform() arch.QEMU {
	if c.Arch == nil {
		return archs.Default().QEMU()
	}
	return c.Arch.QEMU()
}

// managedOptions are the options through which the server talks to QEMU or
// keeps track of it; letting a caller set them would break the serial
// console, the QMP connection or process supervision.
var managedOptions = map[string]string{
	"serial":     "the serial console is wired to the server's FIFOs",
	"chardev":    "character devices are managed by the server",
	"qmp":        "the QMP socket is managed by the server",
	"qmp-pretty": "the QMP socket is managed by the server",
	"monitor":    "the monitor is the server's QMP socket",
	"mon":        "the monitor is the server's QMP socket",
	"daemonize":  "QEMU must stay the server's child so it dies with it",
	"pidfile":    "the server tracks QEMU's PID itself",
	"readconfig": "a config file could redefine the managed devices",
	"preconfig":  "QEMU would wait in preconfig state and the boot would never resume",
}

// ManagedOptions lists the options (without the dash) that extra arguments
// may never set, whatever the host-access policy: the server depends on
// them to talk to QEMU and to supervise it.
func ManagedOptions() []string {
	names := make([]string, 0, len(managedOptions))
	for n := range managedOptions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// CheckExtraArgs refuses arguments that touch what the server manages.
func CheckExtraArgs(args []string) error {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(a, "-")
		if i := strings.IndexByte(name, '='); i >= 0 {
			name = name[:i]
		}
		if why, ok := managedOptions[name]; ok {
			return &ManagedError{Arg: a, Why: why}
		}
	}
	return nil
}

var memoryRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]+(\.[0-9]+)?[KMGT]?$`) })

// Validate checks what can be checked before starting QEMU, so that a typo
// gives a precise message instead of QEMU's.
func (c Config) Validate() error {
	if !memoryRE().MatchString(c.Memory) {
		return fmt.Errorf("memory %q: want a size such as 128M or 1G", c.Memory)
	}
	if c.SMP < 1 || c.SMP > 512 {
		return fmt.Errorf("smp %d: want 1 to 512", c.SMP)
	}
	switch c.BIOS {
	case "default":
		if q := c.Platform(); q.Firmware == "" {
			return fmt.Errorf("bios default: %s guests have no default firmware: give %s", c.ArchName(), q.FirmwareHelp)
		}
	case "none":
	case "":
		if c.Platform().Firmware != "" {
			return errors.New(`bios: want "default", "none" or a firmware path`)
		}
		if c.Kernel == "" {
			return errors.New("no kernel: this board has no firmware of its own to run (give a kernel or bios)")
		}
	default:
		if err := c.checkFile("bios", c.BIOS); err != nil {
			return err
		}
	}
	if c.Kernel != "" {
		if err := c.checkFile("kernel", c.Kernel); err != nil {
			return err
		}
	} else if c.BIOS == "none" {
		return errors.New(`bios "none" needs a kernel: nothing would run`)
	}
	for _, f := range []struct{ what, path string }{{"initrd", c.Initrd}, {"dtb", c.DTB}} {
		if f.path == "" {
			continue
		}
		if c.Kernel == "" {
			return fmt.Errorf("%s needs a kernel: QEMU loads it for the kernel", f.what)
		}
		if err := c.checkFile(f.what, f.path); err != nil {
			return err
		}
	}
	buses := map[string]int{}
	for i, d := range c.Drives {
		if d.Path == "" {
			return fmt.Errorf("drives[%d]: path is empty", i)
		}
		if d.Bus != "" {
			bus, slot, err := c.driveBus(d.Bus)
			if err != nil {
				return fmt.Errorf("drives[%d]: %w", i, err)
			}
			// A virtio-mmio transport holds one device, a PCI slot one.
			if c.Platform().Virtio != "pci" || slot != "" {
				if j, dup := buses[bus+slot]; dup {
					return fmt.Errorf("drives[%d]: bus %q is drives[%d]'s already: it holds one device", i, d.Bus, j)
				}
				buses[bus+slot] = i
			}
		}
		if c.RR != nil && !d.ReadOnly {
			return fmt.Errorf("drives[%d] %s is writable: a recorded run reads its drives only (a replay must read what the recording read): attach it with readonly: true", i, d.Path)
		}
		if err := c.checkFile(fmt.Sprintf("drives[%d]", i), d.Path); err != nil {
			return err
		}
	}
	tags := map[string]bool{}
	for i, sh := range c.Shares {
		if err := CheckTag(sh.Tag); err != nil {
			return fmt.Errorf("shares[%d]: %w", i, err)
		}
		if tags[sh.Tag] {
			return fmt.Errorf("shares[%d]: tag %q is used twice: give each share its own", i, sh.Tag)
		}
		tags[sh.Tag] = true
		if err := c.checkDir(fmt.Sprintf("shares[%d]", i), sh.Path); err != nil {
			return err
		}
		switch sh.Model {
		case "", "mapped-xattr", "mapped-file":
		default:
			return fmt.Errorf("shares[%d]: security model %q: want mapped-xattr or mapped-file", i, sh.Model)
		}
	}
	switch c.Network {
	case "", "none", "user":
	case "tap":
		if c.TAPName == "" {
			return errors.New(`network "tap" needs a TAP device name`)
		}
	default:
		return fmt.Errorf("network %q: want none, user or tap", c.Network)
	}
	return CheckExtraArgs(c.ExtraArgs)
}

func (c Config) checkFile(what, path string) error {
	if f, ok := c.Files[path]; ok {
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, path, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s %s: not a regular file", what, path)
		}
		return nil
	}
	return checkFile(what, path)
}

func (c Config) checkDir(what, path string) error {
	var fi os.FileInfo
	var err error
	if f, ok := c.Files[path]; ok {
		fi, err = f.Stat()
	} else {
		fi, err = os.Stat(path)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s %s: not a directory", what, path)
	}
	return nil
}

var (
	busRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[0-9]+)?$`) })
	slotRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(0x)?[0-9a-fA-F]{1,2}$`) })
)

// driveBus splits a drive's bus into the bus and, on a PCI board, the
// slot ("pcie.0:5" is slot 5 of the root bus; "pcie.0" lets QEMU choose).
func (c Config) driveBus(b string) (bus, slot string, err error) {
	if b == "" {
		return "", "", nil
	}
	q := c.Platform()
	bus = b
	if q.Virtio == "pci" {
		if i := strings.LastIndexByte(b, ':'); i >= 0 {
			bus, slot = b[:i], b[i+1:]
			n, perr := strconv.ParseUint(strings.TrimPrefix(slot, "0x"), 16, 8)
			if !slotRE().MatchString(slot) || perr != nil || n == 0 || n > 0x1f {
				return "", "", fmt.Errorf("bus %q: want a PCI slot from 1 to 0x1f after the colon, such as %s:5", b, q.DriveBus)
			}
			slot = fmt.Sprintf("%#x", n)
		}
	}
	if !busRE().MatchString(bus) {
		return "", "", fmt.Errorf("bus %q: want a bus name such as %s", b, q.DriveBus)
	}
	return bus, slot, nil
}

var tagRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.-]{1,31}$`) })

// CheckTag accepts a 9p mount tag: 1 to 31 letters, digits, '_', '.', '-'
// (QEMU takes at most 31 bytes).
func CheckTag(tag string) error {
	if !tagRE().MatchString(tag) {
		return fmt.Errorf("tag %q: use 1 to 31 letters, digits, '_', '.' or '-'", tag)
	}
	return nil
}

func checkFile(what, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s %s: no such file", what, path)
		}
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s %s: not a regular file", what, path)
	}
	return nil
}

// escapeOpt doubles commas, QEMU's escape inside option values, so a path
// with a comma cannot inject suboptions.
func escapeOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Argv returns the full command line, binary first. serialBase is the
// server-managed FIFO base path, and qmpFD the descriptor of the listening
// QMP socket QEMU inherits. The guest starts paused (-S) so the server can
// attach to everything before it runs.
func (c Config) Argv(serialBase string, qmpFD int) []string {
	q := c.Platform()
	bin := c.Binary
	if bin == "" {
		bin = q.Binary
	}
	machine := c.Machine
	if machine == "" {
		machine = q.Machine
	}
	argv := []string{
		bin,
		"-machine", machine,
		"-nodefaults",
		"-display", "none",
		"-S",
		"-m", c.Memory,
		"-smp", strconv.Itoa(c.SMP),
	}
	if c.CPU != "" {
		argv = append(argv, "-cpu", c.CPU)
	}
	argv = append(argv, q.Args...)
	// A board without firmware of its own runs none already: QEMU would
	// look for a ROM named "none".
	if c.BIOS != "" && !(c.BIOS == "none" && q.Firmware == "") {
		argv = append(argv, "-bios", c.ref(c.BIOS))
	}
	if c.Kernel != "" {
		argv = append(argv, "-kernel", c.ref(c.Kernel))
	}
	if c.Initrd != "" {
		argv = append(argv, "-initrd", c.ref(c.Initrd))
	}
	if c.DTB != "" {
		argv = append(argv, "-dtb", c.ref(c.DTB))
	}
	if c.Append != "" {
		argv = append(argv, "-append", c.Append)
	}
	if c.VirtioModern {
		argv = append(argv, "-global", ModernVirtio)
	}
	for i, d := range c.Drives {
		format := d.Format
		if format == "" {
			format = "raw"
		}
		id := "drive" + strconv.Itoa(i)
		img := id
		if c.RR != nil {
			img += "-img"
		}
		spec := "file=" + escapeOpt(c.ref(d.Path)) + ",format=" + escapeOpt(format) + ",if=none,id=" + img
		if d.ReadOnly {
			spec += ",readonly=on"
		}
		argv = append(argv, "-drive", spec)
		if c.RR != nil {
			// blkreplay makes the order of the drive's completions part
			// of the log.
			argv = append(argv, "-drive", "driver=blkreplay,if=none,image="+img+",id="+id+",readonly=on")
		}
		dev := q.Device("blk") + ",drive=" + id
		if bus, slot, _ := c.driveBus(d.Bus); bus != "" {
			dev += ",bus=" + bus
			if slot != "" {
				dev += ",addr=" + slot
			}
		}
		argv = append(argv, "-device", dev)
	}
	for i, sh := range c.Shares {
		id := "fs" + strconv.Itoa(i)
		// multidevs=remap: a mount point inside the directory must not
		// give the guest two files with one inode number.
		spec := "local,id=" + id + ",path=" + escapeOpt(c.ref(sh.Path)) + ",multidevs=remap"
		if sh.Writable {
			model := sh.Model
			if model == "" {
				model = "mapped-xattr"
			}
			spec += ",security_model=" + model
		} else {
			spec += ",security_model=none,readonly=on"
		}
		argv = append(argv, "-fsdev", spec, "-device", q.Device("9p")+",fsdev="+id+",mount_tag="+escapeOpt(sh.Tag))
	}
	if c.Network == "user" || c.Network == "tap" {
		netdev := "user,id=net0"
		if c.Network == "tap" {
			netdev = "tap,id=net0,ifname=" + escapeOpt(c.TAPName) + ",script=no,downscript=no"
			if c.TAPPlainFrames {
				netdev += ",vnet_hdr=off"
			}
		}
		dev := q.Device("net") + ",netdev=net0"
		if c.MAC != "" {
			dev += ",mac=" + escapeOpt(c.MAC)
		}
		argv = append(argv, "-netdev", netdev, "-device", dev)
	}
	if c.GPU {
		argv = append(argv, "-device", q.Device("gpu"), "-device", q.Device("keyboard"), "-device", q.Device("tablet"))
	}
	if c.VNC && c.vncSocket != "" {
		argv = append(argv, "-vnc", "unix:"+escapeOpt(c.vncSocket))
	}
	serial := "pipe,id=serial0,path=" + escapeOpt(serialBase)
	if c.ConsoleFile != "" {
		serial = "file,id=serial0,append=on,path=" + escapeOpt(c.ConsoleFile)
	}
	argv = append(argv,
		"-chardev", serial,
		"-serial", "chardev:serial0",
		"-chardev", "socket,id=qmp0,fd="+strconv.Itoa(qmpFD)+",server=on,wait=off",
		// -qmp, not -mon chardev=…,mode=control: QEMU 11 warns at every
		// start that -mon is deprecated, and the warning headed every
		// error a user read from a failed boot.
		"-qmp", "chardev:qmp0",
	)
	if c.gdbFD > 0 {
		argv = append(argv, "-chardev", "socket,id=gdb0,fd="+strconv.Itoa(c.gdbFD)+",server=on,wait=off", "-gdb", "chardev:gdb0")
	}
	if rr := c.RR; rr != nil {
		mode := "record"
		if rr.Replay {
			mode = "replay"
		}
		drive := "file=" + escapeOpt(rr.Image) + ",format=qcow2,if=none,id=rr,node-name=" + RRNode
		if rr.Replay {
			// A replay's image is a copy thrown away after it: QEMU's
			// flush of it at every stop and cont (each step of going
			// back) is disk writes for nothing.
			drive += ",cache.no-flush=on"
		}
		argv = append(argv, "-icount", "shift=auto,rr="+mode+",rrfile="+escapeOpt(rr.Log)+",rrsnapshot="+RRSnapshot, "-drive", drive)
	}
	if l := c.LoadVM; l != nil {
		// The copy is thrown away after the load: QEMU's flush of the
		// image (at a stop or cont) would write the whole fresh copy
		// to disk for nothing, tens of milliseconds.
		argv = append(argv, "-blockdev", "driver=qcow2,node-name="+SnapshotNode+",cache.no-flush=on,file.driver=file,file.filename="+escapeOpt(l.Path))
	}
	return append(argv, c.ExtraArgs...)
}

// resolveBinary finds the emulator of c, with a message that says how to
// get it.
func (c Config) resolveBinary() (string, error) {
	q := c.Platform()
	bin := c.Binary
	if bin == "" {
		bin = q.Binary
	}
	if strings.ContainsRune(bin, filepath.Separator) {
		if err := checkFile("qemu binary", bin); err != nil {
			return "", err
		}
		return bin, nil
	}
	p, err := lookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s not found in PATH: install it (Debian: apt-get install %s, or run scripts/deps)", bin, q.Package)
	}
	return p, nil
}

// ShareModel is the security model for a writable share of dir:
// mapped-xattr where its file system takes user extended attributes (the
// guest's metadata is kept in them), else mapped-file (kept in
// .virtfs_metadata directories beside the files).
func ShareModel(dir *os.File) string {
	const probe = "user.qemu-mcp.probe"
	if err := unix.Fsetxattr(int(dir.Fd()), probe, []byte("1"), 0); err != nil {
		return "mapped-file"
	}
	_ = unix.Fremovexattr(int(dir.Fd()), probe)
	return "mapped-xattr"
}

// MountCommand is the guest's command that mounts the share tag on dir.
// msize is the largest message virtio takes in Linux 6.1: reads move
// ten times as fast as with the default.
func MountCommand(tag, dir string) string {
	return "mkdir -p " + dir + " && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 " + tag + " " + dir
}

// ManagedError is an extra QEMU argument that sets what the server
// manages itself (the console, the monitor, daemonizing ...).
type ManagedError struct {
	Arg, Why string
}

func (e *ManagedError) Error() string { return fmt.Sprintf("%s is not allowed: %s", e.Arg, e.Why) }

// Advice says where the option was given.
func (e *ManagedError) Advice() advice.Advice { return advice.Advice{Action: advice.InExtraArguments} }
