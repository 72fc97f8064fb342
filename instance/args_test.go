package instance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/hostpath"
	"github.com/qemu-mcp/qemu-mcp/profile"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// FuzzMachineConfig turns arbitrary machine arguments (as a call or a
// profile gives them) into a QEMU configuration, without starting QEMU.
// Whatever the input, every host file QEMU gets must have been opened and
// checked and lie in the project or the server's images, and no argument
// may smuggle a QEMU suboption or a managed option past validation.
func FuzzMachineConfig(f *testing.F) {
	root := f.TempDir()
	for _, n := range []string{"k.bin", "disk,a.img", "fw.bin"} {
		if err := os.WriteFile(filepath.Join(root, n), []byte{0}, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	runtime := f.TempDir()
	policy := hostpath.Policy{WorkDir: root, Images: ImagesDir(runtime)}
	m := &Manager{cfg: Config{RuntimeDir: runtime, Platforms: map[string]Platform{"riscv64": {Kernel: []byte{1}}}, HostPolicy: policy}}
	scope, err := policy.Project(root)
	if err != nil {
		f.Fatal(err)
	}
	images := ImagesDir(runtime)
	for _, seed := range []string{
		`{}`,
		`{"kernel":"k.bin","memory":"256M","smp":2,"append":"console=ttyS0"}`,
		`{"kernel":"k.bin","drives":[{"path":"disk,a.img","readonly":true}]}`,
		`{"kernel":"k.bin","drives":[{"path":"disk,a.img,file=/etc/passwd"}]}`,
		`{"kernel":"../../../../etc/passwd"}`,
		`{"kernel":"k.bin","bios":"fw.bin"}`,
		`{"kernel":"k.bin","extra_args":["-serial","stdio"]}`,
		`{"kernel":"k.bin","extra_args":["--chardev=socket,id=x"]}`,
		`{"kernel":"k.bin","extra_args":["-device","virtio-rng-device"]}`,
		`{"kernel":"k.bin","memory":"1,share=on"}`,
		`{"bios":"none"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var mach profile.Profile
		if json.Unmarshal(data, &mach) != nil {
			return
		}
		cfg, err := m.machineConfig(Args{Machine: mach, scope: scope})
		if err != nil {
			return
		}
		defer qemu.CloseFiles(cfg.Files)
		var drives []string
		for _, d := range cfg.Drives {
			drives = append(drives, d.Path)
		}
		for _, p := range append([]string{cfg.Kernel}, drives...) {
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
			if got := strings.ReplaceAll(file, "\x00", ","); !slices.Contains(drives, got) {
				t.Fatalf("-drive %q names file %q, not one of %q", spec, got, drives)
			}
		}
	})
}
