package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// step is one tool call the fake model makes, by the server's tool name.
type step struct {
	Tool string
	Args map[string]any
}

// api is one model API's wire format: how a request names its tools and
// carries the results of earlier calls, and how an answer calls a tool or
// says something.
type api interface {
	// parse reads a request: the tools it offers (names as the model sees
	// them, with their parameter schemas) and the results of tool calls so
	// far, in order.
	parse(body []byte) (tools map[string]json.RawMessage, results []seen, err error)
	// answer writes a reply calling tool (as the model knows it) with
	// args, or, with tool empty, saying text.
	answer(w http.ResponseWriter, r *http.Request, n int, tool string, args map[string]any, text string)
}

// seen is a tool result as the model receives it: the JSON of what its
// request carries for it, and the text a model reads there.
type seen struct {
	Raw  json.RawMessage
	Text string
}

// exchange is one request the fake answered.
type exchange struct {
	Path    string
	Tools   map[string]json.RawMessage
	Results []seen
	Called  string // the tool called in the answer, if any
}

// fake is a model API on loopback that calls the script's tools in order
// (each request carries the results so far) and then says done; it keeps
// every request whole in dir.
type fake struct {
	api    api
	script []step
	dir    string

	mu        sync.Mutex
	exchanges []exchange
	others    []string // requests the fake does not model, answered 404
	ln        net.Listener
	srv       *http.Server
}

func startFake(a api, script []step, dir string) (*fake, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fake{api: a, script: script, dir: dir, ln: ln}
	f.srv = &http.Server{Handler: f}
	go f.srv.Serve(ln)
	return f, nil
}

func (f *fake) URL() string { return "http://" + f.ln.Addr().String() }

