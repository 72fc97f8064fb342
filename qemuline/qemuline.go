// Package qemuline reads the QEMU invocation a project runs (what its
// `make -n qemu` prints) into the server's boot fields, so that a kernel
// boots as its own build boots it. Each option is kept (honoured by a
// boot field, or passed on after the boundary's check), replaced (the
// server does it its own way: the console, the monitor, the gdbstub) or
// refused, each with its reason, so that the user fixes the line once.
// It knows nothing of MCP; files are checked later, by the boot, under
// the host-path policy.
package qemuline

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/qemuopts"
	"github.com/qemu-mcp/qemu-mcp/internal/shellwords"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// Entry is one option of the line and what became of it.
type Entry struct {
	// Option is the option with its value, as the line gave it.
	Option string `json:"option"`
	// As says what it is now (a kept or replaced option).
	As string `json:"as,omitempty"`
	// Reason says why it was replaced or refused.
	Reason string `json:"reason,omitempty"`
}

// Report is what became of every option of a line.
type Report struct {
	Kept     []Entry `json:"kept,omitempty"`
	Replaced []Entry `json:"replaced,omitempty"`
	Refused  []Entry `json:"refused,omitempty"`

	files []File
}

// File is a host file the line names, for the boot to check under the
// host-path policy before anything starts.
type File struct {
	// Field is the boot field it went to: kernel, initrd, dtb, bios or
	// drives[N].
	Field string
	Path  string
	// Write: QEMU opens it for writing (a drive not read-only).
	Write bool
	// Option is the option of the line that named it.
	Option string
}

// RefusedDrive is the Field of the file of a -drive whose device was
// refused: it goes to no boot field, and is checked all the same.
const RefusedDrive = "-drive"

// Files lists the host files the line names.
func (r Report) Files() []File { return r.files }

// Merge adds o's entries to r's.
func (r *Report) Merge(o Report) {
	r.Kept = append(r.Kept, o.Kept...)
	r.Replaced = append(r.Replaced, o.Replaced...)
	r.Refused = append(r.Refused, o.Refused...)
	r.files = append(r.files, o.files...)
}

// Refuse adds a refusal, for what a later check (a file's) refuses.
func (r *Report) Refuse(option, reason string) {
	r.Refused = append(r.Refused, Entry{Option: option, Reason: reason})
}

// Text is the report in a few lines, for readers of text.
func (r Report) Text() string {
	var b strings.Builder
	list := func(what string, es []Entry) {
		if len(es) == 0 {
			return
		}
		fmt.Fprintf(&b, "%s:\n", what)
		for _, e := range es {
			fmt.Fprintf(&b, "  %s", e.Option)
			switch {
			case e.As != "" && e.Reason != "":
				fmt.Fprintf(&b, " -> %s (%s)", e.As, e.Reason)
			case e.As != "":
				fmt.Fprintf(&b, " -> %s", e.As)
			case e.Reason != "":
				fmt.Fprintf(&b, ": %s", e.Reason)
			}
			b.WriteByte('\n')
		}
	}
	list("refused", r.Refused)
	list("replaced", r.Replaced)
	list("kept", r.Kept)
	return b.String()
}

// RefusedError is a line with options the server does not take; nothing
// was started or stopped.
type RefusedError struct {
	Report Report
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the QEMU command line: %d option(s) refused, so nothing was started (and no running guest was stopped); fix them and boot again:\n", len(e.Report.Refused))
	for _, r := range e.Report.Refused {
		fmt.Fprintf(&b, "  %s: %s\n", r.Option, r.Reason)
	}
	if n := len(e.Report.Replaced); n > 0 {
		fmt.Fprintf(&b, "(%d replaced by the server's own plumbing and %d kept as they are)", n, len(e.Report.Kept))
	}
	return strings.TrimRight(b.String(), "\n")
}

