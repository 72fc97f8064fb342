package tools

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// FuzzBootArguments decodes arbitrary qemu_boot arguments the way a call
// does, up to the command line, without starting QEMU. Whatever the input,
// decoding must not panic, every path must end up absolute under its root
// or as given, and no argument may smuggle a QEMU suboption or a managed
// option past validation.
func FuzzBootArguments(f *testing.F) {
	root := f.TempDir()
	for _, n := range []string{"k.bin", "disk,a.img", "fw.bin"} {
		if err := os.WriteFile(filepath.Join(root, n), []byte{0}, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	s := &Server{cfg: Config{RuntimeDir: f.TempDir(), BuiltinKernel: []byte{1}, WorkDir: root}}
	scope, err := s.hostPolicy().Project(root)
	if err != nil {
		f.Fatal(err)
	}
	images := filepath.Join(s.cfg.RuntimeDir, "images")
	for _, seed := range []string{
		`{}`,
		`{"kernel":"k.bin","memory":"256M","smp":2,"append":"console=ttyS0"}`,
		`{"kernel":"k.bin","drives":[{"path":"disk,a.img","readonly":true}]}`,
		`{"kernel":"k.bin","drives":[{"path":"disk,a.img,file=/etc/passwd"}]}`,
		`{"kernel":"../../../../etc/passwd"}`,
		`{"kernel":"k.bin","bios":"fw.bin","wait_for":"tiny> $","timeout":0.5}`,
		`{"kernel":"k.bin","extra_args":["-serial","stdio"]}`,
		`{"kernel":"k.bin","extra_args":["--chardev=socket,id=x"]}`,
		`{"kernel":"k.bin","extra_args":["-device","virtio-rng-device"]}`,
		`{"kernel":"k.bin","timeout":-1}`,
		`{"kernel":"k.bin","timeout":1e308}`,
		`{"kernel":"k.bin","wait_for":"(unclosed"}`,
		`{"kernel":"k.bin","wait_for":["a","(b"],"idle_ms":-1}`,
		`{"kernel":"k.bin","wait_for":[1,2],"panic_patterns":["("]}`,
		`{"kernel":"k.bin","wait_for":{"x":1}}`,
		`{"kernel":"k.bin","memory":"1,share=on"}`,
		`{"bios":"none"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in BootInput
		if json.Unmarshal(data, &in) != nil {
			return
		}
		if _, err := s.plan(nil, in.WaitOptions, in.Timeout, time.Minute, defaultMaxBytes, nil); err != nil && !strings.Contains(err.Error(), "wait_for") &&
			!strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "idle_ms") && !strings.Contains(err.Error(), "panic_patterns") {
			t.Fatalf("plan error %q does not name the argument", err)
		}
		if d, err := seconds("timeout", in.Timeout, time.Minute); err == nil && (d <= 0 || d > 24*time.Hour) {
			t.Fatalf("seconds(%v) = %v without error", in.Timeout, d)
		}
		cfg, err := s.bootConfig(scope, in)
		if err != nil {
			return
		}
		defer qemu.CloseFiles(cfg.Files)
		// Every host file QEMU gets was opened and checked, and lies in
		// the project or the server's images.
		for _, p := range append([]string{cfg.Kernel}, drivePaths(cfg)...) {
			if _, ok := cfg.Files[p]; !ok {
				t.Fatalf("path %q is not one of the checked files", p)
			}
			if !strings.HasPrefix(p, root+"/") && !strings.HasPrefix(p, images+"/") {
				t.Fatalf("path %q is outside the project %s", p, root)
			}
		}
		if cfg.Memory != "" && strings.ContainsAny(cfg.Memory, ", =") {
			t.Fatalf("memory %q passed validation", cfg.Memory)
		}
		argv := cfg.Argv("/r/serial-1", 3)
		for i, a := range argv {
			if a != "-drive" || i+1 >= len(argv) {
				continue
			}
			// Unescaping ",," must give back exactly one file= option that
			// names the drive's path: a comma in a path cannot add options.
			spec := argv[i+1]
			file := strings.TrimPrefix(strings.SplitN(strings.ReplaceAll(spec, ",,", "\x00"), ",", 2)[0], "file=")
			if got := strings.ReplaceAll(file, "\x00", ","); !contains(drivePaths(cfg), got) {
				t.Fatalf("-drive %q names file %q, not one of %q", spec, got, drivePaths(cfg))
			}
		}
		if math.IsNaN(in.Timeout) {
			t.Fatal("NaN timeout decoded")
		}
	})
}

func drivePaths(c qemu.Config) []string {
	var ps []string
	for _, d := range c.Drives {
		ps = append(ps, d.Path)
	}
	return ps
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
