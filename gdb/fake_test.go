package gdb

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
)

// fakeStub is a scripted gdbstub that behaves like QEMU's where it
// matters: it drops a packet that arrives while the target "runs" and
// answers with a stop instead, and it acks in ack mode.
type fakeStub struct {
	t    *testing.T
	addr string
	// features is the qSupported reply.
	features string
	docs     map[string]string
	mem      map[uint64]byte
	regs     map[int]string // 'p' replies by regnum
	gReply   string         // sent as is (may be run-length encoded)
	// hook may answer a command itself (return true), e.g. to delay,
	// corrupt or hang up.
	hook func(f *fakeConn, cmd string) bool
	// threads, if set, are the threads qfThreadInfo lists, one a reply;
	// tregs are 'p' replies by thread (selected with Hg) and regnum.
	threads []string
	tregs   map[string]map[int]string

	mu    sync.Mutex
	conns []*fakeConn
	// steps counts each thread's steps ("" without threads): a step
	// moves its pc (register 3) on by 4; stalls are steps to come that
	// leave it in place, as QEMU's now and then do.
	steps  map[string]int
	stalls int
}

// step records a step of thread.
func (s *fakeStub) step(thread string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalls > 0 {
		s.stalls--
		return
	}
	if s.steps == nil {
		s.steps = map[string]int{}
	}
	s.steps[thread]++
}

// rewind puts thread's pc back where it was before its steps.
func (s *fakeStub) rewind(thread string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.steps, thread)
}

// pc is v, a pc register's reply, moved on by thread's steps.
func (s *fakeStub) pc(thread, v string) string {
	s.mu.Lock()
	n := s.steps[thread]
	s.mu.Unlock()
	b, err := hexBytes(v)
	if err != nil || len(b) != 8 || n == 0 {
		return v
	}
	pc := binary.LittleEndian.Uint64(b) + uint64(4*n)
	return fmt.Sprintf("%016x", binary.LittleEndian.AppendUint64(nil, pc))
}

func hexBytes(v string) ([]byte, error) {
	out := make([]byte, len(v)/2)
	for i := range out {
		n, err := strconv.ParseUint(v[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil, err
		}
		out[i] = byte(n)
	}
	return out, nil
}

type fakeConn struct {
	s    *fakeStub
	conn net.Conn

	wmu      sync.Mutex
	ack      bool
	lastSent []byte

	running atomic.Bool
	sel     string       // the thread Hg selected
	cur     string       // the thread an interrupt reports (Hc, or the last stop)
	next    int          // the next thread qsThreadInfo lists
	acks    atomic.Int32 // '+' received
	nacks   atomic.Int32
	cmds    chan string // every command received, in order
}

func newFakeStub(t *testing.T) *fakeStub {
	t.Helper()
	dir, err := os.MkdirTemp("", "gdbf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &fakeStub{
		t:        t,
		addr:     filepath.Join(dir, "stub.sock"),
		features: "PacketSize=100;qXfer:features:read+;QStartNoAckMode+;vContSupported+",
		docs: map[string]string{
			"target.xml": `<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd"><target><architecture>riscv:rv64</architecture>` +
				`<xi:include href="core.xml"/><xi:include href="extra.xml"/></target>`,
			"core.xml": `<?xml version="1.0"?><!-- ` + strings.Repeat("padding so the document takes several qXfer chunks ", 8) + `-->` +
				`<feature name="org.gnu.gdb.riscv.cpu"><reg name="zero" bitsize="64" type="int"/><reg name="ra" bitsize="64" type="code_ptr"/>` +
				`<reg name="sp" bitsize="64" type="data_ptr"/><reg name="pc" bitsize="64" type="code_ptr"/></feature>`,
			"extra.xml": `<feature name="org.example.extra"><reg name="br}ce#$*" bitsize="32" regnum="100" group="special"/>` +
				`<reg name="next" bitsize="16"/><reg name="wide" bitsize="128"/></feature>`,
		},
		mem:  map[uint64]byte{},
		regs: map[int]string{0: "0000000000000000", 1: "8877665544332211", 3: "0000208000000000", 0x64: "78563412", 0x65: "3412"},
		// zero: 16 '0's; ra; sp unavailable; pc 0x80200000 as
		// "0000" "208" and nine '0's, all run-length encoded.
		gReply: "0*,8877665544332211xxxxxxxxxxxxxxxx0* 2080*%",
	}
	for i := range 1000 {
		s.mem[0x1000+uint64(i)] = byte(i)
	}
	ln, err := net.Listen("unix", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			// QEMU's register commands start on the first thread.
			f := &fakeConn{s: s, conn: conn, ack: true, cmds: make(chan string, 1000), sel: "01", cur: "01"}
			s.mu.Lock()
			s.conns = append(s.conns, f)
			s.mu.Unlock()
			t.Cleanup(func() { conn.Close() })
			go f.serve()
		}
	}()
	return s
}

