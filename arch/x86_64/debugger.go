package x86_64

import "strconv"

// debugger is what the kernel debugger knows of x86-64: its registers and
// privilege levels (regs.go), exceptions and verdicts (verdict.go), page
// walks (pagewalk.go), instructions (disasm.go, access.go), prologues
// (prologue.go) and Linux's trap frames (frames.go).
type debugger struct{}

// hex formats v as the debugger shows addresses and values: 0x and
// lower-case digits.
func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }
