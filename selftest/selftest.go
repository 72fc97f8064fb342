// Package selftest drives a qemu-mcp tool server through a real MCP client
// session (in-memory transports, the same handlers as stdio): boot the tiny
// kernel, echo, QMP, shutdown, and check that nothing was left behind.
package selftest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/settings"
	"github.com/qemu-mcp/qemu-mcp/tools"
)

// Run performs the self test, printing one line per step to w. It returns
// the first failure, with its reason.
func Run(ctx context.Context, w io.Writer, set settings.Settings, cfg tools.Config) (err error) {
	start := time.Now()
	// A private lock: the selftest must not depend on, or disturb, a
	// server holding the lock of the repository it happens to run in.
	lockDir, err := os.MkdirTemp("", "qemu-mcp-selftest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(lockDir)
	set.LockFile = filepath.Join(lockDir, "qemu.lock")
	guests, err := set.Manager()
	if err != nil {
		return err
	}
	cfg.Guests = guests
	srv, err := tools.New(cfg)
	if err == nil {
		err = srv.Ready()
	}
	if err != nil {
		return err
	}
	closed := false
	closeServer := func() error {
		if closed {
			return nil
		}
		closed = true
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return srv.Close(cctx)
	}
	defer func() {
		if cerr := closeServer(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.NewMCPServer().Connect(ctx, st, nil)
	if err != nil {
		return fmt.Errorf("server connect: %w", err)
	}
	defer ss.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "qemu-mcp-selftest", Version: cfg.Version}, nil)
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		return fmt.Errorf("client connect: %w", err)
	}
	defer cs.Close()

	step := func(name string, f func() (string, error)) error {
		t := time.Now()
		detail, err := f()
		ms := float64(time.Since(t).Microseconds()) / 1000
		if err != nil {
			fmt.Fprintf(w, "FAIL %-22s %8.1f ms  %v\n", name, ms, err)
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(w, "ok   %-22s %8.1f ms  %s\n", name, ms, detail)
		return nil
	}
	call := func(name string, args any, out any) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			return err
		}
		if res.IsError {
			return errors.New(toolText(res))
		}
		if out == nil {
			return nil
		}
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, out)
	}

	var boot struct {
		PID     int    `json:"pid"`
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
		Paths   struct {
			SerialIn, SerialOut, QMPSocket string
		} `json:"paths"`
	}
	var qemuID proc.Identity
	var others []proc.Identity // the other architectures' QEMUs
	steps := []struct {
		name string
		f    func() (string, error)
	}{
		{"list tools", func() (string, error) {
			res, err := cs.ListTools(ctx, nil)
			if err != nil {
				return "", err
			}
			have := map[string]bool{}
			for _, t := range res.Tools {
				have[t.Name] = true
			}
			for _, n := range []string{"qemu_boot", "serial_send", "serial_read", "qmp_command", "qemu_shutdown", "qemu_status"} {
				if !have[n] {
					return "", fmt.Errorf("tool %s missing", n)
				}
			}
			return strconv.Itoa(len(res.Tools)) + " tools", nil
		}},
		{"boot tiny kernel", func() (string, error) {
			if err := call("qemu_boot", map[string]any{"wait_for": `tiny> $`, "timeout": 30, "gdb": true}, &boot); err != nil {
				return "", err
			}
			if !boot.Matched {
				return "", fmt.Errorf("prompt not seen; output: %q", tail(boot.Output))
			}
			info, err := proc.Stat(boot.PID)
			if err != nil {
				return "", err
			}
			qemuID = proc.Identity{PID: info.PID, StartTime: info.StartTime}
			return "qemu pid " + strconv.Itoa(boot.PID) + ", " + firstLine(boot.Output, "qemu-mcp tiny kernel"), nil
		}},
		{"echo round trip", func() (string, error) {
			token := randomToken()
			var out struct {
				Matched bool   `json:"matched"`
				Output  string `json:"output"`
			}
			if err := call("serial_send", map[string]any{"data": "echo " + token, "wait_for": token + `\r?\n`, "timeout": 10}, &out); err != nil {
				return "", err
			}
			if !out.Matched {
				return "", fmt.Errorf("echo of %s not seen; output: %q", token, out.Output)
			}
			return "echoed " + token, nil
		}},
		{"debugger", func() (string, error) {
			if err := call("debug_break", map[string]any{"location": "cmd_echo"}, nil); err != nil {
				return "", err
			}
			if err := call("serial_send", map[string]any{"data": "echo stop"}, nil); err != nil {
				return "", err
			}
			var st struct {
				Stopped  bool   `json:"stopped"`
				Function string `json:"function"`
				PC       string `json:"pc"`
			}
			if err := call("debug_continue", map[string]any{"timeout": 10}, &st); err != nil {
				return "", err
			}
			if !st.Stopped || st.Function != "cmd_echo" {
				return "", fmt.Errorf("no stop at the breakpoint on cmd_echo: %+v", st)
			}
			if err := call("debug_break", map[string]any{"location": "cmd_echo", "remove": true}, nil); err != nil {
				return "", err
			}
			var run struct {
				Running bool `json:"running"`
			}
			if err := call("debug_continue", map[string]any{"timeout": 0.1}, &run); err != nil {
				return "", err
			}
			if !run.Running {
				return "", fmt.Errorf("the guest did not run on after the breakpoint was removed")
			}
			return "stopped at cmd_echo (" + st.PC + ") and resumed", nil
		}},
		{"qmp query-status", func() (string, error) {
			var out struct {
				Return struct {
					Running bool   `json:"running"`
					Status  string `json:"status"`
				} `json:"return"`
			}
			if err := call("qmp_command", map[string]any{"command": "query-status"}, &out); err != nil {
				return "", err
			}
			if !out.Return.Running {
				return "", fmt.Errorf("guest not running: status %q", out.Return.Status)
			}
			return "status " + out.Return.Status, nil
		}},
		{"other architectures", func() (string, error) {
			var info struct {
				Arches []struct {
					Name    string `json:"name"`
					Binary  string `json:"binary"`
					Found   bool   `json:"found"`
					Builtin bool   `json:"builtin_kernel"`
				} `json:"architectures"`
			}
			if err := call("server_info", nil, &info); err != nil {
				return "", err
			}
			var done []string
			for _, a := range info.Arches[1:] {
				if !a.Found || !a.Builtin {
					why := "no " + a.Binary
					if a.Found {
						why = "no built-in kernel"
					}
					done = append(done, a.Name+": skipped ("+why+")")
					continue
				}
				id, err := otherArch(call, a.Name)
				if err != nil {
					return "", fmt.Errorf("%s: %w", a.Name, err)
				}
				others = append(others, id)
				done = append(done, a.Name+": booted, echoed, shut down")
			}
			return strings.Join(done, "; "), nil
		}},
		{"shutdown", func() (string, error) {
			var out struct {
				How        string `json:"how"`
				ExitStatus int    `json:"exit_status"`
			}
			if err := call("qemu_shutdown", map[string]any{}, &out); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s, exit status %d", out.How, out.ExitStatus), nil
		}},
		{"close server", func() (string, error) {
			return "registry record removed", closeServer()
		}},
		{"nothing left behind", func() (string, error) {
			for _, id := range append([]proc.Identity{qemuID}, others...) {
				if live, _, _ := proc.Check(id); live == proc.Alive {
					return "", fmt.Errorf("qemu pid %d still running", id.PID)
				}
			}
			left, err := leftovers(set.RuntimeDir, os.Getpid())
			if err != nil {
				return "", err
			}
			if len(left) > 0 {
				return "", fmt.Errorf("left in %s: %s", set.RuntimeDir, strings.Join(left, ", "))
			}
			return "runtime dir " + set.RuntimeDir + " clean", nil
		}},
	}
	for _, s := range steps {
		if err := step(s.name, s.f); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "selftest passed in %.1f ms\n", float64(time.Since(start).Microseconds())/1000)
	return nil
}