func (s *fakeStub) conn(i int) *fakeConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[i]
}

func (s *fakeStub) dial(t *testing.T, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix", s.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// send frames payload exactly as given (the caller escapes or encodes).
func (f *fakeConn) send(payload string) {
	f.sendRaw(fmt.Sprintf("$%s#%02x", payload, checksum(payload)))
}

func (f *fakeConn) sendRaw(b string) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	if strings.HasPrefix(b, "$") {
		f.lastSent = []byte(b)
	}
	f.conn.Write([]byte(b))
}

// escapeBinary escapes data as the stub does in binary replies.
func escapeBinary(data string) string {
	p := appendPacket(nil, []byte(data))
	return string(p[1 : len(p)-3])
}

func checksum(s string) byte {
	var sum byte
	for i := range len(s) {
		sum += s[i]
	}
	return sum
}

func (f *fakeConn) serve() {
	r := bufio.NewReader(f.conn)
	for {
		b, err := r.ReadByte()
		if err != nil {
			return
		}
		switch b {
		case '+':
			f.acks.Add(1)
			continue
		case '-':
			f.nacks.Add(1)
			f.wmu.Lock()
			f.conn.Write(f.lastSent)
			f.wmu.Unlock()
			continue
		case 0x03:
			if f.running.CompareAndSwap(true, false) {
				f.send("T02thread:" + f.cur + ";")
			}
			continue
		case '$':
		default:
			continue
		}
		raw, err := r.ReadString('#')
		if err != nil {
			return
		}
		var cs [2]byte
		if _, err := r.Read(cs[:1]); err != nil {
			return
		}
		if _, err := r.Read(cs[1:]); err != nil {
			return
		}
		if f.running.CompareAndSwap(true, false) {
			// QEMU: the first byte stops the guest, the packet is lost.
			f.send("T02thread:01;")
			continue
		}
		raw = raw[:len(raw)-1]
		if want, _ := strconv.ParseUint(string(cs[:]), 16, 8); byte(want) != checksum(raw) {
			f.s.t.Errorf("fake stub: bad checksum on %q", raw)
			continue
		}
		cmd, err := unescape([]byte(raw))
		if err != nil {
			f.s.t.Errorf("fake stub: %v", err)
			continue
		}
		if f.ack {
			f.sendRaw("+")
		}
		f.cmds <- string(cmd)
		if f.s.hook != nil && f.s.hook(f, string(cmd)) {
			continue
		}
		f.handle(string(cmd))
	}
}

