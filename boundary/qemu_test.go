package boundary

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/qmp"
)

// These tests check the rule tables against a real qemu-system-riscv64 7.2.

func qemuPath(t *testing.T) string {
	t.Helper()
	return testguest.QEMU(t)
}

// startQEMU starts a paused riscv64 virt machine in dir and returns a
// connected monitor.
func startQEMU(t *testing.T, dir string) *qmp.Monitor {
	t.Helper()
	return startArchQEMU(t, riscv64.Arch, dir, "-bios", "none")
}

// startArchQEMU starts a paused virt machine of architecture a in dir,
// with args, and returns a connected monitor.
func startArchQEMU(t *testing.T, a arch.Arch, dir string, args ...string) *qmp.Monitor {
	t.Helper()
	// t.TempDir can be too long for sun_path.
	sockDir, err := os.MkdirTemp("", "bq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "q.sock")
	testguest.StartArchQEMU(t, a, dir, append([]string{"-M", strings.SplitN(a.QEMU().Machine, ",", 2)[0], "-S", "-display", "none", "-nodefaults",
		"-qmp", "unix:" + sock + ",server=on,wait=off"}, args...)...)
	m := qmp.New(sock)
	t.Cleanup(func() { m.Disconnect() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := m.ConnectContext(ctx); err != nil {
		t.Fatal(err)
	}
	if v := m.Greeting().Version.QEMU; v.Major != 7 || v.Minor != 2 {
		t.Logf("note: the rules were written for QEMU 7.2, this is %d.%d.%d", v.Major, v.Minor, v.Micro)
	}
	return m
}

func execute(t *testing.T, m *qmp.Monitor, command string, args any, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ret, err := m.Execute(ctx, command, args)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(ret, out); err != nil {
			t.Fatalf("%s: %v", command, err)
		}
	}
}

func hmpLine(t *testing.T, m *qmp.Monitor, line string) string {
	t.Helper()
	var out string
	execute(t, m, "human-monitor-command", map[string]any{"command-line": line}, &out)
	return out
}

// TestQEMUCommandsClassified: every QMP command QEMU offers is classified by
// a named rule (allow-list or explicit refusal), and every command the rules
// name exists, so a typo cannot leave a command to the default rule.
func TestQEMUCommandsClassified(t *testing.T) {
	m := startQEMU(t, t.TempDir())
	var cmds []struct{ Name string }
	execute(t, m, "query-commands", nil, &cmds)

	offered := make(map[string]bool)
	perRule := make(map[string][]string)
	allowed, refused := 0, 0
	for _, c := range cmds {
		offered[c.Name] = true
		r := ClassifyQMP(c.Name)
		if r.Name == RuleUnlisted {
			t.Errorf("QEMU command %q is not classified by any rule", c.Name)
			continue
		}
		perRule[r.Name] = append(perRule[r.Name], c.Name)
		if r.Allow {
			allowed++
		} else {
			refused++
		}
	}
	for _, r := range QMPRules {
		for _, c := range r.Commands {
			if !offered[c] && NotEverywhere[c] == "" {
				t.Errorf("rule %q lists %q, which this QEMU does not offer (and NotEverywhere does not name)", r.Name, c)
			}
		}
	}
	var summary strings.Builder
	for _, r := range QMPRules {
		verdict := "refuse"
		if r.Allow {
			verdict = "allow"
		}
		summary.WriteString("  " + verdict + " " + r.Name + ": " + itoa(len(perRule[r.Name])) + "\n")
	}
	t.Logf("QEMU offers %d QMP commands: %d allowed, %d refused by a named rule\n%s",
		len(cmds), allowed, refused, summary.String())
}

// TestQEMUSchemaArguments: no unconditionally allowed command takes an
// argument that names a host resource, and the captures-only commands take
// their file where checkQMP looks for it.
func TestQEMUSchemaArguments(t *testing.T) {
	m := startQEMU(t, t.TempDir())
	var schema []struct {
		Name     string `json:"name"`
		MetaType string `json:"meta-type"`
		ArgType  string `json:"arg-type"`
		Members  []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"members"`
		Variants []struct {
			Type string `json:"type"`
		} `json:"variants"`
	}
	execute(t, m, "query-qmp-schema", nil, &schema)
	types := make(map[string]int)
	for i, e := range schema {
		types[e.Name] = i
	}
	// members lists the member names of an object type, recursively.
	var members func(typ string, seen map[string]bool) []string
	members = func(typ string, seen map[string]bool) []string {
		i, ok := types[typ]
		if !ok || seen[typ] || schema[i].MetaType != "object" {
			return nil
		}
		seen[typ] = true
		var out []string
		for _, mem := range schema[i].Members {
			out = append(out, mem.Name)
			out = append(out, members(mem.Type, seen)...)
		}
		for _, v := range schema[i].Variants {
			out = append(out, members(v.Type, seen)...)
		}
		return out
	}
	hostish := map[string]bool{
		"filename": true, "file": true, "protocol": true, "uri": true, "fdname": true, "fdset-id": true,
		"socket": true, "chardev": true, "netdev": true, "mem-path": true, "dir": true, "host": true,
	}
	checked := 0
	for _, e := range schema {
		if e.MetaType != "command" {
			continue
		}
		r := ClassifyQMP(e.Name)
		if !r.Allow {
			continue
		}
		args := members(e.ArgType, map[string]bool{})
		switch {
		case r.Name == RuleCapturesOnly:
			want := captureArg[e.Name]
			if e.Name == "dump-guest-memory" {
				want = "protocol"
			}
			if !contains(args, want) {
				t.Errorf("%s: schema has no argument %q (has %v)", e.Name, want, args)
			}
		case e.Name == "device_add", e.Name == "human-monitor-command":
			// Checked by their own rules.
		default:
			for _, a := range args {
				if hostish[a] {
					t.Errorf("allowed command %s (rule %s) takes argument %q", e.Name, r.Name, a)
				}
			}
		}
		checked++
	}
	t.Logf("checked the arguments of %d allowed commands", checked)
}

// TestQEMUGuestDevices: every allowed model exists, and every property
// DeviceProperties allows on it is a plain value, not a link to a backend or
// a string that could be a host path.
func TestQEMUGuestDevices(t *testing.T) {
	m := startQEMU(t, t.TempDir())
	// A USB port path such as "1.2"; a PCI slot.function such as "01.0"
	// (a string since QEMU 9, an int32 before).
	stringOK := map[string]bool{"port": true, "addr": true}
	for _, driver := range slices.Sorted(maps.Keys(GuestDevices)) {
		var props []struct{ Name, Type string }
		execute(t, m, "device-list-properties", map[string]any{"typename": driver}, &props)
		for _, p := range props {
			if !DeviceProperties[p.Name] {
				if err := CheckExtraArgs([]string{"-device", driver + "," + p.Name + "=1"}); err == nil {
					t.Errorf("%s: property %s is not allow-listed but -device accepts it", driver, p.Name)
				}
				continue
			}
			if strings.HasPrefix(p.Type, "link<") || strings.HasPrefix(p.Type, "child<") ||
				(p.Type == "str" && !stringOK[p.Name]) {
				t.Errorf("%s: allowed property %s has type %s", driver, p.Name, p.Type)
			}
		}
	}
}

// TestQEMUOptionArity: the checker consumes a value exactly for the allowed
// options QEMU consumes one for; otherwise a value could be smuggled past it
// as an option or the other way round.
func TestQEMUOptionArity(t *testing.T) {
	bin := qemuPath(t)
	var wg sync.WaitGroup
	// A few QEMUs at a time: thirty at once on a busy machine outlast
	// the timeout, and a QEMU killed by it printed nothing.
	sem := make(chan struct{}, 4)
	for _, r := range ExtraArgRules {
		if !r.Allow {
			continue
		}
		for _, opt := range r.Commands {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				var out []byte
				if NotEverywhere["-"+opt] != "" {
					if out, _ = exec.CommandContext(ctx, bin, "-"+opt, "-version").CombinedOutput(); bytes.Contains(out, []byte("invalid option")) {
						return // not in this QEMU: it refuses the whole command line
					}
				}
				if flagOptions[opt] {
					// A flag leaves -version to be processed.
					out, _ = exec.CommandContext(ctx, bin, "-"+opt, "-version").CombinedOutput()
					if !bytes.Contains(out, []byte("QEMU emulator version")) {
						t.Errorf("-%s: checker treats it as a flag, but QEMU consumed the next argument:\n%s", opt, out)
					}
					return
				}
				out, _ = exec.CommandContext(ctx, bin, "-"+opt).CombinedOutput()
				if !bytes.Contains(out, []byte("requires an argument")) {
					t.Errorf("-%s: checker consumes a value, but QEMU does not require one:\n%s", opt, out)
				}
			})
		}
	}
	wg.Wait()
}

// TestQEMUHMPClassified: every HMP command and info subcommand QEMU lists is
// classified, and every command the HMP rules name exists.
func TestQEMUHMPClassified(t *testing.T) {
	m := startQEMU(t, t.TempDir())
	names := map[string]bool{}
	for _, line := range strings.Split(hmpLine(t, m, "help"), "\n") {
		if line == "" || line[0] == ' ' || line[0] == '\t' || line[0] == '[' {
			continue
		}
		field := strings.Fields(line)[0]
		for _, n := range strings.Split(field, "|") {
			names[n] = true
		}
	}
	allowed, refused := 0, 0
	for n := range names {
		r := ClassifyHMP(n)
		switch {
		case r.Name == RuleUnlisted:
			t.Errorf("HMP command %q is not classified", n)
		case r.Allow:
			allowed++
		default:
			refused++
		}
	}
	for _, r := range HMPRules {
		for _, c := range r.Commands {
			if !names[c] && c != "info" && NotEverywhere[c] == "" {
				t.Errorf("HMP rule %q lists %q, which this QEMU does not offer (and NotEverywhere does not name)", r.Name, c)
			}
		}
	}
	subs := 0
	listed := map[string]bool{}
	for _, line := range strings.Split(hmpLine(t, m, "info"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "info" {
			continue
		}
		subs++
		listed[f[1]] = true
		if !InfoSubcommands[f[1]] && f[1] != "usbhost" {
			t.Errorf("info %s is not classified", f[1])
		}
		if err := CheckHMP("info "+f[1], ""); (err == nil) != InfoSubcommands[f[1]] {
			t.Errorf("info %s: CheckHMP = %v", f[1], err)
		}
	}
	for sub := range InfoSubcommands {
		if !listed[sub] && NotEverywhere["info "+sub] == "" {
			t.Errorf("InfoSubcommands lists %q, which this QEMU does not offer (and NotEverywhere does not name)", sub)
		}
	}
	t.Logf("QEMU offers %d HMP command names: %d allowed, %d refused; %d info subcommands", len(names), allowed, refused, subs)
}

// TestQEMUCaptures runs the file-writing commands the boundary allows against
// QEMU, and shows why HMP memsave needs its strict grammar: QEMU reads
// "16 /2zz" as the size 16/2 followed by the relative file "zz".
func TestQEMUCaptures(t *testing.T) {
	cwd := t.TempDir()
	captures := t.TempDir()
	m := startQEMU(t, cwd)
	p := Policy{CapturesDir: captures}

	dtb := filepath.Join(captures, "virt.dtb")
	args := map[string]any{"filename": dtb}
	if err := p.QMP("dumpdtb", args); err != nil {
		t.Fatal(err)
	}
	execute(t, m, "dumpdtb", args, nil)

	line := `pmemsave 0x80000000 16 "` + filepath.Join(captures, "ram.bin") + `"`
	if err := p.HMP(line); err != nil {
		t.Fatal(err)
	}
	if out := hmpLine(t, m, line); out != "" {
		t.Fatalf("%s: %s", line, out)
	}
	for _, f := range []string{dtb, filepath.Join(captures, "ram.bin")} {
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}

	unquoted := "pmemsave 0x80000000 16 " + filepath.Join(captures, "unquoted.bin")
	if err := p.HMP(unquoted); err == nil {
		t.Errorf("%s allowed", unquoted)
	}
	if out := hmpLine(t, m, unquoted); !strings.Contains(out, "in expression") {
		t.Logf("QEMU now accepts %q: %s", unquoted, out)
	}
	quirk := "pmemsave 0x80000000 16 /2zz"
	if err := p.HMP(quirk); err == nil {
		t.Errorf("%s allowed", quirk)
	}
	hmpLine(t, m, quirk)
	if _, err := os.Stat(filepath.Join(cwd, "zz")); err != nil {
		t.Logf("QEMU no longer reads %q as a relative file: %v", quirk, err)
	} else {
		t.Logf("confirmed: QEMU wrote %q for %q", filepath.Join(cwd, "zz"), quirk)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
