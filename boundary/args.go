package boundary

import (
	"maps"
	"slices"
	"sync"

	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/qemu"

	"strings"
)

// ExtraArgRules classifies QEMU 7.2 command-line options for qemu_boot's
// extra_args. Names are given without the leading dash; "-opt", "--opt" and
// "-opt=value" spellings are all checked the same way. Options not listed,
// and bare arguments (which QEMU takes as a disk image path), are refused.
var ExtraArgRules = []Rule{
	{
		Name:  RuleGuestConfig,
		Allow: true,
		Commands: []string{"machine", "M", "cpu", "smp", "m", "accel", "append", "icount", "rtc",
			"name", "uuid", "boot", "numa", "fw_cfg", "seed", "singlestep", "usb",
			"nodefaults", "no-user-config"},
		Condition: "only the listed properties of each option: -machine type (a board of an architecture the server knows) and its board's properties (riscv64: aclint, aia, aia-guests; aarch64: gic-version, its, virtualization ...), " +
			"dt-compatible, dump-guest-core, graphics, mem-merge, phandle-start, suppress-vmdesc, usb, append, accel=tcg; " +
			"-accel tcg with thread, tb-size, split-wx; -icount shift, align, sleep; -rtc base, clock, driftfix; " +
			"-name guest, debug-threads; -boot order, once, menu, reboot-timeout, strict, splash-time; -numa without memdev; " +
			"-fw_cfg name, string; -smp and -m numbers",
		Rationale: "guest hardware and firmware configuration emulated inside QEMU. Refused properties name host files " +
			"(-machine dumpdtb=, dtb=, kernel=, initrd=, firmware=, boot.splash=; -icount rrfile=; -boot splash=; -fw_cfg file=), " +
			"host backends (memory-backend=, memdev=) or rename the host process (-name process=)",
	},
	{
		Name:      RuleVMLifecycle,
		Allow:     true,
		Commands:  []string{"no-reboot", "no-shutdown", "S", "action", "watchdog-action"},
		Rationale: "what QEMU does on guest reset, shutdown, panic or watchdog expiry, and starting paused",
	},
	{
		Name:     RuleGuestDevice,
		Allow:    true,
		Commands: []string{"device", "global", "vga", "usbdevice"},
		Condition: "-device (QemuOpts or JSON): no host-facing property (drive, netdev, chardev, romfile, file...); a guest-only model (GuestDevices) " +
			"or a model of this QEMU that no refuse rule names; every other property allow-listed (DeviceProperties; addr, port, serial) or passing by its type. " +
			"-global DRIVER.PROP=VALUE (or driver=,property=,value=): DRIVER a device class of this QEMU and PROP passing by its type. " +
			"By its type: this QEMU (asked once per binary, then cached) types it bool, an integer, size or an enumeration, and the value is one. " +
			"-vga none, std, virtio or cirrus; -usbdevice tablet, mouse or keyboard",
		Rationale: "guest hardware with no host backend, and device settings that name no host resource (force-legacy, disable-legacy, queue sizes): " +
			"QEMU's type says so; a string never passes by its type, since QEMU types drive=, chardev=, romfile= and a loader's file= as str too",
	},
	{
		Name:      RuleGuestDebug,
		Allow:     true,
		Commands:  []string{"d", "dfilter", "msg"},
		Condition: "-d without trace: items",
		Rationale: "QEMU's debug log goes to its stderr, which the server collects; -D, which would name a host file, is refused",
	},
	{
		Name:      RuleNoneOnly,
		Allow:     true,
		Commands:  []string{"display", "nic", "net"},
		Condition: "the value must be exactly none",
		Rationale: "no display window or server, no network backend",
	},
	{
		Name:      RuleHardening,
		Allow:     true,
		Commands:  []string{"sandbox"},
		Condition: "only enable, obsolete, elevateprivileges, spawn, resourcecontrol",
		Rationale: "the seccomp sandbox can only take abilities away from QEMU",
	},

	{
		Name:      RuleServerManaged,
		Commands:  serverManaged(),
		Fixed:     true,
		Rationale: "the server wires the serial console and the QMP socket itself, keeps QEMU as its child and tracks its PID; --preconfig would stall the boot",
	},
	{
		Name:      RuleIndirectConfig,
		Commands:  []string{"readconfig", "writeconfig", "set"},
		Rationale: "config files and -set can set any option of every group, including host backends (e.g. -set drive.x.file=); -writeconfig writes a host file",
	},
	{
		Name:      RuleHostChardev,
		Commands:  []string{"gdb", "s", "parallel", "debugcon", "virtioconsole", "qtest", "qtest-log"},
		Rationale: "these open character devices on the host (files, sockets, ptys, stdio); the gdb stub (-s is -gdb tcp::1234) listens on a host port and gives whoever connects full control of the guest",
	},
	{
		Name: RuleBlockLayer,
		Commands: []string{"drive", "blockdev", "hda", "hdb", "hdc", "hdd", "fda", "fdb", "cdrom", "mtdblock",
			"sd", "pflash", "snapshot", "iscsi"},
		Rationale: "block devices are host files, host devices or network storage; the server attaches the configured drives itself",
	},
	{
		Name: RuleHostFile,
		Commands: []string{"kernel", "initrd", "dtb", "bios", "L", "option-rom", "mem-path", "dump-vmstate",
			"fsdev", "virtfs", "acpitable", "smbios", "k"},
		Rationale: "they read (or for -dump-vmstate write) host files and directories: boot images (the server sets its own), ROMs, " +
			"memory backing files, shared directories (virtfs), ACPI/SMBIOS tables, keymaps",
	},
	{
		Name:      RuleHostNetwork,
		Commands:  []string{"netdev"},
		Rationale: "network backends are host interfaces or sockets; user networking reaches the host's network and can forward host ports, serve host directories (tftp=, smb=) or run host commands (guestfwd=...cmd:)",
	},
	{
		Name:      RuleHostBackend,
		Commands:  []string{"object"},
		Rationale: "user-creatable objects are host backends (memory-backend-file, rng-random, input-linux, filter-dump, tls-creds, secret...)",
	},
	{
		Name:      RuleHostDevice,
		Commands:  []string{"enable-kvm", "audiodev", "audio", "soundhw", "tpmdev", "mem-prealloc", "overcommit"},
		Rationale: "host devices and resources: /dev/kvm (not applicable to riscv64 guests on this host anyway), sound cards, TPMs, locked or preallocated host memory",
	},
	{
		Name:      RuleHostDisplay,
		Commands:  []string{"vnc", "spice", "nographic", "sdl", "curses", "full-screen", "portrait", "rotate", "alt-grab", "ctrl-grab", "g"},
		Rationale: "host windows, terminals and VNC/SPICE servers on host sockets; -nographic can put a monitor on QEMU's stdio (the server already runs -display none)",
	},
	{
		Name:      RuleHostLog,
		Commands:  []string{"D", "trace"},
		Rationale: "-D and -trace file= write QEMU's log or trace to an arbitrary host file; -trace events= reads one",
	},
	{
		Name:      RuleHostURI,
		Commands:  []string{"incoming"},
		Rationale: "loads guest state from a host URI (tcp:, unix:, exec: runs a host shell command, fd:)",
	},
	{
		Name:      RuleSnapshot,
		Commands:  []string{"loadvm"},
		Rationale: "loads a snapshot from host disk images",
	},
	{
		Name:      RuleFDPassing,
		Commands:  []string{"add-fd"},
		Rationale: "hands host file descriptors to QEMU",
	},
	{
		Name:      RuleHostCode,
		Commands:  []string{"plugin"},
		Rationale: "loads a host shared library into QEMU",
	},
	{
		Name:      RuleHostProcess,
		Commands:  []string{"runas", "chroot", "run-with", "async-teardown"},
		Rationale: "change the host user, root directory or process structure of QEMU",
	},
	{
		Name:      RuleSemihosting,
		Commands:  []string{"semihosting", "semihosting-config"},
		Rationale: "semihosting lets guest code open, read and write host files and run host commands (SYS_SYSTEM) through QEMU",
	},
}

