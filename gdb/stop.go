package gdb

import (
	"fmt"
	"strconv"
	"strings"
)

// Signal numbers as GDB numbers them (not the host's): stop replies use
// these whatever the target.
const (
	SIGINT  = 2
	SIGTRAP = 5
)

// Stop reasons.
const (
	ReasonBreakpoint = "breakpoint" // a software or hardware breakpoint, or a trap
	ReasonStep       = "step"       // a single step finished
	ReasonWatch      = "watch"      // a write watchpoint fired; Addr says where
	ReasonRWatch     = "rwatch"     // a read watchpoint fired
	ReasonAWatch     = "awatch"     // an access watchpoint fired
	ReasonSignal     = "signal"     // any other signal; SIGINT when interrupted
	ReasonExited     = "exited"     // the target exited (QEMU quit); ExitStatus says how
	ReasonTerminated = "terminated" // the target was killed by Signal
)

// A Stop is why the target stopped, decoded from a stop reply.
type Stop struct {
	// Signal is GDB's signal number: SIGTRAP (5) for breakpoints, steps
	// and watchpoints, SIGINT (2) after an interrupt or when QEMU was
	// stopped some other way (QMP "stop", a debugger connecting). For
	// "terminated" it is the signal that ended the target.
	Signal int `json:"signal"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
	// Addr is the data address that fired a watchpoint.
	Addr uint64 `json:"addr,omitempty"`
	// ExitStatus is the status of an "exited" target.
	ExitStatus int `json:"exit_status,omitempty"`
	// Thread is the stopped thread (a vCPU for QEMU, "01" for the first)
	// as the stub names it.
	Thread string `json:"thread,omitempty"`
	// Raw is the stop reply as received.
	Raw string `json:"raw"`
}

func (s Stop) String() string {
	switch s.Reason {
	case ReasonExited:
		return fmt.Sprintf("exited with status %d", s.ExitStatus)
	case ReasonTerminated:
		return fmt.Sprintf("terminated by signal %d", s.Signal)
	case ReasonWatch, ReasonRWatch, ReasonAWatch:
		return fmt.Sprintf("%s 0x%x (thread %s)", s.Reason, s.Addr, s.Thread)
	case ReasonSignal:
		return fmt.Sprintf("signal %d (thread %s)", s.Signal, s.Thread)
	}
	return fmt.Sprintf("%s (thread %s)", s.Reason, s.Thread)
}

// exited reports whether the target is gone for good.
func (s Stop) exited() bool { return s.Reason == ReasonExited || s.Reason == ReasonTerminated }

// parseStop decodes a stop reply: "S05", "T05thread:01;watch:80204148;",
// "W00", "X09;process:1". Pairs it does not know (registers, "core",
// "library") are skipped, so a richer stub still parses.
func parseStop(p []byte) (Stop, error) {
	s := Stop{Raw: string(p)}
	if !isStopReply(p) {
		return s, fmt.Errorf("%w: not a stop reply: %.60q", errMalformed, p)
	}
	n, _ := parseHexByte(p[1], p[2])
	switch p[0] {
	case 'W':
		s.Reason, s.ExitStatus = ReasonExited, int(n)
		return s, nil
	case 'X':
		s.Reason, s.Signal = ReasonTerminated, int(n)
		return s, nil
	}
	s.Signal = int(n)
	if n == SIGTRAP {
		s.Reason = ReasonBreakpoint
	} else {
		s.Reason = ReasonSignal
	}
	if p[0] == 'S' {
		return s, nil
	}
	for pair := range strings.SplitSeq(string(p[3:]), ";") {
		key, val, _ := strings.Cut(pair, ":")
		switch key {
		case "thread":
			s.Thread = val
		case "watch", "rwatch", "awatch":
			a, err := strconv.ParseUint(val, 16, 64)
			if err != nil {
				return s, fmt.Errorf("%w: %s address %q in %.60q", errMalformed, key, val, p)
			}
			s.Reason, s.Addr = key, a
		case "swbreak", "hwbreak":
			s.Reason = ReasonBreakpoint
		}
	}
	return s, nil
}
