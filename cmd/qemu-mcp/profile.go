package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/internal/shellwords"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu/caps"
	"github.com/qemu-mcp/qemu-mcp/qemuline"
)

// profileCmd is `qemu-mcp profile`: a profile of .qemu-mcp.json from the
// QEMU command a project runs, so that its next boot is a boot with no
// arguments.
func profileCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("qemu-mcp profile", stderr, fmt.Sprintf("usage: qemu-mcp profile [flags] [--] QEMU-COMMAND...\n       make -n qemu | qemu-mcp profile [flags] -\n\n"+
		"Writes a profile of %s from the QEMU command the project runs: what the server keeps, replaces\n"+
		"and refuses of it is printed, and nothing is written while anything is refused.\n", profile.FileName))
	var (
		name      = fs.String("name", "default", "the profile's name")
		dir       = fs.String("dir", ".", "the project root, where .qemu-mcp.json is written (the line's paths are relative to it)")
		prompt    = fs.String("prompt", "", "regex of the guest's prompt, the default wait of a boot")
		panics    = fs.String("panic", "", "regex of the kernel's panic line, beside the server's defaults")
		replace   = fs.Bool("replace", false, "replace a profile of that name")
		allowHost = fs.Bool("allow-host-access", false, "pass on options the host-access boundary refuses (as the server's flag of that name)")
		qemuBin   = fs.String("qemu", "", "the qemu-system-riscv64 the server runs (default: from PATH), whose device properties decide what -global and -device may set")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var words []string
	switch rest := fs.Args(); {
	case len(rest) == 1 && rest[0] == "-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "qemu-mcp profile: read the command: %v\n", err)
			return 1
		}
		if words, err = shellwords.Split(string(b)); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp profile: the command: %v\n", err)
			return 1
		}
	case len(rest) == 1:
		var err error
		if words, err = shellwords.Split(rest[0]); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp profile: the command: %v\n", err)
			return 1
		}
	case len(rest) > 1:
		words = rest
	}
	if len(words) == 0 {
		fs.Usage()
		return 2
	}
	policy := boundary.Policy{AllowHostAccess: *allowHost}
	if !*allowHost {
		policy.Props = caps.NewPropProber(caps.PropsConfig{Binary: *qemuBin, CacheDir: caps.DefaultCacheDir(),
			Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}
	p, rep := qemuline.Parse(words, policy.ExtraArgs)
	fmt.Fprint(stdout, rep.Text())
	for _, f := range rep.Files() {
		path := f.Path
		if !strings.HasPrefix(path, "/") {
			path = *dir + "/" + path
		}
		if _, err := os.Stat(path); err != nil {
			fmt.Fprintf(stderr, "qemu-mcp profile: note: %s (%s) is not there yet: build it before the boot\n", f.Path, f.Option)
		}
	}
	if len(rep.Refused) > 0 {
		fmt.Fprintf(stderr, "qemu-mcp profile: %d option(s) refused: nothing was written\n", len(rep.Refused))
		return 1
	}
	p.Description = "from: " + shellwords.Join(words)
	p.Prompt = *prompt
	if *panics != "" {
		p.PanicPatterns = []string{*panics}
	}
	path, err := profile.Put(*dir, *name, p, *replace)
	if err != nil {
		fmt.Fprintf(stderr, "qemu-mcp profile: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote profile %q to %s\n", *name, path)
	return 0
}
