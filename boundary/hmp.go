package boundary

import (
	"strings"
	"sync"
)

// HMPRules classifies the HMP commands of qemu-system-riscv64 7.2 and 11.1 for
// human-monitor-command. Aliases ("c" for "cont") are listed separately
// because HMP matches names exactly. Commands not listed are refused.
var HMPRules = []Rule{
	{
		Name:      RuleReadOnly,
		Allow:     true,
		Commands:  []string{"info", "help", "?", "qom-list", "qom-get", "clear"},
		Condition: "info: the subcommand must be on the list of read-only info subcommands (not usbhost)",
		Rationale: "they print QEMU's and the guest's state",
	},
	{
		Name:  RuleVMLifecycle,
		Allow: true,
		Commands: []string{"stop", "s", "cont", "c", "system_reset", "system_powerdown", "system_wakeup",
			"quit", "q", "nmi", "mce", "watchdog_action", "boot_set"},
		Rationale: "run state of the guest, its boot order, what QEMU does when its watchdog fires, and the machine checks (mce) and NMIs injected into it",
	},
	{
		Name:      RulePreconfig,
		Allow:     true,
		Commands:  []string{"exit_preconfig"},
		Rationale: "leaves --preconfig, which the server never uses",
	},
	{
		Name:      RuleGuestInput,
		Allow:     true,
		Commands:  []string{"sendkey", "mouse_move", "mouse_button", "mouse_set"},
		Rationale: "inject keyboard and mouse events into the guest",
	},
	{
		Name:      RuleGuestDevice,
		Allow:     true,
		Commands:  []string{"device_add", "device_del", "balloon", "set_link", "announce_self"},
		Condition: "device_add: as for QMP device_add",
		Rationale: "guest hardware, as for the QMP commands of the same rule",
	},
	{
		Name:  RuleGuestDebug,
		Allow: true,
		Commands: []string{"x", "xp", "print", "p", "sum", "gva2gpa", "cpu", "i", "o", "singlestep", "one-insn-per-tb",
			"sync-profile", "pcie_aer_inject_error"},
		Rationale: "inspect and poke guest memory, registers and emulated I/O ports, choose the monitor's default vCPU, " +
			"switch TCG to single-stepping, profile QEMU's locks, inject PCIe errors into a guest device",
	},
	{
		Name:      RuleVCPUTuning,
		Allow:     true,
		Commands:  []string{"calc_dirty_rate", "set_vcpu_dirty_limit", "cancel_vcpu_dirty_limit"},
		Rationale: "measure or throttle the guest's memory dirtying",
	},
	{
		Name:      RuleMemoryChardev,
		Allow:     true,
		Commands:  []string{"ringbuf_read", "ringbuf_write"},
		Rationale: "ring buffer character devices live in QEMU's memory",
	},
	{
		Name:      RuleCapturesOnly,
		Allow:     true,
		Commands:  []string{"screendump", "memsave", "pmemsave", "dump-guest-memory", "dumpdtb"},
		Condition: "the file must be inside the captures directory (see QMP); memsave/pmemsave must be written ADDR SIZE \"FILE\" with the file quoted, because HMP reads an unquoted \"/...\" as a division continuing the size expression",
		Rationale: "as for the QMP commands of the same name",
	},

	{
		Name: RuleHostURI,
		Commands: []string{"migrate", "migrate_incoming", "migrate_recover", "client_migrate_info",
			"nbd_server_start", "nbd_server_add", "nbd_server_remove", "nbd_server_stop"},
		Rationale: "as for QMP: migration URIs (exec: runs a host shell command) and NBD servers on host sockets",
	},
	{
		Name: RuleMigration,
		Commands: []string{"migrate_cancel", "migrate_continue", "migrate_pause", "migrate_set_capability",
			"migrate_set_parameter", "migrate_start_postcopy", "x_colo_lost_heartbeat"},
		Rationale: "control of a migration, which only exists with a host URI",
	},
	{
		Name:      RuleHostFile,
		Commands:  []string{"wavcapture"},
		Rationale: "writes guest audio to an arbitrary host file",
	},
	{
		Name: RuleBlockLayer,
		Commands: []string{"drive_add", "drive_del", "change", "commit", "drive_backup", "drive_mirror",
			"eject", "snapshot_blkdev", "block_resize", "block_set_io_throttle", "block_stream",
			"block_job_cancel", "block_job_complete", "block_job_pause", "block_job_resume",
			"block_job_set_speed", "qemu-io"},
		Rationale: "as for QMP: these open, create, copy and rewrite host images; qemu-io runs arbitrary I/O on them",
	},
	{
		Name:      RuleSnapshot,
		Commands:  []string{"savevm", "loadvm", "delvm", "snapshot_blkdev_internal", "snapshot_delete_blkdev_internal"},
		Rationale: "snapshots live in host disk images; loadvm replaces the whole guest state",
	},
	{
		Name:      RuleRecordReplay,
		Commands:  []string{"replay_break", "replay_delete_break", "replay_seek"},
		Rationale: "record/replay needs a host log file and loads snapshots from host images",
	},
	{
		Name:      RuleFDPassing,
		Commands:  []string{"getfd", "closefd"},
		Rationale: "pass host file descriptors into QEMU",
	},
	{
		Name:      RuleHostChardev,
		Commands:  []string{"chardev-add", "chardev-change", "chardev-remove", "chardev-send-break", "gdbserver"},
		Rationale: "character devices are host files, sockets, ptys or stdio; gdbserver listens on a host TCP port (tcp::1234 by default) and gives whoever connects full control of the guest",
	},
	{
		Name:      RuleHostNetwork,
		Commands:  []string{"netdev_add", "netdev_del", "hostfwd_add", "hostfwd_remove"},
		Rationale: "host network backends; hostfwd_add opens a listening port on the host",
	},
	{
		Name:      RuleHostBackend,
		Commands:  []string{"object_add", "object_del"},
		Rationale: "as for QMP object-add: user-creatable objects are host backends",
	},
	{
		Name:      RuleHostDevice,
		Commands:  []string{"stopcapture"},
		Rationale: "audio captures go to host files or audio devices",
	},
	{
		Name:      RuleHostDisplay,
		Commands:  []string{"set_password", "expire_password"},
		Rationale: "VNC and SPICE servers listen on host sockets",
	},
	{
		Name:      RuleHostLog,
		Commands:  []string{"log", "logfile", "trace-event"},
		Rationale: "logfile redirects QEMU's log to an arbitrary host file; log and trace-event fill it",
	},
	{
		Name:      RuleHostInfo,
		Commands:  []string{"gpa2hpa", "gpa2hva"},
		Rationale: "reveal host physical (reads /proc/self/pagemap) and virtual addresses of guest memory, which defeats host ASLR",
	},
	{
		Name:      RuleQOMSet,
		Commands:  []string{"qom-set"},
		Rationale: "as for QMP qom-set",
	},
	{
		Name:      RuleOtherMachines,
		Commands:  []string{"xen-event-inject", "xen-event-list"},
		Rationale: "as for QMP: Xen, which the riscv64 virt board never has",
	},
}

