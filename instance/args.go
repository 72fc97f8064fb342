package instance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/debuginfo"
	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
	"github.com/qemu-mcp/qemu-mcp/internal/kept"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemuline"
)

// Args is a boot as a caller asks for it: the machine and the debugger in
// the words of a .qemu-mcp.json profile, paths relative to the project.
// Manager.Resolve completes it from the project's profile and from the
// snapshot or recording it starts from; Manager.BootArgs opens every host
// file it names under the host-path policy (Config.HostPolicy), turns it
// into a Spec and boots it.
type Args struct {
	Name string
	// Root is the project: the base of relative paths, whose repository
	// lock the guest holds; "" means the policy's working directory.
	// Resolve sets it to the project's real path.
	Root    string
	Machine profile.Profile
	// VNC also serves the display over VNC.
	VNC bool
	// Profile names the profile of the project's .qemu-mcp.json to apply
	// ("" its default, if it has one).
	Profile string
	// Snapshot, Record and Replay name the project's snapshot to start
	// from, recording to record into, recording to replay.
	Snapshot, Record, Replay string
	Restart                  bool
	TAP                      *TAPSpec
	Capture                  *CaptureSpec
	// Panics are what ends a wait as a panic on this guest (the profile's
	// patterns, compiled by the caller).
	Panics []*regexp.Regexp

	scope    *hostpath.Scope
	resolved Resolved
}

// Resolved is what Resolve applied: the profile (its name, "" for none),
// with its prompt and panic patterns.
type Resolved struct {
	Profile string
	Prompt  string
	Panics  []string
	// Line is what became of the options of a command line the boot or
	// its profile gave, nil without one.
	Line *qemuline.Report
}

// expandLine reads p's command line into p, under the fields p gives
// itself (its extra arguments follow the line's), and adds what became of
// each option to *line.
func expandLine(p *profile.Profile, line **qemuline.Report, check func([]string) error) {
	if p.CommandLine == nil {
		return
	}
	lp, r := qemuline.Parse(p.CommandLine, check)
	extra := p.ExtraArgs
	p.ExtraArgs = nil
	lp.Under(p)
	if extra != nil {
		p.ExtraArgs = append(append([]string(nil), lp.ExtraArgs...), extra...)
	}
	p.CommandLine = nil
	if *line == nil {
		*line = &qemuline.Report{}
	}
	(*line).Merge(r)
}

// checkLineFiles checks, under the host-path policy, each host file a
// command line named that the boot uses, so that a refused file is told
// beside the line's other refusals before anything starts.
func checkLineFiles(scope *hostpath.Scope, mach profile.Profile, line *qemuline.Report) {
	uses := func(f qemuline.File) bool {
		switch f.Field {
		case "kernel":
			return mach.Kernel == f.Path
		case "initrd":
			return mach.Initrd == f.Path
		case "dtb":
			return mach.DTB == f.Path
		case "bios":
			return mach.BIOS == f.Path
		case qemuline.RefusedDrive:
			return true
		}
		for _, d := range mach.Drives {
			if d.Path == f.Path {
				return true
			}
		}
		return false
	}
	for _, f := range line.Files() {
		if !uses(f) {
			continue
		}
		o, err := scope.Open(f.Field, f.Path, f.Write)
		if err != nil {
			line.Refuse(f.Option, err.Error())
			continue
		}
		o.Close()
	}
}

var (
	// ErrNoBuiltinKernel is a boot that names no kernel by a server that
	// has no built-in one.
	ErrNoBuiltinKernel = advice.New("no kernel given and this binary has no built-in kernel", advice.Advice{Action: advice.PassKernel})
	// ErrNoBuiltinSymbols is a debugger asked of the built-in kernel by a
	// server that has no symbols for it.
	ErrNoBuiltinSymbols = advice.New("this binary has no symbols for its built-in kernel", advice.Advice{Action: advice.PassSymbols})
)

