package caps

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// cannedProps are QMP answers about device classes as QEMU 7.2 and 11.1
// give them: a concrete device, an abstract one (device-list-properties
// refuses it, qom-list-properties lists it with QOM's realized), a class
// that is no device (no realized), and names that are no class.
var cannedProps = map[string]string{
	"query-qmp-schema": `{"return": [
		{"name": "1", "meta-type": "enum", "values": ["on", "off", "auto"]},
		{"name": "2", "meta-type": "enum", "members": [{"name": "split"}, {"name": "unmap"}]},
		{"name": "3", "meta-type": "object", "members": [{"name": "not-an-enum", "type": "str"}]}]}`,
	"device-list-properties virtio-mmio": `{"return": [
		{"name": "force-legacy", "type": "bool", "description": "on/off"},
		{"name": "ioeventfd", "type": "bool", "default-value": true},
		{"name": "hotpluggable", "type": "bool"}]}`,
	"device-list-properties virtio-pci":        `{"error": {"class": "GenericError", "desc": "Parameter 'typename' expects a non-abstract device type"}}`,
	"qom-list-properties virtio-pci":           `{"return": [{"name": "type", "type": "string"}, {"name": "parent_bus", "type": "link<bus>"}, {"name": "realized", "type": "bool"}, {"name": "romfile", "type": "str"}, {"name": "addr", "description": "Slot and optional function number, example: 06.0 or 06", "type": "int32"}]}`,
	"device-list-properties memory-backend":    `{"error": {"class": "GenericError", "desc": "Parameter 'typename' expects a non-abstract device type"}}`,
	"qom-list-properties memory-backend":       `{"return": [{"name": "type", "type": "string"}, {"name": "share", "type": "bool"}, {"name": "size", "type": "int"}]}`,
	"device-list-properties no-such-class":     `{"error": {"class": "DeviceNotFound", "desc": "Device 'no-such-class' not found"}}`,
	"device-list-properties odd":               `{"error": {"class": "GenericError", "desc": "Parameter 'typename' expects a non-abstract device type"}}`,
	"qom-list-properties odd":                  `{"error": {"class": "DeviceNotFound", "desc": "Class 'odd' not found"}}`,
	"device-list-properties virtio-rng-device": `{"return": [{"name": "max-bytes", "type": "uint64"}]}`,
}

