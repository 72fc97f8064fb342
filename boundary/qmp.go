package boundary

import (
	"fmt"
	"strings"
	"sync"
)

// QMPRules classifies every QMP command of qemu-system-riscv64 7.2 and 11.1
// (the test TestQEMUCommandsClassified checks this against each; see
// NotEverywhere for the commands only some of them have). Commands not
// listed are refused by RuleUnlisted.
var QMPRules = []Rule{
	{
		Name:  RuleReadOnly,
		Allow: true,
		Commands: []string{
			"query-acpi-ospm-status", "query-balloon", "query-block", "query-block-exports",
			"query-block-jobs", "query-blockstats", "query-chardev", "query-chardev-backends",
			"query-colo-status", "query-command-line-options", "query-commands", "query-cpus-fast",
			"query-current-machine", "query-dirty-rate", "query-display-options", "query-dump",
			"query-dump-guest-memory-capability", "query-fdsets", "query-hotpluggable-cpus",
			"query-iothreads", "query-jobs", "query-kvm", "query-machines", "query-memdev",
			"query-memory-devices", "query-memory-size-summary", "query-mice", "query-migrate",
			"query-migrate-capabilities", "query-migrate-parameters", "query-name",
			"query-named-block-nodes", "query-pci", "query-pr-managers", "query-qmp-schema",
			"query-replay", "query-rocker", "query-rocker-of-dpa-flows", "query-rocker-of-dpa-groups",
			"query-rocker-ports", "query-rx-filter", "query-spice", "query-stats",
			"query-stats-schemas", "query-status", "query-target", "query-tpm", "query-tpm-models",
			"query-tpm-types", "query-uuid", "query-vcpu-dirty-limit", "query-version",
			"query-vm-generation-id", "query-vnc", "query-vnc-servers",
			"query-xen-replication-status", "query-yank",
			"x-query-irq", "x-query-jit", "x-query-numa", "x-query-opcount", "x-query-profile",
			"x-query-ramblock", "x-query-rdma", "x-query-roms", "x-query-usb", "x-query-virtio",
			"x-query-virtio-queue-element", "x-query-virtio-queue-status", "x-query-virtio-status",
			"x-query-virtio-vhost-queue-status",
			"x-debug-query-block-graph", "x-debug-block-dirty-bitmap-sha256",
			"qom-list", "qom-get", "qom-list-types", "qom-list-properties",
			"device-list-properties", "trace-event-get-state",
			// Since 7.2.
			"query-accelerators", "query-audiodevs", "query-cryptodev", "query-cpu-definitions",
			"query-cpu-model-expansion", "query-cpu-model-baseline", "query-cpu-model-comparison",
			"query-firmware-log", "qom-list-get", "x-accel-stats", "x-query-interrupt-controllers",
		},
		Rationale: "read-only: they report QEMU's and the guest's state and open no host file or socket " +
			"(their only arguments are names, QOM paths and numbers; checked against the QEMU 7.2 schema). " +
			"Some report host paths QEMU already uses (query-block, query-chardev), which reveals names, not contents",
	},
	{
		Name:  RuleVMLifecycle,
		Allow: true,
		Commands: []string{"stop", "cont", "system_reset", "system_powerdown", "system_wakeup",
			"quit", "inject-nmi", "set-action", "watchdog-set-action"},
		Rationale: "run state of the guest and what QEMU does on guest reset, shutdown, panic or watchdog expiry; " +
			"quit ends the QEMU process the server supervises",
	},
	{
		Name:      RulePreconfig,
		Allow:     true,
		Commands:  []string{"x-exit-preconfig", "set-numa-node"},
		Rationale: "guest NUMA topology during --preconfig (which the server never uses, so they fail harmlessly)",
	},
	{
		Name:      RuleGuestInput,
		Allow:     true,
		Commands:  []string{"send-key", "input-send-event"},
		Rationale: "inject keyboard, mouse and tablet events into the guest's input devices",
	},
	{
		Name:      RuleGuestDevice,
		Allow:     true,
		Commands:  []string{"device_add", "device_del", "balloon", "set_link", "announce-self", "device-sync-config"},
		Condition: "device_add: as -device (the guest-device rule of the options): no host-facing property, a guest-only model or a model of this QEMU no refuse rule names, every property allow-listed or passing by its type",
		Rationale: "guest hardware: hot-plug and unplug of models with no host backend, balloon target, a NIC's link " +
			"state and gratuitous ARP (packets the guest could send itself)",
	},
	{
		Name:      RuleVCPUTuning,
		Allow:     true,
		Commands:  []string{"calc-dirty-rate", "set-vcpu-dirty-limit", "cancel-vcpu-dirty-limit"},
		Rationale: "measure or throttle the guest's memory dirtying; affects vCPU speed only",
	},
	{
		Name:      RuleMemoryChardev,
		Allow:     true,
		Commands:  []string{"ringbuf-read", "ringbuf-write"},
		Rationale: "read or write a ringbuf character device, a buffer in QEMU's memory (they fail on any other chardev)",
	},
	{
		Name:      RuleCapturesOnly,
		Allow:     true,
		Commands:  []string{"screendump", "memsave", "pmemsave", "dump-guest-memory", "dumpdtb"},
		Condition: "the file (filename, or dump-guest-memory's protocol \"file:PATH\") must be an absolute path inside the captures directory, without \"..\", not through a symlink, not an existing symlink, special file or multiply-linked file",
		Rationale: "they write guest screen, memory or device tree to a host file, which is fine in the captures directory the server hands out and nowhere else",
	},
	{
		Name:      RuleHMP,
		Allow:     true,
		Commands:  []string{"human-monitor-command"},
		Condition: "the command line must pass CheckHMP (HMPRules)",
		Rationale: "HMP duplicates QMP, including host-facing commands, so each line is checked against its own allow-list",
	},

	{
		Name: RuleHostURI,
		Commands: []string{"migrate", "migrate-incoming", "migrate-recover", "client_migrate_info",
			"nbd-server-start", "nbd-server-add", "nbd-server-remove", "nbd-server-stop",
			"block-export-add", "block-export-del"},
		Rationale: "migration sends guest state to, or loads it from, a host URI (exec:, file:, unix:, tcp:, rdma:, fd:) " +
			"outside the guest; exec: runs a host shell command. The NBD server and block exports listen on host " +
			"sockets or FUSE mounts",
	},
	{
		Name: RuleMigration,
		Commands: []string{"migrate-pause", "migrate-continue", "migrate-start-postcopy", "migrate_cancel",
			"migrate-set-capabilities", "migrate-set-parameters", "x-colo-lost-heartbeat",
			"xen-colo-do-checkpoint", "xen-set-global-dirty-log", "xen-set-replication"},
		Rationale: "control of a migration or COLO replication, which only exists with a host URI (see host-uri); " +
			"migration parameters name TLS credentials objects",
	},
	{
		Name:      RuleHostFile,
		Commands:  []string{"xen-save-devices-state", "xen-load-devices-state", "dump-skeys"},
		Rationale: "write or read device state to or from an arbitrary host file",
	},
	{
		Name: RuleBlockLayer,
		Commands: []string{"blockdev-add", "blockdev-del", "blockdev-create", "blockdev-reopen",
			"blockdev-backup", "blockdev-mirror", "blockdev-snapshot", "blockdev-snapshot-sync",
			"blockdev-change-medium", "blockdev-insert-medium", "blockdev-remove-medium",
			"blockdev-open-tray", "blockdev-close-tray", "eject",
			"drive-backup", "drive-mirror", "block-commit", "block-stream", "change-backing-file",
			"block_resize", "block_set_io_throttle", "block-set-write-threshold",
			"block-latency-histogram-set",
			"block-dirty-bitmap-add", "block-dirty-bitmap-clear", "block-dirty-bitmap-disable",
			"block-dirty-bitmap-enable", "block-dirty-bitmap-merge", "block-dirty-bitmap-remove",
			"block-job-cancel", "block-job-complete", "block-job-dismiss", "block-job-finalize",
			"block-job-pause", "block-job-resume", "block-job-set-speed",
			"job-cancel", "job-complete", "job-dismiss", "job-finalize", "job-pause", "job-resume",
			"transaction", "x-blockdev-amend", "x-blockdev-change", "x-blockdev-set-iothread",
			"blockdev-set-active", "block-job-change"},
		Rationale: "block nodes are host files, host devices or network storage (NBD, iSCSI, ssh, http); these commands " +
			"open, create, copy, resize and rewrite them. The server attaches the configured drives itself",
	},
	{
		Name: RuleSnapshot,
		Commands: []string{"snapshot-save", "snapshot-load", "snapshot-delete",
			"blockdev-snapshot-internal-sync", "blockdev-snapshot-delete-internal-sync"},
		Rationale: "snapshots are written into and read back from host disk images; loading one replaces the whole guest state",
	},
	{
		Name:      RuleRecordReplay,
		Commands:  []string{"replay-break", "replay-delete-break", "replay-seek"},
		Rationale: "record/replay needs -icount rr=...,rrfile=<host file> and seeks by loading snapshots from host disk images",
	},
	{
		Name:      RuleFDPassing,
		Commands:  []string{"getfd", "add-fd", "closefd", "remove-fd", "add_client"},
		Rationale: "pass host file descriptors into QEMU (over the server's QMP socket) or hand them to display/chardev servers",
	},
	{
		Name:     RuleHostChardev,
		Commands: []string{"chardev-add", "chardev-change", "chardev-remove", "chardev-send-break"},
		Rationale: "character devices are host files, pipes, sockets, ptys, serial ports or stdio; removing or changing one " +
			"would also cut the server's serial console",
	},
	{
		Name:     RuleHostNetwork,
		Commands: []string{"netdev_add", "netdev_del"},
		Rationale: "network backends are host interfaces (tap, bridge, vhost), host sockets, or user-mode networking, which " +
			"reaches the host's network and can forward host ports, serve host directories (tftp=, smb=) or run commands (guestfwd=cmd:)",
	},
	{
		Name:     RuleHostBackend,
		Commands: []string{"object-add", "object-del"},
		Rationale: "user-creatable objects are host backends: memory-backend-file (a host file), rng-random (a host device), " +
			"rng-egd, input-linux (host evdev), filter-dump (writes a host file), tls-creds-x509 (host directory), authz-list-file, " +
			"secret (reads a host file), can-host-socketcan, cryptodev-vhost-user...",
	},
	{
		Name:      RuleHostDisplay,
		Commands:  []string{"change-vnc-password", "set_password", "expire_password", "display-reload", "display-update"},
		Rationale: "VNC and SPICE servers listen on host sockets and load TLS material from host files; display-update can move a VNC server to new host addresses",
	},
	{
		Name:      RuleHostLog,
		Commands:  []string{"trace-event-set-state"},
		Rationale: "trace output goes to QEMU's log or, depending on the trace backend QEMU was built with, to a trace file in its working directory",
	},
	{
		Name:      RuleQOMSet,
		Commands:  []string{"qom-set"},
		Rationale: "QOM properties include host-facing ones (links to chardev, netdev, block and memory backends, file names); no per-property allow-list exists, so writes are refused",
	},
	{
		Name:      RuleServerManaged,
		Commands:  []string{"qmp_capabilities", "yank", "request-ebpf"},
		Rationale: "the server owns the QMP session (capabilities were negotiated on connect) and its character devices, which yank would disconnect; request-ebpf hands out a program for a host's vhost backend",
	},
	{
		Name: RuleOtherMachines,
		Commands: []string{"cxl-add-dynamic-capacity", "cxl-release-dynamic-capacity", "cxl-inject-correctable-error",
			"cxl-inject-uncorrectable-errors", "cxl-inject-poison", "cxl-inject-memory-module-event",
			"cxl-inject-dram-event", "cxl-inject-general-media-event", "inject-ghes-v2-error",
			"rtc-reset-reinjection", "set-cpu-topology", "query-s390x-cpu-polarization", "query-gic-capabilities",
			"query-hv-balloon-status-report", "query-sev", "query-sev-attestation-report", "query-sev-capabilities",
			"query-sev-launch-measure", "sev-inject-launch-secret", "query-sgx", "query-sgx-capabilities",
			"xen-event-inject", "xen-event-list"},
		Rationale: "devices, hosts and accelerators the riscv64 virt board never has (CXL memory, ARM GHES and GIC, x86 RTC, SEV and SGX, s390 CPU topology, Hyper-V balloon, Xen): they only fail here, and some reach host firmware",
	},
}

