package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/instance"
	"github.com/qemu-mcp/qemu-mcp/serial"
)

// TranscriptURI is the MCP resource holding the default guest's console;
// TranscriptTemplate names any guest's.
const (
	TranscriptURI      = "qemu://serial/transcript"
	TranscriptTemplate = "qemu://serial/transcript/{instance}"
)

// maxResource bounds what one resource read returns: a day-long transcript
// is better read with serial_read's cursors.
const maxResource = 8 << 20

func (s *Server) registerResources(ms *mcp.Server) {
	ms.AddResource(&mcp.Resource{
		URI:         TranscriptURI,
		Name:        "serial transcript",
		Description: "The complete serial console output of the default guest's current (or last) boot, as text with terminal escapes stripped; the last 8 MiB when it is longer.",
		MIMEType:    "text/plain",
	}, s.readTranscript)
	ms.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: TranscriptTemplate,
		Name:        "serial transcript of a guest",
		Description: "The complete serial console output of the named guest's current (or last) boot, as for " + TranscriptURI + ".",
		MIMEType:    "text/plain",
	}, s.readTranscript)
}

func (s *Server) readTranscript(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	name := instance.DefaultName
	if rest, ok := strings.CutPrefix(req.Params.URI, TranscriptURI+"/"); ok {
		name = rest
	}
	inst, err := s.instance(Target{Instance: name})
	if err != nil {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	con := inst.Console()
	if con == nil {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	buf := con.Buffer()
	// What the drain holds back is written first, so the file is complete.
	if err := buf.Flush(); err != nil {
		s.log.Warn("flush transcript", "err", err)
	}
	// Read through the buffer: the transcript file for what left memory,
	// the ring for the rest (all of it while the file cannot be written),
	// and what neither holds is said where it was.
	var b strings.Builder
	end := buf.End()
	since := max(0, end-maxResource)
	if since > 0 {
		fmt.Fprintf(&b, "[%d earlier bytes omitted: read them with serial_read since 0, or from %s]\n", since, buf.TranscriptPath())
	}
	if st := buf.TranscriptStatus(); st.Err != nil {
		fmt.Fprintf(&b, "[qemu-mcp: %s; this text comes from memory]\n", transcriptStopped(st))
	}
	for cur := since; cur < end; {
		p, err := buf.ReadPage(cur, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("read transcript: %w", err)
		}
		if p.Lost > 0 {
			fmt.Fprintf(&b, "\n[qemu-mcp: %d bytes of output (cursors %d to %d) cannot be served: they left memory while the transcript could not be written]\n", p.Lost, p.Start-p.Lost, p.Start)
		}
		if p.Next == p.Start && p.Lost == 0 {
			break
		}
		data := p.Data
		if p.Next < end {
			// End the piece where a sequence is complete, so the next
			// one cleans it whole.
			if k := serial.CompletePrefix(data); k > 0 {
				data = data[:k]
			}
		}
		b.WriteString(serial.Clean(data))
		cur = p.Start + int64(len(data))
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{
		URI: req.Params.URI, MIMEType: "text/plain", Text: b.String(),
	}}}, nil
}
