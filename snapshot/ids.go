package snapshot

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/qemu-mcp/qemu-mcp/internal/names"
	"github.com/qemu-mcp/qemu-mcp/internal/store"
)

// A save's id is store.NewID's: "<pid>-<start time>-<n>" (package
// comment). Its tag and image carry it.
func tagFor(name, id string) string    { return TagPrefix + name + "." + id }
func imageName(name, id string) string { return name + "." + id + ".qcow2" }

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
	p, err := store.WriteIntent(dir, in.Name, in.ID, b)
	if err != nil {
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
