package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// BootInput is qemu_boot's arguments.
type BootInput struct {
	Kernel      string       `json:"kernel,omitempty" jsonschema:"kernel image, relative to project_root; default the built-in tiny kernel (prompt 'tiny> ')"`
	Initrd      string       `json:"initrd,omitempty" jsonschema:"initramfs (-initrd)"`
	DTB         string       `json:"dtb,omitempty" jsonschema:"device tree blob replacing QEMU's (-dtb)"`
	BIOS        string       `json:"bios,omitempty" jsonschema:"firmware: 'default' (OpenSBI), 'none' or a path"`
	Memory      string       `json:"memory,omitempty" jsonschema:"guest RAM, such as 128M or 1G; default 128M"`
	SMP         int          `json:"smp,omitempty" jsonschema:"number of harts; default 1"`
	Append      string       `json:"append,omitempty" jsonschema:"kernel command line"`
	Drives      []qemu.Drive `json:"drives,omitempty" maxitems:"32" jsonschema:"disk images attached as virtio-mmio block devices; paths relative to project_root"`
	Shares      []ShareArg   `json:"shares,omitempty" maxitems:"8" jsonschema:"host directories the guest mounts over virtio-9p (the result gives the mount command)"`
	ExtraArgs   []string     `json:"extra_args,omitempty" maxitems:"256" jsonschema:"extra QEMU arguments; options the server manages (-serial -chardev -qmp -monitor -daemonize -pidfile ...) are refused"`
	Timeout     float64      `json:"timeout,omitempty" default:"30" jsonschema:"seconds to wait for wait_for (fractions allowed)"`
	ProjectRoot string       `json:"project_root,omitempty" jsonschema:"base of relative paths; default the server's working directory"`
	Restart     bool         `json:"restart,omitempty" jsonschema:"stop a running guest of the same instance first instead of failing"`
	GPU         bool         `json:"gpu,omitempty" jsonschema:"virtio display (headless), keyboard and tablet, for the screenshot, key, text and mouse tools"`
	VNC         bool         `json:"vnc,omitempty" jsonschema:"also serve the display over VNC on a unix socket only you can open (reported as vnc)"`
	Network     string       `json:"network,omitempty" jsonschema:"none (default), user (QEMU's slirp, no privileges) or tap (a TAP of the guest's own; made by the server with CAP_NET_ADMIN, else give tap)"`
	Tap         string       `json:"tap,omitempty" jsonschema:"with network tap: your persistent TAP, used as it is (no privileges; root makes it once: ip tuntap add dev NAME mode tap user YOU)"`
	TapCIDR     string       `json:"tap_cidr,omitempty" jsonschema:"host address of the TAP, such as 192.0.2.1/24; default 10.0.2.2/24 (network tap without bridge)"`
	Bridge      string       `json:"bridge,omitempty" jsonschema:"attach the TAP to this existing bridge instead of giving it an address"`
	PCAP        bool         `json:"pcap,omitempty" jsonschema:"start a capture on the TAP at boot (see qemu_pcap_read)"`
	PCAPFilter  string       `json:"pcap_filter,omitempty" jsonschema:"filter for the boot-time capture (the tcpdump subset of qemu_pcap_start)"`
	Snapshot    string       `json:"snapshot,omitempty" max:"64" jsonschema:"boot into this snapshot of the project; machine arguments not given are the snapshot's, given ones must match"`
	GDB         bool         `json:"gdb,omitempty" jsonschema:"QEMU's gdbstub for the debug_* tools (breakpoints, registers, memory, backtraces, crash triage)"`
	Symbols     string       `json:"symbols,omitempty" jsonschema:"kernel ELF with symbols (vmlinux); implies gdb; default the kernel if an ELF, else a vmlinux beside it or atop its build tree"`
	Profile     string       `json:"profile,omitempty" jsonschema:"profile from project_root/.qemu-mcp.json (default: its default); explicit arguments override it"`
	Record      string       `json:"record,omitempty" max:"64" jsonschema:"record the run as this recording of the project (input paced by the guest's echo)"`
	Replay      string       `json:"replay,omitempty" max:"64" jsonschema:"replay this recording, halted at its start, with the debugger (it goes back too)"`
	Target
	WaitOptions
}

// ShareArg is a directory to share with the guest.
type ShareArg struct {
	Path     string `json:"path" jsonschema:"directory, relative to project_root"`
	Tag      string `json:"tag,omitempty" jsonschema:"mount tag; default the directory's name"`
	Writable bool   `json:"writable,omitempty" jsonschema:"let the guest write (never a directory with a .git)"`
}

