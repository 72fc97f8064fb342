// Command qemu-mcp-clients drives the real agent clients (Claude Code, Codex CLI,
// Gemini CLI, Copilot CLI) against qemu-mcp, each pointed at a fake of its
// model API on loopback that calls the server's tools in a fixed order and
// keeps what the client sends back: the tool list each model is given and
// each tool result as the model receives it. It reports, per client, the
// tools accepted, the size of what its model saw of each result, and
// whether every value of the server's result (the console text, the QMP
// answer, the frames) reached the model. Run it with scripts/clients,
// which installs the clients.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
)

// script is what every fake model calls, in order.
var script = []step{
	{"qemu_boot", map[string]any{"wait_for": "tiny> $", "gdb": true}},
	{"serial_send", map[string]any{"data": "echo hello-42", "wait_for": "tiny> $"}},
	{"qmp_command", map[string]any{"command": "query-status"}},
	{"debug_backtrace", nil},
	{"serial_send", map[string]any{"data": "flood 200000", "wait_for": "tiny> $"}},
	// The largest page a call can ask for.
	{"serial_read", map[string]any{"since": 0, "max_bytes": 32768}},
	{"qemu_status", nil},
	{"qemu_shutdown", nil},
}

// viewBudget is what a 200 KB wait may cost in any client's view.
const viewBudget = 40000

