package boundary

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// capturesFixture builds a captures directory with the traps a path check
// must not fall into, next to a directory standing for the rest of the host.
type capturesFixture struct {
	captures string // the real captures directory
	link     string // a symlink to it, as a configured captures path may be
	outside  string // a host directory outside it
}

func newCaptures(t *testing.T) capturesFixture {
	t.Helper()
	root := t.TempDir()
	f := capturesFixture{
		captures: filepath.Join(root, "captures"),
		link:     filepath.Join(root, "caplink"),
		outside:  filepath.Join(root, "outside"),
	}
	for _, d := range []string{f.captures, f.outside, filepath.Join(f.captures, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(f.outside, "secret")
	must(t, os.WriteFile(secret, []byte("host secret"), 0o600))
	must(t, os.WriteFile(filepath.Join(f.captures, "old.ppm"), nil, 0o600))
	must(t, os.Symlink(f.captures, f.link))
	must(t, os.Symlink(f.outside, filepath.Join(f.captures, "escape")))
	must(t, os.Symlink(secret, filepath.Join(f.captures, "link.ppm")))
	must(t, os.Link(secret, filepath.Join(f.captures, "hard.ppm")))
	must(t, syscall.Mkfifo(filepath.Join(f.captures, "fifo"), 0o600))
	return f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantRule checks that err is nil (rule == "") or a refusal by rule.
func wantRule(t *testing.T, what string, err error, rule string) {
	t.Helper()
	if rule == "" {
		if err != nil {
			t.Errorf("%s: refused, want allowed: %v", what, err)
		}
		return
	}
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Errorf("%s: err = %v, want refusal by rule %q", what, err, rule)
		return
	}
	if re.Rule != rule {
		t.Errorf("%s: refused by rule %q, want %q: %v", what, re.Rule, rule, err)
	}
	if !errors.Is(err, ErrRefused) {
		t.Errorf("%s: errors.Is(err, ErrRefused) = false", what)
	}
	hint := "; start qemu-mcp with --allow-host-access to allow it"
	if re.fixed() {
		hint = "; the server manages it, so no flag allows it"
	}
	if msg := err.Error(); !strings.HasSuffix(msg, hint) ||
		!strings.Contains(msg, `refused by rule "`+rule+`"`) {
		t.Errorf("%s: message does not name the rule and how to allow it: %s", what, msg)
	}
}

func TestCheckQMP(t *testing.T) {
	f := newCaptures(t)
	in := func(name string) string { return filepath.Join(f.captures, name) }
	hmp := func(line string) map[string]any { return map[string]any{"command-line": line} }
	type A = map[string]any
	tests := []struct {
		name    string
		command string
		args    map[string]any
		rule    string // "" means allowed
	}{
		// Harmless commands.
		{"query-status", "query-status", nil, ""},
		{"query-cpus-fast", "query-cpus-fast", nil, ""},
		{"qom-list", "qom-list", A{"path": "/machine"}, ""},
		{"stop", "stop", nil, ""},
		{"cont", "cont", nil, ""},
		{"system_reset", "system_reset", nil, ""},
		{"quit", "quit", nil, ""},
		{"send-key", "send-key", A{"keys": []any{A{"type": "qcode", "data": "a"}}}, ""},
		{"input-send-event", "input-send-event", A{"events": []any{A{"type": "btn", "data": A{"down": true, "button": "left"}}}}, ""},
		{"hmp info registers", "human-monitor-command", hmp("info registers"), ""},
		{"hmp x/10x", "human-monitor-command", hmp("x/10x 0x80000000"), ""},
		{"hmp print $pc", "human-monitor-command", hmp("p $pc"), ""},
		{"hmp sendkey", "human-monitor-command", hmp("sendkey ctrl-alt-delete"), ""},

		// Host URIs and migration.
		{"migrate exec:", "migrate", A{"uri": "exec:cat /etc/passwd"}, RuleHostURI},
		{"migrate file:", "migrate", A{"uri": "file:/tmp/guest.img"}, RuleHostURI},
		{"migrate tcp:", "migrate", A{"uri": "tcp:127.0.0.1:4444"}, RuleHostURI},
		{"migrate-incoming", "migrate-incoming", A{"uri": "unix:/tmp/s"}, RuleHostURI},
		{"migrate-set-parameters", "migrate-set-parameters", A{"tls-creds": "x"}, RuleMigration},
		{"nbd-server-start", "nbd-server-start", A{"addr": A{"type": "inet"}}, RuleHostURI},
		{"hmp migrate exec:", "human-monitor-command", hmp(`migrate "exec:sh -c id"`), RuleHostURI},
		{"hmp migrate_set_parameter", "human-monitor-command", hmp("migrate_set_parameter max-bandwidth 1"), RuleMigration},

		// Block layer, snapshots, fds, chardevs, network, objects.
		{"hmp drive_add", "human-monitor-command", hmp("drive_add 0 file=/etc/passwd,if=none"), RuleBlockLayer},
		{"blockdev-add file", "blockdev-add", A{"driver": "file", "node-name": "n", "filename": "/etc/passwd"}, RuleBlockLayer},
		{"drive-mirror", "drive-mirror", A{"device": "d", "target": "/tmp/x", "sync": "full"}, RuleBlockLayer},
		{"snapshot-save", "snapshot-save", A{"job-id": "j", "tag": "t", "vmstate": "d", "devices": []any{"d"}}, RuleSnapshot},
		{"hmp savevm", "human-monitor-command", hmp("savevm snap"), RuleSnapshot},
		{"hmp loadvm", "human-monitor-command", hmp("loadvm snap"), RuleSnapshot},
		{"getfd", "getfd", A{"fdname": "x"}, RuleFDPassing},
		{"add-fd", "add-fd", A{"fdset-id": 1}, RuleFDPassing},
		{"closefd", "closefd", A{"fdname": "x"}, RuleFDPassing},
		{"chardev-add file", "chardev-add", A{"id": "c", "backend": A{"type": "file", "data": A{"out": "/tmp/x"}}}, RuleHostChardev},
		{"chardev-add socket", "chardev-add", A{"id": "c", "backend": A{"type": "socket", "data": A{"addr": A{"type": "unix", "data": A{"path": "/tmp/s"}}}}}, RuleHostChardev},
		{"chardev-remove", "chardev-remove", A{"id": "serial0"}, RuleHostChardev},
		{"hmp chardev-add", "human-monitor-command", hmp("chardev-add socket,id=c,path=/tmp/s,server=on"), RuleHostChardev},
		{"netdev_add tap", "netdev_add", A{"type": "tap", "id": "n", "ifname": "tap0"}, RuleHostNetwork},
		{"netdev_add user", "netdev_add", A{"type": "user", "id": "n", "hostfwd": "tcp::2222-:22"}, RuleHostNetwork},
		{"hmp netdev_add user", "human-monitor-command", hmp("netdev_add user,id=n,smb=/"), RuleHostNetwork},
		{"hmp hostfwd_add", "human-monitor-command", hmp("hostfwd_add tcp::2222-:22"), RuleHostNetwork},
		{"object-add memory-backend-file", "object-add", A{"qom-type": "memory-backend-file", "id": "m", "mem-path": "/etc/passwd", "size": 4096}, RuleHostBackend},
		{"hmp object_add", "human-monitor-command", hmp("object_add memory-backend-file,id=m,mem-path=/etc/passwd,size=4096"), RuleHostBackend},
		{"qom-set", "qom-set", A{"path": "/machine", "property": "dumpdtb", "value": "/tmp/x"}, RuleQOMSet},
		{"hmp qom-set", "human-monitor-command", hmp("qom-set /machine dumpdtb /tmp/x"), RuleQOMSet},
		{"trace-event-set-state", "trace-event-set-state", A{"name": "*", "enable": true}, RuleHostLog},
		{"hmp logfile", "human-monitor-command", hmp("logfile /tmp/qemu.log"), RuleHostLog},
		{"hmp log", "human-monitor-command", hmp("log in_asm"), RuleHostLog},
		{"hmp gdbserver", "human-monitor-command", hmp("gdbserver"), RuleHostChardev},
		{"hmp gpa2hva", "human-monitor-command", hmp("gpa2hva 0x80000000"), RuleHostInfo},
		{"hmp info usbhost", "human-monitor-command", hmp("info usbhost"), RuleHostInfo},
		{"hmp commit", "human-monitor-command", hmp("commit all"), RuleBlockLayer},
		{"hmp qemu-io", "human-monitor-command", hmp(`qemu-io drive0 "write 0 512"`), RuleBlockLayer},
		{"set_password", "set_password", A{"protocol": "vnc", "password": "x"}, RuleHostDisplay},
		{"qmp_capabilities", "qmp_capabilities", nil, RuleServerManaged},
		{"unknown command", "x-brand-new-command", nil, RuleUnlisted},
		{"case matters", "QUERY-STATUS", nil, RuleUnlisted},
		{"hmp unknown", "human-monitor-command", hmp("frobnicate"), RuleUnlisted},
		{"hmp without command-line", "human-monitor-command", nil, RuleHMP},
		{"hmp command-line not a string", "human-monitor-command", A{"command-line": 1}, RuleHMP},

		// Files: only inside the captures directory.
		{"screendump inside", "screendump", A{"filename": in("shot.ppm")}, ""},
		{"screendump subdir", "screendump", A{"filename": in("sub/shot.png"), "format": "png"}, ""},
		{"screendump overwrite", "screendump", A{"filename": in("old.ppm")}, RuleCapturesOnly},
		{"screendump via another path to captures", "screendump", A{"filename": filepath.Join(f.link, "shot.ppm")}, RuleCapturesOnly},
		{"screendump outside", "screendump", A{"filename": filepath.Join(f.outside, "x.ppm")}, RuleCapturesOnly},
		{"screendump /etc", "screendump", A{"filename": "/etc/passwd"}, RuleCapturesOnly},
		{"screendump dotdot", "screendump", A{"filename": f.captures + "/../outside/x.ppm"}, RuleCapturesOnly},
		{"screendump dotdot inside", "screendump", A{"filename": f.captures + "/sub/../x.ppm"}, RuleCapturesOnly},
		{"screendump relative", "screendump", A{"filename": "x.ppm"}, RuleCapturesOnly},
		{"screendump dir symlink escape", "screendump", A{"filename": in("escape/x.ppm")}, RuleCapturesOnly},
		{"screendump file symlink", "screendump", A{"filename": in("link.ppm")}, RuleCapturesOnly},
		{"screendump hard link", "screendump", A{"filename": in("hard.ppm")}, RuleCapturesOnly},
		{"screendump fifo", "screendump", A{"filename": in("fifo")}, RuleCapturesOnly},
		{"screendump captures dir itself", "screendump", A{"filename": f.captures}, RuleCapturesOnly},
		{"screendump missing dir", "screendump", A{"filename": in("nodir/x.ppm")}, RuleCapturesOnly},
		{"screendump prefix sibling", "screendump", A{"filename": f.captures + "-evil/x.ppm"}, RuleCapturesOnly},
		{"screendump fdset", "screendump", A{"filename": "/dev/fdset/1"}, RuleCapturesOnly},
		{"screendump no filename", "screendump", nil, RuleCapturesOnly},
		{"screendump filename not string", "screendump", A{"filename": 7}, RuleCapturesOnly},
		{"screendump NUL", "screendump", A{"filename": in("x\x00.ppm")}, RuleCapturesOnly},
		{"memsave inside", "memsave", A{"val": 0, "size": 16, "filename": in("mem.bin")}, ""},
		{"memsave outside", "memsave", A{"val": 0, "size": 16, "filename": "/tmp/mem.bin"}, RuleCapturesOnly},
		{"pmemsave inside", "pmemsave", A{"val": 0x80000000, "size": 16, "filename": in("pmem.bin")}, ""},
		{"pmemsave outside", "pmemsave", A{"val": 0x80000000, "size": 16, "filename": filepath.Join(f.outside, "p")}, RuleCapturesOnly},
		{"dumpdtb inside", "dumpdtb", A{"filename": in("virt.dtb")}, ""},
		{"dumpdtb outside", "dumpdtb", A{"filename": "/tmp/virt.dtb"}, RuleCapturesOnly},
		{"dump-guest-memory inside", "dump-guest-memory", A{"paging": false, "protocol": "file:" + in("core")}, ""},
		{"dump-guest-memory outside", "dump-guest-memory", A{"paging": false, "protocol": "file:/tmp/core"}, RuleCapturesOnly},
		{"dump-guest-memory dotdot", "dump-guest-memory", A{"paging": false, "protocol": "file:" + f.captures + "/sub/../core"}, RuleCapturesOnly},
		{"dump-guest-memory fd:", "dump-guest-memory", A{"paging": false, "protocol": "fd:x"}, RuleFDPassing},
		{"dump-guest-memory bare path", "dump-guest-memory", A{"paging": false, "protocol": in("core")}, RuleCapturesOnly},
		{"dump-guest-memory no protocol", "dump-guest-memory", A{"paging": false}, RuleCapturesOnly},
		{"hmp screendump inside", "human-monitor-command", hmp("screendump " + in("a.ppm")), ""},
		{"hmp screendump quoted", "human-monitor-command", hmp(`screendump "` + in("a b.ppm") + `" -f png`), ""},
		{"hmp screendump outside", "human-monitor-command", hmp("screendump /tmp/a.ppm"), RuleCapturesOnly},
		{"hmp screendump escape", "human-monitor-command", hmp("screendump " + in("escape/a.ppm")), RuleCapturesOnly},
		{"hmp screendump too long", "human-monitor-command", hmp("screendump " + in(strings.Repeat("a", 1100))), RuleSyntax},
		{"hmp pmemsave inside", "human-monitor-command", hmp(`pmemsave 0x80000000 16 "` + in("p.bin") + `"`), ""},
		{"hmp memsave inside", "human-monitor-command", hmp(`memsave $pc 0x10 "` + in("p.bin") + `"  `), ""},
		{"hmp pmemsave outside", "human-monitor-command", hmp(`pmemsave 0x80000000 16 "/tmp/p.bin"`), RuleCapturesOnly},
		{"hmp pmemsave unquoted", "human-monitor-command", hmp("pmemsave 0x80000000 16 " + in("p.bin")), RuleSyntax},
		{"hmp memsave expression", "human-monitor-command", hmp(`memsave 0 16 + 4 "` + in("p.bin") + `"`), RuleSyntax},
		{"hmp memsave char constant", "human-monitor-command", hmp(`memsave ' ' 16 "` + in("p.bin") + `"`), RuleSyntax},
		{"hmp memsave trailing", "human-monitor-command", hmp(`memsave 0 16 "` + in("p.bin") + `" x`), RuleSyntax},
		{"hmp memsave division", "human-monitor-command", hmp("memsave 0 16 /2zz"), RuleSyntax},
		{"hmp dump-guest-memory inside", "human-monitor-command", hmp("dump-guest-memory -p " + in("core")), ""},
		{"hmp dump-guest-memory range", "human-monitor-command", hmp("dump-guest-memory -z " + in("core") + " 0x80000000 4096"), ""},
		{"hmp dump-guest-memory outside", "human-monitor-command", hmp("dump-guest-memory /tmp/core"), RuleCapturesOnly},
		{"hmp dump-guest-memory glued flag", "human-monitor-command", hmp("dump-guest-memory -pcore"), RuleCapturesOnly},
		{"hmp dumpdtb outside", "human-monitor-command", hmp("dumpdtb /tmp/x.dtb"), RuleCapturesOnly},
		{"no captures dir", "screendump", A{"filename": "/x.ppm"}, RuleCapturesOnly},

		// Devices.
		{"device_add keyboard", "device_add", A{"driver": "virtio-keyboard-device", "id": "kbd"}, ""},
		{"device_add rng", "device_add", A{"driver": "virtio-rng-device"}, ""},
		{"device_add usb-tablet", "device_add", A{"driver": "usb-tablet", "bus": "usb-bus.0", "port": "1"}, ""},
		{"device_add loader", "device_add", A{"driver": "loader", "file": "/etc/passwd", "addr": 0x80000000}, RuleHostFile},
		{"device_add rng backend", "device_add", A{"driver": "virtio-rng-pci", "rng": "r0"}, RuleHostBackend},
		{"device_add pcap", "device_add", A{"driver": "usb-kbd", "pcap": "/tmp/usb.pcap"}, RuleHostFile},
		{"device_add romfile", "device_add", A{"driver": "edu", "romfile": "/etc/passwd"}, RuleHostFile},
		{"device_add 9p", "device_add", A{"driver": "virtio-9p-device", "fsdev": "f", "mount_tag": "h"}, RuleHostFile},
		{"device_add usb-host", "device_add", A{"driver": "usb-host", "hostbus": 1, "hostaddr": 2}, RuleHostDevice},
		{"device_add evdev", "device_add", A{"driver": "virtio-input-host-pci", "evdev": "/dev/input/event0"}, RuleHostDevice},
		{"device_add vhost-vsock", "device_add", A{"driver": "vhost-vsock-device", "guest-cid": 3}, RuleHostDevice},
		{"device_add nic", "device_add", A{"driver": "virtio-net-device", "netdev": "n"}, RuleHostNetwork},
		{"device_add blk", "device_add", A{"driver": "virtio-blk-device", "drive": "d"}, RuleBlockLayer},
		{"device_add unknown", "device_add", A{"driver": "brand-new-device"}, RuleGuestDevice},
		{"device_add no driver", "device_add", A{"id": "x"}, RuleGuestDevice},
		{"device_add driver not string", "device_add", A{"driver": 3}, RuleGuestDevice},
		{"device_add nested value", "device_add", A{"driver": "edu", "addr": A{"x": 1}}, RuleGuestDevice},
		{"hmp device_add", "human-monitor-command", hmp("device_add virtio-tablet-device,id=t"), ""},
		{"hmp device_add loader", "human-monitor-command", hmp("device_add loader,file=/etc/passwd"), RuleHostFile},
		{"hmp device_add second driver", "human-monitor-command", hmp("device_add virtio-rng-device,driver=loader,file=/etc/passwd"), RuleHostFile},
		{"hmp device_add no-flag", "human-monitor-command", hmp("device_add usb-kbd,nopcap"), RuleHostFile},
		{"hmp device_add trailing", "human-monitor-command", hmp("device_add edu x"), RuleSyntax},
		{"hmp NUL", "human-monitor-command", hmp("info registers\x00; migrate exec:id"), RuleSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := f.captures
			if tt.name == "no captures dir" {
				dir = ""
			}
			err := CheckQMP(tt.command, tt.args, dir)
			wantRule(t, tt.name, err, tt.rule)
			if err != nil {
				t.Log(err)
			}
			// Policy is CheckQMP, unless host access is allowed.
			perr := Policy{CapturesDir: dir}.QMP(tt.command, tt.args)
			if (perr == nil) != (err == nil) {
				t.Errorf("Policy.QMP = %v, CheckQMP = %v", perr, err)
			}
			if err := (Policy{AllowHostAccess: true}).QMP(tt.command, tt.args); err != nil {
				t.Errorf("AllowHostAccess: %v", err)
			}
		})
	}
}

func TestSymlinkedCapturesDir(t *testing.T) {
	f := newCaptures(t)
	for _, tt := range []struct {
		path string
		rule string
	}{
		{filepath.Join(f.link, "a.ppm"), ""},
		{filepath.Join(f.captures, "a.ppm"), ""},
		{filepath.Join(f.link, "sub", "a.ppm"), ""},
		{filepath.Join(f.link, "escape", "a.ppm"), RuleCapturesOnly},
		{f.link + "/../outside/a.ppm", RuleCapturesOnly},
		{f.link + "/sub/../a.ppm", RuleCapturesOnly},
		{f.link + "//sub/./a.ppm", ""},
		{filepath.Join(f.outside, "a.ppm"), RuleCapturesOnly},
	} {
		err := CheckQMP("screendump", map[string]any{"filename": tt.path}, f.link)
		wantRule(t, tt.path, err, tt.rule)
	}
	// A captures directory that does not exist allows nothing.
	err := CheckQMP("screendump", map[string]any{"filename": "/nonexistent/a.ppm"}, "/nonexistent")
	wantRule(t, "missing captures dir", err, RuleCapturesOnly)
}

func TestErrorMessage(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string // prefix
	}{
		{CheckQMP("migrate", map[string]any{"uri": "exec:id"}, ""),
			`qmp migrate refused by rule "host-uri": migration sends guest state to, or loads it from, a host URI`},
		{CheckQMP("human-monitor-command", map[string]any{"command-line": "migrate exec:id"}, ""),
			`qmp human-monitor-command: hmp migrate refused by rule "host-uri": `},
		{CheckExtraArgs([]string{"-gdb", "tcp::1234"}),
			`option -gdb refused by rule "host-chardev": `},
	} {
		if tt.err == nil || !strings.HasPrefix(tt.err.Error(), tt.want) {
			t.Errorf("got %v\nwant prefix %s", tt.err, tt.want)
		}
	}
}