// Checker checks an option the line passes on to QEMU as it is (an extra
// argument): nil, or an error that says why it is refused. The option is
// its words, such as ["-global", "virtio-mmio.force-legacy=false"].
type Checker func(option []string) error

// flags are the options that take no value.
var flags = map[string]bool{
	"nographic": true, "S": true, "s": true, "no-reboot": true, "no-shutdown": true, "nodefaults": true,
	"no-user-config": true, "singlestep": true, "enable-kvm": true, "daemonize": true, "snapshot": true,
	"usb": true, "full-screen": true, "no-hpet": true, "no-acpi": true, "no-fd-bootchk": true,
	"preconfig": true, "only-migratable": true, "alt-grab": true, "ctrl-grab": true, "win2k-hack": true,
	"no-quit": true, "no-frame": true, "portrait": true, "mem-prealloc": true, "old-param": true,
	"semihosting": true, "nouserconfig": true, "version": true, "help": true, "h": true,
}

// option is one option of the line.
type option struct {
	name  string // without dashes or inline value
	value string
	words []string // as the line gave them
}

func (o option) String() string { return shellwords.Join(o.words) }

// Parse reads words, a QEMU invocation (its first word may be the QEMU
// binary, or absent), into the machine of a boot and the report of what
// became of each option. check judges what is passed on as it is; the
// line is refused if the report has any refusal.
func Parse(words []string, check Checker) (profile.Profile, Report) {
	var (
		p   profile.Profile
		rep Report
	)
	if len(words) > 0 && !strings.HasPrefix(words[0], "-") {
		bin := filepath.Base(words[0])
		if a := archOf(bin); a != nil {
			p.Arch = a.Name()
			rep.Replaced = append(rep.Replaced, Entry{Option: words[0], As: "the server's " + a.QEMU().Binary,
				Reason: "the server runs the QEMU it was started with for " + a.Name() + " (its -qemu flag)"})
			words = words[1:]
		} else if strings.HasPrefix(bin, "qemu-system-") {
			rep.Refuse(words[0], "this server runs "+strings.Join(archs.Names(), " and ")+" guests")
			words = words[1:]
		}
	}
	opts, bare := split(words)
	for _, w := range bare {
		rep.Refuse(shellwords.Quote(w), "QEMU takes a bare argument as the path of a disk image: attach images with -drive file=PATH,if=none,id=ID and -device virtio-blk-device,drive=ID")
	}
	l := &line{p: &p, rep: &rep, check: check, drives: map[string]*driveOpt{}, netdevs: map[string]*netdevOpt{}, chardevs: map[string]string{}}
	l.index(opts)
	for _, o := range opts {
		l.take(o)
	}
	l.finish()
	return p, rep
}

// archOf is the architecture whose QEMU is bin, or nil.
func archOf(bin string) arch.Arch {
	for _, a := range archs.All() {
		if a.QEMU().Binary == bin {
			return a
		}
	}
	return nil
}

// split groups words into options with their values; words that are no
// option's value are bare.
func split(words []string) (opts []option, bare []string) {
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
			bare = append(bare, w)
			continue
		}
		name := strings.TrimPrefix(w[1:], "-")
		o := option{name: name, words: []string{w}}
		if j := strings.IndexByte(name, '='); j >= 0 {
			o.name, o.value = name[:j], name[j+1:]
		} else if !flags[name] && i+1 < len(words) {
			i++
			o.value = words[i]
			o.words = append(o.words, words[i])
		}
		opts = append(opts, o)
	}
	return opts, bare
}

// driveOpt is a -drive of the line and the -device that attaches it.
type driveOpt struct {
	opt    option
	kvs    []qemuopts.KV
	device *option
	bus    string
	index  int // in p.Drives, once placed
	bad    bool
}

// netdevOpt is a -netdev of the line.
type netdevOpt struct {
	opt  option
	kvs  []qemuopts.KV
	used bool
}