// ShareInfo is a share as booted.
type ShareInfo struct {
	Path     string `json:"path"`
	Tag      string `json:"tag"`
	Writable bool   `json:"writable,omitempty"`
	// Mount is the guest's command that mounts it.
	Mount string `json:"mount"`
}

// BootOutput is qemu_boot's result.
type BootOutput struct {
	Instance string     `json:"instance" jsonschema:"the guest's name"`
	PID      int        `json:"pid" jsonschema:"QEMU's process ID"`
	Argv     []string   `json:"argv" jsonschema:"the exact QEMU command line"`
	Paths    qemu.Paths `json:"paths" jsonschema:"the serial FIFOs and QMP socket in use"`
	Kernel   string     `json:"kernel" jsonschema:"the kernel image booted"`
	Lock     string     `json:"lock" jsonschema:"the repository lock file held while the guest runs"`
	// Reaped reports what dead servers had left and this boot removed.
	Reaped      *reaper.Report `json:"reaped,omitempty" jsonschema:"what dead servers left behind and this boot removed"`
	KeptRemoved []string       `json:"kept_removed,omitempty" jsonschema:"old kept files removed to stay under --max-kept"`
	VNC         string         `json:"vnc,omitempty" jsonschema:"the VNC server's unix socket, with vnc: true"`
	TAP         string         `json:"tap,omitempty" jsonschema:"the TAP device, with network tap"`
	PCAPPath    string         `json:"pcap,omitempty" jsonschema:"the capture file, with pcap: true"`
	// Profile is the profile applied, if any.
	Profile string `json:"profile,omitempty" jsonschema:"the .qemu-mcp.json profile applied"`
	// Transcript is the complete console log of this boot.
	Transcript string `json:"transcript" jsonschema:"file holding the complete serial output of this boot (kept after the server exits)"`
	// Symbols is the ELF the debugger reads symbols from.
	Symbols string `json:"symbols,omitempty" jsonschema:"the ELF the debugger names addresses by"`
	// Shares are the directories the guest can mount, with the command.
	Shares []ShareInfo `json:"shares,omitempty"`
	// Recording is the recording the guest records into or replays.
	Recording *RecordingInfo `json:"recording,omitempty"`
	WaitResult
	ElapsedMS int64 `json:"elapsed_ms" jsonschema:"milliseconds from the call to the result"`
}

// defaultBootTimeout ends a boot's wait well inside the 60 s that MCP
// clients (the TypeScript SDK's default) give a request: a prompt that
// never comes is a timed_out result, not a protocol time-out. Longer waits
// are asked for with timeout, and send progress notifications.
const defaultBootTimeout = 30 * time.Second

// bootMaxBytes keeps a boot result small (about 2,000 characters with the
// command line and paths): the firmware banner's start and the last lines
// up to the prompt; the rest is one serial_read away.
const bootMaxBytes = 640