var optionIndex = sync.OnceValue(func() map[string]*Rule { return ruleIndex("option", ExtraArgRules) })

// ClassifyOption returns the rule covering a command-line option given
// without its dash, RuleUnlisted's if none.
func ClassifyOption(name string) Rule {
	if r, ok := optionIndex()[name]; ok {
		return *r
	}
	return unlistedRule
}

// flagOptions are the allowed options that take no argument.
var flagOptions = map[string]bool{
	"singlestep": true, "usb": true, "nodefaults": true, "no-user-config": true,
	"no-reboot": true, "no-shutdown": true, "S": true,
}

// machines are the machine types -machine may select, and the properties
// it may set besides the common ones: every architecture's boards. A board
// of another architecture than the guest's is harmless: QEMU refuses it.
var machines = sync.OnceValues(func() (types, props map[string]bool) {
	types, props = set("none"), set()
	for _, a := range archs.All() {
		q := a.QEMU()
		for _, m := range q.Machines {
			types[m] = true
		}
		for _, p := range q.MachineProps {
			props[p] = true
		}
	}
	return types, props
})

func set(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// optionKeys are the properties each key=value option may set, with the
// implied key of a first element without "=".
var optionKeys = map[string]struct {
	implied string
	allowed map[string]bool
}{
	"machine": {"type", set("type", "dt-compatible", "dump-guest-core",
		"graphics", "mem-merge", "phandle-start", "suppress-vmdesc", "usb", "append", "accel")},
	"smp":     {"cpus", set("cpus", "maxcpus", "sockets", "dies", "clusters", "cores", "threads")},
	"m":       {"size", set("size", "slots", "maxmem")},
	"accel":   {"accel", set("accel", "thread", "tb-size", "split-wx")},
	"icount":  {"shift", set("shift", "align", "sleep")},
	"rtc":     {"", set("base", "clock", "driftfix")},
	"name":    {"guest", set("guest", "debug-threads")},
	"boot":    {"order", set("order", "once", "menu", "reboot-timeout", "strict", "splash-time")},
	"fw_cfg":  {"name", set("name", "string")},
	"action":  {"", set("reboot", "shutdown", "panic", "watchdog")},
	"msg":     {"", set("timestamp", "guest-name")},
	"sandbox": {"enable", set("enable", "obsolete", "elevateprivileges", "spawn", "resourcecontrol")},
	"numa": {"type", set("type", "nodeid", "cpus", "mem", "initiator", "src", "dst", "val", "node-id",
		"socket-id", "die-id", "cluster-id", "core-id", "thread-id", "hierarchy", "data-type", "latency",
		"bandwidth", "target", "size", "level", "associativity", "policy", "line")},
}

// hostOptionKeys maps host-facing properties of key=value options to rules.
var hostOptionKeys = map[string]string{
	"dumpdtb": RuleHostFile, "dtb": RuleHostFile, "kernel": RuleHostFile, "initrd": RuleHostFile,
	"firmware": RuleHostFile, "boot.splash": RuleHostFile, "splash": RuleHostFile, "file": RuleHostFile,
	"memory-backend": RuleHostBackend, "memdev": RuleHostBackend, "confidential-guest-support": RuleHostBackend,
	"memory-encryption": RuleHostBackend, "gen_id": RuleHostBackend,
	"rr": RuleRecordReplay, "rrfile": RuleRecordReplay, "rrsnapshot": RuleRecordReplay,
	"process": RuleHostProcess,
}

// CheckExtraArgs reports whether qemu_boot's extra_args may be passed to
// QEMU: nil, or a *RefusedError naming the rule for the first refused one.
// It does not know the QEMU binary's property types: -global is refused
// and -device takes the fixed lists only (see Policy.ExtraArgsContext).
func CheckExtraArgs(args []string) error { return checkExtraArgs(args, nil) }

func checkExtraArgs(args []string, env *propEnv) error {
	if env != nil && env.src != nil {
		if classes := extraArgClasses(args); len(classes) > 0 {
			env.types(classes...) // one probe for all of them
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			return refuse(RuleBlockLayer, "QEMU takes a bare argument as the path of a host disk image").err(KindOption, describe(a))
		}
		name, value, inline := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		subject := "-" + name
		rule, ok := optionIndex()[name]
		if !ok {
			return refuse(RuleUnlisted, "%s is not on the allow-list of guest-only QEMU options; unknown options are refused by default", describe(a)).err(KindOption, subject)
		}
		if !rule.Allow {
			return refuse(rule.Name, "%s", rule.Rationale).err(KindOption, subject)
		}
		if flagOptions[name] {
			if inline {
				return refuse(RuleSyntax, "%s takes no value", subject).err(KindOption, subject)
			}
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return refuse(RuleSyntax, "%s needs a value", subject).err(KindOption, subject)
			}
			i++
			value = args[i]
		}
		if r := checkOption(name, value, env); r != nil {
			return r.err(KindOption, subject+" "+describe(value))
		}
	}
	return nil
}

