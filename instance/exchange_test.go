package instance

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/serial"
)

// bufferOf is a buffer that holds data.
func bufferOf(t *testing.T, data string, opts ...serial.Option) *serial.Buffer {
	t.Helper()
	b, err := serial.OpenBuffer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if _, err := b.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	return b
}

// whole is the excerpt's bytes with the elided middle read back from buf:
// what the excerpt stands for.
func whole(t *testing.T, buf *serial.Buffer, ex Excerpt) string {
	t.Helper()
	s := string(ex.Head)
	if ex.Elided != nil {
		page, err := buf.ReadPage(ex.Elided.Start, int(ex.Elided.Len()))
		if err != nil {
			t.Fatal(err)
		}
		s += string(page.Data)
	}
	return s + string(ex.Tail)
}

// Typed text ends every line with the ending asked for, the last one too,
// whichever ending the text came with; the echo a wait skips is the first
// line.
func TestLinesAsTyped(t *testing.T) {
	for _, c := range []struct{ data, ending, want string }{
		{"ls", "\r", "ls\r"},
		{"a\nb", "\r", "a\rb\r"},
		{"a\r\nb", "\r", "a\rb\r"},
		{"a\r\nb", "\r\n", "a\r\nb\r\n"},
		{"a\nb", "\n", "a\nb\n"},
		{"a\nb", "", "ab"},
		{"\u0003", "", "\u0003"},
	} {
		if got := lines(c.data, c.ending); got != c.want {
			t.Errorf("lines(%q, %q) = %q, want %q", c.data, c.ending, got, c.want)
		}
	}
	for data, want := range map[string]string{"ls -l": "ls -l", "a\r\nb": "a", "a\nb": "a", "\nb": ""} {
		if got := firstLine(data); got != want {
			t.Errorf("firstLine(%q) = %q, want %q", data, got, want)
		}
	}
}

// A failed typing says how much the guest took and where its output shows
// what it did with it, and why: no echo, too slow, or the error itself.
func TestWriteErrorSaysWhy(t *testing.T) {
	noEcho := &WriteError{Took: 4, Of: 8, From: 100, Err: &NoEchoError{Within: 2 * time.Second, From: 4, Chunk: []byte("abcd")}}
	slow := &WriteError{Took: 1, Of: 9, From: 7, Timeout: 3 * time.Second, Err: context.DeadlineExceeded}
	other := &WriteError{Took: 0, Of: 3, Err: errors.New("broken pipe")}
	for _, c := range []struct {
		err  *WriteError
		want string
	}{
		{noEcho, `write to serial console: the guest took 4 of 8 bytes: the guest did not echo what was typed within 2s of bytes 4..8 ("abcd"): a recording guest is given input only as fast as it takes it, which its echo shows; output from cursor 100 on shows what it did with them`},
		{slow, "write to serial console: the guest took 1 of 9 bytes within the timeout of 3s (it is not reading its console fast enough); output from cursor 7 on shows what it did with them"},
		{other, "write to serial console: broken pipe (wrote 0 of 3 bytes)"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
	if !errors.Is(noEcho, ErrNoEcho) || !errors.Is(slow, context.DeadlineExceeded) {
		t.Errorf("the cause is lost: %v, %v", errors.Is(noEcho, ErrNoEcho), errors.Is(slow, context.DeadlineExceeded))
	}
	var we *WaitError
	if err := error(&WaitError{Err: ErrExited}); !errors.As(err, &we) || !errors.Is(err, ErrExited) || err.Error() != ErrExited.Error() {
		t.Errorf("a wait error: %v", err)
	}
}

const tapOutput = "TAP version 13\r\n1..3\r\nok 1 - first\r\nnot ok 2 - second\r\nok 3 - third # SKIP no disk\r\n"

// A wait's excerpt with a head is its start and its end around the
// elided middle, which the buffer still holds; the tests in all of it
// are summarised, the elided part's too.
func TestWaitedExcerpt(t *testing.T) {
	data := "boot log\r\n" + tapOutput + strings.Repeat("filler line\r\n", 40) + "$ "
	buf := bufferOf(t, data)
	ctx := context.Background()
	res, err := buf.WaitFor(ctx, 0, serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile(`\$ $`)}, Timeout: time.Second, MaxOutput: 100, Head: 25})
	if err != nil || !res.Matched {
		t.Fatalf("wait: %+v %v", res, err)
	}
	ex := waited(buf, res)
	if ex.Since != 0 || ex.Start != 0 || ex.End != int64(len(data)) || !ex.Truncated || ex.Lost || ex.Elided == nil {
		t.Fatalf("excerpt: %+v", ex)
	}
	if string(ex.Head) != data[:len(ex.Head)] || len(ex.Head) == 0 || ex.Elided.Start != int64(len(ex.Head)) || ex.Elided.End >= ex.End {
		t.Errorf("head %q, elided %+v", ex.Head, *ex.Elided)
	}
	if got := whole(t, buf, ex); got != data {
		t.Errorf("head, elided and tail are not the output:\n%q\nwant\n%q", got, data)
	}
	if ex.Tests == nil || ex.Tests.Passed != 1 || ex.Tests.Failed != 1 || ex.Tests.Skipped != 1 || len(ex.Tests.Failures) != 1 || ex.Tests.Failures[0].Name != "second" {
		t.Errorf("tests: %+v", ex.Tests)
	}

	// Without a head the front is cut: the excerpt starts later.
	res, _ = buf.WaitFor(ctx, 0, serial.Spec{Timeout: -1, MaxOutput: 30})
	ex = waited(buf, res)
	if ex.Head != nil || ex.Elided != nil || ex.Start != int64(len(data)-30) || !ex.Truncated || string(ex.Tail) != data[len(data)-30:] {
		t.Errorf("without a head: %+v", ex)
	}
	// A wait from the end of the output has no tests to tell.
	res, _ = buf.WaitFor(ctx, int64(len(data)), serial.Spec{Timeout: -1})
	if ex = waited(buf, res); ex.Tests != nil || ex.Truncated || len(ex.Tail) != 0 {
		t.Errorf("from the end: %+v", ex)
	}
}

