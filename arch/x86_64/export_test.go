package x86_64

import "github.com/qemu-mcp/qemu-mcp/arch"

// Paging is the debugger's page walker, for the tests outside the package
// (which import the gdb client; it imports this package).
var Paging arch.Paging = debugger{}
