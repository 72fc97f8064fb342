package boundary

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeTypes is a PropertyTypes written by hand, shaped like QEMU 7.2's
// answers (see props_qemu_test.go for the real ones).
type fakeTypes struct {
	classes map[string]map[string][2]string // class -> prop -> type, description
	enums   map[string]bool
}

func (f *fakeTypes) Class(name string) bool { return f.classes[name] != nil }
func (f *fakeTypes) Type(class, prop string) (string, string, bool) {
	p, ok := f.classes[class][prop]
	return p[0], p[1], ok
}
func (f *fakeTypes) EnumValue(v string) bool { return f.enums[v] }

// fakeSource counts what it is asked.
type fakeSource struct {
	types *fakeTypes
	err   error
	calls [][]string
}

func (s *fakeSource) PropertyTypes(_ context.Context, classes ...string) (PropertyTypes, error) {
	s.calls = append(s.calls, classes)
	if s.err != nil {
		return nil, s.err
	}
	return s.types, nil
}

func newFakeTypes() *fakeTypes {
	virtio := map[string][2]string{"packed": {"bool", "on/off"}, "iommu_platform": {"bool", "on/off"}}
	with := func(m map[string][2]string, more map[string][2]string) map[string][2]string {
		out := map[string][2]string{}
		for k, v := range m {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}
	pci := map[string][2]string{"romfile": {"str", ""}, "addr": {"int32", "Slot and optional function number, example: 06.0 or 06"},
		"rombar": {"uint32", ""}, "multifunction": {"bool", "on/off"}, "failover_pair_id": {"str", ""}}
	return &fakeTypes{
		classes: map[string]map[string][2]string{
			"virtio-mmio":   {"force-legacy": {"bool", ""}, "ioeventfd": {"bool", "on/off"}},
			"virtio-device": virtio,
			"virtio-pci":    with(pci, map[string][2]string{"page-per-vq": {"bool", ""}}),
			"virtio-blk-device": with(virtio, map[string][2]string{"drive": {"str", "Node name or ID of a block device to use as a backend"},
				"queue-size": {"uint16", ""}, "serial": {"str", ""}, "iothread": {"link<iothread>", ""},
				"account-invalid": {"OnOffAuto", "on/off/auto"}, "werror": {"BlockdevOnError", "Error handling policy, report/ignore/enospc/stop/auto"},
				"logical_block_size": {"size", "A power of two between 512 B and 2 MiB"}, "stats-intervals": {"list", ""}}),
			"virtio-blk-pci":   with(pci, map[string][2]string{"disable-legacy": {"OnOffAuto", "on/off/auto"}, "drive": {"str", ""}, "vectors": {"uint32", ""}}),
			"virtio-rng-pci":   with(pci, map[string][2]string{"disable-legacy": {"OnOffAuto", "on/off/auto"}, "max-bytes": {"uint64", ""}, "vectors": {"uint32", ""}, "rng": {"link<rng-backend>", ""}}),
			"virtio-iommu-pci": with(pci, map[string][2]string{"disable-legacy": {"OnOffAuto", "on/off/auto"}, "granule": {"GranuleMode", "Granule page size (4k/8k/16k/64k/host)"}, "boot-bypass": {"bool", ""}}),
			"loader":           {"file": {"str", ""}, "addr": {"uint64", ""}, "data": {"uint64", ""}, "data-len": {"uint8", ""}},
			"vfio-user-pci":    with(pci, map[string][2]string{"socket": {"SocketAddress", "SocketAddress (UNIX sockets only)"}}),
			"cpu-core":         {"core-id": {"int", ""}, "nr-threads": {"int", ""}},
			"rv64-riscv-cpu":   {"pmp-granularity": {"", "pmp-granularity"}, "mvendorid": {"uint32", ""}, "x-misa-w": {"int8", ""}},
		},
		enums: set("on", "off", "auto", "report", "ignore", "enospc", "stop", "4k", "8k", "16k", "64k", "host", "split"),
	}
}

// The type rule: what -global, -device and device_add let pass when the
// binary's property types are known.
func TestPropertyTypesRule(t *testing.T) {
	src := &fakeSource{types: newFakeTypes()}
	p := Policy{Props: src}
	for _, tt := range []struct {
		args []string
		rule string
		says string // in the message
	}{
		// -global: the transport settings kernels need.
		{[]string{"-global", "virtio-mmio.force-legacy=false"}, "", ""},
		{[]string{"-global", "virtio-mmio.force-legacy=off"}, "", ""},
		{[]string{"-global=virtio-mmio.force-legacy=no"}, "", ""},
		{[]string{"-global", "driver=virtio-mmio,property=force-legacy,value=false"}, "", ""},
		{[]string{"-global", "property=force-legacy,value=on,driver=virtio-mmio,id=g"}, "", ""},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=on"}, "", ""},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=auto"}, "", ""},
		{[]string{"-global", "virtio-device.packed=on"}, "", ""},
		{[]string{"-global", "virtio-blk-device.queue-size=256"}, "", ""},
		{[]string{"-global", "virtio-blk-device.queue-size=0x100"}, "", ""},
		{[]string{"-global", "virtio-blk-device.logical_block_size=4K"}, "", ""},
		{[]string{"-global", "virtio-blk-device.logical_block_size=4096"}, "", ""},
		{[]string{"-global", "virtio-blk-device.werror=report"}, "", ""},
		{[]string{"-global", "virtio-blk-device.serial=abc"}, "", ""},
		{[]string{"-global", "virtio-iommu-pci.granule=64k"}, "", ""},
		{[]string{"-global", "rv64-riscv-cpu.x-misa-w=-1"}, "", ""},
		{[]string{"-global", "rv64-riscv-cpu.mvendorid=0x1234"}, "", ""},
		{[]string{"-global", "cpu-core.core-id=-3"}, "", ""},

		// -global: host-facing properties name their rule and type.
		{[]string{"-global", "loader.file=/etc/passwd"}, RuleHostFile, "property file of loader is a string (str) and may name a host file"},
		{[]string{"-global", "virtio-blk-pci.romfile=x"}, RuleHostFile, "property romfile of virtio-blk-pci is a string (str)"},
		{[]string{"-global", "virtio-pci.romfile=x"}, RuleHostFile, "romfile"},
		{[]string{"-global", "driver=loader,property=file,value=/etc/passwd"}, RuleHostFile, "file"},
		{[]string{"-global", "virtio-blk-device.drive=x"}, RuleBlockLayer, "drive"},
		{[]string{"-global", "virtio-blk-device.iothread=x"}, RuleHostBackend, "link<iothread>"},
		{[]string{"-global", "virtio-rng-pci.rng=r"}, RuleHostBackend, "rng"},
		// -global: other strings, links and unknown types.
		{[]string{"-global", "virtio-blk-pci.failover_pair_id=x"}, RuleGuestDevice, "is a string (str)"},
		{[]string{"-global", "vfio-user-pci.socket=/tmp/s"}, RuleGuestDevice, "of type SocketAddress"},
		{[]string{"-global", "virtio-blk-device.stats-intervals=1"}, RuleGuestDevice, "of type list"},
		{[]string{"-global", "rv64-riscv-cpu.pmp-granularity=4"}, RuleGuestDevice, "does not name"},
		// -global: values not of the type.
		{[]string{"-global", "virtio-blk-device.queue-size=abc"}, RuleGuestDevice, "queue-size of virtio-blk-device (uint16)"},
		{[]string{"-global", "virtio-blk-device.queue-size=70000"}, RuleGuestDevice, "out of the range"},
		{[]string{"-global", "virtio-blk-device.queue-size=-1"}, RuleGuestDevice, "not a decimal"},
		{[]string{"-global", "virtio-blk-device.queue-size="}, RuleGuestDevice, "not a decimal"},
		{[]string{"-global", "virtio-blk-device.queue-size=1_000"}, RuleGuestDevice, "not a decimal"},
		{[]string{"-global", "virtio-mmio.force-legacy=maybe"}, RuleGuestDevice, "not on, off"},
		{[]string{"-global", "virtio-mmio.force-legacy=false,driver=loader"}, RuleGuestDevice, "not on, off"},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=/etc/passwd"}, RuleGuestDevice, "not a value of any"},
		{[]string{"-global", "virtio-blk-pci.disable-legacy=report"}, RuleGuestDevice, "not one of auto, off, on"},
		{[]string{"-global", "virtio-blk-device.logical_block_size=/dev/sda"}, RuleGuestDevice, "not a size"},
		// -global: classes and properties QEMU does not have.
		{[]string{"-global", "no-such-device.x=1"}, RuleGuestDevice, `no device class "no-such-device"`},
		{[]string{"-global", "virtio-pci.disable-legacy=on"}, RuleGuestDevice, "name a class that has it"},
		{[]string{"-global", "virtio-mmio.realized=on"}, RuleGuestDevice, "QOM's own"},
		{[]string{"-global", "virtio-mmio.type=loader"}, RuleGuestDevice, "QOM's own"},
		// -global: syntax.
		{[]string{"-global", "virtio-mmio"}, RuleSyntax, ""},
		{[]string{"-global", "driver=virtio-mmio,property=force-legacy"}, RuleSyntax, ""},
		{[]string{"-global", "driver=virtio-mmio,property=force-legacy,value=on,file=/x"}, RuleSyntax, ""},
		{[]string{"-global"}, RuleSyntax, ""},

		// -device: guest models, with properties passing by type.
		{[]string{"-device", "virtio-rng-pci,disable-legacy=on,vectors=2"}, "", ""},
		{[]string{"-device", `{"driver":"virtio-rng-pci","disable-legacy":"auto","vectors":2,"max-bytes":1024}`}, "", ""},
		{[]string{"-device", "virtio-rng-pci,id=r,bus=pcie.0,addr=06.0,max-bytes=1024,period=1000"}, "", ""},
		{[]string{"-device", "virtio-iommu-pci,granule=4k,boot-bypass=off,addr=03.0"}, "", ""},
		{[]string{"-device", "virtio-rng-pci,disable-legacy=/etc/passwd"}, RuleGuestDevice, "not a value of any"},
		{[]string{"-device", "virtio-rng-pci,vectors=many"}, RuleGuestDevice, "vectors"},
		{[]string{"-device", "virtio-rng-pci,failover_pair_id=x"}, RuleGuestDevice, "failover_pair_id"},
		{[]string{"-device", "virtio-rng-pci,nosuch=1"}, RuleGuestDevice, "no property"},
		{[]string{"-device", "virtio-iommu-pci,romfile=/etc/passwd"}, RuleHostFile, "romfile of virtio-iommu-pci is a string (str)"},
		{[]string{"-device", "no-such-model"}, RuleGuestDevice, `no device model "no-such-model"`},
		// -device: host-facing properties first, then host-backed models.
		{[]string{"-device", "virtio-blk-device,drive=x,serial=abc"}, RuleBlockLayer, "property drive of virtio-blk-device is a string (str)"},
		{[]string{"-device", "virtio-blk-device,serial=abc"}, RuleBlockLayer, "device model"},
		{[]string{"-device", "virtio-blk-pci,queue-size=4"}, RuleBlockLayer, "device model"},
		{[]string{"-device", "loader,addr=0x80000000,data=1,data-len=4"}, RuleHostFile, "device model"},
		{[]string{"-device", "vfio-user-pci"}, RuleHostDevice, "device model"},
		{[]string{"-device", "virtio-rng-pci,rng=r"}, RuleHostBackend, "link<rng-backend>"},
		{[]string{"-device", "virtio-rng-pci,driver=loader,file=/etc/passwd"}, RuleHostFile, "file"},
	} {
		name := strings.Join(tt.args, " ")
		err := p.ExtraArgs(tt.args)
		wantRule(t, name, err, tt.rule)
		if err != nil && tt.says != "" && !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: message lacks %q: %v", name, tt.says, err)
		}
		if testing.Verbose() && err != nil {
			t.Log(err)
		}
	}

	// The same rule for QMP and HMP device_add.
	type A = map[string]any
	for _, tt := range []struct {
		args A
		rule string
	}{
		{A{"driver": "virtio-rng-pci", "disable-legacy": "on", "vectors": float64(2)}, ""},
		{A{"driver": "virtio-iommu-pci", "granule": "host", "id": "io"}, ""},
		{A{"driver": "virtio-rng-pci", "vectors": true}, RuleGuestDevice},
		{A{"driver": "virtio-rng-pci", "vectors": 2.5}, RuleGuestDevice},
		{A{"driver": "virtio-rng-pci", "disable-legacy": float64(1)}, RuleGuestDevice},
		{A{"driver": "virtio-rng-pci", "disable-legacy": nil}, RuleGuestDevice},
		{A{"driver": "virtio-rng-pci", "disable-legacy": "/etc/passwd"}, RuleGuestDevice},
		{A{"driver": "virtio-blk-device", "drive": "d", "serial": "abc"}, RuleBlockLayer},
		{A{"driver": "loader", "file": "/etc/passwd"}, RuleHostFile},
	} {
		err := p.QMP("device_add", tt.args)
		wantRule(t, describe(tt.args), err, tt.rule)
		hmp := "device_add " + tt.args["driver"].(string)
		for k, v := range tt.args {
			if k != "driver" {
				hmp += "," + k + "=" + strings.Trim(describe(v), `"`)
			}
		}
		if tt.args["vectors"] == 2.5 || tt.args["disable-legacy"] == nil || tt.args["vectors"] == true || tt.args["disable-legacy"] == float64(1) {
			continue // only JSON has these types
		}
		wantRule(t, hmp, p.HMP(hmp), tt.rule)
		wantRule(t, "qmp "+hmp, p.QMP("human-monitor-command", A{"command-line": hmp}), tt.rule)
	}
	wantRule(t, "hmp disable-legacy=/etc/passwd", p.HMP("device_add virtio-rng-pci,disable-legacy=/etc/passwd"), RuleGuestDevice)
	wantRule(t, "hmp force-legacy", p.HMP("device_add virtio-rng-pci,disable-legacy=on,nopacked"), RuleGuestDevice) // packed is not on virtio-rng-pci here
}