// Resolve checks a's project against the host-path policy and completes
// a's machine: the project's profile fills what a leaves empty, and a
// boot from a snapshot or a replay that gives no machine at all gets the
// machine it was made on (Boot checks a given one against it). A replay
// always has its debugger.
func (m *Manager) Resolve(a *Args) (Resolved, error) {
	root := a.Root
	if root == "" {
		root = m.cfg.HostPolicy.WorkDir
	}
	scope, err := m.cfg.HostPolicy.Project(root)
	if err != nil {
		return Resolved{}, err
	}
	a.scope, a.Root = scope, scope.Dir()
	var res Resolved
	f, err := profile.Load(a.Root)
	if err != nil {
		return Resolved{}, err
	}
	p, ok, err := f.Pick(a.Profile)
	if err != nil {
		return Resolved{}, err
	}
	var line *qemuline.Report
	expandLine(&a.Machine, &line, m.cfg.Boundary.ExtraArgs)
	if ok {
		res = Resolved{Profile: a.Profile, Prompt: p.Prompt, Panics: p.PanicPatterns}
		if res.Profile == "" {
			res.Profile = f.Default
		}
		expandLine(&p, &line, m.cfg.Boundary.ExtraArgs)
		p.Under(&a.Machine)
	}
	if line != nil {
		checkLineFiles(scope, a.Machine, line)
		if len(line.Refused) > 0 {
			return Resolved{}, &qemuline.RefusedError{Report: *line}
		}
		res.Line = line
	}
	given := givenMachine(a.Machine)
	if a.Replay != "" {
		if !given {
			mach, err := m.recs.Machine(a.Root, a.Replay)
			if err != nil {
				return Resolved{}, err
			}
			mach.Under(&a.Machine)
		}
		a.Machine.GDB = true
	}
	if a.Snapshot != "" && !given {
		mach, err := m.Snapshots().Machine(a.Root, a.Snapshot)
		if err != nil {
			return Resolved{}, err
		}
		mach.Under(&a.Machine)
	}
	a.resolved = res
	return res, nil
}

// givenMachine says whether p gives any of the machine.
func givenMachine(p profile.Profile) bool {
	return p.Kernel != "" || p.Initrd != "" || p.DTB != "" || p.BIOS != "" || p.Memory != "" || p.SMP != 0 ||
		p.Append != "" || p.Drives != nil || p.ExtraArgs != nil || p.GPU || p.VirtioModern || p.Network != "" || p.Shares != nil ||
		p.CommandLine != nil
}

// Booted is what BootArgs booted beside the instance.
type Booted struct {
	// Reaped is what dead servers had left and the boot removed.
	Reaped *reaper.Report
	// QEMU is the configuration booted: files by their real paths,
	// shares with their tags.
	QEMU qemu.Config
	// Symbols is the ELF the debugger names addresses by.
	Symbols string
	// KeptRemoved lists the kept files the boot removed to stay under the
	// cap.
	KeptRemoved []kept.File
	// ReplayAdvice, for a recording, names the options of the
	// architecture's ReplayAppend its kernel command line lacks, and why:
	// without them its replays take far longer than it took to record.
	ReplayAdvice string
}

