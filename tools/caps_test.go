package tools_test

import (
	"os"
	"strings"
	"testing"
	"time"
)

type capsInfo struct {
	QEMUCaps struct {
		Binary   string `json:"binary"`
		State    string `json:"state"`
		ProbedAt string `json:"probed_at"`
		Error    string `json:"error"`
		Timer    *struct {
			Answer string `json:"answer"`
			Detail string `json:"detail"`
		} `json:"timer_kept"`
		InPlace *struct {
			Answer string `json:"answer"`
			Detail string `json:"detail"`
		} `json:"in_place_load"`
		Replay *struct {
			Answer string `json:"answer"`
		} `json:"replay_checkpoint"`
	} `json:"qemu_capabilities"`
}

// server_info shows the QEMU binary's capabilities: not probed before a
// guest booted, probed in the background after, answers a server with
// the same cache reads at once; and the probes leave nothing in the
// runtime directory.
func TestServerInfoQEMUCapabilities(t *testing.T) {
	cache := t.TempDir()
	withCache := func(c *testConfig) { c.CacheDir = cache }
	s := newSessionWith(t, withCache, nil)
	var info capsInfo
	res := s.call("server_info", nil, &info)
	if info.QEMUCaps.State != "not probed yet" || info.QEMUCaps.Timer != nil || !strings.Contains(text(res), "qemu capabilities: not probed yet") {
		t.Fatalf("before any boot: %+v\n%s", info.QEMUCaps, text(res))
	}
	s.bootTiny()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res = s.call("server_info", nil, &info)
		if info.QEMUCaps.State == "probed" {
			break
		}
		if info.QEMUCaps.State != "probing" && info.QEMUCaps.State != "not probed yet" || time.Now().After(deadline) {
			t.Fatalf("after a boot: %+v", info.QEMUCaps)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s", text(res))
	q := info.QEMUCaps
	want := "no"
	if strings.Contains(qemuVersionOf(t, s), " 11.") {
		want = "yes"
	}
	if q.Timer.Answer != want || q.InPlace.Answer != want || q.Replay.Answer != want {
		t.Errorf("capabilities %s/%s/%s, want %s (%s)", q.Timer.Answer, q.InPlace.Answer, q.Replay.Answer, want, q.Timer.Detail)
	}
	if !strings.Contains(text(res), "timer kept by a load "+want) {
		t.Errorf("text content: %s", text(res))
	}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "probe-") {
			t.Errorf("left in the runtime directory: %s", e.Name())
		}
	}
	// Another server with the same cache knows at once.
	s2 := newSessionWith(t, withCache, nil)
	var info2 capsInfo
	s2.call("server_info", nil, &info2)
	if info2.QEMUCaps.State != "probed" || info2.QEMUCaps.ProbedAt != q.ProbedAt {
		t.Errorf("a server with the same cache: %+v", info2.QEMUCaps)
	}
}

func qemuVersionOf(t *testing.T, s *session) string {
	t.Helper()
	var v struct {
		QEMUVersion string `json:"qemu_version"`
	}
	s.mustCall("server_info", nil, &v)
	return v.QEMUVersion
}
