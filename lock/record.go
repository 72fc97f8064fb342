package lock

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Record is what the lock file says about its holder. The keys pid, target
// and started are those of the original server and its shell wrapper, which
// take the same lock; start_time and exe are ours: start_time tells the
// holder apart from a later process that reused its PID, and exe tells a
// human what the holder is.
type Record struct {
	// PID is the holder's process ID.
	PID int
	// Target is what the lock protects: the project root.
	Target string
	// Started is when the lock was taken.
	Started time.Time
	// StartTime is the holder's start time in clock ticks after boot
	// (field 22 of /proc/<pid>/stat); zero when the writer did not record it.
	StartTime uint64
	// Exe is the holder's executable, for messages only.
	Exe string
	// Instances names the holder's guests that the lock protects, for
	// messages only; the original's records have none.
	Instances []string
}

// Record keys, in the order Format writes them.
const (
	keyPID       = "pid"
	keyTarget    = "target"
	keyStarted   = "started"
	keyStartTime = "start_time"
	keyExe       = "exe"
	keyInstances = "instances"
)

// maxRecordSize bounds how much of a lock file is read: a record is a few
// hundred bytes, and a huge file there is garbage, not a reason to use memory.
const maxRecordSize = 64 << 10

// maxPID is the kernel's PID_MAX_LIMIT: anything above cannot be a PID.
const maxPID = 1 << 22

// maxUnixSeconds is the start of year 10000: RFC 3339 cannot write later times.
const maxUnixSeconds = 253402300800

// Format renders the record one key=value per line, so that values may
// contain spaces. A newline inside a value would end the line early and let
// the rest pose as another key, so it is written as '?': target and exe are
// for humans, nothing matches on them.
func (r Record) Format() []byte {
	var b bytes.Buffer
	started := ""
	if !r.Started.IsZero() {
		started = r.Started.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(&b, "%s=%d\n", keyPID, r.PID)
	fmt.Fprintf(&b, "%s=%s\n", keyTarget, oneLine(r.Target))
	fmt.Fprintf(&b, "%s=%s\n", keyStarted, started)
	fmt.Fprintf(&b, "%s=%d\n", keyStartTime, r.StartTime)
	fmt.Fprintf(&b, "%s=%s\n", keyExe, oneLine(r.Exe))
	if len(r.Instances) > 0 {
		fmt.Fprintf(&b, "%s=%s\n", keyInstances, oneLine(strings.Join(r.Instances, ",")))
	}
	return b.Bytes()
}

func oneLine(s string) string {
	return strings.ReplaceAll(s, "\n", "?")
}

// ParseRecord reads a lock record. It accepts Format's one key per line and
// the original wrapper's single line of space-separated key=value tokens
// ("pid=123 target=/x started=..."): a record with a single line is read as
// tokens, one with several lines as one key per line. Unknown keys, blank
// lines and '#' comments are ignored, and so are unreadable values of keys
// other than pid, which only feed messages (an unreadable start_time is
// treated as absent, which makes the liveness check less strict, never more).
// The error is non-nil when there is no usable pid, since then the record
// cannot name a holder; the Record returned with it holds what could be read.
func ParseRecord(b []byte) (Record, error) {
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return Record{}, errors.New("the lock record is empty")
	}
	fields := lines
	if len(lines) == 1 {
		fields = strings.Fields(lines[0])
	}
	var (
		rec    Record
		pidErr error
	)
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case keyPID:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > maxPID {
				rec.PID, pidErr = 0, fmt.Errorf("the lock record's pid %s is not a process ID", quoteShort(v))
				continue
			}
			rec.PID, pidErr = n, nil
		case keyTarget:
			rec.Target = v
		case keyStarted:
			rec.Started = parseTime(v)
		case keyStartTime:
			rec.StartTime, _ = strconv.ParseUint(v, 10, 64)
		case keyExe:
			rec.Exe = v
		case keyInstances:
			rec.Instances = nil
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					rec.Instances = append(rec.Instances, n)
				}
			}
		}
	}
	if rec.PID == 0 {
		if pidErr != nil {
			return rec, pidErr
		}
		return rec, errors.New("the lock record has no pid")
	}
	return rec, nil
}

// parseTime reads RFC 3339 (what Format writes), a local date-time without
// zone, or Unix seconds (what a script's `date +%s` or Python's time.time()
// would write). Anything else is the zero time: started is for messages.
func parseTime(v string) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t
	}
	if t, err := time.ParseInLocation("2006-01-02T15:04:05", v, time.Local); err == nil {
		return t
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < maxUnixSeconds) {
		return time.Time{}
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// quoteShort quotes a value for an error message without letting a garbage
// file flood it.
func quoteShort(s string) string {
	const limit = 40
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}