// replayAdvice is Booted.ReplayAdvice for a recording of cfg.
func replayAdvice(cfg qemu.Config) string {
	if cfg.Arch == nil || cfg.Append == "" {
		// No kernel command line: not a Linux the options are for.
		return ""
	}
	have := strings.Fields(cfg.Append)
	var missing []string
	for _, o := range cfg.Arch.QEMU().ReplayAppend {
		if !slices.Contains(have, o) {
			missing = append(missing, o)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("append %s for replays as fast as the recording: Linux's boot on %s spins while it checks its timers, which a replay takes minutes to pass",
		strings.Join(missing, " "), cfg.ArchName())
}

// BootArgs boots a, which Resolve completed.
func (m *Manager) BootArgs(ctx context.Context, a Args) (*Instance, Booted, error) {
	if a.scope == nil {
		return nil, Booted{}, errors.New("instance: BootArgs of arguments Resolve did not complete")
	}
	cfg, err := m.machineConfig(a)
	if err != nil {
		return nil, Booted{}, err
	}
	// The instance hands the files to QEMU, which closes them; on every
	// other way out they are closed here.
	defer qemu.CloseFiles(cfg.Files)
	spec := Spec{Name: a.Name, Root: a.Root, QEMU: cfg, Restart: a.Restart,
		Profile: a.resolved.Profile, Prompt: a.resolved.Prompt, Panics: a.Panics, TAP: a.TAP, Capture: a.Capture}
	if a.Snapshot != "" {
		spec.Snapshot = &SnapshotSpec{Name: a.Snapshot}
	}
	if (a.Replay != "" || a.Record != "") && cfg.Arch != nil && (cfg.Arch.Debugger() == nil || !cfg.Arch.QEMU().TimeTravel) {
		// A recording is for the debugger's time travel, offered where
		// it was verified.
		return nil, Booted{}, &arch.UnsupportedError{Arch: cfg.ArchName(), What: "time travel (record and replay)"}
	}
	switch {
	case a.Replay != "":
		spec.Replay = &ReplaySpec{Name: a.Replay}
	case a.Record != "":
		spec.Record = &RecordSpec{Name: a.Record}
	}
	var symbols string
	if a.Machine.GDB || a.Machine.Symbols != "" {
		d, path, err := openSymbols(a.scope, a.Machine, cfg.Kernel, cfg.Arch, m.builtin(cfg.Arch))
		if err != nil {
			return nil, Booted{}, err
		}
		spec.Debug, symbols = d, path
	}
	i, reaped, err := m.Boot(ctx, spec)
	if err != nil {
		return nil, Booted{Reaped: reaped}, err
	}
	i.mu.Lock()
	removed := i.keptRemoved
	i.mu.Unlock()
	b := Booted{Reaped: reaped, QEMU: cfg, Symbols: symbols, KeptRemoved: removed}
	if spec.Record != nil {
		b.ReplayAdvice = replayAdvice(cfg)
	}
	return i, b, nil
}

// openSymbols opens the debugger's symbols: mach.Symbols, else those
// debuginfo.FindKernelSymbols finds for the kernel, each under the
// host-path policy; the built-in kernel brings its own.
func openSymbols(scope *hostpath.Scope, mach profile.Profile, kernel string, ar arch.Arch, builtin builtins) (*DebugSpec, string, error) {
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
	case mach.Symbols != "":
		var f *os.File
		if f, path, err = open(mach.Symbols); err != nil {
			return nil, "", err
		}
		df, err = debuginfo.OpenKernel(f, path, ar)
	case mach.Kernel == "":
		if path, err = builtin.symbols(); err != nil {
			return nil, "", err
		}
		var f *os.File
		if f, err = os.Open(path); err != nil {
			return nil, "", fmt.Errorf("built-in kernel's symbols: %w", err)
		}
		df, err = debuginfo.OpenKernel(f, path, ar)
	default:
		df, path, err = debuginfo.FindKernelSymbols(kernel, ar, open)
	}
	if err != nil {
		return nil, "", err
	}
	return &DebugSpec{Symbols: df}, path, nil
}

// machineConfig turns a's machine into a QEMU configuration. Every host
// file it names is opened here through the host-path policy (relative
// paths are relative to the project) and handed to QEMU as that
// descriptor; on error nothing stays open.
func (m *Manager) machineConfig(a Args) (cfg qemu.Config, err error) {
	in := a.Machine
	o := &opener{scope: a.scope, files: map[string]*os.File{}}
	defer func() {
		if err != nil {
			qemu.CloseFiles(o.files)
		}
	}()
	ar, kernel, err := m.guestArch(in, o)
	if err != nil {
		return qemu.Config{}, err
	}
	opts := []qemu.Option{qemu.WithArch(ar), qemu.WithBinary(m.platform(ar).QEMU), qemu.WithExtraArgs(in.ExtraArgs...)}
	if err := m.policy(qemu.NewConfig(opts...)).ExtraArgs(in.ExtraArgs); err != nil {
		return qemu.Config{}, err
	}
	boot, err := o.bootFiles(in, kernel)
	if err != nil {
		return qemu.Config{}, err
	}
	opts = append(opts, boot...)
	if in.Memory != "" {
		opts = append(opts, qemu.WithMemory(in.Memory))
	}
	if in.SMP != 0 {
		opts = append(opts, qemu.WithSMP(in.SMP))
	}
	if in.Append != "" {
		opts = append(opts, qemu.WithAppend(in.Append))
	}
	opts = append(opts, qemu.WithGPU(in.GPU), qemu.WithVNC(a.VNC), qemu.WithVirtioModern(in.VirtioModern))
	switch in.Network {
	case "", "none", "user":
		opts = append(opts, qemu.WithNetwork(in.Network, "", ""))
	case "tap":
		// The instance makes and names the TAP.
	default:
		return qemu.Config{}, fmt.Errorf("network %q: want none, user or tap", in.Network)
	}
	devs, err := o.drives(in.Drives)
	if err != nil {
		return qemu.Config{}, err
	}
	shares, err := o.shares(in.Shares)
	if err != nil {
		return qemu.Config{}, err
	}
	cfg = qemu.NewConfig(append(append(opts, devs...), shares...)...)
	cfg.Files = o.files
	return cfg, cfg.Validate()
}

// guestArch is the architecture of a boot of in, and the path of its
// kernel: the architecture in names, else its kernel's (read from its
// headers), else the default; without a kernel the architecture's
// built-in one. A kernel of another architecture than the one named is
// refused: QEMU would start it and print nothing.
func (m *Manager) guestArch(in profile.Profile, o *opener) (arch.Arch, string, error) {
	named, err := archs.Lookup(in.Arch)
	if err != nil {
		return nil, "", err
	}
	if in.Kernel == "" {
		k, err := m.builtin(named).kernel()
		return named, k, err
	}
	k, err := o.file("kernel", in.Kernel, false)
	if err != nil {
		return nil, "", err
	}
	found, ok, err := archs.Recognize(o.files[k])
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("kernel %s: %w", k, err)
	case !ok:
		return named, k, nil
	case in.Arch == "":
		return found, k, nil
	case found != named:
		return nil, "", &ArchMismatchError{Kernel: k, KernelArch: found.Name(), Asked: named.Name()}
	}
	return named, k, nil
}