func TestCheckHMP(t *testing.T) {
	f := newCaptures(t)
	for _, tt := range []struct {
		line string
		rule string
	}{
		{"info registers", ""},
		{"  info   registers -a", ""},
		{"info", ""},
		{"info mtree -f", ""},
		{"info trace-events", ""},
		{"info nonsense", RuleUnlisted},
		{"info usbhost", RuleHostInfo},
		{"stop", ""},
		{"s", ""},
		{"c", ""},
		{"cont", ""},
		{"system_reset", ""},
		{"x/4i $pc", ""},
		{"xp /8x 0x80000000", ""},
		{"print 1+2", ""},
		{"help info", ""},
		{"qom-get /machine type", ""},
		{"sendkey a", ""},
		{"mouse_move 1 2", ""},
		{"migrate -d tcp:1.2.3.4:5", RuleHostURI},
		{"migrate_incoming unix:/tmp/s", RuleHostURI},
		{"nbd_server_start 0.0.0.0:10809", RuleHostURI},
		{"drive_add 0 if=none,file=/etc/shadow", RuleBlockLayer},
		{"drive_mirror drive0 /tmp/copy", RuleBlockLayer},
		{"change drive0 /etc/passwd", RuleBlockLayer},
		{`pmemsave 0 16 "/tmp/x"`, RuleCapturesOnly},
		{`memsave 0 16 "/tmp/x"`, RuleCapturesOnly},
		{"memsave 0 16 /tmp/x", RuleSyntax},
		{"memsave 0 16", RuleSyntax},
		{`memsave 0 16 "`, RuleSyntax},
		{"memsave 0 16 /1captures/x", RuleSyntax},
		{"dump-guest-memory /tmp/x", RuleCapturesOnly},
		{"dump-guest-memory", RuleSyntax},
		{"screendump", RuleSyntax},
		{`screendump "unterminated`, RuleSyntax},
		{`screendump "bad\escape"`, RuleSyntax},
		{"screendump /etc/x", RuleCapturesOnly},
		{"chardev-add file,id=f,path=/tmp/f", RuleHostChardev},
		{"netdev_add tap,id=n", RuleHostNetwork},
		{"object_add rng-random,id=r,filename=/dev/mem", RuleHostBackend},
		{"device_add virtio-rng-pci,rng=r", RuleHostBackend},
		{"device_add {\"driver\":\"edu\"}", RuleGuestDevice},
		{"device_add", ""},
		{"wavcapture /tmp/x.wav snd0", RuleHostFile},
		{"getfd fd0", RuleFDPassing},
		{"gdbserver tcp::1234", RuleHostChardev},
		{"gpa2hpa 0", RuleHostInfo},
		{"trace-event * on", RuleHostLog},
		{"replay_seek 100", RuleRecordReplay},
		{"delvm x", RuleSnapshot},
		{"", RuleUnlisted},
		{"   ", RuleUnlisted},
		{"/x", RuleUnlisted},
		{"quit|q", RuleUnlisted},
		{"INFO registers", RuleUnlisted},
	} {
		wantRule(t, tt.line, CheckHMP(tt.line, f.captures), tt.rule)
	}
	if err := (Policy{AllowHostAccess: true}).HMP("migrate exec:id"); err != nil {
		t.Errorf("AllowHostAccess: %v", err)
	}
}