func (s *Server) boot(ctx context.Context, req *mcp.CallToolRequest, in BootInput) (*mcp.CallToolResult, BootOutput, error) {
	start := time.Now()
	name := in.Target.name()
	if err := instance.CheckName(name); err != nil {
		return nil, BootOutput{}, err
	}
	root := in.ProjectRoot
	if root == "" {
		root = s.cfg.WorkDir
	}
	// Every path of this boot is checked against the host-path policy
	// before anything changes, a running guest included (restart).
	scope, err := s.hostPolicy().Project(root)
	if err != nil {
		return nil, BootOutput{}, err
	}
	root = scope.Dir()
	explicitWait := in.WaitFor != nil
	prof, err := applyProfile(root, &in)
	if err != nil {
		return nil, BootOutput{}, err
	}
	if in.Replay != "" {
		if in.Record != "" || in.Snapshot != "" {
			return nil, BootOutput{}, errors.New("replay boots the recording's machine: record and snapshot do not go with it")
		}
		if err := s.fillMachine(&in, func(mgr *instance.Manager) (profile.Profile, error) {
			return mgr.RecordingMachine(root, in.Replay, s.cfg.BuiltinKernel)
		}); err != nil {
			return nil, BootOutput{}, err
		}
		in.GDB = true
		// A replay is halted at its start: it prints nothing until the
		// debugger runs it.
		in.WaitFor = nil
	}
	if in.Snapshot != "" {
		if err := s.fillMachine(&in, func(mgr *instance.Manager) (profile.Profile, error) {
			return mgr.SnapshotMachine(root, in.Snapshot, s.cfg.BuiltinKernel)
		}); err != nil {
			return nil, BootOutput{}, err
		}
		if !explicitWait {
			// A restored guest does not print its prompt again.
			in.WaitFor = nil
		}
	}
	panics, err := compileAll("panic_patterns of the profile", prof.Panics)
	if err != nil {
		return nil, BootOutput{}, err
	}
	p, err := s.plan(req, in.WaitOptions, in.Timeout, defaultBootTimeout, bootMaxBytes, panics)
	if err != nil {
		return nil, BootOutput{}, err
	}
	cfg, err := s.bootConfig(scope, in)
	if err != nil {
		return nil, BootOutput{}, err
	}
	// The instance hands the files to QEMU, which closes them; on every
	// other way out they are closed here.
	defer qemu.CloseFiles(cfg.Files)
	if in.PCAP && in.Network != "tap" {
		return nil, BootOutput{}, errors.New(`pcap: true needs network: "tap" (the capture runs on the guest's TAP)`)
	}
	if (in.TapCIDR != "" || in.Bridge != "" || in.Tap != "") && in.Network != "tap" {
		return nil, BootOutput{}, errors.New(`tap, tap_cidr and bridge need network: "tap"`)
	}
	if in.Tap != "" && (in.TapCIDR != "" || in.Bridge != "") {
		return nil, BootOutput{}, fmt.Errorf("tap %q is used as it is: the server does not configure it, so tap_cidr and bridge do not go with it (root sets its address or bridge)", in.Tap)
	}
	spec := instance.Spec{Name: name, Root: root, QEMU: cfg, Restart: in.Restart,
		Profile: prof.name, Prompt: prof.Prompt, Panics: panics}
	if in.Snapshot != "" {
		spec.Snapshot = &instance.SnapshotSpec{Name: in.Snapshot}
	}
	switch {
	case in.Replay != "":
		spec.Replay = &instance.ReplaySpec{Name: in.Replay}
	case in.Record != "":
		spec.Record = &instance.RecordSpec{Name: in.Record}
	}
	var symbols string
	if in.GDB || in.Symbols != "" {
		d, path, err := s.openSymbols(scope, in, cfg.Kernel)
		if err != nil {
			return nil, BootOutput{}, err
		}
		spec.Debug, symbols = d, path
	}
	if in.Network == "tap" {
		spec.TAP = &instance.TAPSpec{CIDR: in.TapCIDR, Bridge: in.Bridge, Name: in.Tap}
		if in.PCAP {
			spec.Capture = &instance.CaptureSpec{Filter: in.PCAPFilter}
		}
	}
	mgr, err := s.manager()
	if err != nil {
		if spec.Debug != nil && spec.Debug.Symbols != nil {
			spec.Debug.Symbols.Close()
		}
		return nil, BootOutput{}, err
	}
	inst, reaped, err := mgr.Boot(ctx, spec)
	if err != nil {
		return nil, BootOutput{}, tapAdvice(err, in.Tap)
	}
	m := inst.Machine()
	out := BootOutput{Instance: name, PID: m.PID(), Argv: m.Argv(), Paths: m.Paths(), Kernel: cfg.Kernel,
		Lock: inst.LockPath(), Profile: prof.name, Transcript: inst.Transcript(), Symbols: symbols}
	if reaped != nil {
		b := reaped.Bounded(10)
		out.Reaped = &b
	}
	if dev := inst.TAP(); dev != nil {
		out.TAP = dev.Name
	}
	for _, sh := range cfg.Shares {
		out.Shares = append(out.Shares, ShareInfo{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable, Mount: qemu.MountCommand(sh.Tag, "/mnt/"+sh.Tag)})
	}
	for _, f := range inst.KeptRemoved() {
		out.KeptRemoved = append(out.KeptRemoved, f.Path)
	}
	if st, active, ok := inst.CaptureStats(); ok && active {
		out.PCAPPath = st.Path
	}
	out.VNC = m.Paths().VNCSocket
	if meta, ok := inst.Recording(); ok {
		out.Recording = recordingInfo(meta)
	}
	if meta, ok := inst.Replaying(); ok {
		out.Recording = recordingInfo(meta)
		out.Recording.Replaying = true
	}
	if p.active() {
		w, err := s.wait(ctx, req, inst, 0, p)
		if err != nil {
			return nil, BootOutput{}, err
		}
		out.WaitResult = w
	} else {
		out.Running = true
	}
	out.ElapsedMS = time.Since(start).Milliseconds()
	return textResult(bootText(out, p.desc)), out, nil
}