var hmpIndex = sync.OnceValue(func() map[string]*Rule { return ruleIndex("hmp command", HMPRules) })

// InfoSubcommands are the "info" subcommands of QEMU 7.2 and 11.1 that HMP may run:
// all of them except usbhost, which enumerates the host's USB devices.
var InfoSubcommands = map[string]bool{
	"balloon": true, "block": true, "block-jobs": true, "blockstats": true, "capture": true,
	"chardev": true, "cpus": true, "dirty_rate": true, "dump": true, "history": true,
	"hotpluggable-cpus": true, "iothreads": true, "irq": true, "jit": true, "kvm": true,
	"mem": true, "memdev": true, "memory-devices": true, "memory_size_summary": true,
	"mice": true, "migrate": true, "migrate_capabilities": true, "migrate_parameters": true,
	"mtree": true, "name": true, "network": true, "numa": true, "opcount": true, "pci": true,
	"pic": true, "profile": true, "qdm": true, "qom-tree": true, "qtree": true, "ramblock": true,
	"rdma": true, "registers": true, "replay": true, "rocker": true, "rocker-of-dpa-flows": true,
	"rocker-of-dpa-groups": true, "rocker-ports": true, "roms": true, "snapshots": true,
	"spice": true, "stats": true, "status": true, "sync-profile": true, "tpm": true,
	"trace-events": true, "usb": true, "usernet": true, "uuid": true, "vcpu_dirty_limit": true,
	"version": true, "virtio": true, "virtio-queue-element": true, "virtio-queue-status": true,
	"virtio-status": true, "virtio-vhost-queue-status": true, "vm-generation-id": true, "vnc": true,
	"accel": true, "accelerators": true, "cryptodev": true, "firmware-log": true, "via": true,
	// x86's: the vCPU's local APIC, its page tables, and the guest's SEV
	// and SGX settings.
	"lapic": true, "tlb": true, "sev": true, "sgx": true,
}

