package names_test

import (
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

func TestClassify(t *testing.T) {
	o := names.Owner{PID: 12, StartTime: 345}
	for name, want := range map[string]names.Entry{
		"serial-12-345-default.in":   {Owner: o, Kind: names.SerialIn, Instance: "default"},
		"serial-12-345-a_b-c.out":    {Owner: o, Kind: names.SerialOut, Instance: "a_b-c"},
		"qmp-12-345-x.sock":          {Owner: o, Kind: names.QMPSocket, Instance: "x"},
		"gdb-12-345-x.sock":          {Owner: o, Kind: names.GDBSocket, Instance: "x"},
		"gdb-12.sock":                {},
		"snapload-12-345-x.qcow2":    {Owner: o, Kind: names.SnapshotStage, Instance: "x"},
		"vnc-12-345-x.sock":          {Owner: o, Kind: names.VNCSocket, Instance: "x"},
		"pcap-12-345-x.fifo":         {Owner: o, Kind: names.CaptureFIFO, Instance: "x"},
		"snapload-12.qcow2":          {},
		"probe-12-345-6789":          {Owner: o, Kind: names.ProbeDir},
		"probe-12-345-":              {},
		"probe-12-345-x":             {},
		"probe-12-6789":              {},
		"probe-12":                   {},
		"server-12-345.json":         {Owner: o, Kind: names.Record},
		".server-12-345.json.0f.tmp": {Owner: o, Kind: names.RecordTemp},
		// The names of older versions.
		"serial-12.in":            {Owner: names.Owner{PID: 12}, Kind: names.SerialIn},
		"serial-12.out":           {Owner: names.Owner{PID: 12}, Kind: names.SerialOut},
		"qmp-4194304.sock":        {Owner: names.Owner{PID: 4194304}, Kind: names.QMPSocket},
		"server-7.json":           {Owner: names.Owner{PID: 7}, Kind: names.Record},
		".server-7.json.00ff.tmp": {Owner: names.Owner{PID: 7}, Kind: names.RecordTemp},
		// Not ours.
		"serial-12-345.in":                   {},
		"serial-12-0345-a.in":                {},
		"serial-12-345-.in":                  {},
		"serial-12-345-A.in":                 {},
		"serial-12-345-a/b.in":               {},
		"serial-12-345-abcdefghijklmnopq.in": {},
		"serial-12--a.in":                    {},
		"serial-012.in":                      {},
		"serial-0.in":                        {},
		"serial-4194305.in":                  {},
		"serial-12.in.x":                     {},
		"serial-12.log":                      {},
		"serial-+12.in":                      {},
		"serial- 12.in":                      {},
		"qmp-12.sock/":                       {},
		"server-7.json.tmp":                  {},
		"server-7-345-a.json":                {},
		".server-7.json..tmp":                {},
		".server-7.json.00FF.tmp":            {},
		"captures":                           {},
		"images":                             {},
		"serial-99999999999999999999.in":     {},
		"serial-\u0661\u0662.in":             {},
		".server-7.json.00ff.tmp.json.tmp":   {},
	} {
		got, ok := names.Classify(name)
		if ok != (want.Owner.PID != 0) || got != want {
			t.Errorf("Classify(%q) = %+v %v, want %+v", name, got, ok, want)
		}
	}
}

// FuzzClassify: a name is accepted only if it is exactly the canonical name
// of what it is classified as.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"serial-12.in", "serial-12-5-a.out", "qmp-3-9-default.sock", "server-9-1.json",
		".server-9.json.ab12.tmp", "serial-01.in", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		e, ok := names.Classify(name)
		if !ok {
			if e != (names.Entry{}) {
				t.Fatalf("rejected %q but returned %+v", name, e)
			}
			return
		}
		if e.Owner.PID <= 0 || e.Owner.PID > names.MaxPID {
			t.Fatalf("Classify(%q) pid %d", name, e.Owner.PID)
		}
		if e.Kind == names.RecordTemp {
			if !strings.HasPrefix(name, names.TempPrefix+e.Owner.Tag()+".json.") || !strings.HasSuffix(name, names.TempSuffix) {
				t.Fatalf("Classify(%q) = temp record of %+v", name, e)
			}
			return
		}
		if got := names.Name(e.Kind, e.Owner, e.Instance); got != name {
			t.Fatalf("Classify(%q) = %+v, whose name is %q", name, e, got)
		}
	})
}

func TestCheckInstance(t *testing.T) {
	for _, ok := range []string{"default", "a", "0", "client-1", "router_b", "abcdefghijklmnop"} {
		if err := names.CheckInstance(ok); err != nil {
			t.Errorf("CheckInstance(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "_a", "A", "a b", "a/b", "..", "abcdefghijklmnopq", "é"} {
		if err := names.CheckInstance(bad); err == nil {
			t.Errorf("CheckInstance(%q) = nil", bad)
		}
	}
}

// TAP names fit an interface name, and differ between instances and
// between processes that had the same PID.
func TestTAPAndMAC(t *testing.T) {
	a := names.Owner{PID: 4194304, StartTime: 18446744073709551615}
	b := names.Owner{PID: 4194304, StartTime: 7}
	seen := map[string]bool{}
	macs := map[string]bool{}
	for _, o := range []names.Owner{a, b} {
		for _, inst := range []string{"default", "b", "abcdefghijklmnop"} {
			n := names.TAP(o, inst)
			if len(n) != 15 || !strings.HasPrefix(n, names.TAPPrefix) || seen[n] {
				t.Errorf("TAP(%v, %q) = %q", o, inst, n)
			}
			seen[n] = true
			if names.TAP(o, inst) != n {
				t.Errorf("TAP(%v, %q) is not stable", o, inst)
			}
			mac := names.GuestMAC(o, inst)
			if mac[0] != 0x52 || mac[1] != 0x54 || mac[2] != 0 || macs[mac.String()] {
				t.Errorf("GuestMAC(%v, %q) = %s", o, inst, mac)
			}
			macs[mac.String()] = true
		}
	}
}

// The stores take user names as file names: only safe ones pass.
func TestValidUserName(t *testing.T) {
	for name, want := range map[string]bool{
		"boot": true, "a.b_c-d": true, "9lives": true, strings.Repeat("x", 64): true,
		"": false, ".hidden": false, "-x": false, "a/b": false, "..": false, "a b": false, strings.Repeat("x", 65): false,
	} {
		if got := names.ValidUserName(name); got != want {
			t.Errorf("ValidUserName(%q) = %v, want %v", name, got, want)
		}
	}
}

// A project's directory is one per clean root, and says whose it is.
func TestProject(t *testing.T) {
	if names.Project("/p") == names.Project("/q") || names.Project("/p") != names.Project("/p/") {
		t.Errorf("project names: %q %q %q", names.Project("/p"), names.Project("/q"), names.Project("/p/"))
	}
	if p := names.Project("/home/me/my os"); !strings.HasPrefix(p, "my_os-") || len(p) != len("my_os-")+8 {
		t.Errorf("Project: %q", p)
	}
}
