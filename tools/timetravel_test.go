package tools_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"github.com/qemu-mcp/qemu-mcp/internal/qcow2state"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
	"github.com/qemu-mcp/qemu-mcp/recording"
)

type replayStopOut struct {
	stopOut
	ICount *uint64 `json:"icount"`
	Note   string  `json:"note"`
	Access *struct {
		Old string `json:"old"`
		New string `json:"new"`
	} `json:"access"`
}

type lastWriteOut struct {
	Found     bool          `json:"found"`
	Note      string        `json:"note"`
	ICount    *uint64       `json:"icount"`
	Access    *accessOut    `json:"access"`
	Backtrace *backtraceOut `json:"backtrace"`
}

type recordingsOut struct {
	Recordings []struct {
		Name         string `json:"name"`
		State        string `json:"state"`
		Instructions uint64 `json:"instructions"`
		Ended        string `json:"ended"`
		Size         int64  `json:"size"`
		Checkpoints  int64  `json:"checkpoints"`
	} `json:"recordings"`
	Deleted string `json:"deleted"`
	Total   int64  `json:"total"`
	Cap     int64  `json:"cap"`
}

// consoleBytes reads a guest's whole console, as the guest printed it.
func consoleBytes(t *testing.T, s *session) []byte {
	t.Helper()
	var out []byte
	since := int64(0)
	for {
		var r struct {
			Output    string `json:"output"`
			Encoding  string `json:"encoding"`
			Cursor    int64  `json:"cursor"`
			Truncated bool   `json:"truncated"`
		}
		s.mustCall("serial_read", map[string]any{"since": since, "raw": true, "max_bytes": 32768}, &r)
		b := []byte(r.Output)
		if r.Encoding == "base64" {
			var err error
			if b, err = base64.StdEncoding.DecodeString(r.Output); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, b...)
		if !r.Truncated || r.Cursor == since {
			return out
		}
		since = r.Cursor
	}
}

// linuxRecordSession starts a server for the Linux guest with its own
// state directory.
func linuxRecordSession(t *testing.T) (*session, testguest.Linux, string) {
	lin := testguest.LinuxGuest(t)
	state := t.TempDir()
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir = lin.Dir
		c.Captures = filepath.Join(state, "captures")
		os.MkdirAll(c.Captures, 0o700)
	}, nil)
	return s, lin, filepath.Join(state, "recordings")
}

func bootLinux(t *testing.T, s *session, extra map[string]any) bootOut {
	t.Helper()
	args := map[string]any{"kernel": "Image", "initrd": "initramfs.cpio.gz", "append": testguest.LinuxAppend,
		"memory": "256M", "wait_for": testguest.LinuxPrompt, "timeout": 60, "restart": true}
	for k, v := range extra {
		args[k] = v
	}
	var b bootOut
	res := s.call("qemu_boot", args, &b)
	if res.IsError || !b.Matched {
		t.Fatalf("boot %v: %s %+v", extra, text(res), b)
	}
	return b
}

// The Linux guest recorded through boot, two sysctl writes, uname and a
// sysrq crash, then replayed: its console is the recording's; from the
// crash, the last write to panic_timeout is the 7 -> 9 write in
// do_proc_dointvec_conv, and before it the 0 -> 7; going back to a
// breakpoint, one instruction back, and to an instruction count all land
// where they should; crash triage works on the replay. On a QEMU that
// reloads replay checkpoints, the same questions asked again once
// checkpoints exist get the same answers at the same counts.
func TestTimeTravelLinux(t *testing.T) {
	s, lin, recDir := linuxRecordSession(t)
	timeTravelLinux(t, s, lin, recDir, func(extra map[string]any) { bootLinux(t, s, extra) }, func() bool { return replayCheckpoints(t, s) }, "sys_newuname")
}

// timeTravelLinux is TestTimeTravelLinux on the Linux guest lin, booted by
// boot, its recordings in recDir; checkpoints says whether the guest's
// QEMU reloads replay checkpoints, and uname is the function uname(2)
// reaches on this architecture.
func timeTravelLinux(t *testing.T, s *session, lin testguest.Linux, recDir string, boot func(extra map[string]any), checkpoints func() bool, uname string) {
	t0 := time.Now()
	boot(map[string]any{"record": "crash", "gdb": true})
	t.Logf("recorded boot in %v", time.Since(t0))
	// Where RAM is in the machine (a replay answers only query-*).
	var mtree struct {
		Return string `json:"return"`
	}
	s.mustCall("qmp_command", map[string]any{"command": "human-monitor-command", "arguments": map[string]any{"command-line": "info mtree -f"}}, &mtree)
	regions, err := qcow2state.ParseFlatView(mtree.Return)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"echo 7 > /proc/sys/kernel/panic", "echo 9 > /proc/sys/kernel/panic", "uname -a"} {
		var w struct {
			waitOut
			Paced bool `json:"paced"`
		}
		res := s.call("serial_send", map[string]any{"data": cmd, "wait_for": testguest.LinuxPrompt}, &w)
		if res.IsError || !w.Matched || !w.Paced || w.Written != len(cmd)+1 {
			t.Fatalf("%s: %s %+v", cmd, text(res), w)
		}
	}
	var w waitOut
	s.mustCall("serial_send", map[string]any{"data": "echo c > /proc/sysrq-trigger", "wait_for": "Kernel panic", "timeout": 20}, &w)
	if !w.Matched {
		t.Fatalf("no panic: %+v", w)
	}
	s.mustCall("qemu_shutdown", nil, nil)
	recorded := consoleBytes(t, s)

	var list recordingsOut
	s.mustCall("qemu_recordings", nil, &list)
	if len(list.Recordings) != 1 || list.Recordings[0].Name != "crash" || list.Recordings[0].State != "complete" || list.Recordings[0].Instructions < 1e8 {
		t.Fatalf("recordings: %+v", list)
	}
	end := list.Recordings[0].Instructions - 1
	t.Logf("recording: %+v (%d console bytes)", list.Recordings[0], len(recorded))
	// Whether this QEMU reloads replay checkpoints is probed after the
	// first boot; the replay below takes them if it does.
	inPlace := checkpoints()

	var b struct {
		bootOut
		Recording struct {
			Name         string `json:"name"`
			Replaying    bool   `json:"replaying"`
			Instructions uint64 `json:"instructions"`
		} `json:"recording"`
	}
	res := s.call("qemu_boot", map[string]any{"replay": "crash", "restart": true}, &b)
	if res.IsError || !b.Recording.Replaying {
		t.Fatalf("replay boot: %s", text(res))
	}
	t.Logf("replay boot: %s", text(res))

	var st replayStopOut
	t0 = time.Now()
	res = s.call("debug_continue", map[string]any{"timeout": 120}, &st)
	t.Logf("to the end in %v: %s", time.Since(t0), text(res))
	if st.Reason != "end" || st.ICount == nil || *st.ICount != end {
		t.Fatalf("continue to the end: %s", text(res))
	}
	if got := consoleBytes(t, s); string(got) != string(recorded) {
		t.Errorf("the replay's console (%d bytes) is not the recording's (%d bytes)", len(got), len(recorded))
	}
	// The recording's own copy of its console is the same.
	m, err := recording.Store{Dir: recDir}.Get(lin.Dir, "crash")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.Console()); err != nil || string(b) != string(recorded) {
		t.Errorf("the recording's console.log (%d bytes, %v) is not what the guest printed (%d bytes)", len(b), err, len(recorded))
	}

	lastWrite := func(before uint64) lastWriteOut {
		t.Helper()
		args := map[string]any{"location": "panic_timeout"}
		if before > 0 {
			args["before"] = before
		}
		var lw lastWriteOut
		t0 := time.Now()
		res := s.call("debug_last_write", args, &lw)
		t.Logf("last write before %d in %v: %s", before, time.Since(t0), text(res))
		if res.IsError || !lw.Found || lw.Access == nil || lw.ICount == nil {
			t.Fatalf("last write: %s", text(res))
		}
		if fn := lw.Access.Insn.Function; fn != "do_proc_dointvec_conv" || !strings.HasSuffix(lw.Access.Insn.File, "kernel/sysctl.c") || lw.Access.Insn.Line == 0 {
			t.Errorf("last write: by %+v, want do_proc_dointvec_conv at kernel/sysctl.c:N", lw.Access.Insn)
		}
		return lw
	}
	second := lastWrite(0)
	if second.Access.Old != "0x7" || second.Access.New != "0x9" {
		t.Errorf("last write from the crash: %s -> %s, want 0x7 -> 0x9", second.Access.Old, second.Access.New)
	}
	first := lastWrite(*second.ICount)
	if first.Access.Old != "0x0" || first.Access.New != "0x7" || *first.ICount >= *second.ICount {
		t.Errorf("last write before %d: %s -> %s at %d, want 0x0 -> 0x7 earlier", *second.ICount, first.Access.Old, first.Access.New, *first.ICount)
	}
	var here replayStopOut
	s.mustCall("debug_pause", nil, &here)
	if here.ICount == nil || *here.ICount != end {
		t.Errorf("after debug_last_write the replay is at %v, want %d (where it was)", here.ICount, end)
	}

	// A breakpoint hit earlier: uname's system call.
	s.mustCall("debug_break", map[string]any{"location": uname}, nil)
	t0 = time.Now()
	res = s.call("debug_continue", map[string]any{"reverse": true}, &st)
	t.Logf("reverse continue in %v: %s", time.Since(t0), text(res))
	if res.IsError || st.Reason != "breakpoint" || st.Function != uname || st.ICount == nil || *st.ICount >= end || *st.ICount <= *second.ICount {
		t.Fatalf("reverse continue: %s", text(res))
	}
	hitAt := *st.ICount
	t0 = time.Now()
	res = s.call("debug_step", map[string]any{"reverse": true}, &st)
	t.Logf("reverse step in %v: %s", time.Since(t0), text(res))
	if res.IsError || st.ICount == nil || *st.ICount != hitAt-1 {
		t.Fatalf("reverse step from %d: %s", hitAt, text(res))
	}
	s.mustCall("debug_break", map[string]any{"location": uname, "remove": true}, nil)
	target := *first.ICount - 1000
	res = s.call("debug_continue", map[string]any{"icount": target}, &st)
	if res.IsError || st.ICount == nil || *st.ICount != target {
		t.Fatalf("go to %d: %s", target, text(res))
	}

	// Crash triage on the replay, as on a live guest.
	s.mustCall("debug_continue", map[string]any{"icount": end}, &st)
	var tw struct {
		waitOut
		Panicked bool `json:"panicked"`
		Triage   *struct {
			Culprit *whereOut `json:"culprit"`
		} `json:"triage"`
	}
	res = s.call("serial_read", map[string]any{"since": 0, "wait_for": "never printed", "max_bytes": 1024}, &tw)
	if !tw.Panicked || tw.Triage == nil || tw.Triage.Culprit == nil || tw.Triage.Culprit.Function != "sysrq_handle_crash" {
		t.Errorf("triage on the replay: %s", text(res))
	}

	// On a QEMU that reloads checkpoints, the forward runs left some: the
	// same questions get the same answers at the same counts.
	s.mustCall("qemu_recordings", nil, &list)
	t.Logf("after the replay: %+v", list.Recordings)
	if inPlace != (list.Recordings[0].Checkpoints > 0) {
		t.Fatalf("QEMU reloads replay checkpoints: %v; the replay left %d bytes of them", inPlace, list.Recordings[0].Checkpoints)
	}
	if inPlace {
		again := lastWrite(0)
		if *again.ICount != *second.ICount || again.Access.Old != "0x7" || again.Access.New != "0x9" {
			t.Errorf("with checkpoints: %+v at %d, before %+v at %d", again.Access, *again.ICount, second.Access, *second.ICount)
		}
		again = lastWrite(*second.ICount)
		if *again.ICount != *first.ICount || again.Access.New != "0x7" {
			t.Errorf("with checkpoints: %+v at %d, before %+v at %d", again.Access, *again.ICount, first.Access, *first.ICount)
		}
	}
	savedStatesAreLoaded(t, s, m, regions, inPlace)

	// Input to a replay is refused, plainly.
	s.wantError("serial_send", map[string]any{"data": "ls"}, "replays a recording")
}