// ClassifyHMP returns the rule covering an HMP command name, RuleUnlisted's
// if none.
func ClassifyHMP(name string) Rule {
	if r, ok := hmpIndex()[name]; ok {
		return *r
	}
	return unlistedRule
}

// hmpMaxArg is the size of QEMU's buffer for one HMP string argument less the
// NUL: longer arguments are silently truncated, so they are refused.
const hmpMaxArg = 1023

// CheckHMP reports whether an HMP command line (as given to
// human-monitor-command) may run: nil, or a *RefusedError naming the rule.
// device_add is checked against the fixed lists only (see
// Policy.HMPContext).
func CheckHMP(line string, capturesDir string) error { return checkHMPLine(line, capturesDir, nil) }

func checkHMPLine(line string, capturesDir string, env *propEnv) error {
	name, rest := hmpCommandName(line)
	if r := checkHMP(name, rest, line, capturesDir, env); r != nil {
		subject := name
		if subject == "" {
			subject = describe(line)
		}
		return r.err("hmp", subject)
	}
	return nil
}

func checkHMP(name, rest, line, capturesDir string, env *propEnv) *refusal {
	if strings.ContainsRune(line, 0) {
		return refuse(RuleSyntax, "the line contains a NUL byte, where QEMU would stop reading")
	}
	rule, ok := hmpIndex()[name]
	if !ok {
		return refuse(RuleUnlisted, "%s is not on the allow-list of guest-only HMP commands; new and unknown commands are refused by default", describe(name))
	}
	if !rule.Allow {
		return refuse(rule.Name, "%s", rule.Rationale)
	}
	switch name {
	case "info":
		sub, _ := hmpCommandName(rest)
		if sub == "" {
			return nil // lists the subcommands
		}
		if !InfoSubcommands[sub] {
			if sub == "usbhost" {
				return refuse(RuleHostInfo, "info usbhost enumerates the host's USB devices")
			}
			return refuse(RuleUnlisted, "info %s is not on the allow-list of info subcommands", describe(sub))
		}
	case "screendump", "dumpdtb":
		// The file is the first argument ("filename:F,...").
		return checkHMPFile(name, rest, capturesDir)
	case "dump-guest-memory":
		return checkHMPDump(rest, capturesDir)
	case "memsave", "pmemsave":
		return checkHMPMemsave(name, rest, capturesDir)
	case "device_add":
		arg, tail, ok := hmpString(rest)
		if !ok {
			if strings.TrimLeft(rest, hmpSpace) == "" {
				return nil // prints an error: no device given
			}
			return refuse(RuleSyntax, "device_add: cannot parse the device description")
		}
		if strings.TrimLeft(tail, hmpSpace) != "" {
			return refuse(RuleSyntax, "device_add: extraneous characters after the device description")
		}
		return checkDevice(parseOpts(arg, "driver"), env)
	}
	return nil
}

// hmpSpace is qemu_isspace's set.
const hmpSpace = " \t\n\v\f\r"

func isHMPSpace(c byte) bool { return strings.IndexByte(hmpSpace, c) >= 0 }

