package x86_64

import "strconv"

// debugger is what the kernel debugger knows of x86-64, built a part at a
// time (instructions, page walks, traps, Linux's frames): Arch.Debugger
// returns it once every part of arch.Debugger is there.
type debugger struct{}

// hex formats v as the debugger shows addresses and values: 0x and
// lower-case digits.
func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }
