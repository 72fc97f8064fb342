package snapshot

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
)

// newID names a save of owner o: "<pid>-<start time>-<n>" (package
// comment), n growing with the time.
func newID(o names.Owner) string {
	return o.Tag() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// parseID returns the server a save id names.
func parseID(id string) (names.Owner, bool) {
	parts := strings.Split(id, "-")
	if len(parts) != 3 || parts[2] == "" {
		return names.Owner{}, false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid < 1 || pid > names.MaxPID || strconv.Itoa(pid) != parts[0] {
		return names.Owner{}, false
	}
	start, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || start == 0 || strconv.FormatUint(start, 10) != parts[1] {
		return names.Owner{}, false
	}
	if _, err := strconv.ParseUint(parts[2], 36, 64); err != nil {
		return names.Owner{}, false
	}
	return names.Owner{PID: pid, StartTime: start}, true
}

func tagFor(name, id string) string         { return TagPrefix + name + "." + id }
func imageName(name, id string) string      { return name + "." + id + ".qcow2" }
func intentName(name, id string) string     { return "." + name + "." + id + ".intent" }
func recordTempName(name, id string) string { return "." + name + "." + id + ".json.tmp" }

// Part is one save's parts: its id, image file name and tag.
type Part struct {
	ID    string `json:"id,omitempty"`
	Image string `json:"image"`
	Tag   string `json:"tag"`
}

// Intent is what a save is about to write, made durable before it writes
// anything: if the save is killed, it tells the reaper what to remove.
type Intent struct {
	Name string `json:"name"`
	Part
	// Drives are the writable qcow2 drives the save writes Tag into.
	Drives []string `json:"drives,omitempty"`
	// Replaces is the snapshot of the name when the save began.
	Replaces *Part `json:"replaces,omitempty"`
	// Owner is the saving server.
	Owner names.Owner `json:"owner"`
}

func writeIntent(dir string, in Intent) (string, error) {
	b, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, intentName(in.Name, in.ID))
	if err := writeDurable(p, p+".tmp", b); err != nil {
		return "", fmt.Errorf("write the save's intent: %w", err)
	}
	return p, nil
}

func readIntent(path string) (Intent, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Intent{}, err
	}
	var in Intent
	if err := json.Unmarshal(b, &in); err != nil {
		return Intent{}, fmt.Errorf("intent %s: %w", path, err)
	}
	if !names.ValidUserName(in.Name) || in.Image != filepath.Base(in.Image) || (in.Replaces != nil && in.Replaces.Image != filepath.Base(in.Replaces.Image)) {
		return Intent{}, fmt.Errorf("intent %s: names files outside its directory", path)
	}
	return in, nil
}