// hmpCommandName splits a command name off s as QEMU's get_command_name does:
// leading space is skipped and the name ends at space or '/' ("x/10x addr").
func hmpCommandName(s string) (name, rest string) {
	s = strings.TrimLeft(s, hmpSpace)
	i := 0
	for i < len(s) && s[i] != '/' && s[i] != 0 && !isHMPSpace(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

// hmpString reads one string argument as QEMU's get_str does: leading space
// is skipped, then either a double-quoted string with \n \r \\ \' \" escapes
// or a run of non-space bytes. ok is false where QEMU fails, and for
// arguments QEMU would truncate.
func hmpString(s string) (arg, rest string, ok bool) {
	s = strings.TrimLeft(s, hmpSpace)
	if s == "" {
		return "", "", false
	}
	var b strings.Builder
	if s[0] == '"' {
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			c := s[i]
			if c == '\\' {
				i++
				if i >= len(s) {
					return "", "", false
				}
				switch s[i] {
				case 'n':
					c = '\n'
				case 'r':
					c = '\r'
				case '\\', '\'', '"':
					c = s[i]
				default:
					return "", "", false
				}
			}
			b.WriteByte(c)
		}
		if i >= len(s) {
			return "", "", false // unterminated
		}
		rest = s[i+1:]
	} else {
		i := 0
		for i < len(s) && !isHMPSpace(s[i]) {
			i++
		}
		b.WriteString(s[:i])
		rest = s[i:]
	}
	if b.Len() > hmpMaxArg {
		return "", "", false
	}
	return b.String(), rest, true
}

// checkHMPDump checks "dump-guest-memory [-p] [-d] [-z|-l|-s|-w] filename
// [begin length]". Flags are accepted only as separate two-byte tokens, so
// that the file is the first other token, as in QEMU.
func checkHMPDump(rest, capturesDir string) *refusal {
	for {
		t := strings.TrimLeft(rest, hmpSpace)
		if len(t) >= 2 && t[0] == '-' && strings.IndexByte("pdwzls", t[1]) >= 0 && (len(t) == 2 || isHMPSpace(t[2])) {
			rest = t[2:]
			continue
		}
		break
	}
	return checkHMPFile("dump-guest-memory", rest, capturesDir)
}

// checkHMPFile checks the file command writes, the first string argument
// of rest.
func checkHMPFile(command, rest, capturesDir string) *refusal {
	path, _, ok := hmpString(rest)
	if !ok {
		return refuse(RuleSyntax, "%s: cannot parse the file name", command)
	}
	return checkCapture(command, path, capturesDir)
}

// checkHMPMemsave checks "memsave ADDR SIZE FILE". ADDR and SIZE are HMP
// expressions, which continue across spaces: QEMU reads "16 /tmp/x" as 16
// divided by the expression "tmp/x" (an error) and "16 /2zz" as 16/2 followed
// by the relative file "zz". Only a quoted file ends the size expression
// reliably, so the accepted form is two arguments free of spaces and quotes
// followed by a double-quoted file name and nothing else.
func checkHMPMemsave(name, rest, capturesDir string) *refusal {
	usage := func() *refusal {
		return refuse(RuleSyntax, `%s: write it as %s ADDR SIZE "/captures/FILE", with ADDR and SIZE free of spaces and quotes and the file quoted; unquoted, HMP reads "/..." as a division continuing the size expression`, name, name)
	}
	t := rest
	for range 2 {
		t = strings.TrimLeft(t, hmpSpace)
		j := 0
		for j < len(t) && !isHMPSpace(t[j]) {
			j++
		}
		if j == 0 || strings.ContainsAny(t[:j], `"'`) {
			return usage()
		}
		t = t[j:]
	}
	t = strings.TrimLeft(t, hmpSpace)
	if !strings.HasPrefix(t, `"`) {
		return usage()
	}
	path, tail, ok := hmpString(t)
	if !ok || strings.TrimLeft(tail, hmpSpace) != "" {
		return usage()
	}
	return checkCapture(name, path, capturesDir)
}
