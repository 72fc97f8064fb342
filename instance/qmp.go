package instance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// ReplayCommandError is a QMP command other than a query sent to a guest
// that replays a recording: its run state, breaks and snapshots are the
// debugger's, and a change behind its back would lose its place.
type ReplayCommandError struct {
	Name, Recording, Command string
}

func (e *ReplayCommandError) Error() string {
	return fmt.Sprintf("guest %q replays recording %q: it takes only query-* commands (its debugger moves the replay)", e.Name, e.Recording)
}

func (e *ReplayCommandError) Is(target error) bool { return target == ErrReplay }

// QMP runs a QMP command for a caller outside the server: within the
// host-access boundary (Config.Boundary sees exactly the arguments that
// are sent), on the running guest, and on a replay only a query.
func (i *Instance) QMP(ctx context.Context, command string, args map[string]any) (json.RawMessage, error) {
	if err := i.mgr.policy(i.vm.config()).QMPContext(ctx, command, args); err != nil {
		return nil, err
	}
	m, err := i.Running()
	if err != nil {
		return nil, err
	}
	if rm, ok := i.Replaying(); ok && !strings.HasPrefix(command, "query-") {
		return nil, &ReplayCommandError{Name: i.name, Recording: rm.Name, Command: command}
	}
	var a any
	if args != nil {
		a = args
	}
	return m.Monitor().Execute(ctx, command, a)
}

// Advice is what a caller can do: only queries, or move the replay.
func (e *ReplayCommandError) Advice() advice.Advice {
	return advice.Advice{Action: advice.QueriesOnly, Name: e.Name, Other: e.Recording}
}