func bootText(o BootOutput, waitFor string) string {
	var b strings.Builder
	if o.Reaped != nil {
		fmt.Fprintf(&b, "reaped %d dead server(s)\n", len(o.Reaped.DeadServers))
	}
	fmt.Fprintf(&b, "booted %q: qemu pid %d in %d ms\n", o.Instance, o.PID, o.ElapsedMS)
	if r := o.Recording; r != nil && r.Replaying {
		fmt.Fprintf(&b, "replaying recording %q, halted at instruction 0 of %d: debug_continue runs it (reverse: true goes back)\n", r.Name, r.Instructions)
		return b.String()
	}
	if r := o.Recording; r != nil {
		fmt.Fprintf(&b, "recording as %q\n", r.Name)
	}
	if waitFor != "" {
		b.WriteString(o.WaitResult.summary(waitFor))
	} else {
		b.WriteString("guest running; read its console with serial_read\n")
	}
	return b.String()
}

// fillMachine sets the machine arguments of a boot that gives none to
// the machine a snapshot or a recording was made on (machine says which);
// the instance checks given ones against it at the boot.
func (s *Server) fillMachine(in *BootInput, machine func(*instance.Manager) (profile.Profile, error)) error {
	if givenMachine(in) {
		return nil
	}
	mgr, err := s.manager()
	if err != nil {
		return err
	}
	m, err := machine(mgr)
	if err != nil {
		return err
	}
	args := in.machine()
	m.Under(&args)
	in.setMachine(args)
	return nil
}

// givenMachine says whether the call gives any machine argument.
func givenMachine(in *BootInput) bool {
	return in.Kernel != "" || in.Initrd != "" || in.DTB != "" || in.BIOS != "" || in.Memory != "" || in.SMP != 0 ||
		in.Append != "" || in.Drives != nil || in.ExtraArgs != nil || in.GPU || in.Network != "" || in.Shares != nil
}

// openSymbols opens the debugger's symbols: in.Symbols, else those
// debuginfo.FindKernelSymbols finds for the kernel, each under the
// host-path policy; the built-in kernel brings its own.
func (s *Server) openSymbols(scope *hostpath.Scope, in BootInput, kernel string) (*instance.DebugSpec, string, error) {
	open := func(p string) (*os.File, string, error) {
		f, err := scope.Open("symbols", p, false)
		if err != nil {
			return nil, "", err
		}
		path, _ := hostpath.Real(f)
		return f, path, nil
	}
	var df *debuginfo.File
	var path string
	var err error
	switch {
	case in.Symbols != "":
		var f *os.File
		if f, path, err = open(in.Symbols); err != nil {
			return nil, "", err
		}
		df, err = debuginfo.OpenKernel(f, path)
	case in.Kernel == "":
		if path, err = s.builtinSymbols(); err != nil {
			return nil, "", err
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, "", fmt.Errorf("built-in kernel's symbols: %w", err)
		}
		df, err = debuginfo.OpenKernel(f, path)
	default:
		df, path, err = debuginfo.FindKernelSymbols(kernel, open)
	}
	if err != nil {
		return nil, "", err
	}
	return &instance.DebugSpec{Symbols: df}, path, nil
}

// activeProfile is the profile a boot used, kept for its prompt.
type activeProfile struct {
	name   string
	Prompt string
	Panics []string
}

func compileAll(what string, srcs []string) ([]*regexp.Regexp, error) {
	res := make([]*regexp.Regexp, 0, len(srcs))
	for i, src := range srcs {
		re, err := regexp.Compile(src)
		if err != nil {
			return nil, fmt.Errorf("%s[%d] %q: %w", what, i, src, err)
		}
		res = append(res, re)
	}
	return res, nil
}