// A read pages through the output; a page that more follows ends where a
// character is complete when asked, and a read past what the ring kept
// starts after the loss and says how much is gone.
func TestPageOf(t *testing.T) {
	data := "hé wörld" // é is 2 bytes, at 1 and 2
	buf := bufferOf(t, data)
	ex, err := pageOf(buf, 0, 2, true)
	if err != nil || string(ex.Tail) != "h" || ex.End != 1 || !ex.Truncated || ex.Since != 0 || ex.Start != 0 {
		t.Errorf("a page ending inside é: %+v %v", ex, err)
	}
	if ex, _ = pageOf(buf, ex.End, 100, true); string(ex.Tail) != data[1:] || ex.Truncated || ex.End != int64(len(data)) {
		t.Errorf("the next page: %+v", ex)
	}
	if ex, _ = pageOf(buf, 0, 2, false); ex.End != 2 {
		t.Errorf("a raw page keeps every byte: %+v", ex)
	}
	if ex, _ = pageOf(buf, 1000, 10, true); ex.Since != int64(len(data)) || ex.Start != ex.Since || ex.End != ex.Since || ex.Truncated || ex.Lost {
		t.Errorf("a page past the end: %+v", ex)
	}
	if ex, _ = pageOf(buf, -5, 1, true); ex.Since != 0 || string(ex.Tail) != "h" {
		t.Errorf("a page from before the start: %+v", ex)
	}

	small := bufferOf(t, strings.Repeat("x", 90)+"0123456789", serial.WithRingSize(10))
	ex, err = pageOf(small, 0, 1000, true)
	if err != nil || !ex.Lost || ex.Start != 90 || ex.LostBytes() != 90 || string(ex.Tail) != "0123456789" {
		t.Errorf("a page of lost output: %+v %v", ex, err)
	}
	if ex, _ = pageOf(small, 95, 1000, true); ex.Lost || ex.LostBytes() != 0 {
		t.Errorf("a page of kept output: %+v", ex)
	}
}

