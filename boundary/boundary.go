// Package boundary enforces the security boundary "no host access through
// the guest tools": letting an agent use qemu-mcp's QEMU tools (qmp_command,
// qemu_boot's extra_args) must not give it a shell on the host, nor access to
// host files, sockets or devices. Everything the agent asks for must stay
// inside the guest, except for the files the server hands out on purpose: the
// captures directory, into which screendump, memsave, pmemsave,
// dump-guest-memory and dumpdtb may write.
//
// The boundary is an allow-list. QMP commands, HMP commands and QEMU
// command-line options are allowed only when a rule with a documented
// rationale says they are guest-only (QMPRules, HMPRules, ExtraArgRules);
// everything else, including commands a newer QEMU adds, is refused by the
// "unlisted" rule. Refusals name their rule, so a user who does want host
// access can see what was refused and why; the server's --allow-host-access
// flag sets Policy.AllowHostAccess, which turns every check off.
//
// The checks model how QEMU 7.2 parses its input (QemuOpts and keyval option
// strings, HMP argument strings and expressions) and refuse whatever they
// cannot model exactly, so that what is checked is what QEMU executes.
// Callers must pass QEMU exactly what they checked: for QMP, marshal the same
// args map that was passed to CheckQMP (a map cannot hold duplicate keys,
// whose meaning would otherwise differ between Go's decoder and QEMU's).
//
// Paths are checked when the command is checked. Someone with host access can
// still swap a directory inside the captures directory for a symlink between
// the check and QEMU's open; that needs host access already, so it does not
// widen what the agent can do.
package boundary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// Rule names. A rule either allows what it lists (possibly after checking its
// arguments, see Rule.Condition) or refuses it.
const (
	// Allow rules.
	RuleReadOnly      = "read-only"
	RuleVMLifecycle   = "vm-lifecycle"
	RulePreconfig     = "preconfig"
	RuleGuestInput    = "guest-input"
	RuleGuestDevice   = "guest-device"
	RuleGuestDebug    = "guest-debug"
	RuleVCPUTuning    = "vcpu-tuning"
	RuleMemoryChardev = "memory-chardev"
	RuleCapturesOnly  = "captures-only"
	RuleHMP           = "hmp"
	RuleGuestConfig   = "guest-config"
	RuleNoneOnly      = "none-only"
	RuleHardening     = "hardening"

	// Refuse rules.
	RuleHostURI        = "host-uri"
	RuleMigration      = "migration"
	RuleHostFile       = "host-file"
	RuleBlockLayer     = "block-layer"
	RuleSnapshot       = "snapshot"
	RuleRecordReplay   = "record-replay"
	RuleFDPassing      = "fd-passing"
	RuleHostChardev    = "host-chardev"
	RuleHostNetwork    = "host-network"
	RuleHostBackend    = "host-backend"
	RuleHostDevice     = "host-device"
	RuleHostDisplay    = "host-display"
	RuleHostLog        = "host-log"
	RuleHostInfo       = "host-info"
	RuleHostCode       = "host-code"
	RuleHostProcess    = "host-process"
	RuleSemihosting    = "semihosting"
	RuleIndirectConfig = "indirect-config"
	RuleQOMSet         = "qom-set"
	RuleServerManaged  = "server-managed"
	RuleOtherMachines  = "other-machines"
	// RuleSyntax refuses input that cannot be parsed the way QEMU parses
	// it, and so cannot be checked.
	RuleSyntax = "syntax"
	// RuleUnlisted is the default: whatever no rule lists is refused.
	RuleUnlisted = "unlisted"
)

// A Rule classifies QMP commands, HMP commands or command-line options.
type Rule struct {
	// Name is one of the Rule* constants.
	Name string
	// Allow is true for allow rules. An allow rule with a Condition still
	// refuses arguments that fail the condition, naming itself or a more
	// specific refuse rule.
	Allow bool
	// Commands lists what the rule covers: QMP command names, HMP command
	// names (aliases listed separately), or option names without the dash.
	Commands []string
	// Condition, if not empty, says what is checked before allowing.
	Condition string
	// Fixed marks a refuse rule that --allow-host-access does not lift:
	// the server itself depends on what it protects.
	Fixed bool
	// Rationale says why the rule is safe (allow) or unsafe (refuse).
	Rationale string
}

// ErrRefused is matched by errors.Is for every refusal.
var ErrRefused = errors.New("refused by the host-access boundary")

// allowHint ends every refusal message.
const allowHint = "start qemu-mcp with --allow-host-access to allow it"

// fixedHint ends a refusal that --allow-host-access does not lift.
const fixedHint = "the server manages it, so no flag allows it"

// KindOption is the Kind of a refused QEMU command-line option.
const KindOption = "option"

// RefusedError is a refusal. Use errors.As to get the rule.
type RefusedError struct {
	// Kind is "qmp", "hmp" or KindOption.
	Kind string
	// Subject is the command or option that was refused.
	Subject string
	// Rule is the rule's Name.
	Rule string
	// Reason explains the refusal.
	Reason string
}