func TestCheckExtraArgs(t *testing.T) {
	for _, tt := range []struct {
		args []string
		rule string
	}{
		// Harmless.
		{nil, ""},
		{[]string{"-device", "virtio-rng-device"}, ""},
		{[]string{"-device", "virtio-rng-pci,id=rng0,max-bytes=1024,period=1000"}, ""},
		{[]string{"-device", `{"driver":"virtio-rng-device","id":"rng0","max-bytes":1024}`}, ""},
		{[]string{"-device", "usb-tablet,bus=usb-bus.0"}, ""},
		{[]string{"-cpu", "rv64"}, ""},
		{[]string{"-cpu", "rv64,v=true,vlen=256"}, ""},
		{[]string{"-smp", "2"}, ""},
		{[]string{"-smp", "cpus=4,sockets=2,cores=2"}, ""},
		{[]string{"-m", "256M"}, ""},
		{[]string{"-no-reboot"}, ""},
		{[]string{"--no-reboot", "-no-shutdown", "-S"}, ""},
		{[]string{"-append", "x"}, ""},
		{[]string{"-append", "-drive file=/etc/passwd"}, ""},
		{[]string{"-machine", "virt,aclint=on,aia=aplic-imsic"}, ""},
		{[]string{"-M", "spike"}, ""},
		{[]string{"-machine", "accel=tcg"}, ""},
		{[]string{"-accel", "tcg,thread=single"}, ""},
		{[]string{"-icount", "shift=auto,sleep=off"}, ""},
		{[]string{"-icount", "7"}, ""},
		{[]string{"-rtc", "base=utc,clock=vm"}, ""},
		{[]string{"-name", "guest1,debug-threads=on"}, ""},
		{[]string{"-d", "in_asm,int,guest_errors"}, ""},
		{[]string{"-display", "none", "-vga", "none", "-nic", "none", "-net", "none"}, ""},
		{[]string{"-fw_cfg", "name=opt/x,string=hello"}, ""},
		{[]string{"-sandbox", "on,spawn=deny"}, ""},
		{[]string{"-numa", "node,nodeid=0,cpus=0-1"}, ""},
		{[]string{"-usbdevice", "tablet"}, ""},
		{[]string{"-smp=2"}, ""}, // QEMU itself rejects the = spelling

		// Refused classes.
		{[]string{"/etc/passwd"}, RuleBlockLayer},
		{[]string{"-no-reboot", "disk.img"}, RuleBlockLayer},
		// QEMU opens a bare argument as drive none0, which a device can then expose.
		{[]string{"/etc/shadow", "-device", "virtio-blk-device,drive=none0"}, RuleBlockLayer},
		{[]string{""}, RuleBlockLayer},
		{[]string{"-"}, RuleBlockLayer},
		{[]string{"-drive", "file=/etc/passwd,format=raw"}, RuleBlockLayer},
		{[]string{"--drive", "file=x"}, RuleBlockLayer},
		{[]string{"-drive=file=x"}, RuleBlockLayer},
		{[]string{"-blockdev", "driver=file,filename=/x,node-name=n"}, RuleBlockLayer},
		{[]string{"-hda", "/x"}, RuleBlockLayer},
		{[]string{"-pflash", "/x"}, RuleBlockLayer},
		{[]string{"-mtdblock", "/x"}, RuleBlockLayer},
		{[]string{"-sd", "/x"}, RuleBlockLayer},
		{[]string{"-snapshot"}, RuleBlockLayer},
		{[]string{"-netdev", "user,id=n,hostfwd=tcp::2222-:22"}, RuleHostNetwork},
		{[]string{"-netdev", "tap,id=n"}, RuleHostNetwork},
		{[]string{"-nic", "user,tftp=/"}, RuleHostNetwork},
		{[]string{"-net", "user"}, RuleHostNetwork},
		{[]string{"-object", "memory-backend-file,id=m,mem-path=/etc/passwd,size=4K"}, RuleHostBackend},
		{[]string{"-fsdev", "local,id=f,path=/,security_model=none"}, RuleHostFile},
		{[]string{"-virtfs", "local,path=/,mount_tag=h,security_model=none"}, RuleHostFile},
		{[]string{"-add-fd", "fd=3,set=1"}, RuleFDPassing},
		{[]string{"-plugin", "/tmp/evil.so"}, RuleHostCode},
		{[]string{"-D", "/tmp/log"}, RuleHostLog},
		{[]string{"-trace", "enable=*,file=/tmp/t"}, RuleHostLog},
		{[]string{"-d", "trace:qmp*"}, RuleHostLog},
		{[]string{"-incoming", "exec:sh -c id"}, RuleHostURI},
		{[]string{"-loadvm", "snap"}, RuleSnapshot},
		{[]string{"-kernel", "/x"}, RuleHostFile},
		{[]string{"-initrd", "/x"}, RuleHostFile},
		{[]string{"-dtb", "/x"}, RuleHostFile},
		{[]string{"-bios", "/x"}, RuleHostFile},
		{[]string{"-L", "/"}, RuleHostFile},
		{[]string{"-mem-path", "/dev/shm"}, RuleHostFile},
		{[]string{"-fw_cfg", "name=opt/x,file=/etc/passwd"}, RuleHostFile},
		{[]string{"-fw_cfg", "opt/x,file=/etc/passwd"}, RuleHostFile},
		{[]string{"-monitor", "stdio"}, RuleServerManaged},
		{[]string{"-qmp", "tcp::4444,server=on"}, RuleServerManaged},
		{[]string{"-serial", "stdio"}, RuleServerManaged},
		{[]string{"-chardev", "stdio,id=c"}, RuleServerManaged},
		{[]string{"-daemonize"}, RuleServerManaged},
		{[]string{"-gdb", "tcp::1234"}, RuleHostChardev},
		{[]string{"-s"}, RuleHostChardev},
		{[]string{"-parallel", "file:/tmp/x"}, RuleHostChardev},
		{[]string{"-vnc", ":0"}, RuleHostDisplay},
		{[]string{"-spice", "port=5900"}, RuleHostDisplay},
		{[]string{"-display", "gtk"}, RuleHostDisplay},
		{[]string{"-display", "none,gl=on"}, RuleHostDisplay},
		{[]string{"-nographic"}, RuleHostDisplay},
		{[]string{"-audiodev", "pa,id=a"}, RuleHostDevice},
		{[]string{"-usbdevice", "host:1234:5678"}, RuleHostDevice},
		{[]string{"-enable-kvm"}, RuleHostDevice},
		{[]string{"-accel", "kvm"}, RuleHostDevice},
		{[]string{"-machine", "virt,accel=kvm:tcg"}, RuleHostDevice},
		{[]string{"-runas", "nobody"}, RuleHostProcess},
		{[]string{"-chroot", "/"}, RuleHostProcess},
		{[]string{"-name", "x,process=sshd"}, RuleHostProcess},
		{[]string{"-semihosting"}, RuleSemihosting},
		{[]string{"-semihosting-config", "enable=on,target=native"}, RuleSemihosting},
		{[]string{"-global", "loader.file=/etc/passwd"}, RuleHostFile},
		{[]string{"-global", "pci-device.romfile=/etc/passwd"}, RuleHostFile},
		{[]string{"-global", "driver=loader,property=file,value=/etc/passwd"}, RuleHostFile},
		// Without the QEMU binary's property types (Policy.Props) -global
		// passes nothing.
		{[]string{"-global", "virtio-mmio.force-legacy=false"}, RuleGuestDevice},
		{[]string{"-global", "virtio-mmio"}, RuleSyntax},
		{[]string{"-writeconfig", "/tmp/q.cfg"}, RuleIndirectConfig},
		{[]string{"-set", "drive.drive0.file=/etc/shadow"}, RuleIndirectConfig},
		{[]string{"-readconfig", "/tmp/q.cfg"}, RuleIndirectConfig},
		{[]string{"-machine", "virt,dumpdtb=/tmp/x.dtb"}, RuleHostFile},
		{[]string{"-machine", "virt,dtb=/tmp/x.dtb"}, RuleHostFile},
		{[]string{"-machine", "kernel=/x"}, RuleHostFile},
		{[]string{"-machine", "virt,boot.splash=/x"}, RuleHostFile},
		{[]string{"-M", "virt,memory-backend=m"}, RuleHostBackend},
		{[]string{"-machine", "malta"}, RuleGuestConfig},
		{[]string{"-machine", "virt,,dumpdtb=/x"}, RuleGuestConfig},
		{[]string{"-icount", "shift=1,rr=record,rrfile=/tmp/replay"}, RuleRecordReplay},
		{[]string{"-boot", "menu=on,splash=/x.bmp"}, RuleHostFile},
		{[]string{"-numa", "node,memdev=m"}, RuleHostBackend},
		{[]string{"-device", "loader,file=/etc/passwd,addr=0x80000000"}, RuleHostFile},
		{[]string{"-device=loader,file=/etc/passwd"}, RuleHostFile},
		{[]string{"-device", "virtio-rng-device,driver=loader"}, RuleHostFile},
		{[]string{"-device", "driver=loader"}, RuleHostFile},
		{[]string{"-device", "virtio-rng-pci,rng=r"}, RuleHostBackend},
		{[]string{"-device", "virtio-net-device,netdev=n"}, RuleHostNetwork},
		{[]string{"-device", "virtio-blk-device,drive=d"}, RuleBlockLayer},
		{[]string{"-device", "usb-kbd,pcap=/tmp/k.pcap"}, RuleHostFile},
		{[]string{"-device", "edu,romfile=/etc/passwd"}, RuleHostFile},
		{[]string{"-device", `{"driver":"loader","file":"/etc/passwd"}`}, RuleHostFile},
		{[]string{"-device", `{"driver":"virtio-rng-device","driver":"loader"}`}, RuleSyntax},
		{[]string{"-device", `{"driver":"edu","romfile":{"x":1}}`}, RuleSyntax},
		{[]string{"-device", `{"driver":"edu"} {}`}, RuleSyntax},
		{[]string{"-device", `{'driver':'edu'}`}, RuleSyntax},
		{[]string{"-device", "virtio-rng-device,help"}, RuleGuestDevice},
		{[]string{"-vga", "qxl"}, RuleGuestDevice},
		{[]string{"-append"}, RuleSyntax},
		{[]string{"-no-reboot=1"}, RuleSyntax},
		{[]string{"-frobnicate"}, RuleUnlisted},
		{[]string{"---drive", "x"}, RuleUnlisted},
		{[]string{"-k", "de"}, RuleHostFile},
	} {
		name := strings.Join(tt.args, " ")
		err := CheckExtraArgs(tt.args)
		wantRule(t, name, err, tt.rule)
		if (Policy{}.ExtraArgs(tt.args) == nil) != (err == nil) {
			t.Errorf("%s: Policy.ExtraArgs disagrees with CheckExtraArgs", name)
		}
		if err := (Policy{AllowHostAccess: true}).ExtraArgs(tt.args); err != nil {
			t.Errorf("%s: AllowHostAccess: %v", name, err)
		}
	}
}