// applyProfile fills the arguments the caller left empty from the
// project's profile (profile.Profile.Under).
func applyProfile(root string, in *BootInput) (activeProfile, error) {
	f, err := profile.Load(root)
	if err != nil {
		return activeProfile{}, err
	}
	p, ok, err := f.Pick(in.Profile)
	if err != nil || !ok {
		return activeProfile{}, err
	}
	name := in.Profile
	if name == "" {
		name = f.Default
	}
	args := in.machine()
	p.Under(&args)
	in.setMachine(args)
	if in.WaitFor == nil && p.Prompt != "" {
		in.WaitFor = p.Prompt
	}
	return activeProfile{name: name, Prompt: p.Prompt, Panics: p.PanicPatterns}, nil
}

// machine is the machine and debugger arguments of a boot, as a profile
// gives them.
func (in *BootInput) machine() profile.Profile {
	p := profile.Profile{Kernel: in.Kernel, Initrd: in.Initrd, DTB: in.DTB, BIOS: in.BIOS, Memory: in.Memory, SMP: in.SMP,
		Append: in.Append, Drives: in.Drives, Network: in.Network, GPU: in.GPU, ExtraArgs: in.ExtraArgs, GDB: in.GDB, Symbols: in.Symbols}
	if in.Shares != nil {
		p.Shares = make([]profile.Share, 0, len(in.Shares))
		for _, sh := range in.Shares {
			p.Shares = append(p.Shares, profile.Share(sh))
		}
	}
	return p
}

// setMachine sets a boot's machine and debugger arguments.
func (in *BootInput) setMachine(p profile.Profile) {
	in.Kernel, in.Initrd, in.DTB, in.BIOS, in.Memory, in.SMP = p.Kernel, p.Initrd, p.DTB, p.BIOS, p.Memory, p.SMP
	in.Append, in.Drives, in.Network, in.GPU, in.ExtraArgs = p.Append, p.Drives, p.Network, p.GPU, p.ExtraArgs
	in.GDB, in.Symbols = p.GDB, p.Symbols
	in.Shares = nil
	if p.Shares != nil {
		in.Shares = make([]ShareArg, 0, len(p.Shares))
		for _, sh := range p.Shares {
			in.Shares = append(in.Shares, ShareArg(sh))
		}
	}
}