func checkOption(name, value string, env *propEnv) *refusal {
	if strings.ContainsRune(value, 0) {
		return refuse(RuleSyntax, "the value contains a NUL byte")
	}
	switch name {
	case "M":
		name = "machine"
	case "cpu", "append", "uuid", "seed", "dfilter", "watchdog-action":
		return nil // guest-only values with no sub-options naming host resources
	case "display", "nic", "net":
		if value != "none" {
			rule := RuleHostNetwork
			if name == "display" {
				rule = RuleHostDisplay
			}
			return refuse(rule, "-%s %s uses %s; only -%s none is allowed", name, describe(value), ruleSummaryOption(rule), name)
		}
		return nil
	case "vga":
		switch value {
		case "none", "std", "virtio", "cirrus":
			return nil
		}
		return refuse(RuleGuestDevice, "-vga %s: only none, std, virtio and cirrus are allowed", describe(value))
	case "usbdevice":
		switch value {
		case "tablet", "mouse", "keyboard":
			return nil
		}
		return refuse(RuleHostDevice, "-usbdevice %s: only tablet, mouse and keyboard are allowed (others pass through host USB devices or character devices)", describe(value))
	case "d":
		for _, item := range strings.Split(value, ",") {
			if strings.HasPrefix(item, "trace:") {
				return refuse(RuleHostLog, "-d trace: enables trace events, whose output depends on QEMU's trace backend and may be a host file")
			}
		}
		return nil
	case "device":
		props, err := parseDevice(value)
		if err != nil {
			return refuse(RuleSyntax, "-device JSON: %v", err)
		}
		return checkDevice(props, env)
	case "global":
		return checkGlobal(env, value)
	}
	spec, ok := optionKeys[name]
	if !ok {
		return refuse(RuleUnlisted, "-%s has no value check", name) // unreachable: every allowed option is handled
	}
	props := parseOpts(value, spec.implied)
	allowed := spec.allowed
	boards, boardProps := machines()
	if name == "machine" {
		allowed = maps.Clone(allowed)
		maps.Copy(allowed, boardProps)
	}
	if r := checkKeys("-"+name, props, allowed, hostOptionKeys, RuleGuestConfig); r != nil {
		return r
	}
	for _, p := range props {
		v, _ := p.value.(string)
		switch {
		case name == "machine" && p.key == "type" && !boards[v]:
			return refuse(RuleGuestConfig, "-machine type %s is not one of the boards (%s)", describe(v), strings.Join(slices.Sorted(maps.Keys(boards)), ", "))
		case (name == "machine" && p.key == "accel" || name == "accel" && p.key == "accel") && v != "tcg":
			return refuse(RuleHostDevice, "accelerator %s: only tcg is allowed (kvm opens the host's /dev/kvm)", describe(v))
		}
	}
	return nil
}

func ruleSummaryOption(rule string) string {
	if rule == RuleHostDisplay {
		return "a host window, terminal or display server"
	}
	return ruleSummary(rule)
}

// serverManaged is the qemu package's list of options the server manages,
// the one source of it. -readconfig is on that list too, but it is classed
// under indirect-config here, the more specific reason it is refused.
func serverManaged() []string {
	var names []string
	for _, n := range qemu.ManagedOptions() {
		if n != "readconfig" {
			names = append(names, n)
		}
	}
	return names
}
