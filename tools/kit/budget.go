package kit

import "github.com/modelcontextprotocol/go-sdk/mcp"

// A Budget is what a client gives its model of a result, and where it
// stops showing it, measured with each client itself (scripts/clients
// drives them against fakes of their model APIs; docs/running.md, "What
// each client shows its model").
type Budget struct {
	// Structured: the client gives its model the structured content
	// (Claude Code and Codex instead of the text, Copilot CLI after it).
	// Its text is then the summary alone: Copilot's model reads each
	// value once, and nothing is sent twice to the others.
	Structured bool
	// Page is the most bytes of console text (max_bytes) and Answer the
	// most characters of a QMP answer or packet list in one result, so
	// that the whole result stays within what the client shows.
	Page, Answer int
}

// budgets are the clients measured, by the name they declare
// (clientInfo). Every other client reads the text content only, the
// whole of it (Gemini CLI, Claude Desktop, agents built on content
// blocks), within the default budgets.
var budgets = map[string]Budget{
	// Claude Code: JSON.stringify(structuredContent); refuses a result
	// over 25,000 tokens.
	"claude-code": {Structured: true},
	// Codex CLI: "Wall time: ...\nOutput:\n" and the JSON; cuts the
	// middle of a result past 10,000 tokens (counted as 40,000 bytes).
	"codex-mcp-client": {Structured: true},
	// Copilot CLI: the text, a blank line, the JSON; a result over 20 KiB
	// is saved to a file and its model gets a 500-character preview, so
	// a page stays at 16 KiB (about 17,000
	// characters of JSON) and an answer at 16,000 characters.
	"copilot-cli": {Structured: true, Page: 16 << 10, Answer: 16000},
}

// BudgetOf is the Budget of a call's client, with the default budgets
// filled in; all gives every client the whole text (-whole-text).
func BudgetOf(req *mcp.CallToolRequest, all bool) Budget {
	var r Budget
	if req != nil {
		if ci := req.ClientInfo(); ci != nil {
			r = budgets[ci.Name]
		}
	}
	if all {
		r.Structured = false
	}
	if r.Page == 0 {
		r.Page = MaxPage
	}
	if r.Answer == 0 {
		r.Answer = AnswerBudget
	}
	return r
}

// AnswerBudget bounds the JSON of a QMP answer or a list of packets in a
// result (about 8,000 tokens): a list longer than that comes a page at a
// time, anything else that large is saved to a file.
const AnswerBudget = 24000

// MaxPage bounds the console text a result may carry (max_bytes): 32 KiB
// stays well under Claude Code's 25,000-token limit even where it
// tokenizes badly (hex dumps, line noise).
const MaxPage = 32 << 10
