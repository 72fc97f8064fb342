package qemu

import (
	"context"
	"os/exec"
	"strings"
)

// VersionLine is the first line binary --version prints ("QEMU emulator
// version 7.2.22 (...)"); "" means DefaultBinary.
func VersionLine(ctx context.Context, binary string) (string, error) {
	if binary == "" {
		binary = DefaultBinary
	}
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}