// ArchMismatchError is a kernel whose headers name another architecture
// than the boot does.
type ArchMismatchError struct {
	Kernel            string
	KernelArch, Asked string
}

func (e *ArchMismatchError) Error() string {
	return fmt.Sprintf("kernel %s is a %s kernel, but arch %s was asked: drop arch (the kernel's is used) or give a %s kernel",
		e.Kernel, e.KernelArch, e.Asked, e.Asked)
}

// opener opens a boot's host files under the host-path policy, each once,
// named by its real path (what the result and QEMU's errors then show).
type opener struct {
	scope *hostpath.Scope
	files map[string]*os.File
}

// file checks one file, keeps it open and returns its real path.
func (o *opener) file(what, p string, write bool) (string, error) {
	f, err := o.scope.Open(what, p, write)
	if err != nil {
		return "", err
	}
	real, err := hostpath.Real(f)
	if err != nil {
		f.Close()
		return "", fmt.Errorf("%s %s: %w", what, p, err)
	}
	if _, dup := o.files[real]; dup {
		f.Close()
	} else {
		o.files[real] = f
	}
	return real, nil
}

// bootFiles opens what QEMU loads: the kernel, initrd, device tree and
// firmware.
func (o *opener) bootFiles(in profile.Profile, kernel string) ([]qemu.Option, error) {
	k, err := o.file("kernel", kernel, false)
	if err != nil {
		return nil, err
	}
	opts := []qemu.Option{qemu.WithKernel(k)}
	if in.Initrd != "" {
		p, err := o.file("initrd", in.Initrd, false)
		if err != nil {
			return nil, err
		}
		opts = append(opts, qemu.WithInitrd(p))
	}
	if in.DTB != "" {
		p, err := o.file("dtb", in.DTB, false)
		if err != nil {
			return nil, err
		}
		opts = append(opts, qemu.WithDTB(p))
	}
	switch in.BIOS {
	case "", "default":
	case "none":
		opts = append(opts, qemu.WithBIOS("none"))
	default:
		p, err := o.file("bios", in.BIOS, false)
		if err != nil {
			return nil, err
		}
		opts = append(opts, qemu.WithBIOS(p))
	}
	return opts, nil
}

// drives opens the disk images, each checked to be of its format.
func (o *opener) drives(drives []qemu.Drive) ([]qemu.Option, error) {
	var opts []qemu.Option
	for i, d := range drives {
		what := fmt.Sprintf("drives[%d]", i)
		var err error
		if d.Path, err = o.file(what, d.Path, !d.ReadOnly); err != nil {
			return nil, err
		}
		if err := o.scope.CheckImage(what+" "+d.Path, o.files[d.Path], d.Format); err != nil {
			return nil, err
		}
		opts = append(opts, qemu.WithDrive(d))
	}
	return opts, nil
}

// shares opens the shared directories, each shared once, and names each
// that has no tag.
func (o *opener) shares(shares []qemu.Share) ([]qemu.Option, error) {
	var opts []qemu.Option
	tags := map[string]bool{}
	for i, sh := range shares {
		what := fmt.Sprintf("shares[%d]", i)
		f, err := o.scope.OpenDir(what, sh.Path, sh.Writable)
		if err != nil {
			return nil, err
		}
		real, err := hostpath.Real(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s %s: %w", what, sh.Path, err)
		}
		if _, dup := o.files[real]; dup {
			f.Close()
			return nil, fmt.Errorf("%s %s: that directory is shared already", what, sh.Path)
		}
		o.files[real] = f
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
	return opts, nil
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

// builtins are the images built into the server: its tiny kernel and
// that kernel's ELF (its symbols), written to the runtime directory's
// images (ImagesDir) on first use, named by their hash so every server
// shares one copy and no stale copy can be booted by mistake.
type builtins struct {
	kernelImage, symbolsELF []byte
	runtimeDir              string
}

func (m *Manager) builtin(a arch.Arch) builtins {
	p := m.platform(a)
	return builtins{p.Kernel, p.Symbols, m.cfg.RuntimeDir}
}

// kernel is the path of the built-in kernel.
func (b builtins) kernel() (string, error) {
	if len(b.kernelImage) == 0 {
		return "", ErrNoBuiltinKernel
	}
	return b.write(b.kernelImage, ".bin")
}

// symbols is the path of the built-in kernel's ELF.
func (b builtins) symbols() (string, error) {
	if len(b.symbolsELF) == 0 {
		return "", ErrNoBuiltinSymbols
	}
	return b.write(b.symbolsELF, ".elf")
}

// ImagesDir is where a server with runtime directory dir writes its
// built-in images: the host-path policy lets QEMU read them.
func ImagesDir(dir string) string { return filepath.Join(dir, "images") }

func (b builtins) write(data []byte, ext string) (string, error) {
	sum := sha256.Sum256(data)
	dir := ImagesDir(b.runtimeDir)
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