// NotEverywhere are the commands the rules name that only some of the
// QEMUs the server supports have (7.2 to 11.1), with where they exist.
var NotEverywhere = map[string]string{
	"x-query-opcount": "up to 8.x", "x-query-profile": "up to 8.x", "x-query-rdma": "up to 10.0",
	"query-accelerators": "since 10.x", "query-audiodevs": "since 8.x", "query-cryptodev": "since 8.x",
	"query-cpu-definitions": "since 9.x (riscv)", "query-cpu-model-expansion": "since 9.x (riscv)",
	"query-cpu-model-baseline": "s390 builds", "query-cpu-model-comparison": "s390 builds",
	"query-firmware-log": "since 11.x", "qom-list-get": "since 10.x", "x-accel-stats": "since 10.x",
	"x-query-interrupt-controllers": "since 10.x", "device-sync-config": "since 9.x",
	"blockdev-set-active": "since 10.x", "block-job-change": "since 8.x", "dump-skeys": "s390 builds",
	"request-ebpf":             "since 9.x",
	"cxl-add-dynamic-capacity": "since 9.x", "cxl-release-dynamic-capacity": "since 9.x",
	"cxl-inject-correctable-error": "since 8.x", "cxl-inject-uncorrectable-errors": "since 8.x",
	"cxl-inject-poison": "since 8.x", "cxl-inject-memory-module-event": "since 8.x",
	"cxl-inject-dram-event": "since 8.x", "cxl-inject-general-media-event": "since 8.x",
	"inject-ghes-v2-error": "since 10.x", "rtc-reset-reinjection": "x86 builds", "set-cpu-topology": "s390 builds",
	"query-s390x-cpu-polarization": "s390 builds", "query-gic-capabilities": "ARM builds",
	"query-hv-balloon-status-report": "since 8.x", "query-sev": "x86 builds", "query-sev-attestation-report": "x86 builds",
	"query-sev-capabilities": "x86 builds", "query-sev-launch-measure": "x86 builds", "sev-inject-launch-secret": "x86 builds",
	"query-sgx": "x86 builds", "query-sgx-capabilities": "x86 builds", "xen-event-inject": "since 8.x", "xen-event-list": "since 8.x",
	// HMP.
	"singlestep": "up to 8.x (one-insn-per-tb since)", "one-insn-per-tb": "since 8.1", "clear": "since 10.x",
	"mce": "x86 builds",
	// info subcommands.
	"info opcount": "up to 8.x", "info profile": "up to 8.x", "info rdma": "up to 10.0",
	"info accel": "since 10.x", "info accelerators": "since 10.x", "info cryptodev": "since 8.x",
	"info firmware-log": "since 11.x", "info via": "since 8.x",
	"info lapic": "x86 builds", "info sev": "x86 builds", "info sgx": "x86 builds", "info tlb": "x86 and other builds with a software TLB dump",
	// Options.
	"-singlestep": "up to 8.x (-accel tcg,one-insn-per-tb=on since)",
}