func (f *fake) Close() { f.srv.Close() }

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.exchanges) + len(f.others)
	f.mu.Unlock()
	os.WriteFile(filepath.Join(f.dir, fmt.Sprintf("request-%03d.json", n)), body, 0o644)
	if !modelRequest(r) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
			// Copilot CLI asks which models the provider has.
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model","created":0,"owned_by":"fake"}]}`)
			return
		}
		if strings.HasSuffix(r.URL.Path, ":countTokens") || strings.HasSuffix(r.URL.Path, "/count_tokens") {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"totalTokens":100,"input_tokens":100}`)
			return
		}
		f.mu.Lock()
		f.others = append(f.others, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	tools, results, err := f.api.parse(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ex := exchange{Path: r.URL.Path, Tools: tools, Results: results}
	// A request without tools is the client's own side question (a
	// title, whether to go on): answered in a way that ends it.
	if len(tools) > 0 && len(results) < len(f.script) {
		st := f.script[len(results)]
		if name := modelName(tools, st.Tool); name != "" {
			ex.Called = name
			f.api.answer(w, r, n, name, st.Args, "")
		} else {
			f.api.answer(w, r, n, "", nil, "the tool "+st.Tool+" is not offered")
		}
	} else {
		f.api.answer(w, r, n, "", nil, `{"reasoning":"the script is done","next_speaker":"user"}`)
	}
	f.mu.Lock()
	f.exchanges = append(f.exchanges, ex)
	f.mu.Unlock()
}

// modelRequest says whether r asks the model to answer.
func modelRequest(r *http.Request) bool {
	p := r.URL.Path
	return r.Method == http.MethodPost && (strings.HasSuffix(p, "/messages") || strings.HasSuffix(p, "/responses") ||
		strings.HasSuffix(p, "/chat/completions") || strings.HasSuffix(p, ":streamGenerateContent") || strings.HasSuffix(p, ":generateContent"))
}

// modelName is the name a client gave the server's tool: the name itself
// or the name after the client's prefix (mcp__qemu__, qemu__, ...).
func modelName(tools map[string]json.RawMessage, tool string) string {
	if _, ok := tools[tool]; ok {
		return tool
	}
	for name := range tools {
		if rest, ok := strings.CutSuffix(name, tool); ok && rest != "" && strings.ContainsAny(rest[len(rest)-1:], "_-.:/") && strings.Contains(rest, "qemu") {
			return name
		}
	}
	return ""
}

// Exchanges returns the requests answered so far.
func (f *fake) Exchanges() ([]exchange, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]exchange(nil), f.exchanges...), append([]string(nil), f.others...)
}

func sse(w http.ResponseWriter) func(event string, data any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	return func(event string, data any) {
		b, _ := json.Marshal(data)
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
}

func argsJSON(args map[string]any) string {
	if args == nil {
		args = map[string]any{}
	}
	b, _ := json.Marshal(args)
	return string(b)
}

// textOf is the text a model reads in a tool result's content: a string,
// or the text parts of a list of parts.
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []map[string]any
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if t, ok := p["text"].(string); ok {
				b.WriteString(t)
			} else {
				pb, _ := json.Marshal(p)
				b.Write(pb)
			}
		}
		return b.String()
	}
	return string(raw)
}

// parseRequest decodes body as the API's request R; read fills tools with
// the tools it offers and returns the tool results it carries, in order.
func parseRequest[R any](body []byte, read func(req *R, tools map[string]json.RawMessage) []seen) (map[string]json.RawMessage, []seen, error) {
	var req R
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, err
	}
	tools := map[string]json.RawMessage{}
	return tools, read(&req, tools), nil
}

// seenOf is a tool result whose text is textOf its JSON.
func seenOf(raw json.RawMessage) seen { return seen{Raw: raw, Text: textOf(raw)} }

// anthropic is the Messages API (Claude Code).
type anthropic struct{}

type anthropicRequest struct {
	Tools []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (anthropic) parse(body []byte) (map[string]json.RawMessage, []seen, error) {
	return parseRequest(body, func(req *anthropicRequest, tools map[string]json.RawMessage) (res []seen) {
		for _, t := range req.Tools {
			tools[t.Name] = t.InputSchema
		}
		for _, m := range req.Messages {
			var blocks []struct {
				Type    string          `json:"type"`
				Content json.RawMessage `json:"content"`
			}
			if json.Unmarshal(m.Content, &blocks) != nil {
				continue
			}
			for _, b := range blocks {
				if b.Type == "tool_result" {
					res = append(res, seenOf(b.Content))
				}
			}
		}
		return res
	})
}

func (anthropic) answer(w http.ResponseWriter, r *http.Request, n int, tool string, args map[string]any, text string) {
	send := sse(w)
	id := fmt.Sprintf("msg_%d", n)
	send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": "fake-model", "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 100, "output_tokens": 1}}})
	stop := "end_turn"
	if tool != "" {
		stop = "tool_use"
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", n), "name": tool, "input": map[string]any{}}})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": argsJSON(args)}})
	} else {
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": text}})
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": 10}})
	send("message_stop", map[string]any{"type": "message_stop"})
}

// function is a tool as OpenAI's APIs declare it.
type function struct {
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters"`
}

// responses is OpenAI's Responses API over SSE (Codex CLI).
type responses struct{}

type responsesRequest struct {
	Tools []struct {
		function
		Type string `json:"type"`
		// A namespace of tools (an MCP server's) nests them.
		Tools []function `json:"tools"`
	} `json:"tools"`
	Input []struct {
		Type   string          `json:"type"`
		Output json.RawMessage `json:"output"`
	} `json:"input"`
}

func (responses) parse(body []byte) (map[string]json.RawMessage, []seen, error) {
	return parseRequest(body, func(req *responsesRequest, tools map[string]json.RawMessage) (res []seen) {
		for _, t := range req.Tools {
			if t.Name != "" {
				tools[t.Name] = t.Parameters
			}
			for _, nt := range t.Tools {
				tools[t.Name+"."+nt.Name] = nt.Parameters
			}
		}
		for _, it := range req.Input {
			if it.Type == "function_call_output" || it.Type == "custom_tool_call_output" {
				res = append(res, seenOf(it.Output))
			}
		}
		return res
	})
}