func main() {
	if len(os.Args) > 1 && os.Args[1] == "tee" {
		os.Exit(tee(os.Args[2:]))
	}
	var (
		modules = flag.String("clients", "", "directory whose node_modules holds the clients (scripts/clients installs them)")
		server  = flag.String("server", "", "qemu-mcp binary")
		only    = flag.String("only", "", "comma-separated clients to run (default all)")
		keep    = flag.String("keep", "", "keep each client's home, requests and server log under this directory")
		timeout = flag.Duration("timeout", 4*time.Minute, "time a client gets for the whole script")
		page    = flag.Int("page", 32768, "max_bytes of the serial_read page (the largest a call can ask for)")
	)
	flag.Parse()
	for i := range script {
		if script[i].Tool == "serial_read" {
			script[i].Args["max_bytes"] = *page
		}
	}
	if *modules == "" || *server == "" {
		fmt.Fprintln(os.Stderr, "usage: agents -clients DIR -server QEMU_MCP [-only claude-code,codex,gemini-cli,copilot-cli] [-keep DIR]")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	failed := 0
	for _, c := range clients {
		if *only != "" && !slices.Contains(strings.Split(*only, ","), c.Name) {
			continue
		}
		r := run(c, *modules, self, *server, *keep, *timeout)
		r.print(os.Stdout)
		if len(r.Failures) > 0 {
			failed++
		}
	}
	if failed > 0 {
		fmt.Printf("%d client(s) failed\n", failed)
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "agents:", err)
	os.Exit(1)
}

// report is one client's run.
type report struct {
	Client, Version, API, Shows string
	Elapsed                     time.Duration
	ToolsOffered, ToolsAccepted int
	Names                       string   // how the client names the tools, e.g. mcp__qemu__qemu_boot
	SchemaChanges               []string // keywords the client dropped or added
	Lost                        []string // parameters the model got without their description
	Steps                       []stepReport
	Leftovers                   []string
	Signals                     []string // what the client sent the server
	Others                      []string // requests the fake did not model
	Failures                    []string
}

type stepReport struct {
	Tool             string
	ServerJSON       int // characters of structuredContent
	ServerText       int // characters of the text content
	ModelSaw         int // characters of what the model received
	Missing          []string
	Checks           []string
	Tokens           int
	JSONTok, TextTok int
}

func run(c client, modules, self, server, keep string, timeout time.Duration) (r report) {
	start := time.Now()
	r = report{Client: c.Name, API: c.APIName, Shows: c.Shows, Version: version(modules, c.Package)}
	defer func() { r.Elapsed = time.Since(start) }()
	fail := func(format string, a ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, a...)) }
	home, err := os.MkdirTemp(keep, "agents-"+c.Name+"-")
	if err != nil {
		fail("%v", err)
		return
	}
	if keep == "" {
		defer os.RemoveAll(home)
	}
	project := filepath.Join(home, "project")
	reqs := filepath.Join(home, "requests")
	run := filepath.Join(home, "run")
	for _, d := range []string{project, reqs} {
		os.MkdirAll(d, 0o700)
	}
	f, err := startFake(c.API, script, reqs)
	if err != nil {
		fail("%v", err)
		return
	}
	defer f.Close()
	teeLog := filepath.Join(home, "server.jsonl")
	serverEnv := map[string]string{"QEMU_MCP_RUNTIME_DIR": run, "QEMU_MCP_STATE_DIR": filepath.Join(home, "state"),
		"QEMU_MCP_LOCK_FILE": filepath.Join(home, "qemu.lock")}
	args, env, err := c.setup(home, f.URL(), []string{self, "tee", teeLog, server}, serverEnv, prompt)
	if err != nil {
		fail("%v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(modules, "node_modules", ".bin", c.Bin), args...)
	cmd.Dir = project
	cmd.Env = append(os.Environ(), append(env, "HOME="+home, "NO_COLOR=1", "CI=1")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Stdin = nil
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		fail("%s: %v\n%s", c.Bin, err, lastLines(out.String(), 15))
	}
	os.WriteFile(filepath.Join(home, "client-output.txt"), out.Bytes(), 0o644)

	srv := readTee(teeLog)
	r.Signals = srv.signals
	// The client may leave the server to end by itself after it exits.
	if srv.pid.PID != 0 {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if l, _, err := proc.Check(srv.pid); err != nil || l != proc.Alive {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	r.Leftovers = leftovers(run)

	exchanges, others := f.Exchanges()
	r.Others = others
	var last exchange
	for _, ex := range exchanges {
		if len(ex.Tools) > 0 && r.ToolsOffered == 0 {
			r.ToolsOffered = len(ex.Tools)
			r.Names, r.ToolsAccepted, r.SchemaChanges, r.Lost = compareTools(srv.tools, ex.Tools)
		}
		if len(ex.Results) >= len(last.Results) {
			last = ex
		}
	}
	if r.ToolsOffered == 0 {
		fail("the model was offered no tools")
	} else if r.ToolsAccepted != len(srv.tools) {
		fail("%d of the server's %d tools reached the model whole; parameters missing or without their description: %s",
			r.ToolsAccepted, len(srv.tools), strings.Join(r.Lost, ", "))
	}
	if len(last.Results) < len(script) {
		fail("the model received %d of the %d results", len(last.Results), len(script))
	}
	for i, st := range script {
		sr := stepReport{Tool: st.Tool}
		if i < len(srv.results) {
			sr.ServerJSON, sr.ServerText = len(srv.results[i].structured), len(srv.results[i].text)
		}
		if i >= len(last.Results) || i >= len(srv.results) {
			r.Steps = append(r.Steps, sr)
			continue
		}
		saw := last.Results[i].Text
		sr.ModelSaw = len(saw)
		res := srv.results[i]
		if res.isError {
			fail("%s: the server answered an error: %s", st.Tool, res.text)
		}
		sr.Missing = missing(res.structured, saw)
		if len(sr.Missing) > 0 {
			fail("%s: %d values of the result did not reach the model, e.g. %s", st.Tool, len(sr.Missing), sr.Missing[0])
		}
		check := func(name string, ok bool) {
			if ok {
				sr.Checks = append(sr.Checks, name)
			} else {
				fail("%s: %s did not reach the model", st.Tool, name)
			}
		}
		switch i {
		case 0:
			check("console banner", strings.Contains(saw, "qemu-mcp tiny kernel 1.0"))
			check("qemu pid", regexp.MustCompile(`\\?"pid\\?":\s*\d+`).MatchString(saw))
		case 1:
			check("echo answer", strings.Count(saw, "hello-42") >= 2)
		case 2:
			check("QMP status", regexp.MustCompile(`\\?"status\\?":\s*\\?"running`).MatchString(saw))
		case 3:
			check("frames", strings.Contains(saw, "frames") && strings.Contains(saw, "function"))
		case 4:
			check("flood end", strings.Contains(saw, "flood done 200000"))
			check(fmt.Sprintf("under %d characters", viewBudget), len(saw) < viewBudget)
		case 5:
			check(fmt.Sprintf("under %d characters", viewBudget), len(saw) < viewBudget)
		}
		r.Steps = append(r.Steps, sr)
	}
	if len(r.Leftovers) > 0 {
		fail("left in the runtime directory after the client exited: %s", strings.Join(r.Leftovers, ", "))
	}
	countTokens(modules, &r, last, srv)
	return r
}

// version is the installed version of an npm package.
func version(modules, pkg string) string {
	var p struct {
		Version string `json:"version"`
	}
	b, _ := os.ReadFile(filepath.Join(modules, "node_modules", pkg, "package.json"))
	json.Unmarshal(b, &p)
	return p.Version
}

// served is what the server sent, from the tee's log.
type served struct {
	pid     proc.Identity
	tools   map[string]json.RawMessage // input schemas by name
	results []result                   // tools/call answers in the order of the calls
	signals []string
}

type result struct {
	name       string
	structured []byte
	text       string
	isError    bool
}

func readTee(path string) served {
	var s served
	fh, err := os.Open(path)
	if err != nil {
		return s
	}
	defer fh.Close()
	calls := map[string]string{} // JSON-RPC id -> tool name
	var order []string
	answers := map[string]result{}
	sc := bufio.NewScanner(fh)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var e struct {
			Dir  string          `json:"dir"`
			Line json.RawMessage `json:"line"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		switch e.Dir {
		case "pid":
			json.Unmarshal(e.Line, &s.pid)
			continue
		case "signal":
			var sig string
			json.Unmarshal(e.Line, &sig)
			s.signals = append(s.signals, sig)
			continue
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
			Result struct {
				Tools []struct {
					Name        string          `json:"name"`
					InputSchema json.RawMessage `json:"inputSchema"`
				} `json:"tools"`
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
				Structured json.RawMessage `json:"structuredContent"`
				IsError    bool            `json:"isError"`
			} `json:"result"`
		}
		if json.Unmarshal(e.Line, &m) != nil {
			continue
		}
		id := string(m.ID)
		switch {
		case e.Dir == "in" && m.Method == "tools/call":
			calls[id] = m.Params.Name
			order = append(order, id)
		case e.Dir == "out" && len(m.Result.Tools) > 0:
			s.tools = map[string]json.RawMessage{}
			for _, t := range m.Result.Tools {
				s.tools[t.Name] = t.InputSchema
			}
		case e.Dir == "out" && calls[id] != "":
			var text strings.Builder
			for _, c := range m.Result.Content {
				text.WriteString(c.Text)
			}
			answers[id] = result{name: calls[id], structured: m.Result.Structured, text: text.String(), isError: m.Result.IsError}
		}
	}
	for _, id := range order {
		if a, ok := answers[id]; ok {
			s.results = append(s.results, a)
		}
	}
	return s
}

// compareTools finds each of the server's tools among those the model was
// given and says whether its parameters are all there, and which schema
// keywords the client changed.
func compareTools(server, model map[string]json.RawMessage) (names string, whole int, changes, lost []string) {
	kw := map[string][2]int{}
	for name, sch := range server {
		mn := modelName(model, name)
		if mn == "" {
			continue
		}
		if names == "" {
			names = strings.TrimSuffix(mn, name) + "<tool>"
		}
		var sp, mp struct {
			Properties map[string]struct {
				Description string `json:"description"`
			} `json:"properties"`
		}
		json.Unmarshal(sch, &sp)
		json.Unmarshal(model[mn], &mp)
		ok := true
		for p, ps := range sp.Properties {
			mps, found := mp.Properties[p]
			// A description may be reworded around, never lost.
			if !found || !strings.Contains(jsonInner(mps.Description), jsonInner(firstWords(ps.Description))) {
				ok = false
				lost = append(lost, name+"."+p)
			}
		}
		if ok {
			whole++
		}
		for _, k := range []string{"default", "maxLength", "maxItems", "description"} {
			c := kw[k]
			c[0] += bytes.Count(sch, []byte(`"`+k+`"`))
			c[1] += bytes.Count(model[mn], []byte(`"`+k+`"`))
			kw[k] = c
		}
	}
	for _, k := range []string{"default", "maxLength", "maxItems", "description"} {
		if c := kw[k]; c[0] != c[1] {
			changes = append(changes, fmt.Sprintf("%s %d->%d", k, c[0], c[1]))
		}
	}
	sort.Strings(lost)
	return names, whole, changes, lost
}

// firstWords is the start of a description, which a client that folds
// limits into it keeps.
func firstWords(s string) string {
	if len(s) > 40 {
		return s[:40]
	}
	return s
}

// missing lists the values of the structured content that are not in
// what the model saw, in any of the encodings a client may give them: as
// they are, as a JSON string's content, or as that again inside a JSON
// string.
func missing(structured []byte, saw string) []string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(structured))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return nil
	}
	var miss []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		case string:
			if v == "" {
				return
			}
			once := jsonInner(v)
			if !strings.Contains(saw, v) && !strings.Contains(saw, once) && !strings.Contains(saw, jsonInner(once)) {
				miss = append(miss, fmt.Sprintf("%s = %.60q", path, v))
			}
		case json.Number:
			if !strings.Contains(saw, v.String()) {
				miss = append(miss, fmt.Sprintf("%s = %s", path, v))
			}
		}
	}
	walk("", v)
	sort.Strings(miss)
	return miss
}

func jsonInner(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	q := strings.TrimSuffix(b.String(), "\n")
	return q[1 : len(q)-1]
}

// leftovers lists what is in the runtime directory besides the
// directories every server shares.
func leftovers(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// countTokens adds o200k token counts where the clients' directory has
// a tokenizer (scripts/clients installs gpt-tokenizer beside them).
func countTokens(modules string, r *report, last exchange, srv served) {
	var texts []string
	for i := range r.Steps {
		saw, js, txt := "", "", ""
		if i < len(last.Results) {
			saw = last.Results[i].Text
		}
		if i < len(srv.results) {
			js, txt = string(srv.results[i].structured), srv.results[i].text
		}
		texts = append(texts, saw, js, txt)
	}
	counts, err := tokens(modules, texts)
	if err != nil {
		return
	}
	for i := range r.Steps {
		r.Steps[i].Tokens, r.Steps[i].JSONTok, r.Steps[i].TextTok = counts[3*i], counts[3*i+1], counts[3*i+2]
	}
}

const tokenizerJS = `
const { encode } = await import(process.argv[1] + "/node_modules/gpt-tokenizer/esm/encoding/o200k_base.js");
let input = "";
for await (const c of process.stdin) input += c;
console.log(JSON.stringify(JSON.parse(input).map((s) => encode(s).length)));
`

func tokens(modules string, texts []string) ([]int, error) {
	if _, err := os.Stat(filepath.Join(modules, "node_modules", "gpt-tokenizer")); err != nil {
		return nil, err
	}
	in, _ := json.Marshal(texts)
	cmd := exec.Command(filepath.Join(modules, "node_modules", ".bin", "node"), "--input-type=module", "-e", tokenizerJS, modules)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var counts []int
	if err := json.Unmarshal(out, &counts); err != nil || len(counts) != len(texts) {
		return nil, errors.New("tokenizer: unexpected answer")
	}
	return counts, nil
}

func (r report) print(w io.Writer) {
	status := "ok"
	if len(r.Failures) > 0 {
		status = "FAILED"
	}
	fmt.Fprintf(w, "\n== %s %s (%s), %s in %.1f s\n", r.Client, r.Version, r.API, status, r.Elapsed.Seconds())
	fmt.Fprintf(w, "model sees: %s\n", r.Shows)
	changes := "unchanged"
	if len(r.SchemaChanges) > 0 {
		changes = strings.Join(r.SchemaChanges, ", ")
	}
	fmt.Fprintf(w, "tools: the model was offered %d, %d of them the server's with every parameter and its description, named %s; schema keywords (server->model): %s\n",
		r.ToolsOffered, r.ToolsAccepted, r.Names, changes)
	fmt.Fprintf(w, "%-16s %12s %12s %10s %9s  %s\n", "result", "server JSON", "server text", "model saw", "o200k", "reached the model")
	for _, s := range r.Steps {
		reached := "every value"
		if len(s.Missing) > 0 {
			reached = fmt.Sprintf("%d values missing", len(s.Missing))
		}
		if len(s.Checks) > 0 {
			reached += "; " + strings.Join(s.Checks, ", ")
		}
		tok := "-"
		if s.Tokens > 0 {
			tok = fmt.Sprint(s.Tokens)
		}
		fmt.Fprintf(w, "%-16s %12d %12d %10d %9s  %s\n", s.Tool, s.ServerJSON, s.ServerText, s.ModelSaw, tok, reached)
	}
	left := "nothing"
	if len(r.Leftovers) > 0 {
		left = strings.Join(r.Leftovers, ", ")
	}
	sigs := "no signal seen (stdin closed, or a SIGKILL)"
	if len(r.Signals) > 0 {
		sigs = strings.Join(r.Signals, ", ")
	}
	fmt.Fprintf(w, "server stopped by: %s; left in its runtime directory: %s\n", sigs, left)
	if len(r.Others) > 0 {
		fmt.Fprintf(w, "requests the fake answered 404: %s\n", strings.Join(r.Others, ", "))
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "FAIL: %s\n", f)
	}
}