type line struct {
	p        *profile.Profile
	rep      *Report
	check    Checker
	drives   map[string]*driveOpt // by id
	order    []*driveOpt          // in the order of the -drive options
	attached []*driveOpt          // in the order of the -device options
	netdevs  map[string]*netdevOpt
	chardevs map[string]string // id -> backend, of the -chardev options
	serials  int
}

// index records the drives, network backends and character devices the
// other options name.
func (l *line) index(opts []option) {
	for _, o := range opts {
		switch o.name {
		case "drive":
			kvs := qemuopts.Parse(o.value, "")
			d := &driveOpt{opt: o, kvs: kvs, index: -1}
			if id, ok := qemuopts.Get(kvs, "id"); ok {
				l.drives[id] = d
			}
			l.order = append(l.order, d)
		case "netdev":
			kvs := qemuopts.Parse(o.value, "type")
			if id, ok := qemuopts.Get(kvs, "id"); ok {
				l.netdevs[id] = &netdevOpt{opt: o, kvs: kvs}
			}
		case "chardev":
			kvs := qemuopts.Parse(o.value, "backend")
			if id, ok := qemuopts.Get(kvs, "id"); ok {
				b, _ := qemuopts.Get(kvs, "backend")
				l.chardevs[id] = b
			}
		}
	}
}

func (l *line) file(field, path string, write bool, o option) {
	l.rep.files = append(l.rep.files, File{Field: field, Path: path, Write: write, Option: o.String()})
}

func (l *line) keep(o option, as string) {
	l.rep.Kept = append(l.rep.Kept, Entry{Option: o.String(), As: as})
}

func (l *line) replace(o option, as, why string) {
	l.rep.Replaced = append(l.rep.Replaced, Entry{Option: o.String(), As: as, Reason: why})
}

func (l *line) refuse(o option, format string, a ...any) {
	l.rep.Refuse(o.String(), fmt.Sprintf(format, a...))
}

// pass keeps o as an extra argument if check takes it.
func (l *line) pass(o option) {
	words := []string{"-" + o.name}
	if len(o.words) > 1 || strings.Contains(o.words[0], "=") {
		words = append(words, o.value) // the option's value, given apart or inline
	}
	if l.check != nil {
		if err := l.check(words); err != nil {
			l.refuse(o, "%v", err)
			return
		}
	}
	l.p.ExtraArgs = append(l.p.ExtraArgs, words...)
	l.keep(o, "passed to QEMU as it is")
}

// Why the server's own plumbing replaces an option.
const (
	consoleWhy = "the server's console, whose output it keeps and on which its tools read and type"
	monitorWhy = "the server's QMP socket, which its tools talk to (HMP through human-monitor-command)"
	gdbWhy     = "the gdbstub on a socket only this server reaches, which its debugger drives"
)

var (
	memoryRE = regexp.MustCompile(`^([0-9]+(\.[0-9]+)?)([KMGTkmgt]?)[bB]?$`)
	numberRE = regexp.MustCompile(`^[0-9]+$`)
)

// localBackends are the character-device backends that only the user at
// QEMU's terminal reaches, which the server's console and monitor stand
// in for; any other names a host file, socket or device.
func localBackend(b string) bool {
	switch {
	case b == "stdio", b == "mon:stdio", b == "none", b == "null", b == "vc", strings.HasPrefix(b, "vc:"):
		return true
	}
	return false
}

