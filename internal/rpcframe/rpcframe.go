// Package rpcframe is the framing of MCP over stdio: one JSON-RPC message
// per line. Filter sits between the client's stream and the MCP SDK, which
// ends the session at the first byte it cannot decode; here a line that is
// not one well-formed JSON-RPC message is answered the way JSON-RPC says
// (-32700 parse error, -32600 invalid request) and dropped, and the session
// goes on. A line longer than the limit is answered, with its id, and
// skipped without being held in memory.
package rpcframe

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// JSON-RPC error codes.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
)

// DefaultMaxLine bounds a message: the same 4 MiB the SDK's HTTP transport
// accepts in a request body.
const DefaultMaxLine = 4 << 20

// Writer serialises whole messages to the client: the SDK's and the
// filter's answers must never interleave within a line.
type Writer struct {
	mu sync.Mutex
	w  io.WriteCloser
}

// NewWriter wraps w.
func NewWriter(w io.WriteCloser) *Writer { return &Writer{w: w} }

// Write writes p (one or more whole lines) at once.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// Close closes the underlying writer.
func (w *Writer) Close() error { return w.w.Close() }

// Filter reads lines from r and returns a reader of only the well-formed
// JSON-RPC messages among them, each on its own line; the rest are answered
// on out. maxLine bounds a line (0 means DefaultMaxLine).
func Filter(r io.Reader, out io.Writer, maxLine int) io.ReadCloser {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(filter(bufio.NewReaderSize(r, 64<<10), pw, out, maxLine))
	}()
	return pr
}

func filter(r *bufio.Reader, pass io.Writer, out io.Writer, maxLine int) error {
	for {
		line, over, id, err := readLine(r, maxLine)
		if over {
			if werr := answer(out, id, CodeInvalidRequest, fmt.Sprintf("message longer than %d bytes: refused", maxLine)); werr != nil {
				return werr
			}
		} else if msg := bytes.TrimSpace(line); len(msg) > 0 {
			id, code, reason := Check(msg)
			if code == 0 {
				if _, werr := pass.Write(append(msg, '\n')); werr != nil {
					return werr
				}
			} else if werr := answer(out, id, code, reason); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// readLine reads one line without its newline; a line over max is skipped
// to its end and reported as over, with its top-level id when it has a
// usable one (scanned as it streams by, never held).
func readLine(r *bufio.Reader, max int) (line []byte, over bool, id json.RawMessage, err error) {
	var scan *idScanner
	for {
		frag, err := r.ReadSlice('\n')
		if !over && len(line)+len(frag) > max+1 {
			over = true
			scan = &idScanner{}
			scan.feed(line)
			line = nil
		}
		if over {
			scan.feed(frag)
		} else {
			line = append(line, frag...)
		}
		if err == nil {
			if over {
				return nil, true, scan.ID(), nil
			}
			return bytes.TrimSuffix(line, []byte("\n")), false, nil, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if over {
				return nil, true, scan.ID(), err
			}
			return line, false, nil, err
		}
	}
}

// Check says whether msg is one JSON-RPC 2.0 message (a request, a
// notification or a response): code 0, or the error code to answer with,
// the reason, and the message's id when it has a usable one.
func Check(msg []byte) (id json.RawMessage, code int, reason string) {
	// Nearly every line is an ordinary message: one pass over it, no
	// allocation (the full check decodes it three times, the SDK's decoder
	// with a 32 KiB buffer, and the SDK decodes it once more after).
	if fastAccept(msg) {
		return nil, 0, ""
	}
	return checkFull(msg)
}

// checkFull is Check by decoding: every verdict and every reason.
func checkFull(msg []byte) (id json.RawMessage, code int, reason string) {
	if !json.Valid(msg) {
		return nil, CodeParseError, "parse error: the line is not JSON"
	}
	if msg[0] == '[' {
		return nil, CodeInvalidRequest, "invalid request: batches are not supported"
	}
	if msg[0] != '{' {
		return nil, CodeInvalidRequest, "invalid request: a message is a JSON object"
	}
	var m struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  json.RawMessage `json:"method"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return nil, CodeInvalidRequest, "invalid request: " + err.Error()
	}
	if len(m.ID) > 0 {
		switch m.ID[0] {
		case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			id = m.ID
		case 'n': // null
		default:
			return nil, CodeInvalidRequest, "invalid request: id must be a string or a number"
		}
	}
	switch {
	case m.JSONRPC == nil || *m.JSONRPC != "2.0":
		return id, CodeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`
	case len(m.Method) > 0:
		if m.Method[0] != '"' {
			return id, CodeInvalidRequest, "invalid request: method must be a string"
		}
	case len(m.Result) > 0 || len(m.Error) > 0:
		if id == nil {
			return nil, CodeInvalidRequest, "invalid request: a response needs an id"
		}
	default:
		return id, CodeInvalidRequest, "invalid request: neither a request (method) nor a response (result or error)"
	}
	// Last, what the SDK makes of it: a message it cannot decode (an id
	// of 1e400, an error that is not an object) would end its session.
	if _, err := jsonrpc.DecodeMessage(msg); err != nil {
		if _, bad := intID(id); bad {
			id = nil
		}
		return id, CodeInvalidRequest, "invalid request: " + shorten(err.Error(), 200)
	}
	return nil, 0, ""
}

// intID tells whether a numeric id is an integer that fits an int64, as
// MCP requires; bad is true for any other number.
func intID(id json.RawMessage) (n int64, bad bool) {
	if len(id) == 0 || id[0] == '"' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(id), 10, 64)
	return n, err != nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// answer writes a JSON-RPC error response.
func answer(out io.Writer, id json.RawMessage, code int, message string) error {
	if id == nil {
		id = json.RawMessage("null")
	}
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: rpcError{code, message}})
	_, err := out.Write(append(b, '\n'))
	return err
}