// savedStatesAreLoaded checks that what debug_last_write reads out of each
// checkpoint's saved state without loading it (panic_timeout, through its
// physical address and QEMU's map of RAM; and 16 bytes of linux_banner,
// which the kernel image holds from the start) is what the replay holds
// once that checkpoint is loaded; and the same of the recording's own state
// at instruction 0.
func savedStatesAreLoaded(t *testing.T, s *session, m recording.Meta, regions []qcow2state.Region, checkpoints bool) {
	t.Helper()
	type loc struct {
		name   string
		pa     uint64
		length int
	}
	var locs []loc
	for _, l := range []loc{{"panic_timeout", 0, 4}, {"linux_banner", 0, 16}} {
		var tr struct {
			PA string `json:"pa"`
		}
		s.mustCall("debug_translate", map[string]any{"address": l.name}, &tr)
		pa, err := strconv.ParseUint(strings.TrimPrefix(tr.PA, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("%s's physical address %q: %v", l.name, tr.PA, err)
		}
		l.pa = pa
		locs = append(locs, l)
	}
	type point struct {
		icount    uint64
		path, tag string
	}
	points := []point{{0, m.Image(), recording.InitTag}}
	if checkpoints {
		cks := m.Checkpoints("")
		if len(cks) == 0 {
			t.Fatal("no checkpoints to compare")
		}
		for _, ck := range cks {
			points = append(points, point{ck.ICount, ck.Path, recording.CheckpointTag})
		}
	}
	for _, ck := range points {
		st, err := qcow2state.Open(ck.path, ck.tag)
		if err != nil {
			t.Errorf("the state at %d: %v", ck.icount, err)
			continue
		}
		saved := make([][]byte, len(locs))
		for i, l := range locs {
			saved[i] = make([]byte, l.length)
			if err = st.ReadPhysical(regions, l.pa, saved[i]); err != nil {
				break
			}
		}
		st.Close()
		if err != nil {
			t.Errorf("the state at %d: %v", ck.icount, err)
			continue
		}
		var at replayStopOut
		s.mustCall("debug_continue", map[string]any{"icount": ck.icount}, &at)
		if at.ICount == nil || *at.ICount != ck.icount {
			t.Fatalf("go to %d: %+v", ck.icount, at)
		}
		for i, l := range locs {
			var mem struct {
				Hexdump string `json:"hexdump"`
			}
			// Physical: a hart stopped in user mode (or before the MMU
			// is on) reads no kernel address.
			s.mustCall("debug_memory", map[string]any{"location": fmt.Sprintf("%#x", l.pa), "physical": true, "length": l.length}, &mem)
			f := strings.Fields(mem.Hexdump)
			loaded := make([]byte, l.length)
			for k := range loaded {
				b, err := strconv.ParseUint(f[1+k], 16, 8)
				if err != nil {
					t.Fatalf("hexdump %q: %v", mem.Hexdump, err)
				}
				loaded[k] = byte(b)
			}
			t.Logf("the state at %d: %s saved % x, loaded % x", ck.icount, l.name, saved[i], loaded)
			if string(saved[i]) != string(loaded) {
				t.Errorf("the state at %d: %s saved as % x, but the replay there holds % x", ck.icount, l.name, saved[i], loaded)
			}
		}
	}
}

// A recording whose QEMU is killed mid-run is kept and listed as cut; its
// replay runs to where it was cut and stops there, its console a prefix of
// what the guest printed. A recording being replayed cannot be deleted;
// then it can, with its files.
func TestRecordingCut(t *testing.T) {
	s, lin, recDir := linuxRecordSession(t)
	b := bootLinux(t, s, map[string]any{"record": "cut"})
	s.mustCall("serial_send", map[string]any{"data": "echo before-the-cut", "wait_for": testguest.LinuxPrompt}, nil)
	if err := proc.Signal(qemuProcess(t, b.PID), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var w waitOut
	s.mustCall("serial_read", map[string]any{"wait_for": "never printed", "timeout": 5}, &w)
	if !w.Exited {
		t.Fatalf("QEMU killed, the guest still runs: %+v", w)
	}
	recorded := consoleBytes(t, s)
	var list recordingsOut
	// The guest's cleanup, which writes how the recording ended, runs
	// as QEMU's exit is noticed.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s.mustCall("qemu_recordings", nil, &list)
		if len(list.Recordings) != 1 || list.Recordings[0].State != "recording" || time.Now().After(deadline) {
			break
		}
	}
	if len(list.Recordings) != 1 || list.Recordings[0].State != "cut" || !strings.Contains(list.Recordings[0].Ended, "SIGKILL") {
		t.Fatalf("recordings after the kill: %+v", list)
	}
	t.Logf("cut recording: %+v", list.Recordings[0])

	res := s.call("qemu_boot", map[string]any{"replay": "cut", "restart": true}, nil)
	if res.IsError {
		t.Fatalf("replay of a cut recording: %s", text(res))
	}
	var stop replayStopOut
	res = s.call("debug_continue", map[string]any{"timeout": 120}, &stop)
	t.Logf("continue: %s", text(res))
	if stop.Reason != "end" || stop.ICount == nil {
		t.Fatalf("the replay of a cut recording did not stop at its end: %s", text(res))
	}
	got := consoleBytes(t, s)
	if len(got) < len(recorded)/2 || string(got) != string(recorded[:len(got)]) {
		t.Errorf("the replay's console (%d bytes) is not a prefix of the recording's (%d bytes)", len(got), len(recorded))
	}
	s.mustCall("qemu_recordings", nil, &list)
	if r := list.Recordings[0]; r.State != "cut" || r.Instructions != *stop.ICount {
		t.Errorf("after the replay found its end: %+v, want instructions %d", r, *stop.ICount)
	}
	s.wantError("qemu_recordings", map[string]any{"delete": "cut"}, "being replayed")
	s.mustCall("qemu_shutdown", nil, nil)
	s.mustCall("qemu_recordings", map[string]any{"delete": "cut"}, &list)
	if list.Deleted != "cut" || len(list.Recordings) != 0 {
		t.Fatalf("delete: %+v", list)
	}
	if ents, _ := os.ReadDir(filepath.Join(recDir)); len(ents) > 0 {
		for _, e := range ents {
			sub, _ := os.ReadDir(filepath.Join(recDir, e.Name()))
			if len(sub) > 0 {
				t.Errorf("left in the store after delete: %s/%v", e.Name(), sub)
			}
		}
	}
	_ = lin
}

// What QEMU cannot record so that it replays faithfully is refused before
// anything starts, naming it.
func TestRecordRefused(t *testing.T) {
	s := newSession(t)
	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"smp": 2}, "smp 2"},
		{map[string]any{"network": "user"}, "a network"},
		{map[string]any{"gpu": true}, "gpu"},
	} {
		args := map[string]any{"record": "r"}
		for k, v := range c.args {
			args[k] = v
		}
		s.wantError("qemu_boot", args, "cannot be recorded", c.want)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, make([]byte, 1<<20), 0o600)
	s2 := newSessionWith(t, func(c *testConfig) { c.WorkDir = dir }, nil)
	s2.wantError("qemu_boot", map[string]any{"record": "r", "drives": []map[string]any{{"path": "disk.img"}}}, "writable", "readonly: true")
	s2.wantError("qemu_boot", map[string]any{"record": "r", "shares": []map[string]any{{"path": "."}}}, "shares")
	var list recordingsOut
	s2.mustCall("qemu_recordings", nil, &list)
	if len(list.Recordings) != 0 {
		t.Errorf("a refused recording is listed: %+v", list)
	}
}

