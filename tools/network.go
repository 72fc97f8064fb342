package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/pcap"
)

// PcapStartInput is qemu_pcap_start's arguments.
type PcapStartInput struct {
	Path    string `json:"path,omitempty" jsonschema:"capture file to create (must not exist); default a new file under the captures directory"`
	Filter  string `json:"filter,omitempty" jsonschema:"capture filter, a tcpdump subset: arp ip ip6 icmp icmp6 tcp udp, [src|dst] host A, [src|dst] net A/N, [tcp|udp] [src|dst] port N, ether host MAC, broadcast, multicast, not and or ( )"`
	Snaplen int    `json:"snaplen,omitempty" default:"65535" jsonschema:"bytes kept per packet"`
	Target
}

// PcapStartOutput is qemu_pcap_start's result.
type PcapStartOutput struct {
	Path      string `json:"path"`
	Interface string `json:"interface"`
}

func (s *Server) pcapStart(_ context.Context, _ *mcp.CallToolRequest, in PcapStartInput) (*mcp.CallToolResult, PcapStartOutput, error) {
	inst, _, err := s.running(in.Target)
	if err != nil {
		return nil, PcapStartOutput{}, err
	}
	c, err := inst.Network().StartCaptureFile(in.Path, in.Filter, in.Snaplen)
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
	Error    string `json:"error,omitempty" jsonschema:"the write error (a full disk) that ended the capture early"`
}

func (s *Server) pcapStop(_ context.Context, _ *mcp.CallToolRequest, t Target) (*mcp.CallToolResult, PcapStopOutput, error) {
	inst, err := s.instance(t)
	if err != nil {
		return nil, PcapStopOutput{}, err
	}
	st, ok := inst.Network().StopCapture()
	if !ok {
		return nil, PcapStopOutput{}, fmt.Errorf("no capture of guest %q is running: start one with qemu_pcap_start or qemu_boot pcap: true", inst.Name())
	}
	out := PcapStopOutput{Path: st.Path, Packets: st.Packets, Bytes: st.Bytes, Drops: st.Drops, Filtered: st.Filtered, Error: st.Error}
	text := fmt.Sprintf("capture stopped: %d packets (%d bytes, %d dropped, %d filtered out) in %s; read it with qemu_pcap_read, tcpdump -r or Wireshark",
		out.Packets, out.Bytes, out.Drops, out.Filtered, out.Path)
	if st.Error != "" {
		text += "; it ended early, packets after that were not captured: " + st.Error
	}
	return textResult(text), out, nil
}

// PcapReadInput is qemu_pcap_read's arguments.
type PcapReadInput struct {
	Path  string `json:"path,omitempty" jsonschema:"capture file, in the project or the captures directory; default the guest's running or last capture"`
	From  int    `json:"from,omitempty" jsonschema:"first packet number (1-based); default where the last read of this file ended"`
	Count int    `json:"count,omitempty" default:"100" jsonschema:"most packets to return"`
	Target
}

// PcapReadOutput is qemu_pcap_read's result.
type PcapReadOutput struct {
	Path    string         `json:"path"`
	Packets []pcap.Summary `json:"packets"`
	Next    int            `json:"next" jsonschema:"packet number to read from next"`
}

func (s *Server) pcapRead(_ context.Context, req *mcp.CallToolRequest, in PcapReadInput) (_ *mcp.CallToolResult, _ PcapReadOutput, err error) {
	if in.Count < 0 || in.Count > pcap.MaxSummaries {
		return nil, PcapReadOutput{}, fmt.Errorf("count %d: want 1 to %d", in.Count, pcap.MaxSummaries)
	}
	mgr, err := s.manager()
	if err != nil {
		return nil, PcapReadOutput{}, err
	}
	inst, ierr := s.instance(in.Target)
	if ierr != nil {
		if in.Path == "" {
			return nil, PcapReadOutput{}, ierr
		}
		inst = nil // the path is the server's project's
	}
	count := in.Count
	if count == 0 {
		count = pcap.DefaultSummaries
	}
	r, err := mgr.ReadCapture(inst, in.Path, in.From, count)
	if err != nil {
		return nil, PcapReadOutput{}, err
	}
	// Within the result budget: the packets that fit, and next says
	// where the rest starts.
	sums, next := r.Packets, r.Next
	size := 0
	for k, p := range sums {
		if size += len(p.Text) + 120; size > s.budget(req).Answer && k > 0 {
			sums, next = sums[:k], p.Index
			break
		}
	}
	mgr.CaptureReadTo(r.Path, next)
	text := fmt.Sprintf("%s: %d packet(s), next %d", r.Path, len(sums), next)
	if sums == nil {
		sums = []pcap.Summary{}
	}
	return textResult(text), PcapReadOutput{Path: r.Path, Packets: sums, Next: next}, nil
}

func (s *Server) registerNetwork(ms *mcp.Server) {
	add(s, ms, tool("qemu_pcap_start", "Start capture", mcp.ToolAnnotations{},
		"Start capturing a guest's traffic on its own TAP (boot with network: \"tap\"), in-process, into a pcap file that Wireshark and tcpdump open."), s.pcapStart)
	add(s, ms, tool("qemu_pcap_stop", "Stop capture", mcp.ToolAnnotations{},
		"Stop the running capture; returns its path and counts of packets, bytes, drops and filtered-out packets. The file is kept."), s.pcapStop)
	add(s, ms, tool("qemu_pcap_read", "Read capture", reading,
		"Read captured packets as one-line summaries like tcpdump's (time, Ethernet, ARP, IPv4/IPv6, ICMP, UDP, TCP, DHCP, DNS), from a packet number, at most count at a time; works while the capture runs."), s.pcapRead)
}