// bootConfig turns arguments into a QEMU configuration. Every host file it
// names is opened here through the host-path policy (relative paths are
// relative to the project root) and handed to QEMU as that descriptor; on
// error nothing stays open.
func (s *Server) bootConfig(scope *hostpath.Scope, in BootInput) (cfg qemu.Config, err error) {
	if err := s.policy().ExtraArgs(in.ExtraArgs); err != nil {
		return qemu.Config{}, err
	}
	files := map[string]*os.File{}
	defer func() {
		if err != nil {
			qemu.CloseFiles(files)
		}
	}()
	// open checks one file and names it by its real path, which is what
	// the result and QEMU's errors then show.
	open := func(what, p string, write bool) (string, error) {
		f, err := scope.Open(what, p, write)
		if err != nil {
			return "", err
		}
		real, err := hostpath.Real(f)
		if err != nil {
			f.Close()
			return "", fmt.Errorf("%s %s: %w", what, p, err)
		}
		if _, dup := files[real]; dup {
			f.Close()
		} else {
			files[real] = f
		}
		return real, nil
	}
	opts := []qemu.Option{qemu.WithExtraArgs(in.ExtraArgs...)}
	if s.cfg.QEMUBinary != "" {
		opts = append(opts, qemu.WithBinary(s.cfg.QEMUBinary))
	}
	kernel := in.Kernel
	if kernel == "" {
		if kernel, err = s.builtinKernel(); err != nil {
			return qemu.Config{}, err
		}
	}
	k, err := open("kernel", kernel, false)
	if err != nil {
		return qemu.Config{}, err
	}
	opts = append(opts, qemu.WithKernel(k))
	if in.Initrd != "" {
		p, err := open("initrd", in.Initrd, false)
		if err != nil {
			return qemu.Config{}, err
		}
		opts = append(opts, qemu.WithInitrd(p))
	}
	if in.DTB != "" {
		p, err := open("dtb", in.DTB, false)
		if err != nil {
			return qemu.Config{}, err
		}
		opts = append(opts, qemu.WithDTB(p))
	}
	switch in.BIOS {
	case "", "default":
	case "none":
		opts = append(opts, qemu.WithBIOS("none"))
	default:
		p, err := open("bios", in.BIOS, false)
		if err != nil {
			return qemu.Config{}, err
		}
		opts = append(opts, qemu.WithBIOS(p))
	}
	if in.Memory != "" {
		opts = append(opts, qemu.WithMemory(in.Memory))
	}
	if in.SMP != 0 {
		opts = append(opts, qemu.WithSMP(in.SMP))
	}
	if in.Append != "" {
		opts = append(opts, qemu.WithAppend(in.Append))
	}
	if in.VNC && !in.GPU {
		return qemu.Config{}, errors.New("vnc: true needs gpu: true (there is no display to serve)")
	}
	opts = append(opts, qemu.WithGPU(in.GPU), qemu.WithVNC(in.VNC))
	switch in.Network {
	case "", "none", "user":
		opts = append(opts, qemu.WithNetwork(in.Network, "", ""))
	case "tap":
		// The instance makes and names the TAP.
	default:
		return qemu.Config{}, fmt.Errorf("network %q: want none, user or tap", in.Network)
	}
	for i, d := range in.Drives {
		what := fmt.Sprintf("drives[%d]", i)
		if d.Path, err = open(what, d.Path, !d.ReadOnly); err != nil {
			return qemu.Config{}, err
		}
		if err := scope.CheckImage(what+" "+d.Path, files[d.Path], d.Format); err != nil {
			return qemu.Config{}, err
		}
		opts = append(opts, qemu.WithDrive(d))
	}
	tags := map[string]bool{}
	for i, sh := range in.Shares {
		what := fmt.Sprintf("shares[%d]", i)
		f, err := scope.OpenDir(what, sh.Path, sh.Writable)
		if err != nil {
			return qemu.Config{}, err
		}
		real, err := hostpath.Real(f)
		if err != nil {
			f.Close()
			return qemu.Config{}, fmt.Errorf("%s %s: %w", what, sh.Path, err)
		}
		if _, dup := files[real]; dup {
			f.Close()
			return qemu.Config{}, fmt.Errorf("%s %s: that directory is shared already", what, sh.Path)
		}
		files[real] = f
		tag := sh.Tag
		if tag == "" {
			tag = defaultTag(real, tags)
		}
		tags[tag] = true
		share := qemu.Share{Path: real, Tag: tag, Writable: sh.Writable}
		if sh.Writable {
			share.Model = qemu.ShareModel(f)
		}
		opts = append(opts, qemu.WithShare(share))
	}
	cfg = qemu.NewConfig(opts...)
	cfg.Files = files
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// defaultTag names a share by its directory (letters, digits, '_', '.',
// '-', at most 31), made unique among taken.
func defaultTag(dir string, taken map[string]bool) string {
	base := []byte(filepath.Base(dir))
	for i, c := range base {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			base[i] = '_'
		}
	}
	tag := string(base)
	if len(tag) > 28 {
		tag = tag[:28]
	}
	if tag == "" || tag == "/" || tag == "." || tag == ".." {
		tag = "share"
	}
	for n, t := 1, tag; ; n++ {
		if !taken[t] {
			return t
		}
		t = fmt.Sprintf("%s%d", tag, n)
	}
}

// builtinKernel writes the embedded tiny kernel to the runtime directory,
// named by its hash so every server shares one copy and no stale copy can
// be booted by mistake.
func (s *Server) builtinKernel() (string, error) {
	if len(s.cfg.BuiltinKernel) == 0 {
		return "", errors.New("no kernel given and this binary has no built-in kernel: pass kernel")
	}
	return s.builtinImage(s.cfg.BuiltinKernel, ".bin")
}

// builtinSymbols writes the built-in kernel's ELF (its symbols) the same way.
func (s *Server) builtinSymbols() (string, error) {
	if len(s.cfg.BuiltinSymbols) == 0 {
		return "", errors.New("this binary has no symbols for its built-in kernel: pass symbols")
	}
	return s.builtinImage(s.cfg.BuiltinSymbols, ".elf")
}

func (s *Server) builtinImage(data []byte, ext string) (string, error) {
	sum := sha256.Sum256(data)
	dir := filepath.Join(s.cfg.RuntimeDir, "images")
	path := filepath.Join(dir, "tiny-"+hex.EncodeToString(sum[:8])+ext)
	if b, err := os.ReadFile(path); err == nil && sha256.Sum256(b) == sum {
		return path, nil
	}
	fail := func(err error) (string, error) { return "", fmt.Errorf("write built-in image: %w", err) }
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp(dir, ".tiny-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	// rename is atomic: a concurrent server sees the old file or the new.
	if err := os.Rename(f.Name(), path); err != nil {
		return fail(err)
	}
	return path, nil
}
