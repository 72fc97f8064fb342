package tools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/registry"
	"github.com/qemu-mcp/qemu-mcp/internal/runtimedir"
	"github.com/qemu-mcp/qemu-mcp/pcap"
	"github.com/qemu-mcp/qemu-mcp/tap"
)

// netState is the TAP and capture of the current boot. Guarded by s.mu.
type netState struct {
	dev      *tap.Device
	capture  *pcap.Capture
	last     *pcap.Stats    // the last stopped capture, for status
	readFrom map[string]int // packet cursor per capture file for qemu_pcap_read
}

// createTAP makes this server's TAP before QEMU starts and records it, so
// that if we are killed the next server's reaper deletes it.
func (s *Server) createTAP(in BootInput) (*tap.Device, error) {
	dev, err := tap.Create(tap.Options{PID: s.pid, CIDR: in.TapCIDR, Bridge: in.Bridge, UID: os.Getuid(), GID: os.Getgid()})
	if err != nil {
		return nil, fmt.Errorf("network tap: %w", err)
	}
	s.writeRecord(func(r *registry.Record) bool { r.TAP = dev.Name; return true })
	return dev, nil
}

// deleteTAP stops a capture on dev, deletes dev and clears the record.
func (s *Server) deleteTAP(dev *tap.Device) {
	if dev == nil {
		return
	}
	s.mu.Lock()
	c := s.net.capture
	if c != nil && s.net.dev == dev {
		s.net.capture = nil
	}
	if s.net.dev == dev {
		s.net.dev = nil
	}
	s.mu.Unlock()
	if c != nil {
		s.stopCapture(c)
	}
	if err := dev.Close(); err != nil {
		s.log.Warn("delete tap", "name", dev.Name, "err", err)
	}
	s.writeRecord(func(r *registry.Record) bool {
		if r.TAP != dev.Name {
			return false
		}
		r.TAP = ""
		return true
	})
}

func (s *Server) stopCapture(c *pcap.Capture) pcap.Stats {
	st, err := c.Stop()
	if err != nil {
		s.log.Warn("stop capture", "path", st.Path, "err", err)
	}
	s.mu.Lock()
	s.net.last = &st
	s.mu.Unlock()
	return st
}