func (f *fakeConn) handle(cmd string) {
	s := f.s
	switch {
	case strings.HasPrefix(cmd, "qSupported"):
		f.send(s.features)
	case cmd == "QStartNoAckMode":
		f.send("OK")
		f.ack = false
	case strings.HasPrefix(cmd, "qXfer:features:read:"):
		rest := strings.TrimPrefix(cmd, "qXfer:features:read:")
		annex, span, _ := strings.Cut(rest, ":")
		o, l, _ := strings.Cut(span, ",")
		off, _ := strconv.ParseUint(o, 16, 64)
		n, _ := strconv.ParseUint(l, 16, 64)
		doc, ok := s.docs[annex]
		if !ok {
			f.send("E00")
			return
		}
		// Smaller pieces than asked, to make the client loop.
		n = min(n, 100)
		kind := "l"
		if off+n < uint64(len(doc)) {
			kind = "m"
		} else {
			n = uint64(len(doc)) - min(off, uint64(len(doc)))
		}
		f.send(kind + escapeBinary(doc[off:off+n]))
	case cmd == "vCont?":
		f.send("vCont;c;C;s;S")
	case cmd == "qC":
		f.send("QC01")
	case cmd == "?":
		f.send("T05thread:01;")
	case cmd == "g":
		f.send(s.gReply)
	case cmd == "qfThreadInfo" || cmd == "qsThreadInfo":
		if cmd == "qfThreadInfo" {
			f.next = 0
		}
		if s.threads == nil {
			f.send("")
		} else if f.next < len(s.threads) {
			f.send("m" + s.threads[f.next])
			f.next++
		} else {
			f.send("l")
		}
	case strings.HasPrefix(cmd, "qThreadExtraInfo,"):
		f.send(fmt.Sprintf("%x", "CPU#"+strings.TrimPrefix(cmd, "qThreadExtraInfo,")+" [halted ]"))
	case strings.HasPrefix(cmd, "Hc") && s.threads != nil:
		f.cur = cmd[2:]
		f.send("OK")
	case strings.HasPrefix(cmd, "Hg") && s.threads != nil:
		if slices.Contains(s.threads, cmd[2:]) {
			f.sel = cmd[2:]
			f.send("OK")
		} else {
			f.send("E22")
		}
	case strings.HasPrefix(cmd, "p"):
		n, _ := strconv.ParseUint(cmd[1:], 16, 32)
		if v, ok := s.tregs[f.sel][int(n)]; ok {
			if n == 3 {
				v = s.pc(f.sel, v)
			}
			f.send(v)
		} else if v, ok := s.regs[int(n)]; ok {
			if n == 3 {
				v = s.pc("", v)
			}
			f.send(v)
		} else {
			f.send("E14")
		}
	case strings.HasPrefix(cmd, "m"):
		a, l, _ := strings.Cut(cmd[1:], ",")
		addr, _ := strconv.ParseUint(a, 16, 64)
		n, _ := strconv.ParseUint(l, 16, 64)
		var sb strings.Builder
		for i := range n {
			b, ok := s.mem[addr+i]
			if !ok {
				break
			}
			fmt.Fprintf(&sb, "%02x", b)
		}
		if sb.Len() == 0 {
			f.send("E14")
			return
		}
		f.send(sb.String())
	case cmd == "c" || strings.HasPrefix(cmd, "vCont;c"):
		f.running.Store(true)
	case strings.HasPrefix(cmd, "vCont;s:"):
		f.cur = strings.TrimPrefix(cmd, "vCont;s:")
		if s.threads != nil {
			s.step(f.cur)
		} else {
			s.step("")
		}
		f.send("T05thread:" + f.cur + ";")
	case cmd == "s":
		s.step("")
		f.send("T05thread:01;")
	case cmd == "D" || strings.HasPrefix(cmd, "Z") || strings.HasPrefix(cmd, "z") || strings.HasPrefix(cmd, "P") || strings.HasPrefix(cmd, "M"):
		f.send("OK")
	default:
		f.send("")
	}
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestFakeProtocol(t *testing.T) {
	s := newFakeStub(t)
	c := s.dial(t)
	f := s.conn(0)
	ctx := bg(t)

	if c.Arch() != "riscv:rv64" || c.Supported()["PacketSize"] != "100" || c.Supported()["QStartNoAckMode"] != "+" {
		t.Errorf("Arch %q, Supported %v", c.Arch(), c.Supported())
	}
	var names []string
	for _, r := range c.Registers() {
		names = append(names, fmt.Sprintf("%s:%d:%d:%s", r.Name, r.Regnum, r.Bitsize, r.Group))
	}
	want := "zero:0:64:general ra:1:64:general sp:2:64:general pc:3:64:general br}ce#$*:100:32:special next:101:16:system wide:102:128:system"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("registers\n got %s\nwant %s", got, want)
	}
	if r, ok := c.Register("x1"); !ok || r.Name != "ra" {
		t.Errorf("x1 = %+v, %v", r, ok)
	}

	// Nothing is acknowledged in no-ack mode: the client acked up to the
	// OK of QStartNoAckMode, and no more.
	acks := f.acks.Load()
	regs, err := c.ReadRegisters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(regs) != "map[pc:2149580800 ra:1234605616436508552 zero:0]" {
		t.Errorf("ReadRegisters = %v", regs)
	}
	if v, err := c.ReadRegister(ctx, "br}ce#$*"); err != nil || v != 0x12345678 {
		t.Errorf("read br}ce#$* = %#x, %v", v, err)
	}
	if v, err := c.ReadRegister(ctx, "next"); err != nil || v != 0x1234 {
		t.Errorf("read next = %#x, %v", v, err)
	}
	if _, err := c.ReadRegister(ctx, "wide"); err == nil {
		t.Error("a 128-bit register read into a uint64")
	}
	if err := c.WriteRegister(ctx, "next", 0xabcdef); err != nil {
		t.Fatal(err)
	}
	if acks := f.acks.Load() - acks; acks != 0 {
		t.Errorf("%d acks sent in no-ack mode", acks)
	}

	// A notification between replies is ignored.
	f.sendRaw("%Stop:T05thread:01;#" + fmt.Sprintf("%02x", checksum("Stop:T05thread:01;")))
	got, err := c.ReadMemory(ctx, 0x1000+10, 300)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte(10+i) {
			t.Fatalf("memory[%d] = %d", i, b)
		}
	}
	// Reads are split at aligned boundaries: 0x100 bytes of packet make
	// 128-byte chunks.
	var reads []string
	for len(f.cmds) > 0 {
		if cmd := <-f.cmds; strings.HasPrefix(cmd, "m") {
			reads = append(reads, cmd)
		}
	}
	if strings.Join(reads, " ") != "m100a,76 m1080,80 m1100,36" {
		t.Errorf("reads: %v", reads)
	}
	got, err = c.ReadMemory(ctx, 0x1000+990, 20)
	var me *MemoryError
	if !errors.As(err, &me) || me.Addr != 0x1000+1000 || me.Done != 10 || len(got) != 10 {
		t.Errorf("read past the end: %d bytes, %v", len(got), err)
	}
	var se *StubError
	if !errors.As(err, &se) || se.Code != 0x14 {
		t.Errorf("not a StubError E14: %v", err)
	}
	if err := c.WriteMemory(ctx, 0x2000, make([]byte, 200)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if cmd := lastCmd(f); cmd != "vCont;s:01" {
		t.Errorf("step sent %q", cmd)
	}
}