func (l *line) take(o option) {
	switch o.name {
	case "machine", "M":
		kvs := qemuopts.Parse(o.value, "type")
		if t, _ := qemuopts.Get(kvs, "type"); len(kvs) == 1 && t == "virt" {
			l.keep(o, "machine virt (the server's board)")
			return
		}
		l.pass(o)
	case "bios", "kernel", "initrd", "dtb":
		*map[string]*string{"bios": &l.p.BIOS, "kernel": &l.p.Kernel, "initrd": &l.p.Initrd, "dtb": &l.p.DTB}[o.name] = o.value
		if o.name != "bios" || o.value != "none" && o.value != "default" {
			l.file(o.name, o.value, false, o)
		}
		l.keep(o, o.name)
	case "append":
		l.p.Append = o.value
		l.keep(o, "append")
	case "m":
		v := o.value
		if s, ok := qemuopts.Get(qemuopts.Parse(v, "size"), "size"); ok && !strings.Contains(v, ",") {
			v = s
		}
		if m := memoryRE.FindStringSubmatch(v); m != nil {
			l.p.Memory = m[1] + strings.ToUpper(m[3])
			if m[3] == "" {
				l.p.Memory += "M" // QEMU reads a bare number as MiB
			}
			l.keep(o, "memory "+l.p.Memory)
			return
		}
		l.pass(o)
	case "smp":
		v := o.value
		if c, ok := qemuopts.Get(qemuopts.Parse(v, "cpus"), "cpus"); ok && !strings.Contains(v, ",") {
			v = c
		}
		if numberRE.MatchString(v) {
			n, err := strconv.Atoi(v)
			if err == nil && n >= 1 && n <= 512 {
				l.p.SMP = n
				l.keep(o, "smp "+v)
				return
			}
		}
		l.pass(o)
	case "nographic":
		l.replace(o, "no window", consoleWhy+"; "+monitorWhy)
	case "display":
		l.replace(o, "-display none", "the server shows no window; a boot with a display (gpu) has screenshots through QMP")
	case "vga":
		if o.value == "none" {
			l.replace(o, "no display", "the server adds no display unless the boot asks for one (gpu)")
			return
		}
		l.pass(o)
	case "serial":
		l.serial(o)
	case "monitor":
		backend := o.value
		if strings.HasPrefix(backend, "chardev:") {
			backend = l.chardevs[strings.TrimPrefix(backend, "chardev:")]
		}
		if localBackend(backend) {
			l.replace(o, "the server's QMP socket", monitorWhy)
			return
		}
		l.refuse(o, "a monitor on a host socket, file or device (%s) gives whoever opens it the whole of QEMU; the server's QMP socket replaces -monitor stdio", o.value)
	case "mon":
		kvs := qemuopts.Parse(o.value, "chardev")
		id, _ := qemuopts.Get(kvs, "chardev")
		if localBackend(l.chardevs[id]) {
			l.replace(o, "the server's QMP socket", monitorWhy)
			return
		}
		l.refuse(o, "a monitor on character device %q, which is not the terminal; the server's QMP socket replaces it", id)
	case "chardev":
		kvs := qemuopts.Parse(o.value, "backend")
		if b, _ := qemuopts.Get(kvs, "backend"); localBackend(b) {
			l.replace(o, "the server's console and QMP socket", "a terminal character device: "+consoleWhy)
			return
		}
		l.refuse(o, "a character device on the host (a file, socket, pty or device); the server wires the console and the monitor itself")
	case "qmp", "qmp-pretty":
		l.replace(o, "the server's QMP socket", monitorWhy)
	case "s", "gdb":
		l.p.GDB = true
		l.replace(o, "the debugger's gdbstub (gdb)", gdbWhy)
	case "S":
		l.replace(o, "the server's paused start", "the server starts QEMU paused and runs the guest once its console is attached, so no output is lost; a breakpoint, or QMP stop, stops it")
	case "daemonize", "pidfile":
		l.replace(o, "the server's child process", "QEMU stays the server's child, which tracks it and stops it with the server")
	case "drive":
		// Taken with the -device that attaches it, in finish.
	case "device":
		l.device(o)
	case "netdev":
		// Taken with the -device or -nic that uses it.
		kvs := qemuopts.Parse(o.value, "type")
		if id, _ := qemuopts.Get(kvs, "id"); id == "" {
			l.refuse(o, "a -netdev without an id= is used by no device")
		}
	case "nic":
		kvs := qemuopts.Parse(o.value, "type")
		l.network(o, kvs, "")
	case "net":
		kvs := qemuopts.Parse(o.value, "type")
		switch t, _ := qemuopts.Get(kvs, "type"); t {
		case "nic":
			if m, ok := qemuopts.Get(kvs, "model"); ok && m != "virtio" && m != "virtio-net-device" {
				l.refuse(o, "NIC model %s: the server's NIC is virtio-net-device", m)
				return
			}
			l.keep(o, "the server's virtio-net-device")
		case "none":
			l.keep(o, "no network")
		default:
			l.network(o, kvs, "")
		}
	case "global":
		if o.value == qemu.ModernVirtio || o.value == "virtio-mmio.force-legacy=off" || o.value == "virtio-mmio.force-legacy=no" {
			l.p.VirtioModern = true
			l.keep(o, "modern-only virtio-mmio transports")
			return
		}
		l.pass(o)
	case "fsdev", "virtfs":
		l.refuse(o, "host directories are shared with shares: [{path, tag}] (a checked, read-only by default virtio-9p export)")
	default:
		l.pass(o)
	}
}