var qmpIndex = sync.OnceValue(func() map[string]*Rule { return ruleIndex("qmp command", QMPRules) })

// ClassifyQMP returns the rule covering a QMP command, RuleUnlisted's if none.
func ClassifyQMP(command string) Rule {
	if r, ok := qmpIndex()[command]; ok {
		return *r
	}
	return unlistedRule
}

// captureArg names the argument holding the file of each captures-only
// command.
var captureArg = map[string]string{
	"screendump": "filename",
	"memsave":    "filename",
	"pmemsave":   "filename",
	"dumpdtb":    "filename",
}

// CheckQMP reports whether a QMP command may run: nil, or a *RefusedError
// naming the rule. capturesDir is the only directory commands may write to.
// device_add is checked against the fixed lists only (see
// Policy.QMPContext).
func CheckQMP(command string, args map[string]any, capturesDir string) error {
	return checkQMPCommand(command, args, capturesDir, nil)
}

func checkQMPCommand(command string, args map[string]any, capturesDir string, env *propEnv) error {
	if r := checkQMP(command, args, capturesDir, env); r != nil {
		return r.err("qmp", command)
	}
	if command == "human-monitor-command" {
		line, _ := args["command-line"].(string)
		if err := checkHMPLine(line, capturesDir, env); err != nil {
			return fmt.Errorf("qmp human-monitor-command: %w", err)
		}
	}
	return nil
}