func TestParseOpts(t *testing.T) {
	for _, tt := range []struct {
		in, implied string
		want        []kv
	}{
		{"virtio-rng-device", "driver", []kv{{"driver", "virtio-rng-device"}}},
		{"a,b=1,noc,d", "driver", []kv{{"driver", "a"}, {"b", "1"}, {"c", "off"}, {"d", "on"}}},
		{"a,,b,c=x,,y", "driver", []kv{{"driver", "a,b"}, {"c", "x,y"}}},
		{"k=v,", "driver", []kv{{"k", "v"}}},
		{",x", "driver", []kv{{"driver", ""}, {"x", "on"}}},
		{",,x", "driver", []kv{{"driver", ",x"}}},
		{"x=1,,,y=2", "", []kv{{"x", "1,"}, {"y", "2"}}},
		{"=v", "", []kv{{"", "v"}}},
		{"on", "", []kv{{"on", "on"}}},
		{"", "driver", nil},
	} {
		if got := parseOpts(tt.in, tt.implied); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseOpts(%q, %q) = %v, want %v", tt.in, tt.implied, got, tt.want)
		}
	}
}

func TestHMPString(t *testing.T) {
	for _, tt := range []struct {
		in, arg, rest string
		ok            bool
	}{
		{"  /a/b c", "/a/b", " c", true},
		{`"a b" c`, "a b", " c", true},
		{`"a\"b\\c\n"`, "a\"b\\c\n", "", true},
		{`"a`, "", "", false},
		{`"a\x"`, "", "", false},
		{"", "", "", false},
		{"\t\v", "", "", false},
	} {
		arg, rest, ok := hmpString(tt.in)
		if arg != tt.arg || rest != tt.rest || ok != tt.ok {
			t.Errorf("hmpString(%q) = %q, %q, %v; want %q, %q, %v", tt.in, arg, rest, ok, tt.arg, tt.rest, tt.ok)
		}
	}
}

