package pcap_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The server does not link gopacket: its layers package alone brings 5 MiB
// of pointer-bearing globals that the garbage collector scans every cycle,
// a tenth of the server's CPU under a stream of tool calls. It stays a
// test-only dependency (the summaries are compared with it).
func TestServerWithoutGopacket(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../cmd/qemu-mcp").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/gopacket/") {
			t.Errorf("the server links %s", p)
		}
	}
}
