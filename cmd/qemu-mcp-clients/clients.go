package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// client is one agent client: how to point it at the fake model and at
// the server, and how to run it once, non-interactively.
type client struct {
	Name    string
	Package string // its npm package, for the version
	Bin     string // its command in node_modules/.bin
	API     api
	APIName string
	// Shows says what the client gives its model of a result (measured;
	// the report checks it).
	Shows string
	// setup writes the client's configuration under home and returns its
	// arguments and environment.
	setup func(home, fakeURL string, server []string, serverEnv map[string]string, prompt string) ([]string, []string, error)
}

const prompt = "Drive the qemu guest with its tools."

var clients = []client{
	{
		Name: "claude-code", Package: "@anthropic-ai/claude-code", Bin: "claude", API: anthropic{}, APIName: "Anthropic Messages",
		Shows: "JSON.stringify(structuredContent); the text content is dropped",
		setup: func(home, url string, server []string, env map[string]string, prompt string) ([]string, []string, error) {
			cfg := filepath.Join(home, "mcp.json")
			if err := writeJSON(cfg, map[string]any{"mcpServers": map[string]any{"qemu": map[string]any{
				"type": "stdio", "command": server[0], "args": server[1:], "env": env}}}); err != nil {
				return nil, nil, err
			}
			return []string{"-p", prompt, "--mcp-config", cfg, "--strict-mcp-config", "--allowedTools", "mcp__qemu",
					"--output-format", "stream-json", "--verbose"},
				[]string{"ANTHROPIC_BASE_URL=" + url, "ANTHROPIC_API_KEY=dummy", "CLAUDE_CONFIG_DIR=" + filepath.Join(home, ".claude"),
					"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
					// Since 2.1.x MCP tools are deferred behind ToolSearch by
					// default; listed up front, the request shows them whole.
					"ENABLE_TOOL_SEARCH=false"}, nil
		},
	},
	{
		Name: "codex", Package: "@openai/codex", Bin: "codex", API: responses{}, APIName: "OpenAI Responses (SSE)",
		Shows: "\"Wall time: ...\\nOutput:\\n\" and the JSON of structuredContent; the text content is dropped",
		setup: func(home, url string, server []string, env map[string]string, prompt string) ([]string, []string, error) {
			dir := filepath.Join(home, ".codex")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, nil, err
			}
			var b strings.Builder
			// The known models (gpt-5.5 ...) defer MCP tools behind a
			// tool search, so the request would not show them; an unknown
			// model lists them up front, and is given the known models'
			// truncation of tool output (10,000 tokens, counted as 4
			// bytes each) instead of its smaller default, so results are
			// cut where users meet it.
			b.WriteString("model = \"fake-model\"\nmodel_provider = \"fake\"\ntool_output_token_limit = 10000\n\n")
			b.WriteString("[model_providers.fake]\nname = \"fake\"\n")
			b.WriteString("base_url = " + strconv.Quote(url+"/v1") + "\nwire_api = \"responses\"\nenv_key = \"FAKE_API_KEY\"\n\n")
			b.WriteString("[mcp_servers.qemu]\ncommand = " + strconv.Quote(server[0]) + "\nargs = [")
			for i, a := range server[1:] {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(strconv.Quote(a))
			}
			b.WriteString("]\nstartup_timeout_sec = 30\ntool_timeout_sec = 120\n\n[mcp_servers.qemu.env]\n")
			for k, v := range env {
				b.WriteString(k + " = " + strconv.Quote(v) + "\n")
			}
			if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(b.String()), 0o600); err != nil {
				return nil, nil, err
			}
			return []string{"exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json", prompt},
				[]string{"CODEX_HOME=" + dir, "FAKE_API_KEY=dummy"}, nil
		},
	},
	{
		Name: "gemini-cli", Package: "@google/gemini-cli", Bin: "gemini", API: gemini{}, APIName: "Gemini",
		Shows: "the text content only",
		setup: func(home, url string, server []string, env map[string]string, prompt string) ([]string, []string, error) {
			if err := writeJSON(filepath.Join(home, ".gemini", "settings.json"), map[string]any{
				"mcpServers": map[string]any{"qemu": map[string]any{"command": server[0], "args": server[1:], "env": env,
					"timeout": 120000, "trust": true}},
				// Untrusted folders get no MCP servers (gemini mcp list:
				// Disabled); the project here is a fresh directory.
				"security": map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}, "folderTrust": map[string]any{"enabled": false}},
				"general":  map[string]any{"disableAutoUpdate": true},
				"privacy":  map[string]any{"usageStatisticsEnabled": false},
			}); err != nil {
				return nil, nil, err
			}
			return []string{"-p", prompt, "--yolo", "--output-format", "json"},
				[]string{"GEMINI_CLI_HOME=" + home, "GEMINI_API_KEY=dummy", "GOOGLE_GEMINI_BASE_URL=" + url}, nil
		},
	},
	{
		Name: "copilot-cli", Package: "@github/copilot", Bin: "copilot", API: chat{}, APIName: "OpenAI Chat Completions",
		Shows: "the text content, a blank line, then the JSON of structuredContent",
		setup: func(home, url string, server []string, env map[string]string, prompt string) ([]string, []string, error) {
			cfg := filepath.Join(home, "mcp.json")
			if err := writeJSON(cfg, map[string]any{"mcpServers": map[string]any{"qemu": map[string]any{
				"type": "local", "command": server[0], "args": server[1:], "env": env, "tools": []string{"*"}}}}); err != nil {
				return nil, nil, err
			}
			return []string{"-p", prompt, "--additional-mcp-config", "@" + cfg, "--allow-all-tools", "--disable-builtin-mcps",
					"--no-auto-update", "--output-format", "json"},
				[]string{"COPILOT_PROVIDER_BASE_URL=" + url + "/v1", "COPILOT_PROVIDER_API_KEY=dummy", "COPILOT_MODEL=fake-model",
					"COPILOT_OFFLINE=1", "COPILOT_HOME=" + filepath.Join(home, ".copilot")}, nil
		},
	},
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