func withAnswers(extra map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range cannedProps {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

// What the property probe makes of QEMU's answers, from one QEMU, and
// that it asks no QEMU again for what it knows.
func TestPropProbeAnswers(t *testing.T) {
	bin, log := fakeQMPBinary(t, 0, cannedProps)
	p := newPropProber(t, bin, "", 0)
	pt, err := p.PropertyTypes(t.Context(), "virtio-mmio", "virtio-pci", "memory-backend", "no-such-class", "odd", "virtio-mmio")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ class, prop, typ, desc string }{
		{"virtio-mmio", "force-legacy", "bool", "on/off"},
		{"virtio-mmio", "ioeventfd", "bool", ""},
		{"virtio-pci", "romfile", "str", ""},
		{"virtio-pci", "addr", "int32", "Slot and optional function number, example: 06.0 or 06"},
	} {
		if typ, desc, ok := pt.Type(tc.class, tc.prop); !ok || typ != tc.typ || desc != tc.desc {
			t.Errorf("%s.%s: %q %q %v", tc.class, tc.prop, typ, desc, ok)
		}
	}
	for _, internal := range []string{"hotpluggable", "realized", "type", "parent_bus"} {
		if _, _, ok := pt.Type("virtio-pci", internal); ok {
			t.Errorf("QOM's %s is listed as a setting", internal)
		}
		if _, _, ok := pt.Type("virtio-mmio", internal); ok {
			t.Errorf("QOM's %s is listed as a setting", internal)
		}
	}
	for c, want := range map[string]bool{"virtio-mmio": true, "virtio-pci": true, "memory-backend": false, "no-such-class": false, "odd": false} {
		if pt.Class(c) != want {
			t.Errorf("Class(%s) = %v", c, !want)
		}
	}
	for v, want := range map[string]bool{"auto": true, "split": true, "unmap": true, "not-an-enum": false} {
		if pt.EnumValue(v) != want {
			t.Errorf("EnumValue(%s) = %v", v, !want)
		}
	}
	tab := pt.(*propTable)
	if !tab.Classes["virtio-pci"].Abstract || tab.Classes["virtio-mmio"].Abstract || tab.Version != "11.1.3 fake" {
		t.Errorf("abstract %v %v, version %q", tab.Classes["virtio-pci"].Abstract, tab.Classes["virtio-mmio"].Abstract, tab.Version)
	}
	if n := asked(t, log, "start"); n != 1 {
		t.Errorf("%d QEMUs, want 1", n)
	}
	if n := asked(t, log, "device-list-properties virtio-mmio"); n != 1 {
		t.Errorf("virtio-mmio asked about %d times", n)
	}

	// Known classes (and names known to be none): no QEMU.
	if _, err := p.PropertyTypes(t.Context(), "virtio-pci", "odd"); err != nil || asked(t, log, "start") != 1 {
		t.Errorf("asked again: %v, %d QEMUs", err, asked(t, log, "start"))
	}
	// A new class: a QEMU for it alone, the schema is not asked again,
	// and what was learnt before stays.
	pt, err = p.PropertyTypes(t.Context(), "virtio-rng-device")
	if err != nil || !pt.Class("virtio-rng-device") || !pt.Class("virtio-pci") || !pt.EnumValue("auto") {
		t.Errorf("a new class: %v", err)
	}
	if asked(t, log, "start") != 2 || asked(t, log, "query-qmp-schema") != 1 || asked(t, log, "device-list-properties virtio-pci") != 1 {
		t.Errorf("for a new class: %d QEMUs, the schema asked %d times", asked(t, log, "start"), asked(t, log, "query-qmp-schema"))
	}
}

// A class whose question kills QEMU fails, naming it and QEMU's last
// words; the others are asked of a new QEMU, three at most; what failed
// is not asked again at once.
func TestPropProbeDeaths(t *testing.T) {
	deaths := map[string]string{}
	for _, c := range []string{"k1", "k2", "k3"} {
		deaths["device-list-properties "+c] = `{"die": "qemu-system-riscv64: ` + c + ` is not supported"}`
	}
	bin, log := fakeQMPBinary(t, 0, withAnswers(deaths))
	p := newPropProber(t, bin, "", 0)
	_, err := p.PropertyTypes(t.Context(), "k1", "virtio-mmio")
	if err == nil || !strings.Contains(err.Error(), "asking QEMU about k1: QEMU exited (exit status 1): qemu-system-riscv64: k1 is not supported") {
		t.Errorf("QEMU died under k1: %v", err)
	}
	if pt, err := p.PropertyTypes(t.Context(), "virtio-mmio"); err != nil || !pt.Class("virtio-mmio") || asked(t, log, "start") != 2 {
		t.Errorf("virtio-mmio after k1 killed QEMU: %v, %d QEMUs", err, asked(t, log, "start"))
	}

	bin, log = fakeQMPBinary(t, 0, withAnswers(deaths))
	p = newPropProber(t, bin, "", 0)
	_, err = p.PropertyTypes(t.Context(), "k1", "k2", "k3", "virtio-pci")
	for _, c := range []string{"k1", "k2", "k3"} {
		if err == nil || !strings.Contains(err.Error(), c+" is not supported") {
			t.Errorf("the error does not say %s killed QEMU: %v", c, err)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "asking QEMU about virtio-pci: QEMU exited") || asked(t, log, "start") != 3 {
		t.Errorf("after three deaths: %v, %d QEMUs, want 3", err, asked(t, log, "start"))
	}
	if _, err := p.PropertyTypes(t.Context(), "virtio-pci"); err == nil || asked(t, log, "start") != 3 {
		t.Errorf("asked again at once: %v, %d QEMUs", err, asked(t, log, "start"))
	}
	// Once the retry time is over, it is asked again.
	for c, f := range p.failed {
		p.failed[c] = failure{f.err, time.Now().Add(-time.Second)}
	}
	if pt, err := p.PropertyTypes(t.Context(), "virtio-pci"); err != nil || !pt.Class("virtio-pci") || asked(t, log, "start") != 4 {
		t.Errorf("after the retry time: %v, %d QEMUs", err, asked(t, log, "start"))
	}

	bin, log = fakeQMPBinary(t, 0, withAnswers(map[string]string{"query-qmp-schema": `{"die": "Aborted (core dumped)"}`}))
	p = newPropProber(t, bin, "", 0)
	if _, err := p.PropertyTypes(t.Context(), "virtio-mmio"); err == nil || !strings.Contains(err.Error(), "asking QEMU for its enumerations: QEMU exited") || !strings.Contains(err.Error(), "Aborted (core dumped)") {
		t.Errorf("QEMU dies when asked for its schema: %v", err)
	}
	if _, err := p.PropertyTypes(t.Context(), "virtio-mmio"); err == nil || asked(t, log, "start") != 3 {
		t.Errorf("the schema's deaths: %v, %d QEMUs, want 3", err, asked(t, log, "start"))
	}
}

// An answer that makes no sense fails its class alone; a QEMU that stops
// answering ends the probe at its timeout, naming the class; a binary not
// found is named.
func TestPropProbeOtherFailures(t *testing.T) {
	bin, log := fakeQMPBinary(t, 0, withAnswers(map[string]string{"device-list-properties bad": `{"return": {"name": "x"}}`}))
	p := newPropProber(t, bin, "", 0)
	if _, err := p.PropertyTypes(t.Context(), "bad", "virtio-mmio"); err == nil || !strings.Contains(err.Error(), "properties of bad") {
		t.Errorf("a class QEMU answers nonsense for: %v", err)
	}
	if pt, err := p.PropertyTypes(t.Context(), "virtio-mmio"); err != nil || !pt.Class("virtio-mmio") || asked(t, log, "start") != 1 {
		t.Errorf("the others, from the same QEMU: %v, %d QEMUs", err, asked(t, log, "start"))
	}

	bin, _ = fakeQMPBinary(t, 0, withAnswers(map[string]string{"device-list-properties stuck": `{"hang": true}`}))
	// The timeout leaves a loaded machine time to start the fake QEMU.
	p = newPropProber(t, bin, "", 1500*time.Millisecond)
	start := time.Now()
	_, err := p.PropertyTypes(t.Context(), "stuck")
	if err == nil || !strings.Contains(err.Error(), "asking QEMU about stuck: no answer within the probe's time") || time.Since(start) > 10*time.Second {
		t.Errorf("a hung QEMU: %v after %v", err, time.Since(start))
	}
	m := newPropProber(t, "no-such-qemu-for-caps", "", 0)
	if _, err := m.PropertyTypes(t.Context(), "virtio-mmio"); err == nil || !strings.Contains(err.Error(), "QEMU binary") || !strings.Contains(err.Error(), "no-such-qemu-for-caps") {
		t.Errorf("a binary not on PATH: %v", err)
	}
}

// propsCacheOf is where the property types of bin are cached, beside the
// capabilities.
func propsCacheOf(dir, bin string) string {
	sum := sha256.Sum256([]byte(bin))
	return filepath.Join(dir, "qemu-caps", hex.EncodeToString(sum[:])[:16]+".props.json")
}

// What was learnt is cached for the next server; a cache file that is not
// this binary's as it is now, or not of this version, is asked again.
func TestPropCache(t *testing.T) {
	bin, log := fakeQMPBinary(t, 0, cannedProps)
	cache := t.TempDir()
	if _, err := newPropProber(t, bin, cache, 0).PropertyTypes(t.Context(), "virtio-mmio", "odd"); err != nil {
		t.Fatal(err)
	}
	f := propsCacheOf(cache, bin)
	b, err := os.ReadFile(f)
	var onDisk struct {
		Binary       string   `json:"binary"`
		ProbeVersion int      `json:"probe_version"`
		Enums        []string `json:"enums"`
		Classes      map[string]struct {
			Props map[string]struct {
				Type string `json:"type"`
			} `json:"props"`
		} `json:"classes"`
		NotClasses []string `json:"not_classes"`
	}
	if err == nil {
		err = json.Unmarshal(b, &onDisk)
	}
	if err != nil || onDisk.Binary != bin || onDisk.ProbeVersion != propsVersion || len(onDisk.Enums) != 5 ||
		onDisk.Classes["virtio-mmio"].Props["force-legacy"].Type != "bool" || fmt.Sprint(onDisk.NotClasses) != "[odd]" {
		t.Fatalf("the cache file: %v %s", err, b)
	}
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the cache file's mode: %v %v", fi.Mode(), err)
	}
	q := newPropProber(t, bin, cache, 0)
	if pt, err := q.PropertyTypes(t.Context(), "virtio-mmio", "odd"); err != nil || !pt.Class("virtio-mmio") || asked(t, log, "start") != 1 {
		t.Errorf("from the cache: %v, %d QEMUs", err, asked(t, log, "start"))
	}

	for name, spoil := range map[string]func(){
		"corrupt": func() { os.WriteFile(f, b[:len(b)/2], 0o600) },
		"other version": func() {
			os.WriteFile(f, []byte(strings.Replace(string(b), `"probe_version": 1`, `"probe_version": 99`, 1)), 0o600)
		},
		"no enums": func() { os.WriteFile(f, []byte(strings.Replace(string(b), `"enums"`, `"enums_was"`, 1)), 0o600) },
		"binary touched": func() {
			later := time.Now().Add(time.Hour)
			os.Chtimes(bin, later, later)
		},
	} {
		before := asked(t, log, "start")
		os.WriteFile(f, b, 0o600)
		spoil()
		r := newPropProber(t, bin, cache, 0)
		if pt, err := r.PropertyTypes(t.Context(), "virtio-mmio"); err != nil || !pt.Class("virtio-mmio") || asked(t, log, "start") != before+1 {
			t.Errorf("%s: %v, %d QEMUs, want one more than %d", name, err, asked(t, log, "start"), before)
		}
	}
}

// Servers that start together ask QEMU once (the cache's lock), and so do
// the callers of one server.
func TestPropProbeAtOnce(t *testing.T) {
	bin, log := fakeQMPBinary(t, 300, cannedProps)
	cache := t.TempDir()
	p, q := newPropProber(t, bin, cache, 0), newPropProber(t, bin, cache, 0)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			prober := p
			if i%2 == 1 {
				prober = q
			}
			if pt, err := prober.PropertyTypes(t.Context(), "virtio-mmio", "virtio-pci"); err != nil || !pt.Class("virtio-pci") {
				t.Errorf("caller %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if n := asked(t, log, "start"); n != 1 {
		t.Errorf("%d QEMUs for servers asking at once, want 1", n)
	}
}

// What is known of names that are no class is bounded, and a name that
// became a class is no longer one of them.
func TestPropTableMerge(t *testing.T) {
	old := (&propTable{Enums: []string{"on"}, NotClasses: []string{"x", "y"}}).index()
	learnt := &propTable{Classes: map[string]*classProps{"y": {}}, Probed: time.Now()}
	for i := range maxNotClasses + 10 {
		learnt.NotClasses = append(learnt.NotClasses, fmt.Sprintf("n%03d", i))
	}
	m := learnt.index()
	m = old.merge(m)
	if len(m.NotClasses) != maxNotClasses || !m.knows("x") || !m.Class("y") || m.not["y"] || !m.EnumValue("on") {
		t.Errorf("merged: %d not-classes, x known %v, y a class %v", len(m.NotClasses), m.knows("x"), m.Class("y"))
	}
	if len(old.NotClasses) != 2 || old.Class("y") {
		t.Errorf("the merge changed a published table: %v", old.NotClasses)
	}
}
