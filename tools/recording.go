package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/qemu-mcp/qemu-mcp/instance"
)

// RecordingInfo is a recording as the tools show it.
type RecordingInfo struct {
	Name string `json:"name"`
	// Replaying says the guest replays it (else it records into it).
	Replaying bool   `json:"replaying,omitempty"`
	State     string `json:"state,omitempty" jsonschema:"recording, complete, or cut (its QEMU or server was killed: it replays up to where it was cut)"`
	// Instructions is its length; 0 while unknown.
	Instructions uint64    `json:"instructions,omitempty"`
	Ended        string    `json:"ended,omitempty"`
	Created      time.Time `json:"created,omitempty"`
	Size         int64     `json:"size,omitempty"`
	Checkpoints  int64     `json:"checkpoints,omitempty" jsonschema:"bytes of its size that are replay checkpoints (a cache, removed first when the kept files pass their cap)"`
	ConsoleBytes int64     `json:"console_bytes,omitempty"`
	QEMU         string    `json:"qemu,omitempty"`
	Unreadable   string    `json:"unreadable,omitempty"`
	// Advice is what would make its replays faster, when recording.
	Advice string `json:"advice,omitempty"`
}

func recordingInfo(m instance.RecordingMeta) *RecordingInfo {
	return &RecordingInfo{Name: m.Name, State: m.Status(), Instructions: m.Instructions, Ended: endedText(m.Ended)}
}

func recordingListed(m instance.RecordingMeta) RecordingInfo {
	if u := m.Unreadable(); u != "" {
		return RecordingInfo{Name: m.Name, Unreadable: u}
	}
	size, cks := m.Size()
	n := m.Instructions
	if n == 0 {
		n = m.Seen
	}
	return RecordingInfo{Name: m.Name, State: m.Status(), Instructions: n, Ended: endedText(m.Ended), Created: m.Created,
		Size: size, Checkpoints: cks, ConsoleBytes: m.ConsoleBytes, QEMU: m.QEMU}
}

// RecordingsInput is qemu_recordings' arguments.
type RecordingsInput struct {
	Delete      string `json:"delete,omitempty" max:"64" jsonschema:"delete this recording"`
	ProjectRoot string `json:"project_root,omitempty" jsonschema:"default the guest's project"`
	Target
}

// RecordingsOutput is qemu_recordings' result.
type RecordingsOutput struct {
	Project    string          `json:"project"`
	Recordings []RecordingInfo `json:"recordings"`
	Deleted    string          `json:"deleted,omitempty"`
	// Total is every project's recordings together, against the cap.
	Total int64 `json:"total" jsonschema:"bytes all recordings (every project) take"`
	Cap   int64 `json:"cap"`
}

func (s *Server) recordingsTool(ctx context.Context, _ *mcp.CallToolRequest, in RecordingsInput) (*mcp.CallToolResult, RecordingsOutput, error) {
	root, _, mgr, err := s.snapshotProject(in.ProjectRoot, in.Target)
	if err != nil {
		return nil, RecordingsOutput{}, err
	}
	out := RecordingsOutput{Project: root, Recordings: []RecordingInfo{}, Cap: mgr.KeepCap()}
	if in.Delete != "" {
		if _, err := mgr.Recordings().Delete(root, in.Delete); err != nil {
			return nil, out, err
		}
		out.Deleted = in.Delete
	}
	list, err := mgr.Recordings().List(root)
	if err != nil {
		return nil, out, err
	}
	out.Total = list.Total
	var lines []string
	for _, m := range list.Recordings {
		ri := recordingListed(m)
		out.Recordings = append(out.Recordings, ri)
		line := fmt.Sprintf("%s (%s, %d instructions, %s", ri.Name, ri.State, ri.Instructions, size(ri.Size))
		if ri.Ended != "" {
			line += ", " + ri.Ended
		}
		if ri.Unreadable != "" {
			line = ri.Name + " (UNREADABLE: " + ri.Unreadable
		}
		lines = append(lines, line+")")
	}
	text := fmt.Sprintf("%d recordings in %s", len(lines), root)
	if out.Deleted != "" {
		text = fmt.Sprintf("deleted recording %q; ", out.Deleted) + text
	}
	if len(lines) > 0 {
		text += ": " + strings.Join(lines, "; ")
	}
	return textResult(text), out, nil
}

func (s *Server) registerRecordings(ms *mcp.Server) {
	add(s, ms, tool("qemu_recordings", "Recordings", mutating,
		"List a project's recordings: state (complete, or cut by a kill), instructions, how the run ended, size; or delete one."), s.recordingsTool)
}