func (l *line) serial(o option) {
	backend := o.value
	if strings.HasPrefix(backend, "chardev:") {
		backend = l.chardevs[strings.TrimPrefix(backend, "chardev:")]
	}
	if !localBackend(backend) {
		l.refuse(o, "a console on a host socket, file or device (%s); the server's console replaces -serial stdio", o.value)
		return
	}
	l.serials++
	if l.serials > 1 && backend != "none" && backend != "null" {
		l.refuse(o, "a second serial port on the terminal: the server has one console, the first UART")
		return
	}
	l.replace(o, "the server's console", consoleWhy)
}

// device takes a -device: a block or network device attached to the
// line's -drive or -netdev becomes the server's, anything else is passed
// on as it is.
func (l *line) device(o option) {
	kvs := qemuopts.Parse(o.value, "driver")
	driver, _ := qemuopts.Get(kvs, "driver")
	if id, ok := qemuopts.Get(kvs, "drive"); ok {
		d := l.drives[id]
		switch {
		case d == nil:
			l.refuse(o, "no -drive of the line has id=%s", id)
		case driver != "virtio-blk-device":
			l.refuse(o, "the server attaches drives as virtio-blk-device on a virtio-mmio transport, not %s", driver)
		case d.device != nil:
			l.refuse(o, "drive %s is attached by %s already", id, d.device)
		default:
			for _, kv := range kvs {
				switch kv.Key {
				case "driver", "drive", "id":
				case "bus":
					d.bus = kv.Value
				default:
					l.refuse(o, "property %s of a drive's device: the server takes bus= only (drives[].bus)", kv.Key)
					d.bad = true
					return
				}
			}
			o := o
			d.device = &o
			l.attached = append(l.attached, d)
		}
		return
	}
	if id, ok := qemuopts.Get(kvs, "netdev"); ok {
		n := l.netdevs[id]
		switch {
		case n == nil:
			l.refuse(o, "no -netdev of the line has id=%s", id)
		case driver != "virtio-net-device":
			l.refuse(o, "the server's NIC is virtio-net-device on a virtio-mmio transport, not %s", driver)
		default:
			for _, kv := range kvs {
				switch kv.Key {
				case "driver", "netdev", "id":
				default:
					l.refuse(o, "property %s of the NIC: the server sets the NIC up itself (network)", kv.Key)
					return
				}
			}
			n.used = true
			l.network(n.opt, n.kvs, o.String())
			l.keep(o, "the server's virtio-net-device")
		}
		return
	}
	l.pass(o)
}

