package reaper

import (
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/registry"
)

// Kind is what a runtime-directory entry is, judged by its exact name.
type Kind int

// The kinds of entries a server leaves. Every other name is Unknown and is
// never touched.
const (
	Unknown    Kind = iota
	SerialIn        // serial-<pid>.in: FIFO
	SerialOut       // serial-<pid>.out: FIFO
	QMPSocket       // qmp-<pid>.sock: unix socket
	Record          // server-<pid>.json: regular file
	RecordTemp      // .server-<pid>.json.<hex>.tmp: regular file (a Write cut short)
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
	}
	return "unknown"
}

// MarshalText names the kind in JSON.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads what MarshalText wrote; anything else is Unknown.
func (k *Kind) UnmarshalText(b []byte) error {
	*k = Unknown
	for c := SerialIn; c <= RecordTemp; c++ {
		if c.String() == string(b) {
			*k = c
		}
	}
	return nil
}

// FileType is the file type an entry of that kind must have to be removed.
type FileType string

// File types, as Lstat sees them (a symlink is never followed).
const (
	TypeFIFO    FileType = "fifo"
	TypeSocket  FileType = "socket"
	TypeRegular FileType = "regular file"
	TypeSymlink FileType = "symlink"
	TypeDir     FileType = "directory"
	TypeOther   FileType = "other"
)

// Want returns the only file type an entry of kind k may be removed as.
func (k Kind) Want() FileType {
	switch k {
	case SerialIn, SerialOut:
		return TypeFIFO
	case QMPSocket:
		return TypeSocket
	case Record, RecordTemp:
		return TypeRegular
	}
	return ""
}

// Name returns the file name of the entry of kind k owned by pid (not for
// RecordTemp, whose name has a random part, nor Unknown).
func Name(k Kind, pid int) string {
	p := strconv.Itoa(pid)
	switch k {
	case SerialIn:
		return "serial-" + p + ".in"
	case SerialOut:
		return "serial-" + p + ".out"
	case QMPSocket:
		return "qmp-" + p + ".sock"
	case Record:
		return registry.FileName(pid)
	}
	return ""
}

// Classify parses an entry name: the owner PID and the kind, if the name is
// exactly one of the patterns a server uses (canonical decimal PID, no
// leading zero, 1..registry.MaxPID). Anything else is not ours.
func Classify(name string) (pid int, kind Kind, ok bool) {
	switch {
	case strings.HasPrefix(name, "serial-"):
		rest := name[len("serial-"):]
		if s, ok := strings.CutSuffix(rest, ".in"); ok {
			return pidKind(s, SerialIn)
		}
		if s, ok := strings.CutSuffix(rest, ".out"); ok {
			return pidKind(s, SerialOut)
		}
	case strings.HasPrefix(name, "qmp-"):
		if s, ok := strings.CutSuffix(name[len("qmp-"):], ".sock"); ok {
			return pidKind(s, QMPSocket)
		}
	case strings.HasPrefix(name, "server-"):
		if s, ok := strings.CutSuffix(name[len("server-"):], ".json"); ok {
			return pidKind(s, Record)
		}
	case strings.HasPrefix(name, registry.TempPrefix):
		rest, ok := strings.CutSuffix(name[len(registry.TempPrefix):], registry.TempSuffix)
		if !ok {
			break
		}
		s, rnd, ok := strings.Cut(rest, ".json.")
		if !ok || !isLowerHex(rnd) {
			break
		}
		return pidKind(s, RecordTemp)
	}
	return 0, Unknown, false
}

func pidKind(s string, k Kind) (int, Kind, bool) {
	pid, ok := registry.ParsePID(s)
	if !ok {
		return 0, Unknown, false
	}
	return pid, k, true
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
