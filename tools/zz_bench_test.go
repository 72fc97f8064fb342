package tools_test

import (
	"os"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/tools"
)

func BenchmarkNewMCPServer(b *testing.B) {
	dir := b.TempDir()
	os.Chmod(dir, 0o700)
	srv, err := tools.New(tools.Config{RuntimeDir: dir, Version: "test"})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		srv.NewMCPServer()
	}
}