// One question for all the classes of an extra_args list; none for
// arguments that need none.
func TestPropertyTypesAskedOnce(t *testing.T) {
	src := &fakeSource{types: newFakeTypes()}
	p := Policy{Props: src}
	if err := p.ExtraArgs([]string{"-global", "virtio-mmio.force-legacy=false", "-device", "virtio-rng-pci,disable-legacy=on",
		"-global", "driver=virtio-blk-device,property=queue-size,value=128"}); err != nil {
		t.Fatal(err)
	}
	if len(src.calls) == 0 || strings.Join(src.calls[0], " ") != "virtio-blk-device virtio-mmio virtio-rng-pci" {
		t.Errorf("asked %q first", src.calls)
	}
	src.calls = nil
	if err := p.ExtraArgs([]string{"-device", "virtio-rng-device,id=r", "-smp", "2", "-device", "usb-tablet,bus=usb-bus.0,port=1"}); err != nil {
		t.Fatal(err)
	}
	if len(src.calls) != 0 {
		t.Errorf("asked %q for guest devices with allow-listed properties", src.calls)
	}
}

// Without the types (not probed, or the probe failed) -global is refused
// and -device takes the fixed lists, and the refusal says why.
func TestPropertyTypesUnknown(t *testing.T) {
	failing := &fakeSource{err: errors.New("QEMU exited (exit status 1): no machine")}
	for _, tc := range []struct {
		name   string
		policy Policy
		says   string
	}{
		{"not probed", Policy{}, "not probed"},
		{"probe failed", Policy{Props: failing}, "could not be probed (QEMU exited (exit status 1): no machine)"},
	} {
		for _, tt := range []struct {
			args []string
			rule string
		}{
			{[]string{"-global", "virtio-mmio.force-legacy=false"}, RuleGuestDevice},
			{[]string{"-global", "loader.file=/etc/passwd"}, RuleHostFile},
			{[]string{"-device", "virtio-rng-pci,disable-legacy=on"}, RuleGuestDevice},
			{[]string{"-device", "virtio-iommu-pci"}, RuleGuestDevice},
			{[]string{"-device", "virtio-rng-pci,max-bytes=1024"}, ""},
			{[]string{"-device", "virtio-blk-device,drive=x,serial=abc"}, RuleBlockLayer},
		} {
			name := tc.name + ": " + strings.Join(tt.args, " ")
			err := tc.policy.ExtraArgs(tt.args)
			wantRule(t, name, err, tt.rule)
			if tt.rule == RuleGuestDevice && err != nil && !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%s: the refusal does not say why the types are unknown: %v", name, err)
			}
		}
		wantRule(t, tc.name+": device_add", tc.policy.QMP("device_add", map[string]any{"driver": "virtio-rng-pci", "disable-legacy": "on"}), RuleGuestDevice)
	}
	// A failed probe is asked once per check.
	failing.calls = nil
	Policy{Props: failing}.ExtraArgs([]string{"-global", "virtio-mmio.force-legacy=false", "-global", "virtio-mmio.ioeventfd=on"})
	if len(failing.calls) != 1 {
		t.Errorf("a failing source was asked %d times in one check", len(failing.calls))
	}
	// --allow-host-access asks nothing.
	failing.calls = nil
	if err := (Policy{AllowHostAccess: true, Props: failing}).ExtraArgs([]string{"-global", "loader.file=/x"}); err != nil || len(failing.calls) != 0 {
		t.Errorf("AllowHostAccess: %v, %d questions", err, len(failing.calls))
	}
}

func TestParseGlobal(t *testing.T) {
	long := strings.Repeat("d", 64)
	for _, tt := range []struct {
		in                  string
		driver, prop, value string
		syntaxErr           bool
	}{
		{"virtio-mmio.force-legacy=false", "virtio-mmio", "force-legacy", "false", false},
		{"a.b=c,d=e", "a", "b", "c,d=e", false},
		{"a.b.c=d", "a", "b.c", "d", false},
		{"a.b,c=d", "a", "b,c", "d", false},
		{"a.b==", "a", "b", "=", false},
		{"driver=a,property=b,value=c", "a", "b", "c", false},
		{"driver=a,property=b,value=c,,d", "a", "b", "c,d", false},
		{"driver=a,driver=x,property=b,value=c", "x", "b", "c", false},
		{"value=c,property=b,driver=a", "a", "b", "c", false},
		// sscanf's widths: a longer driver is read as QemuOpts.
		{long + ".p=v", "", "", "", true},
		{"driver=" + long + ",property=p,value=v", long, "p", "v", false},
		{"d." + strings.Repeat("p", 63) + "=v", "d", strings.Repeat("p", 63), "v", false},
		{"d." + strings.Repeat("p", 64) + "=v", "", "", "", true},
		{".p=v", "", "", "", true},
		{"d.=v", "", "", "", true},
		{"d.p", "", "", "", true},
		{"", "", "", "", true},
	} {
		d, p, v, r := parseGlobal(tt.in)
		if (r != nil) != tt.syntaxErr || d != tt.driver || p != tt.prop || v != tt.value {
			t.Errorf("parseGlobal(%q) = %q, %q, %q, %v", tt.in, d, p, v, r)
		}
	}
}

