package tools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// BootInput is qemu_boot's arguments.
type BootInput struct {
	CommandLine  any          `json:"command_line,omitempty" anyof:"string,[]string" max:"16384" maxitems:"512" jsonschema:"the project's QEMU command (what make -n qemu prints), a string or its words; other fields override it; the result lists options kept, replaced, refused"`
	Arch         string       `json:"arch,omitempty" jsonschema:"riscv64, aarch64 or x86_64; default the kernel's, else riscv64"`
	Kernel       string       `json:"kernel,omitempty" jsonschema:"kernel image, relative to project_root; default the built-in tiny kernel (prompt 'tiny> ')"`
	Initrd       string       `json:"initrd,omitempty" jsonschema:"initramfs (-initrd)"`
	DTB          string       `json:"dtb,omitempty" jsonschema:"device tree blob replacing QEMU's (-dtb)"`
	BIOS         string       `json:"bios,omitempty" jsonschema:"firmware: 'default' (riscv64: OpenSBI), 'none' or a path"`
	Memory       string       `json:"memory,omitempty" jsonschema:"guest RAM, such as 128M or 1G; default 128M"`
	SMP          int          `json:"smp,omitempty" jsonschema:"number of vCPUs (harts); default 1"`
	Append       string       `json:"append,omitempty" jsonschema:"kernel command line"`
	Drives       []qemu.Drive `json:"drives,omitempty" maxitems:"32" jsonschema:"disk images (virtio), relative to project_root"`
	Shares       []ShareArg   `json:"shares,omitempty" maxitems:"8" jsonschema:"host directories the guest mounts over virtio-9p (the result gives the mount command)"`
	ExtraArgs    []string     `json:"extra_args,omitempty" maxitems:"256" jsonschema:"extra QEMU arguments (checked by the host-access boundary)"`
	Timeout      float64      `json:"timeout,omitempty" default:"30" jsonschema:"seconds to wait for wait_for (fractions allowed)"`
	ProjectRoot  string       `json:"project_root,omitempty" jsonschema:"base of relative paths; default the server's working directory"`
	Restart      bool         `json:"restart,omitempty" jsonschema:"stop a running guest of the same instance first instead of failing"`
	VirtioModern bool         `json:"virtio_modern,omitempty" jsonschema:"modern-only virtio-mmio (force-legacy=false), as xv6-like kernels need"`
	GPU          bool         `json:"gpu,omitempty" jsonschema:"virtio display (headless), keyboard and tablet, for the screenshot, key, text and mouse tools"`
	VNC          bool         `json:"vnc,omitempty" jsonschema:"also serve the display over VNC on a unix socket only you can open"`
	Network      string       `json:"network,omitempty" jsonschema:"none (default), user (QEMU's slirp, unprivileged) or tap (the guest's own TAP: the server makes it with CAP_NET_ADMIN, else give tap)"`
	Tap          string       `json:"tap,omitempty" jsonschema:"with network tap: your persistent TAP, used as is (root makes it once: ip tuntap add dev NAME mode tap user YOU)"`
	TapCIDR      string       `json:"tap_cidr,omitempty" jsonschema:"host address of the TAP, such as 192.0.2.1/24; default 10.0.2.2/24 (network tap without bridge)"`
	Bridge       string       `json:"bridge,omitempty" jsonschema:"attach the TAP to this existing bridge instead of giving it an address"`
	PCAP         bool         `json:"pcap,omitempty" jsonschema:"start a capture on the TAP at boot (see qemu_pcap_read)"`
	PCAPFilter   string       `json:"pcap_filter,omitempty" jsonschema:"filter for the boot-time capture (the tcpdump subset of qemu_pcap_start)"`
	Snapshot     string       `json:"snapshot,omitempty" max:"64" jsonschema:"boot into this snapshot of the project; machine arguments not given are the snapshot's, given ones must match"`
	GDB          bool         `json:"gdb,omitempty" jsonschema:"QEMU's gdbstub for the debug_* tools (breakpoints, registers, memory, backtraces, crash triage)"`
	Symbols      string       `json:"symbols,omitempty" jsonschema:"vmlinux (ELF with symbols); implies gdb; default the kernel if ELF, else a vmlinux beside it or atop its build tree"`
	Profile      string       `json:"profile,omitempty" jsonschema:"profile from project_root/.qemu-mcp.json (default: its default); explicit arguments override it"`
	Record       string       `json:"record,omitempty" max:"64" jsonschema:"record the run as this recording of the project (input paced by the guest's echo)"`
	Replay       string       `json:"replay,omitempty" max:"64" jsonschema:"replay this recording, halted at its start, with the debugger (it goes back too)"`
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
	Arch     string     `json:"arch" jsonschema:"the guest's architecture"`
	Kernel   string     `json:"kernel" jsonschema:"the kernel image booted"`
	Lock     string     `json:"lock" jsonschema:"the repository lock file held while the guest runs"`
	// Reaped reports what dead servers had left and this boot removed.
	Reaped      *instance.Reaped `json:"reaped,omitempty" jsonschema:"what dead servers left behind and this boot removed"`
	KeptRemoved []string         `json:"kept_removed,omitempty" jsonschema:"old kept files removed to stay under --max-kept"`
	VNC         string           `json:"vnc,omitempty" jsonschema:"the VNC server's unix socket, with vnc: true"`
	TAP         string           `json:"tap,omitempty" jsonschema:"the TAP device, with network tap"`
	PCAPPath    string           `json:"pcap,omitempty" jsonschema:"the capture file, with pcap: true"`
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
	// CommandLine is what became of each option of a command_line.
	CommandLine *instance.LineReport `json:"command_line,omitempty"`
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
	if in.Replay != "" && (in.Record != "" || in.Snapshot != "") {
		return nil, BootOutput{}, errors.New("replay boots the recording's machine: record and snapshot do not go with it")
	}
	mgr, err := s.manager()
	if err != nil {
		return nil, BootOutput{}, err
	}
	// Every path of this boot is checked against the host-path policy
	// before anything changes, a running guest included (restart).
	args, prof, err := in.resolve(mgr, name)
	if err != nil {
		return nil, BootOutput{}, err
	}
	p, err := s.plan(req, in.WaitOptions, in.Timeout, defaultBootTimeout, bootMaxBytes, args.Panics)
	if err != nil {
		return nil, BootOutput{}, err
	}
	inst, booted, err := mgr.BootArgs(ctx, args)
	if err != nil {
		return nil, BootOutput{}, err
	}
	out := bootOutput(inst, booted, prof)
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

// resolve makes the boot's arguments into the guest package's, completed
// by the project's profile (see instance.Manager.Resolve), and settles
// what to wait for.
func (in *BootInput) resolve(mgr *instance.Manager, name string) (instance.Args, instance.Resolved, error) {
	mach, err := in.machine()
	if err != nil {
		return instance.Args{}, instance.Resolved{}, err
	}
	args := instance.Args{Name: name, Root: in.ProjectRoot, Machine: mach, VNC: in.VNC, Profile: in.Profile,
		Snapshot: in.Snapshot, Record: in.Record, Replay: in.Replay, Restart: in.Restart}
	prof, err := mgr.Resolve(&args)
	if err != nil {
		return instance.Args{}, instance.Resolved{}, err
	}
	switch {
	case in.Replay != "":
		// A replay is halted at its start: it prints nothing until the
		// debugger runs it.
		in.WaitFor = nil
	case in.Snapshot != "" && in.WaitFor == nil:
		// A restored guest does not print its prompt again.
	case in.WaitFor == nil && prof.Prompt != "":
		in.WaitFor = prof.Prompt
	}
	if args.Panics, err = compileAll("panic_patterns of the profile", prof.Panics); err != nil {
		return instance.Args{}, instance.Resolved{}, err
	}
	return args, prof, in.network(&args)
}

// network checks the display and network arguments against the machine
// resolved, and gives args its TAP and capture.
func (in *BootInput) network(args *instance.Args) error {
	mach := args.Machine
	switch {
	case in.VNC && !mach.GPU:
		return errors.New("vnc: true needs gpu: true (there is no display to serve)")
	case in.PCAP && mach.Network != "tap":
		return errors.New(`pcap: true needs network: "tap" (the capture runs on the guest's TAP)`)
	case (in.TapCIDR != "" || in.Bridge != "" || in.Tap != "") && mach.Network != "tap":
		return errors.New(`tap, tap_cidr and bridge need network: "tap"`)
	case in.Tap != "" && (in.TapCIDR != "" || in.Bridge != ""):
		return fmt.Errorf("tap %q is used as it is: the server does not configure it, so tap_cidr and bridge do not go with it (root sets its address or bridge)", in.Tap)
	}
	if mach.Network == "tap" {
		args.TAP = &instance.TAPSpec{CIDR: in.TapCIDR, Bridge: in.Bridge, Name: in.Tap}
		if in.PCAP {
			args.Capture = &instance.CaptureSpec{Filter: in.PCAPFilter}
		}
	}
	return nil
}

// bootOutput is the result of a boot, before its wait.
func bootOutput(inst *instance.Instance, booted instance.Booted, prof instance.Resolved) BootOutput {
	m := inst.Process()
	out := BootOutput{Instance: inst.Name(), PID: m.PID(), Argv: m.Argv(), Paths: m.Paths(), Arch: booted.QEMU.ArchName(), Kernel: booted.QEMU.Kernel,
		Lock: inst.LockPath(), Profile: prof.Profile, Transcript: inst.Transcript(), Symbols: booted.Symbols, CommandLine: prof.Line}
	if booted.Reaped != nil {
		b := booted.Reaped.Bounded(10)
		out.Reaped = &b
	}
	if dev := inst.TAP(); dev != nil {
		out.TAP = dev.Name
	}
	for _, sh := range booted.QEMU.Shares {
		out.Shares = append(out.Shares, ShareInfo{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable, Mount: qemu.MountCommand(sh.Tag, "/mnt/"+sh.Tag)})
	}
	for _, f := range booted.KeptRemoved {
		out.KeptRemoved = append(out.KeptRemoved, f.Path)
	}
	if st, active, ok := inst.Network().CaptureStats(); ok && active {
		out.PCAPPath = st.Path
	}
	out.VNC = m.Paths().VNCSocket
	if meta, ok := inst.Recording(); ok {
		out.Recording = recordingInfo(meta)
		out.Recording.Advice = booted.ReplayAdvice
	}
	if meta, ok := inst.Replaying(); ok {
		out.Recording = recordingInfo(meta)
		out.Recording.Replaying = true
	}
	return out
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
		if r.Advice != "" {
			fmt.Fprintf(&b, "advice: %s\n", r.Advice)
		}
	}
	if l := o.CommandLine; l != nil {
		fmt.Fprintf(&b, "command_line: %d option(s) kept", len(l.Kept))
		if len(l.Replaced) > 0 {
			var rs []string
			for _, e := range l.Replaced {
				rs = append(rs, e.Option)
			}
			fmt.Fprintf(&b, "; replaced by the server's own: %s", strings.Join(rs, ", "))
		}
		b.WriteString("\n")
	}
	if waitFor != "" {
		b.WriteString(o.WaitResult.summary(waitFor))
	} else {
		b.WriteString("guest running; read its console with serial_read\n")
	}
	return b.String()
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

// machine is the machine and debugger arguments of a boot, as a profile
// gives them.
func (in *BootInput) machine() (profile.Profile, error) {
	line, err := profile.LineOf(in.CommandLine)
	if err != nil {
		return profile.Profile{}, err
	}
	p := profile.Profile{CommandLine: line, Arch: in.Arch, Kernel: in.Kernel, Initrd: in.Initrd, DTB: in.DTB, BIOS: in.BIOS, Memory: in.Memory, SMP: in.SMP,
		Append: in.Append, Drives: in.Drives, Network: in.Network, GPU: in.GPU, VirtioModern: in.VirtioModern, ExtraArgs: in.ExtraArgs, GDB: in.GDB, Symbols: in.Symbols}
	if in.Shares != nil {
		p.Shares = make([]qemu.Share, 0, len(in.Shares))
		for _, sh := range in.Shares {
			p.Shares = append(p.Shares, qemu.Share{Path: sh.Path, Tag: sh.Tag, Writable: sh.Writable})
		}
	}
	return p, nil
}

func (s *Server) registerBoot(ms *mcp.Server) {
	add(s, ms, tool("qemu_boot", "Boot QEMU", mutating,
		"Boot a riscv64, aarch64 or x86_64 guest as a named instance, optionally waiting for a console pattern. No kernel: the built-in tiny kernel (prompt 'tiny> '). Fails if the instance runs, unless restart. Output is its start and end: serial_read from output_start reads the rest."), s.boot)
}
