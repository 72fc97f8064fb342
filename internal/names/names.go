// Package names makes and parses the names a qemu-mcp server gives what it
// creates: the FIFOs, QMP socket and record in the runtime directory, the
// transcripts in the captures directory, and TAP devices and guest MACs.
//
// Every name carries the server's identity, its PID and its start time
// (field 22 of /proc/<pid>/stat), and the instance's name where there is one.
// PIDs repeat (a container with a persistent runtime directory starts its
// server with the same PID every time); a PID with its start time does not.
// So a server never finds its own name taken by an earlier process, and a
// reader can tell from a name alone whether its owner still runs.
//
// The names of older versions (serial-<pid>.in, qmp-<pid>.sock,
// server-<pid>.json) are still recognised, with a zero start time, so that
// their leftovers are reaped too; nothing here makes them any more.
package names

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
)

// MaxPID is PID_MAX_LIMIT: no Linux process has a larger PID, so a name
// carrying one is not ours.
const MaxPID = 1 << 22

// Owner is the server a name belongs to. StartTime is zero for the names of
// older versions, which carried the PID alone.
type Owner struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time,omitempty"`
}

// Tag is the owner's part of a name: "<pid>-<start time>", or "<pid>" for a
// legacy owner.
func (o Owner) Tag() string {
	if o.StartTime == 0 {
		return strconv.Itoa(o.PID)
	}
	return strconv.Itoa(o.PID) + "-" + strconv.FormatUint(o.StartTime, 10)
}

// Legacy reports whether the owner comes from a name of an older version.
func (o Owner) Legacy() bool { return o.StartTime == 0 }

func (o Owner) String() string { return "pid " + o.Tag() }

// DefaultInstance is the instance a tool call means when it names none.
const DefaultInstance = "default"

// MaxInstanceLen bounds instance names: they appear in file names, and a
// unix socket path has at most 107 bytes.
const MaxInstanceLen = 16