// replayCheckpoints waits for the server's QEMU to be probed and says
// whether it reloads replay checkpoints: QEMU 11 does, 7.2 does not.
func replayCheckpoints(t *testing.T, s *session) bool {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var info capsInfo
		s.mustCall("server_info", nil, &info)
		if info.QEMUCaps.State == "probed" {
			yes := info.QEMUCaps.Replay != nil && info.QEMUCaps.Replay.Answer == "yes"
			if want := strings.Contains(qemuVersionOf(t, s), " 11."); yes != want {
				t.Fatalf("replay checkpoints %v on %s", yes, qemuVersionOf(t, s))
			}
			return yes
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU not probed: %+v", info.QEMUCaps)
		}
	}
}

// Recordings count towards the cap on kept files: past it, the oldest
// kept file goes (never a recording), and replay checkpoints, a cache,
// go before anything kept. Deleting a recording frees its space.
func TestRecordingCap(t *testing.T) {
	lin := testguest.LinuxGuest(t)
	state := t.TempDir()
	captures := filepath.Join(state, "captures")
	os.MkdirAll(captures, 0o700)
	// A kept file from long ago, big enough that with a recording the
	// kept files pass the cap.
	old := filepath.Join(captures, "old-capture.pcap")
	if err := os.WriteFile(old, make([]byte, 20<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-24 * time.Hour)
	os.Chtimes(old, long, long)
	const capBytes = 24 << 20
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir, c.Captures, c.KeepCap = lin.Dir, captures, capBytes
	}, nil)
	bootLinux(t, s, map[string]any{"record": "big"})
	s.mustCall("qemu_shutdown", nil, nil)
	var list recordingsOut
	s.mustCall("qemu_recordings", nil, &list)
	if len(list.Recordings) != 1 || list.Recordings[0].Size < 1<<20 || list.Total != list.Recordings[0].Size {
		t.Fatalf("recordings: %+v", list)
	}
	size := list.Recordings[0].Size
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the old kept file went before the recording passed the cap: %v", err)
	}
	inPlace := replayCheckpoints(t, s)

	// The next boot finds the kept files past the cap: the old file goes,
	// the recording stays.
	var b struct {
		bootOut
		KeptRemoved []string `json:"kept_removed"`
	}
	res := s.call("qemu_boot", map[string]any{"replay": "big", "restart": true}, &b)
	if res.IsError {
		t.Fatalf("replay: %s", text(res))
	}
	if _, err := os.Stat(old); err == nil || !slices.Contains(b.KeptRemoved, old) {
		t.Errorf("past the cap with a recording, the old kept file stays: removed %v", b.KeptRemoved)
	}
	var st replayStopOut
	s.mustCall("debug_continue", map[string]any{"timeout": 120}, &st)
	if st.Reason != "end" {
		t.Fatalf("replay to the end: %+v", st)
	}
	// Checkpoints (16 MiB each on QEMU 11) are taken on the way and, past
	// the cap, removed first: what is left fits beside the recording.
	var kept int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s.mustCall("qemu_recordings", nil, &list)
		kept = list.Recordings[0].Checkpoints
		if list.Total <= capBytes || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after the replay: %+v total %d cap %d", list.Recordings[0], list.Total, list.Cap)
	if list.Cap != capBytes || list.Total > capBytes || list.Recordings[0].Size-kept != size {
		t.Errorf("after the replay: %+v, total %d, cap %d: want the recording (%d bytes) and checkpoints within the cap", list.Recordings[0], list.Total, list.Cap, size)
	}
	if inPlace && kept == 0 {
		// The replay was long enough to take several; the cap leaves
		// room for one.
		t.Errorf("no checkpoint kept within the cap")
	}
	s.mustCall("qemu_shutdown", nil, nil)
	s.mustCall("qemu_recordings", map[string]any{"delete": "big"}, &list)
	if list.Deleted != "big" || len(list.Recordings) != 0 || list.Total != 0 {
		t.Errorf("after delete: %+v", list)
	}
}