// startCapture captures on the current TAP. s.mu must not be held.
func (s *Server) startCapture(path, filter string, snaplen int) (*pcap.Capture, error) {
	s.mu.Lock()
	dev, running, boots := s.net.dev, s.net.capture, s.boots
	s.mu.Unlock()
	if dev == nil {
		return nil, errors.New(`no TAP to capture on: boot with network: "tap" (captures see the guest's own TAP from the host side)`)
	}
	if running != nil {
		return nil, fmt.Errorf("a capture is already running into %s: call qemu_pcap_stop first", running.Path())
	}
	c, err := pcap.Start(dev.Name, pcap.Options{
		Path: path, Dir: runtimedir.CapturesDir(s.cfg.RuntimeDir), Prefix: dev.Name, Boot: boots,
		Snaplen: snaplen, Filter: filter,
	})
	if err != nil {
		return nil, fmt.Errorf("capture on %s: %w", dev.Name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.net.dev != dev {
		// The guest stopped while we started: do not leave it running.
		go c.Stop()
		return nil, errors.New("the guest stopped while the capture started")
	}
	s.net.capture = c
	return c, nil
}

// PcapStartInput is qemu_pcap_start's arguments.
type PcapStartInput struct {
	Path    string `json:"path,omitempty" jsonschema:"capture file to create (must not exist); default a new file under the captures directory"`
	Filter  string `json:"filter,omitempty" jsonschema:"capture filter, a tcpdump subset: arp ip ip6 icmp icmp6 tcp udp, [src|dst] host A, [src|dst] net A/N, [tcp|udp] [src|dst] port N, ether host MAC, broadcast, multicast, not and or ( )"`
	Snaplen int    `json:"snaplen,omitempty" jsonschema:"bytes kept per packet; default 65535"`
}

// PcapStartOutput is qemu_pcap_start's result.
type PcapStartOutput struct {
	Path      string `json:"path"`
	Interface string `json:"interface"`
}

func (s *Server) pcapStart(_ context.Context, _ *mcp.CallToolRequest, in PcapStartInput) (*mcp.CallToolResult, PcapStartOutput, error) {
	if _, err := s.running(); err != nil {
		return nil, PcapStartOutput{}, err
	}
	if in.Path != "" && !filepath.IsAbs(in.Path) {
		in.Path = filepath.Join(s.cfg.WorkDir, in.Path)
	}
	c, err := s.startCapture(in.Path, in.Filter, in.Snaplen)
	if err != nil {
		return nil, PcapStartOutput{}, err
	}
	st := c.Stats()
	return textResult(fmt.Sprintf("capturing on %s into %s", st.Interface, st.Path)), PcapStartOutput{Path: st.Path, Interface: st.Interface}, nil
}

// PcapStopOutput is qemu_pcap_stop's result.
type PcapStopOutput struct {
	Path     string `json:"path"`
	Packets  int64  `json:"packets" jsonschema:"packets written to the file"`
	Bytes    int64  `json:"bytes" jsonschema:"bytes of those packets on the wire"`
	Drops    int64  `json:"drops" jsonschema:"packets the kernel dropped"`
	Filtered int64  `json:"filtered" jsonschema:"packets the filter left out"`
}

func (s *Server) pcapStop(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, PcapStopOutput, error) {
	s.mu.Lock()
	c := s.net.capture
	s.net.capture = nil
	s.mu.Unlock()
	if c == nil {
		return nil, PcapStopOutput{}, errors.New("no capture is running: start one with qemu_pcap_start or qemu_boot pcap: true")
	}
	st := s.stopCapture(c)
	out := PcapStopOutput{Path: st.Path, Packets: st.Packets, Bytes: st.Bytes, Drops: st.Drops, Filtered: st.Filtered}
	return textResult(fmt.Sprintf("capture stopped: %d packets (%d bytes, %d dropped, %d filtered out) in %s; read it with qemu_pcap_read, tcpdump -r or Wireshark",
		out.Packets, out.Bytes, out.Drops, out.Filtered, out.Path)), out, nil
}

// PcapReadInput is qemu_pcap_read's arguments.
type PcapReadInput struct {
	Path  string `json:"path,omitempty" jsonschema:"capture file; default the running or last capture"`
	From  int    `json:"from,omitempty" jsonschema:"first packet number (1-based); default where the last read of this file ended"`
	Count int    `json:"count,omitempty" jsonschema:"most packets to return; default 100"`
}

// PcapReadOutput is qemu_pcap_read's result.
type PcapReadOutput struct {
	Path    string         `json:"path"`
	Packets []pcap.Summary `json:"packets"`
	Next    int            `json:"next" jsonschema:"packet number to read from next"`
}

func (s *Server) pcapRead(_ context.Context, _ *mcp.CallToolRequest, in PcapReadInput) (*mcp.CallToolResult, PcapReadOutput, error) {
	if in.Count < 0 || in.Count > pcap.MaxSummaries {
		return nil, PcapReadOutput{}, fmt.Errorf("count %d: want 1 to %d", in.Count, pcap.MaxSummaries)
	}
	path := in.Path
	s.mu.Lock()
	if path == "" {
		switch {
		case s.net.capture != nil:
			path = s.net.capture.Path()
		case s.net.last != nil:
			path = s.net.last.Path
		}
	}
	from := in.From
	if from == 0 && s.net.readFrom != nil {
		from = s.net.readFrom[path]
	}
	s.mu.Unlock()
	if path == "" {
		return nil, PcapReadOutput{}, errors.New("no capture yet: boot with pcap: true or call qemu_pcap_start, or give path")
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(s.cfg.WorkDir, path)
	}
	count := in.Count
	if count == 0 {
		count = pcap.DefaultSummaries
	}
	sums, next, err := pcap.ReadSummaries(path, from, count)
	if err != nil {
		return nil, PcapReadOutput{}, fmt.Errorf("read capture: %w", err)
	}
	s.mu.Lock()
	if s.net.readFrom == nil {
		s.net.readFrom = map[string]int{}
	}
	s.net.readFrom[path] = next
	s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d packet(s), next %d\n", path, len(sums), next)
	for _, p := range sums {
		fmt.Fprintf(&b, "%d %s\n", p.Index, p.Text)
	}
	if sums == nil {
		sums = []pcap.Summary{}
	}
	return textResult(b.String()), PcapReadOutput{Path: path, Packets: sums, Next: next}, nil
}

func (s *Server) registerNetwork(ms *mcp.Server) {
	f := false
	mcp.AddTool(ms, &mcp.Tool{
		Name:        "qemu_pcap_start",
		Description: "Start capturing the guest's traffic on its own TAP (boot with network: \"tap\"), in-process, into a pcap file that Wireshark and tcpdump open.",
		Annotations: &mcp.ToolAnnotations{Title: "Start capture", OpenWorldHint: &f},
	}, handle(s, s.pcapStart))
	mcp.AddTool(ms, &mcp.Tool{
		Name:        "qemu_pcap_stop",
		Description: "Stop the running capture; returns its path and counts of packets, bytes, drops and filtered-out packets. The file is kept.",
		Annotations: &mcp.ToolAnnotations{Title: "Stop capture", OpenWorldHint: &f},
	}, handle(s, s.pcapStop))
	mcp.AddTool(ms, &mcp.Tool{
		Name:        "qemu_pcap_read",
		Description: "Read captured packets as one-line summaries like tcpdump's (time, Ethernet, ARP, IPv4/IPv6, ICMP, UDP, TCP, DHCP, DNS), from a packet number, at most count at a time; works while the capture runs.",
		Annotations: &mcp.ToolAnnotations{Title: "Read capture", ReadOnlyHint: true, OpenWorldHint: &f},
	}, handle(s, s.pcapRead))
}
