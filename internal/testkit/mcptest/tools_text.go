// Package mcptest holds helpers for tests that call qemu-mcp's tools
// through an MCP client.
package mcptest

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Text is the text content of a tool's result: its text blocks, one
// after another (an image block adds nothing). It is what a client that
// reads only text shows its model, and where a tool error's message is.
func Text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}