// FuzzPropertyTypes: with the binary's types known, an allowed -global
// sets a property of a plain type (or an allow-listed string) of a known
// class, never a host-facing one, and an allowed -device names no
// host-facing property and no host-backed model.
func FuzzPropertyTypes(f *testing.F) {
	for _, s := range [][]string{
		{"-global", "virtio-mmio.force-legacy=false"},
		{"-global", "driver=virtio-mmio,property=force-legacy,value=on"},
		{"-global", "loader.file=/etc/passwd"},
		{"-global", "virtio-blk-device.queue-size=0x100"},
		{"-global", "virtio-blk-pci.disable-legacy=auto"},
		{"-device", "virtio-rng-pci,disable-legacy=on"},
		{"-device", `{"driver":"virtio-iommu-pci","granule":"4k"}`},
		{"-device", "virtio-blk-device,drive=x,serial=abc"},
	} {
		f.Add(strings.Join(s, "\x00"))
	}
	types := newFakeTypes()
	f.Fuzz(func(t *testing.T, in string) {
		var args []string
		if in != "" {
			args = strings.Split(in, "\x00")
		}
		err := Policy{Props: &fakeSource{types: types}}.ExtraArgs(args)
		checkRefusal(t, err)
		if err != nil {
			return
		}
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-global", "--global":
				d, p, _, r := parseGlobal(args[i+1])
				typ, _, ok := types.Type(d, p)
				if r != nil || !ok || hostDeviceProps[p] != "" || !(plainType(typ) || StringProperties[p]) {
					t.Fatalf("allowed -global %q: %s.%s of type %q", args[i+1], d, p, typ)
				}
			case "-device", "--device":
				props, _ := parseDevice(args[i+1])
				for _, p := range props {
					if hostDeviceProps[p.key] != "" {
						t.Fatalf("allowed -device %q with %s", args[i+1], p.key)
					}
					if d, ok := p.value.(string); ok && p.key == "driver" && hostDeviceRule(d) != RuleGuestDevice {
						t.Fatalf("allowed -device model %q", d)
					}
				}
			}
		}
	})
}