func (e *RefusedError) Error() string {
	hint := allowHint
	if e.fixed() {
		hint = fixedHint
	}
	return fmt.Sprintf("%s %s refused by rule %q: %s; %s", e.Kind, e.Subject, e.Rule, e.Reason, hint)
}

// fixed reports whether the refusing rule is one no flag lifts.
func (e *RefusedError) fixed() bool {
	if e.Kind != KindOption {
		return false
	}
	for _, r := range ExtraArgRules {
		if r.Name == e.Rule {
			return r.Fixed
		}
	}
	return false
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Policy is the boundary as configured by the server: the --allow-host-access
// flag sets AllowHostAccess, which disables every check, and CapturesDir is
// the only host directory guest tools may write to. Props gives the
// property types of the QEMU binary the server boots, which let device
// properties that name no host resource pass -device, -global and
// device_add by their type; nil means they are not known, and only the
// fixed lists (GuestDevices, DeviceProperties) apply.
type Policy struct {
	AllowHostAccess bool
	CapturesDir     string
	Props           PropertySource
	// Arch is the guest's architecture, whose board's own commands
	// (arch.QEMU.Commands) pass the other-machines rule; nil allows none.
	Arch arch.Arch
}

// env is what a check under p knows of the guest's QEMU.
func (p Policy) env(ctx context.Context) *propEnv {
	e := newPropEnv(ctx, p.Props)
	if p.Arch != nil {
		e.own = p.Arch.QEMU().Commands
	}
	return e
}

// QMP is QMPContext without a deadline of the caller's (the property
// types' source bounds its probe itself).
func (p Policy) QMP(command string, args map[string]any) error {
	return p.QMPContext(context.Background(), command, args)
}

// QMPContext is CheckQMP under p; ctx bounds asking QEMU for its property
// types, when a device_add needs them.
func (p Policy) QMPContext(ctx context.Context, command string, args map[string]any) error {
	if p.AllowHostAccess {
		return nil
	}
	return checkQMPCommand(command, args, p.CapturesDir, p.env(ctx))
}

// HMP is HMPContext without a deadline of the caller's.
func (p Policy) HMP(line string) error { return p.HMPContext(context.Background(), line) }

// HMPContext is CheckHMP under p.
func (p Policy) HMPContext(ctx context.Context, line string) error {
	if p.AllowHostAccess {
		return nil
	}
	return checkHMPLine(line, p.CapturesDir, p.env(ctx))
}

// ExtraArgs is ExtraArgsContext without a deadline of the caller's.
func (p Policy) ExtraArgs(args []string) error {
	return p.ExtraArgsContext(context.Background(), args)
}

// ExtraArgsContext is CheckExtraArgs under p, with the property types of
// p.Props: all the classes that -device and -global arguments name are
// asked about at once.
func (p Policy) ExtraArgsContext(ctx context.Context, args []string) error {
	if p.AllowHostAccess {
		return nil
	}
	return checkExtraArgs(args, p.env(ctx))
}

// ruleIndex maps each listed name to its rule and refuses duplicates, which
// would make the classification depend on order.
func ruleIndex(kind string, rules []Rule) map[string]*Rule {
	idx := make(map[string]*Rule)
	for i := range rules {
		r := &rules[i]
		for _, c := range r.Commands {
			if prev, ok := idx[c]; ok {
				panic(fmt.Sprintf("boundary: %s %q listed by rules %q and %q", kind, c, prev.Name, r.Name))
			}
			idx[c] = r
		}
	}
	return idx
}

var unlistedRule = Rule{
	Name:      RuleUnlisted,
	Rationale: "not on the allow-list; new and unknown commands and options are refused by default",
}

// WriteRules writes the three rule tables as Markdown, for the README.
func WriteRules(w io.Writer) error {
	var b strings.Builder
	section := func(title, what string, rules []Rule) {
		fmt.Fprintf(&b, "### %s\n\n| rule | verdict | %s | condition | rationale |\n|---|---|---|---|---|\n", title, what)
		for _, r := range rules {
			verdict := "refuse"
			if r.Allow {
				verdict = "allow"
			}
			names := make([]string, len(r.Commands))
			for i, c := range r.Commands {
				if what == "options" {
					c = "-" + c
				}
				names[i] = "`" + c + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.Name, verdict, strings.Join(names, " "),
				mdEscape(r.Condition), mdEscape(r.Rationale))
		}
		fmt.Fprintf(&b, "| `%s` | refuse | everything else | | %s |\n\n", RuleUnlisted, unlistedRule.Rationale)
	}
	section("QMP commands (qmp_command)", "commands", QMPRules)
	section("HMP commands (human-monitor-command)", "commands", HMPRules)
	section("QEMU options (qemu_boot extra_args)", "options", ExtraArgRules)
	_, err := io.WriteString(w, b.String())
	return err
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// Advice names the option argument, for a refused option.
func (e *RefusedError) Advice() advice.Advice {
	if e.Kind != KindOption {
		return advice.Advice{}
	}
	return advice.Advice{Action: advice.ExtraArgument, Keep: strings.TrimPrefix(e.Error(), KindOption)}
}