func lastCmd(f *fakeConn) string {
	var last string
	for len(f.cmds) > 0 {
		last = <-f.cmds
	}
	return last
}

func TestFakeAckModeRetransmit(t *testing.T) {
	s := newFakeStub(t)
	s.features = "PacketSize=1000;qXfer:features:read+"
	var once sync.Once
	s.hook = func(f *fakeConn, cmd string) bool {
		handled := false
		if strings.HasPrefix(cmd, "qSupported") {
			once.Do(func() {
				// A corrupted reply: the client must ask again.
				f.wmu.Lock()
				f.lastSent = fmt.Appendf(nil, "$%s#%02x", s.features, checksum(s.features))
				f.conn.Write([]byte("$" + s.features + "#00"))
				f.wmu.Unlock()
				handled = true
			})
		}
		return handled
	}
	c := s.dial(t)
	f := s.conn(0)
	if f.nacks.Load() != 1 {
		t.Errorf("%d nacks, want 1", f.nacks.Load())
	}
	if _, err := c.ReadRegisters(bg(t)); err != nil {
		t.Fatal(err)
	}
	// Every packet of the stub was acknowledged.
	if f.acks.Load() < 8 {
		t.Errorf("only %d acks in ack mode", f.acks.Load())
	}
}

func TestFakeChecksumErrorWithoutAcks(t *testing.T) {
	s := newFakeStub(t)
	s.hook = func(f *fakeConn, cmd string) bool {
		if cmd == "g" {
			f.sendRaw("$00#00")
			return true
		}
		return false
	}
	c := s.dial(t)
	_, err := c.ReadRegisters(bg(t))
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("ReadRegisters = %v, want a closed connection over a checksum", err)
	}
}