// network maps a network backend (-netdev, -nic, -net) to network.
func (l *line) network(o option, kvs []qemuopts.KV, device string) {
	t, _ := qemuopts.Get(kvs, "type")
	extra := ""
	for _, kv := range kvs {
		switch kv.Key {
		case "type", "id", "model":
		case "ifname", "script", "downscript", "vnet_hdr":
			if t == "tap" {
				continue
			}
			fallthrough
		default:
			if extra == "" {
				extra = kv.Key
			}
		}
	}
	if m, ok := qemuopts.Get(kvs, "model"); ok && m != "virtio" && m != "virtio-net-device" {
		l.refuse(o, "NIC model %s: the server's NIC is virtio-net-device", m)
		return
	}
	switch {
	case t == "none":
		l.keep(o, "no network")
	case t == "user" && extra == "":
		l.p.Network = "user"
		l.keep(o, "network: user")
	case t == "user":
		l.refuse(o, "user networking's %s= reaches the host (forwarded ports, served directories, host commands); network: user gives the guest QEMU's slirp without it", extra)
	case t == "tap" && extra == "":
		l.p.Network = "tap"
		as := "network: tap"
		if name, ok := qemuopts.Get(kvs, "ifname"); ok {
			as += " (the server makes the guest's TAP; boot with tap: " + name + " to use yours)"
		}
		l.keep(o, as)
	default:
		l.refuse(o, "network backend %s: the server gives network none, user or tap", t)
	}
}

// finish places the drives: in the order of the -device options that
// attach them, then those no device attaches (QEMU would show those to
// no guest; the server attaches them as it does its drives).
func (l *line) finish() {
	for _, n := range l.netdevs {
		if !n.used {
			l.keep(n.opt, "nothing: no device of the line uses it")
		}
	}
	for _, d := range l.order {
		if d.bad {
			// Its device is refused; its file is checked all the same, so
			// that the line is fixed once.
			if path, ok := qemuopts.Get(d.kvs, "file"); ok {
				l.file(RefusedDrive, path, false, d.opt)
			}
		}
	}
	placed := append([]*driveOpt(nil), l.attached...)
	for _, d := range l.order {
		if d.device == nil && !d.bad {
			placed = append(placed, d)
		}
	}
	for _, d := range placed {
		drive, reason := l.drive(d)
		if reason != "" {
			l.refuse(d.opt, "%s", reason)
			continue
		}
		i := len(l.p.Drives)
		l.p.Drives = append(l.p.Drives, drive)
		as := fmt.Sprintf("drives[%d]", i)
		l.file(as, drive.Path, !drive.ReadOnly, d.opt)
		if drive.Bus != "" {
			as += " on " + drive.Bus
		}
		if d.device == nil {
			l.keep(d.opt, as+" (no -device attaches it: the server attaches it as virtio-blk-device)")
			continue
		}
		l.keep(d.opt, as)
		l.keep(*d.device, as+"'s device")
	}
}

// drive is d as a drive of the server's, or why it cannot be.
func (l *line) drive(d *driveOpt) (qemu.Drive, string) {
	var drive qemu.Drive
	for _, kv := range d.kvs {
		switch kv.Key {
		case "file":
			drive.Path = kv.Value
		case "format":
			drive.Format = kv.Value
		case "id":
		case "if":
			if kv.Value != "none" {
				return drive, fmt.Sprintf("if=%s: the server attaches drives as virtio-blk-device; write if=none,id=ID with -device virtio-blk-device,drive=ID (bus= where the kernel looks)", kv.Value)
			}
		case "readonly":
			switch kv.Value {
			case "on", "yes", "true":
				drive.ReadOnly = true
			case "off", "no", "false":
			default:
				return drive, "readonly=" + kv.Value + ": want on or off"
			}
		case "media":
			if kv.Value != "disk" {
				return drive, "media=" + kv.Value + ": the server attaches disks"
			}
		default:
			return drive, fmt.Sprintf("drive property %s: the server opens the image itself and takes file, format, readonly, if=none and id", kv.Key)
		}
	}
	if drive.Path == "" {
		return drive, "a -drive without file= has no image"
	}
	drive.Bus = d.bus
	return drive, ""
}