// validInstance is ^[a-z0-9][a-z0-9_-]*$, without a regexp compiled at
// start-up.
func validInstance(name string) bool {
	for i, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

// CheckInstance says what is wrong with an instance name, or nil: 1 to 16
// characters of lower-case letters, digits, '-' and '_', starting with a
// letter or digit.
func CheckInstance(name string) error {
	if len(name) == 0 || len(name) > MaxInstanceLen || !validInstance(name) {
		return fmt.Errorf("instance name %q: want 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit", clip(name), MaxInstanceLen)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Kind is what a runtime-directory entry is, judged by its exact name.
type Kind int

// The kinds of entries a server leaves. Every other name is Unknown and is
// never touched.
const (
	Unknown       Kind = iota
	SerialIn           // serial-<tag>-<instance>.in: FIFO
	SerialOut          // serial-<tag>-<instance>.out: FIFO
	QMPSocket          // qmp-<tag>-<instance>.sock: unix socket
	Record             // server-<tag>.json: regular file
	RecordTemp         // .server-<tag>.json.<hex>.tmp: regular file (a write cut short)
	GDBSocket          // gdb-<tag>-<instance>.sock: unix socket (QEMU's gdbstub)
	SnapshotStage      // snapload-<tag>-<instance>.qcow2: regular file (a snapshot's copy a QEMU loads)
	VNCSocket          // vnc-<tag>-<instance>.sock: unix socket (QEMU's VNC server)
	CaptureFIFO        // pcap-<tag>-<instance>.fifo: FIFO (QEMU's filter-dump writes a capture into it)
	ProbeDir           // probe-<tag>-<digits>: directory (a QEMU capability probe's guests, package qemu/caps)
	ReplayStage        // rrinit-<tag>-<instance>.qcow2: regular file (the copy of a recording's image a replay loads)
	ReplayConsole      // rrcon-<tag>-<instance>.log: regular file (what a replaying guest prints)
)

func (k Kind) String() string {
	switch k {
	case SerialIn:
		return "serial-in"
	case SerialOut:
		return "serial-out"
	case QMPSocket:
		return "qmp-socket"
	case Record:
		return "record"
	case RecordTemp:
		return "record-temp"
	case GDBSocket:
		return "gdb-socket"
	case SnapshotStage:
		return "snapshot-stage"
	case VNCSocket:
		return "vnc-socket"
	case CaptureFIFO:
		return "capture-fifo"
	case ProbeDir:
		return "probe-dir"
	case ReplayStage:
		return "replay-stage"
	case ReplayConsole:
		return "replay-console"
	}
	return "unknown"
}

// MarshalText names the kind in JSON.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads what MarshalText wrote; anything else is Unknown.
func (k *Kind) UnmarshalText(b []byte) error {
	*k = Unknown
	for c := SerialIn; c <= ReplayConsole; c++ {
		if c.String() == string(b) {
			*k = c
		}
	}
	return nil
}

// ProbePrefix starts a probe directory's name: ProbePrefix + the owner's
// tag + "-" is the pattern os.MkdirTemp completes with digits.
const ProbePrefix = "probe-"

// Record temporary files are ".server-<tag>.json.<hex>.tmp".
const (
	TempPrefix = ".server-"
	TempSuffix = ".tmp"
)

// Name returns the file name of the entry of kind k of owner o's instance
// (instance is ignored for records, and for a legacy owner, whose names had
// none). RecordTemp and Unknown have no fixed name: "".
func Name(k Kind, o Owner, instance string) string {
	if k == Record {
		return "server-" + o.Tag() + ".json"
	}
	for _, n := range instanceNames {
		if n.kind != k {
			continue
		}
		if o.Legacy() {
			if !n.legacy {
				return ""
			}
			return n.prefix + o.Tag() + n.suffix
		}
		return n.prefix + o.Tag() + "-" + instance + n.suffix
	}
	return ""
}

// instanceNames are the kinds whose names are <prefix><tag>-<instance><suffix>;
// legacy marks those older versions named <prefix><pid><suffix>.
var instanceNames = []struct {
	kind           Kind
	prefix, suffix string
	legacy         bool
}{
	{SerialIn, "serial-", ".in", true},
	{SerialOut, "serial-", ".out", true},
	{QMPSocket, "qmp-", ".sock", true},
	{GDBSocket, "gdb-", ".sock", false},
	{VNCSocket, "vnc-", ".sock", false},
	{CaptureFIFO, "pcap-", ".fifo", false},
	{SnapshotStage, "snapload-", ".qcow2", false},
	{ReplayStage, "rrinit-", ".qcow2", false},
	{ReplayConsole, "rrcon-", ".log", false},
}

// SerialBase is the FIFOs' common name without ".in"/".out", as QEMU's
// "-chardev pipe,path=" wants it.
func SerialBase(o Owner, instance string) string {
	return strings.TrimSuffix(Name(SerialIn, o, instance), ".in")
}

// TempName is the name of a record being written, with rnd (lower-case hex)
// making it unique.
func TempName(o Owner, rnd string) string {
	return TempPrefix + o.Tag() + ".json." + rnd + TempSuffix
}

// The kinds of files kept in the captures directory, each named
// "<kind>-<pid>-<start>-<instance>-...": KeptOwner reads the server back
// from the name.
const (
	KeptTranscript = "serial"     // the console log of one boot
	KeptCapture    = "capture"    // a packet capture
	KeptScreenshot = "screenshot" // a saved screenshot
	KeptAnswer     = "answer"     // a QMP answer too large for a result
)

// Kept is the start of the name of a kept file of kind made for owner o's
// instance; the caller adds what tells one file from another.
func Kept(kind string, o Owner, instance string) string {
	return kind + "-" + o.Tag() + "-" + instance
}

// Transcript is the file name, in the captures directory, of the complete
// console log of boot number boot of owner o's instance.
func Transcript(o Owner, instance string, boot int) string {
	return Kept(KeptTranscript, o, instance) + "-" + strconv.Itoa(boot) + ".log"
}

// KeptOwner returns the server whose kept file (see Kept) base names, if it
// names one.
func KeptOwner(base string) (Owner, bool) {
	for _, kind := range []string{KeptTranscript, KeptCapture, KeptScreenshot, KeptAnswer} {
		rest, ok := strings.CutPrefix(base, kind+"-")
		if !ok {
			continue
		}
		pidS, rest, ok := strings.Cut(rest, "-")
		if !ok {
			return Owner{}, false
		}
		startS, _, ok := strings.Cut(rest, "-")
		if !ok {
			return Owner{}, false
		}
		return parseOwner(pidS, startS)
	}
	return Owner{}, false
}

// Entry is what a runtime-directory name says.
type Entry struct {
	Owner    Owner
	Kind     Kind
	Instance string // "" for records and legacy names
}

// Classify parses an entry name: its owner, kind and instance, if the name
// is exactly one of the patterns a server uses (canonical decimal numbers,
// no leading zero, a PID in 1..MaxPID, a valid instance name). Anything
// else is not ours.
func Classify(name string) (Entry, bool) {
	for _, n := range instanceNames {
		rest, ok := strings.CutPrefix(name, n.prefix)
		if !ok {
			continue
		}
		if rest, ok := strings.CutSuffix(rest, n.suffix); ok {
			if e, ok := instanceEntry(rest, n.kind); ok && (n.legacy || !e.Owner.Legacy()) {
				return e, true
			}
		}
	}
	switch {
	case strings.HasPrefix(name, ProbePrefix):
		// probe-<pid>-<start>-<digits>, as os.MkdirTemp makes it.
		pidS, rest, _ := strings.Cut(name[len(ProbePrefix):], "-")
		startS, rnd, ok := strings.Cut(rest, "-")
		if !ok || !isDigits(rnd) || rnd == "" || len(rnd) > 20 {
			break
		}
		if o, ok := parseOwner(pidS, startS); ok {
			return Entry{Owner: o, Kind: ProbeDir}, true
		}
	case strings.HasPrefix(name, "server-"):
		if s, ok := strings.CutSuffix(name[len("server-"):], ".json"); ok {
			if o, ok := ParseTag(s); ok {
				return Entry{Owner: o, Kind: Record}, true
			}
		}
	case strings.HasPrefix(name, TempPrefix):
		rest, ok := strings.CutSuffix(name[len(TempPrefix):], TempSuffix)
		if !ok {
			break
		}
		s, rnd, ok := strings.Cut(rest, ".json.")
		if !ok || !isLowerHex(rnd) {
			break
		}
		if o, ok := ParseTag(s); ok {
			return Entry{Owner: o, Kind: RecordTemp}, true
		}
	}
	return Entry{}, false
}

// instanceEntry parses "<pid>-<start>-<instance>" or the legacy "<pid>".
func instanceEntry(s string, k Kind) (Entry, bool) {
	pidS, rest, ok := strings.Cut(s, "-")
	if !ok {
		pid, ok := ParsePID(s)
		if !ok {
			return Entry{}, false
		}
		return Entry{Owner: Owner{PID: pid}, Kind: k}, true
	}
	startS, inst, ok := strings.Cut(rest, "-")
	if !ok || CheckInstance(inst) != nil {
		return Entry{}, false
	}
	o, ok := parseOwner(pidS, startS)
	if !ok {
		return Entry{}, false
	}
	return Entry{Owner: o, Kind: k, Instance: inst}, true
}

// ParseTag is the inverse of Owner.Tag.
func ParseTag(s string) (Owner, bool) {
	pidS, startS, ok := strings.Cut(s, "-")
	if !ok {
		pid, ok := ParsePID(s)
		if !ok {
			return Owner{}, false
		}
		return Owner{PID: pid}, true
	}
	return parseOwner(pidS, startS)
}

func parseOwner(pidS, startS string) (Owner, bool) {
	pid, ok := ParsePID(pidS)
	if !ok || startS == "" || startS[0] == '0' || len(startS) > 20 || !isDigits(startS) {
		return Owner{}, false
	}
	start, err := strconv.ParseUint(startS, 10, 64)
	if err != nil {
		return Owner{}, false
	}
	return Owner{PID: pid, StartTime: start}, true
}

// ParsePID parses a canonical decimal PID: digits only, no leading zero,
// 1..MaxPID.
func ParsePID(s string) (int, bool) {
	if s == "" || len(s) > 7 || s[0] == '0' || !isDigits(s) {
		return 0, false
	}
	n, _ := strconv.Atoi(s)
	if n > MaxPID {
		return 0, false
	}
	return n, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isLowerHex(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// TAPPrefix starts every TAP name a server makes.
const TAPPrefix = "qm"

// LegacyTAP is the TAP name older versions gave the one guest of server pid.
func LegacyTAP(pid int) string { return "qmcp" + strconv.Itoa(pid) }

var tapEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// TAP is the name of the TAP device of owner o's instance: "qm" and 13
// characters of a hash of the owner and the instance. An interface name has
// at most 15 characters, too few for a PID, a start time and an instance,
// and a name must not collide with the TAP of an earlier process that had
// the same PID (a reaper deleting that one would take ours). The server
// reports the name wherever the TAP appears.
func TAP(o Owner, instance string) string {
	sum := sha256.Sum256([]byte("tap\x00" + o.Tag() + "\x00" + instance))
	return TAPPrefix + tapEncoding.EncodeToString(sum[:])[:13]
}

// GuestMAC is the MAC address of the NIC of owner o's instance: QEMU's own
// locally administered prefix 52:54:00 and three bytes of a hash of the
// owner and the instance, so guests of several instances and servers on one
// bridge do not clash.
func GuestMAC(o Owner, instance string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("mac\x00" + o.Tag() + "\x00" + instance))
	return net.HardwareAddr{0x52, 0x54, 0x00, sum[0], sum[1], sum[2]}
}

// ValidUserName reports whether name may name what a user saves (a
// snapshot, a recording): 1 to 64 letters, digits, '.', '_' or '-',
// starting with a letter or digit. Such a name is a file name as it is.
func ValidUserName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i, c := range []byte(name) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// Project names a project root's directory in a store (snapshots,
// recordings): the root's base name made safe, and a hash of its clean
// path, so two roots never share one and the name still says whose it is.
func Project(root string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(root)))
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, filepath.Base(root))
	return base + "-" + hex.EncodeToString(sum[:4])
}
