package boundary

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzCaptures is a fixed captures directory so that the seed corpus can
// name paths inside it: $TMPDIR/qemu-mcp-fuzz-captures. It is created for
// the run and removed afterwards; should a concurrent run remove it early,
// the checks refuse more, which the targets accept.
func fuzzCaptures(f *testing.F) string {
	dir := filepath.Join(os.TempDir(), "qemu-mcp-fuzz-captures")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// checkRefusal fails unless err is nil or a well-formed refusal.
func checkRefusal(t *testing.T, err error) *RefusedError {
	t.Helper()
	if err == nil {
		return nil
	}
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("error is not a *RefusedError: %v", err)
	}
	if re.Rule == "" || re.Reason == "" || !errors.Is(err, ErrRefused) {
		t.Fatalf("malformed refusal: %#v", re)
	}
	return re
}

// insideCaptures is an independent, purely lexical check of what an allowed
// file must satisfy.
func insideCaptures(t *testing.T, path, captures string) {
	t.Helper()
	if !strings.HasPrefix(path, captures+"/") || strings.Contains("/"+path+"/", "/../") ||
		filepath.Clean(path) == captures {
		t.Fatalf("allowed a file outside %s: %q", captures, path)
	}
}

// FuzzCheckQMP: no command name and argument object makes CheckQMP panic;
// the verdict is deterministic and well-formed; an allowed command is on an
// allow rule; and an allowed file-writing command writes inside captures.
func FuzzCheckQMP(f *testing.F) {
	captures := fuzzCaptures(f)
	seeds := []struct{ cmd, args string }{
		{"query-status", `{}`},
		{"migrate", `{"uri":"exec:cat /etc/passwd"}`},
		{"screendump", `{"filename":"` + captures + `/shot.ppm"}`},
		{"screendump", `{"filename":"` + captures + `/../x"}`},
		{"dump-guest-memory", `{"paging":false,"protocol":"file:` + captures + `/core"}`},
		{"dump-guest-memory", `{"paging":false,"protocol":"fd:x"}`},
		{"device_add", `{"driver":"virtio-rng-device","id":"r"}`},
		{"device_add", `{"driver":"loader","file":"/etc/passwd"}`},
		{"human-monitor-command", `{"command-line":"info registers"}`},
		{"human-monitor-command", `{"command-line":"pmemsave 0 16 \"` + captures + `/m\""}`},
		{"human-monitor-command", `{"command-line":"device_add usb-kbd,nopcap"}`},
		{"qom-set", `{"path":"/machine","property":"x","value":1}`},
		{"", `null`},
	}
	for _, s := range seeds {
		f.Add(s.cmd, []byte(s.args))
	}
	f.Fuzz(func(t *testing.T, command string, rawArgs []byte) {
		var args map[string]any
		if json.Unmarshal(rawArgs, &args) != nil {
			args = nil
		}
		err := CheckQMP(command, args, captures)
		if again := CheckQMP(command, args, captures); (again == nil) != (err == nil) ||
			(err != nil && again.Error() != err.Error()) {
			t.Fatalf("not deterministic: %v then %v", err, again)
		}
		checkRefusal(t, err)
		if err := (Policy{AllowHostAccess: true}).QMP(command, args); err != nil {
			t.Fatalf("AllowHostAccess refused: %v", err)
		}
		if err != nil {
			return
		}
		r := ClassifyQMP(command)
		if !r.Allow {
			t.Fatalf("allowed %q, classified by refuse rule %q", command, r.Name)
		}
		switch command {
		case "screendump", "memsave", "pmemsave", "dumpdtb":
			insideCaptures(t, args["filename"].(string), captures)
		case "dump-guest-memory":
			insideCaptures(t, strings.TrimPrefix(args["protocol"].(string), "file:"), captures)
		case "device_add":
			if _, ok := GuestDevices[args["driver"].(string)]; !ok {
				t.Fatalf("allowed device %v", args["driver"])
			}
			for k := range args {
				if k != "driver" && !DeviceProperties[k] {
					t.Fatalf("allowed device property %q", k)
				}
			}
		case "human-monitor-command":
			if err := CheckHMP(args["command-line"].(string), captures); err != nil {
				t.Fatalf("CheckQMP allowed a line CheckHMP refuses: %v", err)
			}
		}
	})
}

// FuzzCheckHMP: no line makes CheckHMP panic, and an allowed line starts
// with an allowed command.
func FuzzCheckHMP(f *testing.F) {
	captures := fuzzCaptures(f)
	for _, s := range []string{
		"info registers", "x/10x 0x80000000", "migrate exec:id", "screendump " + captures + "/a.ppm",
		`screendump "` + captures + `/a b.ppm"`, `memsave 0 16 "` + captures + `/m"`, "memsave 0 16 /2zz",
		"dump-guest-memory -p " + captures + "/core 0 4096", "device_add virtio-rng-device,driver=loader",
		"info usbhost", "\tc", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		err := CheckHMP(line, captures)
		checkRefusal(t, err)
		if err != nil {
			return
		}
		name, _ := hmpCommandName(line)
		if r := ClassifyHMP(name); !r.Allow {
			t.Fatalf("allowed %q, whose command %q is classified %q", line, name, r.Name)
		}
	})
}

// FuzzCheckExtraArgs: no argument list makes CheckExtraArgs panic, and an
// allowed list is closed: it consumed all its values, so an option appended
// after it is parsed as an option, and two allowed lists concatenate to an
// allowed list. The input is split into arguments at NUL bytes, which
// command-line arguments cannot contain.
func FuzzCheckExtraArgs(f *testing.F) {
	for _, s := range [][]string{
		{"-device", "virtio-rng-device"},
		{"-cpu", "rv64", "-smp", "2", "-no-reboot", "-append", "x"},
		{"-machine", "virt,dumpdtb=/tmp/x"},
		{"-device", `{"driver":"loader","file":"/etc/passwd"}`},
		{"-device", "virtio-rng-device,driver=loader"},
		{"-append", "-drive"},
		{"--drive=file=/x"},
		{"disk.img"},
		{"-icount", "shift=1,rrfile=/x"},
		{"-fw_cfg", "opt/x,,file=/x,string=y"},
	} {
		f.Add(strings.Join(s, "\x00"))
	}
	f.Fuzz(func(t *testing.T, in string) {
		var args []string
		if in != "" {
			args = strings.Split(in, "\x00")
		}
		err := CheckExtraArgs(args)
		checkRefusal(t, err)
		if err := (Policy{AllowHostAccess: true}).ExtraArgs(args); err != nil {
			t.Fatalf("AllowHostAccess refused: %v", err)
		}
		if err != nil {
			return
		}
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			t.Fatalf("allowed a bare first argument: %q", args)
		}
		var re *RefusedError
		if err := CheckExtraArgs(append(args[:len(args):len(args)], "-gdb", "tcp::1234")); !errors.As(err, &re) || re.Rule != RuleHostChardev {
			t.Fatalf("%q followed by -gdb: %v", args, err)
		}
		if err := CheckExtraArgs(append(args[:len(args):len(args)], args...)); err != nil {
			t.Fatalf("%q is allowed but twice is not: %v", args, err)
		}
		for i, a := range args {
			if a == "-device" || a == "--device" {
				if i+1 < len(args) && !strings.HasPrefix(args[i+1], "{") {
					for _, p := range parseOpts(args[i+1], "driver") {
						if p.key == "driver" {
							if _, ok := GuestDevices[p.value.(string)]; !ok {
								t.Fatalf("allowed -device driver %q in %q", p.value, args)
							}
						}
					}
				}
			}
		}
	})
}
