package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The official MCP TypeScript SDK client drives the real server over stdio
// (scripts/ts-client/check.mjs): result sizes, the output once, paging
// through every byte, waits after the echo, default waits that end as
// timed_out within 60 s, schemas without nullable unions.
func TestTypeScriptClient(t *testing.T) {
	needQEMU(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found: run scripts/deps (installs nodejs and npm)")
	}
	dir := os.Getenv("QEMU_MCP_TS_CLIENT")
	if dir == "" {
		out, err := exec.Command("../../scripts/ts-client/setup").Output()
		if err != nil {
			t.Skipf("the TypeScript SDK client is not installed: run scripts/ts-client/setup (scripts/test does): %v", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		dir = lines[len(lines)-1]
	}
	rt := runtimeDir(t)
	cmd := exec.Command(node, filepath.Join(dir, "check.mjs"), os.Args[0])
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "QEMU_MCP_TEST_MAIN=server", "QEMU_MCP_RUNTIME_DIR="+rt,
		"QEMU_MCP_LOCK_FILE="+rt+".lock", "QEMU_MCP_STATE_DIR="+rt+".state")
	cmd.Stderr = &logWriter{t: t}
	out, err := cmd.Output()
	var report struct {
		Sizes    map[string]float64 `json:"sizes"`
		Failures []string           `json:"failures"`
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("check.mjs: %v (%v)\n%s", err, jerr, out)
	}
	for k, v := range report.Sizes {
		if !strings.HasPrefix(k, "serial_read {\"since\"") {
			t.Logf("%s: %v", k, v)
		}
	}
	for _, f := range report.Failures {
		t.Error(f)
	}
	if err != nil && len(report.Failures) == 0 {
		t.Errorf("check.mjs: %v", err)
	}
}
