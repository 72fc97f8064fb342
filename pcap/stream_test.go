package pcap_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/qemu-mcp/qemu-mcp/pcap"
)

// writeStream writes ss as one pcap stream into w, as QEMU's filter-dump
// does (its own snap length and time stamps), and closes w if asked.
func writeStream(t *testing.T, w *os.File, ss []sample, close bool) {
	t.Helper()
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(262144, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: len(s.data), Length: len(s.data)}
		if err := pw.WritePacket(ci, s.data); err != nil {
			t.Fatal(err)
		}
	}
	if close {
		w.Close()
	}
}

// A capture fed by two pcap streams in turn (a guest restored into a new
// QEMU): one file, the filter and snap length applied, every frame of both
// kept, and Stop returns once the last writer closed.
func TestStreams(t *testing.T) {
	ss := samples(t)
	dir := t.TempDir()
	c, err := pcap.NewStream("qemu:net0", pcap.Options{Dir: dir, Prefix: "capture-x", Filter: "ip or arp", Snaplen: 60})
	if err != nil {
		t.Fatal(err)
	}
	var ip int
	for _, s := range ss {
		f, _ := pcap.Compile("ip or arp")
		if f.Match(s.data) {
			ip++
		}
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddStream(r); err != nil {
			t.Fatal(err)
		}
		writeStream(t, w, ss, true)
	}
	start := time.Now()
	// Both writers closed: Stop reads what is left and returns at once.
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().Packets < int64(2*ip) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	st, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("Stop took %v", el)
	}
	if st.Packets != int64(2*ip) || st.Filtered != int64(2*(len(ss)-ip)) || st.Interface != "qemu:net0" || st.Snaplen != 60 {
		t.Errorf("stats %+v, want %d packets and %d filtered", st, 2*ip, 2*(len(ss)-ip))
	}
	sums, _, err := pcap.ReadSummaries(st.Path, 1, 100)
	if err != nil || len(sums) != 2*ip {
		t.Fatalf("read back %d summaries, %v", len(sums), err)
	}
	if !strings.HasPrefix(filepath.Base(st.Path), "capture-x-") {
		t.Errorf("path %s", st.Path)
	}
	// Time stamps are when the frames were read, not QEMU's.
	if time.Since(sums[0].Time) > time.Minute {
		t.Errorf("time stamp %q", sums[0].Time)
	}
	if err := c.AddStream(mustPipe(t)); err == nil {
		t.Error("a stopped capture took another stream")
	}
}

func mustPipe(t *testing.T) *os.File {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return r
}

// A writer that never closes its end does not hold Stop for more than the
// drain time-out, and what it wrote is kept.
func TestStreamStopCutsAWriterThatStaysOpen(t *testing.T) {
	ss := samples(t)
	c, err := pcap.NewStream("qemu:net0", pcap.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	r, w, _ := os.Pipe()
	defer w.Close()
	c.AddStream(r)
	writeStream(t, w, ss[:3], false)
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().Packets < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	st, err := c.Stop()
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Stop took %v", el)
	}
	if err != nil || st.Packets != 3 {
		t.Errorf("stop: %+v, %v", st, err)
	}
}