// A command's output is whole within the size, else its start and its
// end: the start kept cleanly (not in the middle of a character) unless
// the output is raw, where only the end is. The kernel's messages come
// out of it, those of a start that is not kept too, and the tests in it
// are summarised.
func TestCommandOutput(t *testing.T) {
	kmsg := "[   12.500000] eth0: link up\r\n"
	out := "line one\r\n" + kmsg + tapOutput
	prefix := "$ cmd\r\n"
	buf := bufferOf(t, prefix+out+"$ ")
	from, to := int64(len(prefix)), int64(len(prefix)+len(out))

	ex, err := commandOutput(buf, from, to, 12.0, 1000, true)
	if err != nil || ex.Truncated || ex.Elided != nil || ex.Head != nil || string(ex.Tail) != "line one\r\n"+tapOutput {
		t.Fatalf("a short output: %+v %v", ex, err)
	}
	if len(ex.KernelMessages) != 1 || ex.KernelMessages[0].Text != "[   12.500000] eth0: link up" || ex.KernelMessages[0].Cursor != from+10 {
		t.Errorf("kernel messages: %+v", ex.KernelMessages)
	}
	if ex.Tests == nil || ex.Tests.Failed != 1 {
		t.Errorf("tests: %+v", ex.Tests)
	}
	// Messages older than the command are its output (dmesg prints them).
	if ex, _ = commandOutput(buf, from, to, 13.0, 1000, true); len(ex.KernelMessages) != 0 || !strings.Contains(string(ex.Tail), "eth0") {
		t.Errorf("an old message: %+v", ex)
	}

	// A long output, the first quarter's end inside a character.
	long := kmsg + strings.Repeat("a", 19) + "é" + strings.Repeat("b", 400) + "END" // é at 49 and 50
	buf = bufferOf(t, long)
	to = int64(len(long))
	ex, err = commandOutput(buf, 0, to, 12.0, 200, true)
	if err != nil || !ex.Truncated || ex.Elided == nil {
		t.Fatalf("a long output: %+v %v", ex, err)
	}
	if ex.Elided.Start != int64(len(kmsg)+19) || ex.Elided.End != to-150 || string(ex.Head) != strings.Repeat("a", 19) {
		t.Errorf("head %q, elided %+v", ex.Head, *ex.Elided)
	}
	if !strings.HasSuffix(string(ex.Tail), "END") || len(ex.Tail) != 150 || len(ex.KernelMessages) != 1 {
		t.Errorf("tail %d bytes, kernel messages %+v", len(ex.Tail), ex.KernelMessages)
	}
	// Raw: the end only, the elided span from the start; the start's
	// kernel message is listed still.
	ex, _ = commandOutput(buf, 0, to, 12.0, 200, false)
	if ex.Head != nil || ex.Elided == nil || ex.Elided.Start != 0 || ex.Elided.End != to-150 || len(ex.KernelMessages) != 1 {
		t.Errorf("a long raw output: %+v", ex)
	}

	// At most maxKernelMessages are listed.
	var many strings.Builder
	for k := range maxKernelMessages + 5 {
		fmt.Fprintf(&many, "[   20.%06d] message %d\r\n", k, k)
	}
	buf = bufferOf(t, many.String())
	if ex, _ = commandOutput(buf, 0, int64(many.Len()), 12.0, 100000, true); len(ex.KernelMessages) != maxKernelMessages || len(ex.Tail) != 0 {
		t.Errorf("%d kernel messages, %d bytes left", len(ex.KernelMessages), len(ex.Tail))
	}

	// A command whose output left memory is truncated, and says so.
	lost := bufferOf(t, strings.Repeat("x", 100), serial.WithRingSize(10))
	if ex, _ = commandOutput(lost, 0, 100, 0, 1000, true); !ex.Truncated || len(ex.Tail) != 10 {
		t.Errorf("lost output: %+v", ex)
	}
}

