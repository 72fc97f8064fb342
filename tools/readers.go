package tools

import "github.com/modelcontextprotocol/go-sdk/mcp"

// A reader is what a client gives its model of a result, and where it
// stops showing it, measured with each client itself (scripts/clients
// drives them against fakes of their model APIs; README, "Use with").
type reader struct {
	// structured: the client gives its model the structured content
	// (Claude Code and Codex instead of the text, Copilot CLI after it).
	// Its text is then the summary alone: Copilot's model reads each
	// value once, and nothing is sent twice to the others.
	structured bool
	// page is the most bytes of console text (max_bytes) and answer the
	// most characters of a QMP answer or packet list in one result, so
	// that the whole result stays within what the client shows.
	page, answer int
}

// readers are the clients measured, by the name they declare
// (clientInfo). Every other client reads the text content only, the
// whole of it (Gemini CLI, Claude Desktop, agents built on content
// blocks), within the default budgets.
var readers = map[string]reader{
	// Claude Code: JSON.stringify(structuredContent); refuses a result
	// over 25,000 tokens.
	"claude-code": {structured: true},
	// Codex CLI: "Wall time: ...\nOutput:\n" and the JSON; cuts the
	// middle of a result past 10,000 tokens (counted as 40,000 bytes).
	"codex-mcp-client": {structured: true},
	// Copilot CLI: the text, a blank line, the JSON; a result over 20 KiB
	// is saved to a file and its model gets a 500-character preview, so
	// a page stays at 16 KiB (about 17,000
	// characters of JSON) and an answer at 16,000 characters.
	"copilot-cli": {structured: true, page: 16 << 10, answer: 16000},
}

// readerOf is the reader of a call's client, with the default budgets
// filled in; all gives every client the whole text (-whole-text).
func readerOf(req *mcp.CallToolRequest, all bool) reader {
	var r reader
	if req != nil {
		if ci := req.ClientInfo(); ci != nil {
			r = readers[ci.Name]
		}
	}
	if all {
		r.structured = false
	}
	if r.page == 0 {
		r.page = maxMaxBytes
	}
	if r.answer == 0 {
		r.answer = answerBudget
	}
	return r
}

// answerBudget bounds the JSON of a QMP answer or a list of packets in a
// result (about 8,000 tokens): a list longer than that comes a page at a
// time, anything else that large is saved to a file.
const answerBudget = 24000

// reader is the reader of req's client under this server's settings,
// decided once per call (see Server.calls).
func (s *Server) reader(req *mcp.CallToolRequest) reader {
	if r, ok := s.calls.Load(req); ok {
		return r.(reader)
	}
	return readerOf(req, s.cfg.WholeText)
}
