package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/debugger"
)

// debugProgress has the debugger's long operations (going back and forth
// through a recording) send progress notifications, when the client asks
// for them.
func (s *Server) debugProgress(ctx context.Context, req *mcp.CallToolRequest) context.Context {
	if req == nil || req.Session == nil {
		return ctx
	}
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return ctx
	}
	sess := req.Session
	return debugger.WithProgress(ctx, func(msg string, done, total uint64) {
		p := &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(done), Message: msg}
		if total > 0 {
			p.Total = float64(total)
		}
		// Best effort: a client that stopped listening must not stall
		// the search.
		_ = sess.NotifyProgress(ctx, p)
	})
}

// LastWriteInput is debug_last_write's arguments.
type LastWriteInput struct {
	Location string  `json:"location" max:"512" jsonschema:"symbol, symbol+0xOFFSET or 0xADDRESS of the data"`
	Length   int     `json:"length,omitempty" jsonschema:"bytes, 1 to 8; default the symbol's size"`
	Before   *uint64 `json:"before,omitempty" jsonschema:"icount to search before; default now"`
	Target
}

func (s *Server) debugLastWrite(ctx context.Context, req *mcp.CallToolRequest, in LastWriteInput) (*mcp.CallToolResult, debugger.LastWrite, error) {
	inst, d, err := s.debugger(in.Target)
	if err != nil {
		return nil, debugger.LastWrite{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(inst.Context(), cancel)()
	var before uint64
	if in.Before != nil {
		if *in.Before == 0 {
			return nil, debugger.LastWrite{}, fmt.Errorf("before 0: nothing runs before the first instruction")
		}
		before = *in.Before
	}
	lw, err := d.LastWrite(s.debugProgress(ctx, req), in.Location, in.Length, before)
	if err != nil {
		return nil, debugger.LastWrite{}, err
	}
	what := lw.Data
	if lw.Symbol != "" {
		what = lw.Symbol
	}
	if !lw.Found {
		return textResult(fmt.Sprintf("no earlier write to %s: %s", what, lw.Note)), lw, nil
	}
	a := lw.Access
	t := fmt.Sprintf("last write to %s before instruction %d: %s -> %s by %q at %s%s [icount %d]", what, lw.Before, a.Old, a.New, a.Text, a.Insn.String(), onHart(lw.Hart, nil), *lw.ICount)
	if bt := lw.Backtrace; bt != nil {
		var fns []string
		for _, f := range bt.Frames {
			if f.Function != "" {
				fns = append(fns, f.Function)
			}
		}
		t += "; backtrace: " + strings.Join(fns, " < ")
	}
	return textResult(t), lw, nil
}