// On a running guest: a send's wait starts after the guest's echo; a
// send without a wait says where the answer begins; reads page through
// what came; a command where no shell answers says so; a panic ends a
// wait, with no triage on a guest without a debugger.
func TestSendAwaitRead(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, filepath.Join(t.TempDir(), "qemu-mcp.lock"))
	i, since := bootTiny(t, ctx, m, "x")
	if h := m.Health(t.TempDir()); len(h.Guests) != 1 || h.Guests[0].Name != "x" || h.Guests[0].Degraded() {
		t.Errorf("the health of a running guest: %+v", h.Guests)
	}
	echo := regexp.MustCompile(`echo`)
	sent, err := i.Send(ctx, Input{Data: "echo echo", Ending: "\r", Timeout: 5 * time.Second, Who: "a test",
		Wait: &serial.Spec{Patterns: []*regexp.Regexp{echo}, Timeout: 5 * time.Second}})
	if err != nil || sent.Written != len("echo echo\r") || !sent.Matched || sent.Exit != nil || sent.Since != since {
		t.Fatalf("send: %+v %v", sent, err)
	}
	if sent.EchoEnd != since+int64(len("echo echo")) || sent.MatchStart < sent.EchoEnd || string(sent.Match) != "echo" || sent.Event != nil || sent.DebugStop != nil {
		t.Errorf("the wait after the echo: echo end %d, match %q at %d", sent.EchoEnd, sent.Match, sent.MatchStart)
	}
	// With MatchEcho the echo itself matches.
	from := sent.End
	expect(t, ctx, i, &from, tinyPrompt)
	sent, err = i.Send(ctx, Input{Data: "echo echo", Ending: "\r", Timeout: 5 * time.Second, MatchEcho: true,
		Wait: &serial.Spec{Patterns: []*regexp.Regexp{echo}, Timeout: 5 * time.Second}})
	if err != nil || sent.EchoEnd != 0 || sent.Since != from || sent.MatchStart != from {
		t.Errorf("a send matching its echo from %d: %+v %v", from, sent, err)
	}
	expect(t, ctx, i, &from, `echo\r\n`+tinyPrompt)

	sent, err = i.Send(ctx, Input{Data: "echo paged", Ending: "\r", Timeout: 5 * time.Second})
	if err != nil || sent.Matched || sent.Start != from || sent.End != from || len(sent.Tail) != 0 || sent.Exit != nil {
		t.Fatalf("a send without a wait: %+v %v", sent, err)
	}
	expect(t, ctx, i, &from, `paged\r\n`+tinyPrompt)
	var got string
	for cur := sent.Start; cur < from; {
		ex, err := i.Read(cur, 4, true)
		if err != nil || ex.Start != cur || ex.End <= cur {
			t.Fatalf("read from %d: %+v %v", cur, ex, err)
		}
		got += string(ex.Tail)
		cur = ex.End
	}
	if got != "echo paged\r\npaged\r\ntiny> " {
		t.Errorf("pages: %q", got)
	}

	w, err := i.Await(ctx, from, serial.Spec{Idle: 200 * time.Millisecond, Timeout: 5 * time.Second})
	if err != nil || !w.Idle || w.DebugStop != nil || w.Exit != nil {
		t.Errorf("an idle wait: %+v %v", w, err)
	}
	ran, err := i.Exec(ctx, Command{Line: "true", Timeout: time.Second, MaxOutput: 1000, KeepHead: true})
	if err != nil || !ran.NoShell || ran.Started || ran.Output.Exit != nil || ran.Event != nil {
		t.Errorf("a command without a shell: %+v %v", ran, err)
	}
	sent, err = i.Send(ctx, Input{Data: "\u0003panic", Ending: "\r", Timeout: 5 * time.Second,
		Wait: &serial.Spec{Patterns: []*regexp.Regexp{regexp.MustCompile("never")}, Timeout: 10 * time.Second}})
	if err != nil || !sent.Panicked || !strings.Contains(sent.PanicMatch, "Kernel panic - not syncing: requested by user") || sent.Triage != nil || sent.TriageErr != nil {
		t.Errorf("a panic: %+v %v", sent, err)
	}
}