// A recording stopped while the guest prints (a flood, or an answer still
// coming) keeps in its console.log all the guest printed, the last bytes
// QEMU left in the pipe included: the copy was made beside the drain's
// last read and lost the last 45 to 441 bytes in about one stop in ten.
func TestRecordingConsoleWhole(t *testing.T) {
	state, work := t.TempDir(), t.TempDir()
	s := newSessionWith(t, func(c *testConfig) {
		c.WorkDir = work
		c.Captures = filepath.Join(state, "captures")
		os.MkdirAll(c.Captures, 0o700)
	}, nil)
	for round := range 6 {
		name := fmt.Sprintf("flood%d", round)
		var b bootOut
		s.mustCall("qemu_boot", map[string]any{"record": name, "wait_for": prompt, "timeout": 30, "restart": true, "gdb": round%2 == 1}, &b)
		if !b.Matched {
			t.Fatalf("boot: %+v", b)
		}
		// A flood cut at some point, or a short answer still coming.
		cmd := "flood 400000"
		if round >= 3 {
			cmd = "help"
		}
		s.mustCall("serial_send", map[string]any{"data": cmd}, nil)
		time.Sleep(time.Duration(20*(round%3)) * time.Millisecond)
		s.mustCall("qemu_shutdown", nil, nil)
		printed := consoleBytes(t, s)
		m, err := recording.Store{Dir: filepath.Join(state, "recordings")}.Get(work, name)
		if err != nil {
			t.Fatal(err)
		}
		saved, err := os.ReadFile(m.Console())
		if err != nil || string(saved) != string(printed) {
			t.Errorf("round %d: console.log has %d bytes (%v), the guest printed %d", round, len(saved), err, len(printed))
		}
		if m.ConsoleBytes != int64(len(printed)) {
			t.Errorf("round %d: the recording counts %d console bytes, the guest printed %d", round, m.ConsoleBytes, len(printed))
		}
	}
}