// otherArch boots the built-in tiny kernel of architecture arch as a guest
// of its own, checks an echo round trip and shuts it down; id is its QEMU.
func otherArch(call func(name string, args, out any) error, arch string) (id proc.Identity, err error) {
	name := "selftest-" + arch
	var boot struct {
		PID     int    `json:"pid"`
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	if err := call("qemu_boot", map[string]any{"instance": name, "arch": arch, "wait_for": `tiny> $`, "timeout": 30}, &boot); err != nil {
		return id, err
	}
	if info, err := proc.Stat(boot.PID); err == nil {
		id = proc.Identity{PID: info.PID, StartTime: info.StartTime}
	}
	defer func() {
		if serr := call("qemu_shutdown", map[string]any{"instance": name}, nil); serr != nil && err == nil {
			err = serr
		}
	}()
	if !boot.Matched {
		return id, fmt.Errorf("prompt not seen; output: %q", tail(boot.Output))
	}
	token := randomToken()
	var out struct {
		Matched bool   `json:"matched"`
		Output  string `json:"output"`
	}
	if err := call("serial_send", map[string]any{"instance": name, "data": "echo " + token, "wait_for": token + `\r?\n`, "timeout": 10}, &out); err != nil {
		return id, err
	}
	if !out.Matched {
		return id, fmt.Errorf("echo of %s not seen; output: %q", token, out.Output)
	}
	return id, nil
}

// leftovers lists entries of dir that carry pid in their name.
func leftovers(dir string, pid int) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list runtime dir: %w", err)
	}
	mark := "-" + strconv.Itoa(pid) + "."
	var left []string
	for _, e := range ents {
		if strings.Contains(e.Name(), mark) {
			left = append(left, filepath.Join(dir, e.Name()))
		}
	}
	return left, nil
}

func toolText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func randomToken() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "st-" + hex.EncodeToString(b)
}

func firstLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			return strings.TrimSpace(l)
		}
	}
	return "banner not found"
}

func tail(s string) string {
	if len(s) > 400 {
		return "..." + s[len(s)-400:]
	}
	return s
}
