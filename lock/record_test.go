package lock

import (
	"strings"
	"testing"
	"time"
)

func TestRecordRoundTrip(t *testing.T) {
	in := Record{
		PID:       4242,
		Target:    "/home/me/my project",
		Started:   time.Date(2026, 2, 23, 10, 0, 0, 0, time.UTC),
		StartTime: 987654,
		Exe:       "/usr/local/bin/qemu-mcp",
	}
	b := in.Format()
	if !strings.HasPrefix(string(b), "pid=4242\n") || strings.Count(string(b), "\n") != 5 {
		t.Errorf("Format = %q", b)
	}
	out, err := ParseRecord(b)
	if err != nil || !recordsEqual(in, out) {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	// A newline in a value cannot forge another key.
	evil := Record{PID: 7, Target: "/x\npid=1"}
	out, err = ParseRecord(evil.Format())
	if err != nil || out.PID != 7 {
		t.Errorf("newline in target: %+v, %v", out, err)
	}
}

func TestParseRecordForms(t *testing.T) {
	started := time.Date(2026, 2, 23, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want Record
	}{
		{"pid=123 target=/x started=2026-02-23T10:00:00Z", Record{PID: 123, Target: "/x", Started: started}},
		{"pid=123 target=/x started=1771840800\n", Record{PID: 123, Target: "/x", Started: started}},
		{"\n\n  pid=123 target=/x  \n\n", Record{PID: 123, Target: "/x"}},
		{"pid=5\ntarget=/a b/c\nstart_time=99\nexe=/bin/x y\nfoo=bar\n", Record{PID: 5, Target: "/a b/c", StartTime: 99, Exe: "/bin/x y"}},
		{"# comment\r\npid = 6\r\nstarted=garbage\r\nstart_time=-1\r\n", Record{PID: 6}},
		{"pid=5 pid=9", Record{PID: 9}},
	} {
		got, err := ParseRecord([]byte(tc.in))
		if err != nil || !recordsEqual(got, tc.want) {
			t.Errorf("ParseRecord(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "\n \n", "target=/x", "pid=0", "pid=-3", "pid=abc", "pid=99999999999999999999", "pid=5000000", "pid=5\npid=x", "\x00\xff"} {
		if got, err := ParseRecord([]byte(in)); err == nil {
			t.Errorf("ParseRecord(%q) = %+v, want an error", in, got)
		}
	}
}

func recordsEqual(a, b Record) bool {
	return a.PID == b.PID && a.Target == b.Target && a.Started.Equal(b.Started) && a.StartTime == b.StartTime && a.Exe == b.Exe
}

// FuzzParseRecord: never panic, and whatever parses survives Format.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{
		"pid=123 target=/x started=2026-02-23T10:00:00+01:00",
		"pid=1\ntarget=/a b\nstarted=2026-02-23T10:00:00.5Z\nstart_time=12\nexe=/bin/sh\n",
		"pid=2 started=1771840800.25",
		"pid=\x00=\n=\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := ParseRecord(b)
		if err != nil {
			return
		}
		if rec.PID <= 0 {
			t.Fatalf("parsed without error but pid %d", rec.PID)
		}
		again, err := ParseRecord(rec.Format())
		if err != nil || !recordsEqual(rec, again) {
			t.Fatalf("round trip of %+v: %+v, %v (formatted %q)", rec, again, err, rec.Format())
		}
	})
}