func TestRules(t *testing.T) {
	names := map[string]bool{
		RuleReadOnly: true, RuleVMLifecycle: true, RulePreconfig: true, RuleGuestInput: true,
		RuleGuestDevice: true, RuleGuestDebug: true, RuleVCPUTuning: true, RuleMemoryChardev: true,
		RuleCapturesOnly: true, RuleHMP: true, RuleGuestConfig: true, RuleNoneOnly: true, RuleHardening: true,
		RuleHostURI: true, RuleMigration: true, RuleHostFile: true, RuleBlockLayer: true, RuleSnapshot: true,
		RuleRecordReplay: true, RuleFDPassing: true, RuleHostChardev: true, RuleHostNetwork: true,
		RuleHostBackend: true, RuleHostDevice: true, RuleHostDisplay: true, RuleHostLog: true,
		RuleHostInfo: true, RuleHostCode: true, RuleHostProcess: true, RuleSemihosting: true,
		RuleIndirectConfig: true, RuleQOMSet: true, RuleServerManaged: true, RuleOtherMachines: true,
	}
	for kind, rules := range map[string][]Rule{"qmp": QMPRules, "hmp": HMPRules, "options": ExtraArgRules} {
		seen := map[string]bool{}
		for _, r := range rules {
			if !names[r.Name] {
				t.Errorf("%s: rule %q is not an exported Rule* name", kind, r.Name)
			}
			if seen[r.Name] {
				t.Errorf("%s: rule %q appears twice", kind, r.Name)
			}
			seen[r.Name] = true
			if r.Rationale == "" || len(r.Commands) == 0 {
				t.Errorf("%s: rule %q lacks commands or rationale", kind, r.Name)
			}
			if !r.Allow && r.Condition != "" {
				t.Errorf("%s: refuse rule %q has a condition", kind, r.Name)
			}
		}
	}
	// Every allowed option is value-checked or a flag.
	for _, r := range ExtraArgRules {
		if !r.Allow {
			continue
		}
		for _, o := range r.Commands {
			if flagOptions[o] {
				continue
			}
			if rr := checkOption(o, "\x01probe", nil); rr != nil && rr.rule == RuleUnlisted {
				t.Errorf("allowed option -%s has no value check", o)
			}
		}
	}
	if got := ClassifyQMP("query-status"); got.Name != RuleReadOnly || !got.Allow {
		t.Errorf("ClassifyQMP(query-status) = %+v", got)
	}
	if got := ClassifyQMP("nope"); got.Name != RuleUnlisted || got.Allow {
		t.Errorf("ClassifyQMP(nope) = %+v", got)
	}
	if got := ClassifyHMP("c"); got.Name != RuleVMLifecycle {
		t.Errorf("ClassifyHMP(c) = %+v", got)
	}
	if got := ClassifyOption("gdb"); got.Name != RuleHostChardev {
		t.Errorf("ClassifyOption(gdb) = %+v", got)
	}

	var b strings.Builder
	if err := WriteRules(&b); err != nil {
		t.Fatal(err)
	}
	for name := range names {
		if !strings.Contains(b.String(), "`"+name+"`") {
			t.Errorf("WriteRules output lacks rule %s", name)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + b.String())
	}
}