func (responses) answer(w http.ResponseWriter, r *http.Request, n int, tool string, args map[string]any, text string) {
	send := sse(w)
	id := fmt.Sprintf("resp_%d", n)
	send("response.created", map[string]any{"type": "response.created", "response": map[string]any{"id": id}})
	var item map[string]any
	if tool != "" {
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", n), "call_id": fmt.Sprintf("call_%d", n),
			"name": tool, "arguments": argsJSON(args), "status": "completed"}
		if ns, name, ok := strings.Cut(tool, "."); ok {
			item["namespace"], item["name"] = ns, name
		}
	} else {
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_%d", n), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	}
	send("response.output_item.added", map[string]any{"type": "response.output_item.added", "output_index": 0, "item": item})
	send("response.output_item.done", map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	send("response.completed", map[string]any{"type": "response.completed", "response": map[string]any{"id": id,
		"usage": map[string]any{"input_tokens": 100, "input_tokens_details": nil, "output_tokens": 10, "output_tokens_details": nil, "total_tokens": 110}}})
}

// chat is OpenAI's Chat Completions API, streamed (Copilot CLI).
type chat struct{}

type chatRequest struct {
	Tools []struct {
		Function function `json:"function"`
	} `json:"tools"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (chat) parse(body []byte) (map[string]json.RawMessage, []seen, error) {
	return parseRequest(body, func(req *chatRequest, tools map[string]json.RawMessage) (res []seen) {
		for _, t := range req.Tools {
			tools[t.Function.Name] = t.Function.Parameters
		}
		for _, m := range req.Messages {
			if m.Role == "tool" {
				res = append(res, seenOf(m.Content))
			}
		}
		return res
	})
}

func (chat) answer(w http.ResponseWriter, r *http.Request, n int, tool string, args map[string]any, text string) {
	send := sse(w)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	if tool != "" {
		send("", chunk(map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"index": 0, "id": fmt.Sprintf("call_%d", n),
			"type": "function", "function": map[string]any{"name": tool, "arguments": argsJSON(args)}}}}, nil))
		send("", chunk(map[string]any{}, "tool_calls"))
	} else {
		send("", chunk(map[string]any{"role": "assistant", "content": text}, nil))
		send("", chunk(map[string]any{}, "stop"))
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// gemini is the Gemini API (Gemini CLI).
type gemini struct{}

type geminiRequest struct {
	Tools []struct {
		FunctionDeclarations []struct {
			Name                 string          `json:"name"`
			Parameters           json.RawMessage `json:"parameters"`
			ParametersJSONSchema json.RawMessage `json:"parametersJsonSchema"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
	Contents []struct {
		Parts []struct {
			FunctionResponse *struct {
				Response json.RawMessage `json:"response"`
				Parts    json.RawMessage `json:"parts"`
			} `json:"functionResponse"`
		} `json:"parts"`
	} `json:"contents"`
}

func (gemini) parse(body []byte) (map[string]json.RawMessage, []seen, error) {
	return parseRequest(body, func(req *geminiRequest, tools map[string]json.RawMessage) (res []seen) {
		for _, t := range req.Tools {
			for _, d := range t.FunctionDeclarations {
				p := d.ParametersJSONSchema
				if p == nil {
					p = d.Parameters
				}
				tools[d.Name] = p
			}
		}
		for _, c := range req.Contents {
			for _, p := range c.Parts {
				if fr := p.FunctionResponse; fr != nil {
					res = append(res, seen{Raw: fr.Response, Text: geminiText(fr.Response)})
				}
			}
		}
		return res
	})
}

// geminiText is the text a model reads in a function response: its
// output, content and error, else the response's JSON itself.
func geminiText(raw json.RawMessage) string {
	var resp map[string]json.RawMessage
	if json.Unmarshal(raw, &resp) == nil {
		var b strings.Builder
		for _, k := range []string{"output", "content", "error"} {
			if v, ok := resp[k]; ok {
				b.WriteString(textOf(v))
			}
		}
		if b.Len() > 0 {
			return b.String()
		}
	}
	return string(raw)
}

func (gemini) answer(w http.ResponseWriter, r *http.Request, n int, tool string, args map[string]any, text string) {
	var part map[string]any
	if tool != "" {
		if args == nil {
			args = map[string]any{}
		}
		part = map[string]any{"functionCall": map[string]any{"name": tool, "args": args}}
	} else {
		part = map[string]any{"text": text}
	}
	resp := map[string]any{"candidates": []any{map[string]any{"content": map[string]any{"role": "model", "parts": []any{part}},
		"finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110},
		"modelVersion":  "fake-model"}
	if strings.HasSuffix(r.URL.Path, ":streamGenerateContent") {
		sse(w)("", resp)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}