func TestFakeDeadPeer(t *testing.T) {
	s := newFakeStub(t)
	s.hook = func(f *fakeConn, cmd string) bool {
		if strings.HasPrefix(cmd, "m") {
			f.conn.Close()
			return true
		}
		return false
	}
	c := s.dial(t)
	start := time.Now()
	_, err := c.ReadMemory(bg(t), 0x1000, 4)
	if !errors.Is(err, ErrClosed) {
		t.Errorf("ReadMemory = %v, want ErrClosed", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close of a dead connection: %v", err)
	}
}

func TestFakeCloseUnblocks(t *testing.T) {
	s := newFakeStub(t)
	s.hook = func(f *fakeConn, cmd string) bool { return strings.HasPrefix(cmd, "m") } // never answered
	c := s.dial(t, WithDetachTimeout(100*time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, err := c.ReadMemory(context.Background(), 0x1000, 4)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("ReadMemory = %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ReadMemory still blocked 2s after Close")
	}
	t.Logf("Close took %v", time.Since(start))
}

func TestFakeAbandonedReply(t *testing.T) {
	s := newFakeStub(t)
	var delayed atomic.Bool
	s.hook = func(f *fakeConn, cmd string) bool {
		if strings.HasPrefix(cmd, "m") && delayed.CompareAndSwap(false, true) {
			// A slow stub: it answers in order, just late.
			time.Sleep(200 * time.Millisecond)
			f.send("deadbeef")
			return true
		}
		return false
	}
	c := s.dial(t)
	f := s.conn(0)
	ctx, cancel := context.WithTimeout(bg(t), 50*time.Millisecond)
	_, err := c.ReadMemory(ctx, 0x1000, 4)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadMemory = %v, want a deadline error", err)
	}
	// The late "deadbeef" must not pass for the answer to this.
	v, err := c.ReadRegister(bg(t), "ra")
	var cmds []string
	for len(f.cmds) > 0 {
		cmds = append(cmds, <-f.cmds)
	}
	if got := strings.Join(cmds, " "); !strings.HasSuffix(got, "m1000,4 qC p1") {
		t.Errorf("commands: %s, want the probe before p1", got)
	}
	if err != nil || v != 0x1122334455667788 {
		t.Errorf("ra = %#x, %v", v, err)
	}
	got, err := c.ReadMemory(bg(t), 0x1000, 4)
	if err != nil || string(got) != "\x00\x01\x02\x03" {
		t.Errorf("ReadMemory = %x, %v", got, err)
	}
}

func TestFakeDroppedWhileRunning(t *testing.T) {
	s := newFakeStub(t)
	c := s.dial(t)
	f := s.conn(0)
	// Resumed behind the client's back (QMP cont): the next packet is
	// dropped and answered by a stop.
	f.running.Store(true)
	v, err := c.ReadRegister(bg(t), "ra")
	if err != nil || v != 0x1122334455667788 {
		t.Fatalf("ra = %#x, %v", v, err)
	}
	var cmds []string
	for len(f.cmds) > 0 {
		cmds = append(cmds, <-f.cmds)
	}
	if got := strings.Join(cmds, " "); !strings.HasSuffix(got, "qC p1") {
		t.Errorf("commands: %s, want the probe then p1 again", got)
	}
	s2, err := c.Wait(bg(t))
	if err != nil || s2.Signal != SIGINT {
		t.Errorf("Wait = %+v, %v; want the SIGINT stop", s2, err)
	}

	// Continue, stop by interrupt, and a stop the target reports itself.
	if err := c.Continue(bg(t)); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Interrupt(bg(t)); err != nil || s.Signal != SIGINT {
		t.Fatalf("Interrupt = %+v, %v", s, err)
	}
	if err := c.Continue(bg(t)); err != nil {
		t.Fatal(err)
	}
	f.running.Store(false)
	f.send("T05thread:01;watch:1234;")
	s3, err := c.Wait(bg(t))
	if err != nil || s3.Reason != ReasonWatch || s3.Addr != 0x1234 {
		t.Errorf("Wait = %+v, %v", s3, err)
	}
}

// Threads: listed one a reply, selected with Hg only when the selection
// changes or a stop may have moved it, stepped and run alone with vCont;
// a thread parked at a breakpoint is stepped past it before a continue,
// whichever thread stopped last.
func TestFakeThreads(t *testing.T) {
	s := newFakeStub(t)
	s.threads = []string{"02", "01"}
	s.tregs = map[string]map[int]string{
		"01": {3: "0010208000000000"}, // pc 0x80201000
		"02": {3: "0020208000000000"}, // pc 0x80202000
	}
	c := s.dial(t)
	f := s.conn(0)
	ctx := bg(t)
	lastCmd(f)

	ths, err := c.Threads(ctx)
	if err != nil || strings.Join(ths, " ") != "01 02" {
		t.Fatalf("Threads = %q, %v", ths, err)
	}
	if n, ok := ThreadNumber("p1.0a"); !ok || n != 10 {
		t.Errorf("ThreadNumber(p1.0a) = %d, %v", n, ok)
	}
	info, err := c.ThreadInfo(ctx, "02")
	if err != nil || info != "CPU#02 [halted ]" || !Halted(info) {
		t.Errorf("ThreadInfo = %q, %v", info, err)
	}
	cmds := func() string {
		var out []string
		for len(f.cmds) > 0 {
			out = append(out, <-f.cmds)
		}
		return strings.Join(out, " ")
	}
	cmds()
	// cmdsUntil waits for the command a resume sends, which has no reply.
	cmdsUntil := func(last string) string {
		var out []string
		for {
			select {
			case cmd := <-f.cmds:
				out = append(out, cmd)
				if cmd == last {
					return strings.Join(out, " ")
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no %s after %q", last, out)
			}
		}
	}

	pc := func(th string) uint64 {
		t.Helper()
		v, err := c.Thread(th).ReadRegister(ctx, "pc")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The handshake's stop named 01, the stub's current thread: no Hg.
	if pc("01") != 0x80201000 || pc("02") != 0x80202000 || pc("02") != 0x80202000 || pc("") != 0x80201000 {
		t.Error("pcs by thread")
	}
	if got := cmds(); got != "p3 Hg02 p3 p3 Hg01 p3" {
		t.Errorf("commands: %s", got)
	}
	if _, err := c.Thread("07").ReadRegister(ctx, "pc"); err == nil || !strings.Contains(err.Error(), "no thread 07") {
		t.Errorf("read of a thread that does not exist: %v", err)
	}

	// A step runs the thread alone, made QEMU's current thread first (so
	// that an interrupt ends its single-stepping); its stop makes it the
	// last thread.
	cmds()
	if st, err := c.Thread("02").Step(ctx); err != nil || st.Thread != "02" || st.Reason != ReasonStep {
		t.Fatalf("step 02: %+v, %v", st, err)
	}
	if got := cmds(); got != "Hc02 vCont;s:02" {
		t.Errorf("step of 02: %s", got)
	}
	if pc("") != 0x80202004 {
		t.Error("after a step of 02, the default thread is not 02")
	}
	if got := cmds(); got != "Hg02 p3" {
		t.Errorf("commands after a stop on 02: %s", got)
	}

	// 02 stopped at a breakpoint; then 01 is stepped. A continue steps 02
	// past its breakpoint (01 is not at one) before resuming all, and
	// reads its pc after the step to see that it moved.
	s.rewind("02")
	if err := c.SetBreakpoint(ctx, Software, 0x80202000, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Thread("01").Step(ctx); err != nil {
		t.Fatal(err)
	}
	cmds()
	if err := c.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cmdsUntil("c"); got != "Hg01 p3 Hg02 p3 z0,80202000,4 p3 Hc02 vCont;s:02 p3 Z0,80202000,4 c" {
		t.Errorf("continue: %s", got)
	}
	if _, err := c.Interrupt(ctx); err != nil {
		t.Fatal(err)
	}
	cmds()
	// Running one thread alone. The interrupt stopped 02, the thread
	// last resumed alone, so it is still selected, and current: neither
	// Hg nor Hc. QEMU's step now and then leaves the pc in place: it is
	// stepped again.
	s.rewind("02")
	s.mu.Lock()
	s.stalls = 1
	s.mu.Unlock()
	if err := c.Thread("02").Continue(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cmdsUntil("vCont;c:02"); got != "p3 z0,80202000,4 p3 vCont;s:02 p3 vCont;s:02 p3 Z0,80202000,4 vCont;c:02" {
		t.Errorf("continue 02 alone: %s", got)
	}
}

// A stub without a target description sends the 'g' registers of the
// guest's architecture: riscv64's x0..x31 and pc, also known as x5 and
// s0; aarch64's x0..x30, sp and pc, x29 also known as fp; an architecture
// the debugger does not know has none to assume.
func TestFakeNoDescription(t *testing.T) {
	s := newFakeStub(t)
	s.features = "PacketSize=1000"
	c := s.dial(t)
	regs := c.Registers()
	if len(regs) != 33 || regs[32].Name != "pc" || regs[32].Type != "code_ptr" || c.Arch() != "riscv:rv64" {
		t.Errorf("riscv64 without a description: %s, %+v", c.Arch(), regs)
	}
	for alias, name := range map[string]string{"x5": "t0", "s0": "fp", "x0": "zero"} {
		if r, ok := c.Register(alias); !ok || r.Name != name {
			t.Errorf("%s = %+v, %v; want %s", alias, r, ok, name)
		}
	}
	s2 := newFakeStub(t)
	s2.features = "PacketSize=1000"
	c2 := s2.dial(t, WithArch(arm64.Arch))
	if regs := c2.Registers(); len(regs) != 33 || regs[31].Name != "sp" || regs[32].Name != "pc" || c2.Arch() != "aarch64" {
		t.Errorf("aarch64 without a description: %s, %+v", c2.Arch(), regs)
	}
	if r, ok := c2.Register("fp"); !ok || r.Name != "x29" {
		t.Errorf("aarch64's fp = %+v, %v", r, ok)
	}
	s3 := newFakeStub(t)
	s3.features = "PacketSize=1000"
	if regs := s3.dial(t, WithArch(noDebugger{arm64.Arch})).Registers(); len(regs) != 0 {
		t.Errorf("an architecture without the debugger, without a description: %+v", regs)
	}
}

// noDebugger is an architecture the debugger does not support.
type noDebugger struct{ arch.Arch }

func (noDebugger) Debugger() arch.Debugger { return nil }

// Leave goes without a detach, which would resume the guest (QEMU
// resumes on a detach even a guest that has not run yet), unless the
// client set breakpoints: those a silent leave would strand in the stub,
// so it detaches as Close does.
func TestFakeLeave(t *testing.T) {
	for _, set := range []bool{false, true} {
		s := newFakeStub(t)
		c := s.dial(t)
		f := s.conn(0)
		if set {
			if err := c.SetBreakpoint(bg(t), Software, 0x80200000, 4); err != nil {
				t.Fatal(err)
			}
		}
		lastCmd(f)
		if err := c.Leave(); err != nil {
			t.Fatalf("Leave (breakpoints set: %v): %v", set, err)
		}
		select {
		case <-c.Done():
		default:
			t.Error("the connection is still open after Leave")
		}
		time.Sleep(50 * time.Millisecond)
		if got, want := lastCmd(f), map[bool]string{false: "", true: "D"}[set]; got != want {
			t.Errorf("Leave with breakpoints set %v sent %q, want %q", set, got, want)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close after Leave: %v", err)
		}
	}
}