func checkQMP(command string, args map[string]any, capturesDir string, env *propEnv) *refusal {
	rule, ok := qmpIndex()[command]
	if !ok {
		return refuse(RuleUnlisted, "%q is not on the allow-list of guest-only QMP commands; new and unknown commands are refused by default", command)
	}
	if !rule.Allow && !(rule.Name == RuleOtherMachines && env.owns(command)) {
		return refuse(rule.Name, "%s", rule.Rationale)
	}
	switch command {
	case "screendump", "memsave", "pmemsave", "dumpdtb":
		name := captureArg[command]
		v, present := args[name]
		path, isString := v.(string)
		if !present || !isString {
			return refuse(RuleCapturesOnly, "%s writes a host file; argument %q must be a string naming a file inside the captures directory", command, name)
		}
		return checkCapture(command, path, capturesDir)
	case "dump-guest-memory":
		v, present := args["protocol"]
		proto, isString := v.(string)
		if !present || !isString {
			return refuse(RuleCapturesOnly, `dump-guest-memory writes a host file; "protocol" must be a string "file:PATH" inside the captures directory`)
		}
		path, ok := strings.CutPrefix(proto, "file:")
		if !ok {
			if strings.HasPrefix(proto, "fd:") {
				return refuse(RuleFDPassing, "dump-guest-memory protocol %s writes to a file descriptor passed from the host", describe(proto))
			}
			return refuse(RuleCapturesOnly, `dump-guest-memory protocol %s: only "file:PATH" inside the captures directory is allowed`, describe(proto))
		}
		return checkCapture(command, path, capturesDir)
	case "device_add":
		return checkDevice(deviceFromMap(args), env)
	case "human-monitor-command":
		v, present := args["command-line"]
		if _, isString := v.(string); !present || !isString {
			return refuse(RuleHMP, `"command-line" must be a string`)
		}
	}
	return nil
}
