package tools

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
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
	name := names.DefaultInstance
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
	path := buf.TranscriptPath()
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open transcript: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("transcript: %w", err)
	}
	var prefix string
	if fi.Size() > maxResource {
		if _, err := f.Seek(fi.Size()-maxResource, io.SeekStart); err != nil {
			return nil, fmt.Errorf("transcript: %w", err)
		}
		prefix = fmt.Sprintf("[%d earlier bytes omitted: read them with serial_read since 0, or from %s]\n", fi.Size()-maxResource, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxResource))
	if err != nil {
		return nil, fmt.Errorf("read transcript: %w", err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{
		URI: req.Params.URI, MIMEType: "text/plain", Text: prefix + serial.Clean(b),
	}}}, nil
}
