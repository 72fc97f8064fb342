package instance

import (
	"fmt"

	"github.com/qemu-mcp/qemu-mcp/internal/ktap"
	"github.com/qemu-mcp/qemu-mcp/internal/reaper"
	"github.com/qemu-mcp/qemu-mcp/qemu"
	"github.com/qemu-mcp/qemu-mcp/qemuline"
	"github.com/qemu-mcp/qemu-mcp/recording"
	"github.com/qemu-mcp/qemu-mcp/serial"
	"github.com/qemu-mcp/qemu-mcp/shell"
	"github.com/qemu-mcp/qemu-mcp/snapshot"
)

// Span is a range of console cursors [Start, End).
type Span struct {
	Start, End int64
}

// Len is how many bytes the span covers.
func (s Span) Len() int64 { return s.End - s.Start }

// The guest's results in the types of the packages that make them, named
// here so that a caller of the guest's methods needs only this package.
type (
	// KernelMessage is a kernel message told apart from a command's
	// output.
	KernelMessage = shell.KernelMessage
	// Reaped is what dead servers had left and a boot removed.
	Reaped = reaper.Report
	// LineReport is what became of each option of a command line a
	// boot gave.
	LineReport = qemuline.Report
	// ShellResult is how a command at the guest's shell went.
	ShellResult = shell.Result
	// SnapshotMeta is a saved state's record; RecordingMeta a recording's.
	SnapshotMeta  = snapshot.Meta
	RecordingMeta = recording.Meta
)

// RecordingStopped is how a recording ended that a stop of its guest
// ended (RecordingMeta.Ended).
const RecordingStopped = recording.EndedStopped

// TestSummary is what the TAP or KTAP in a stretch of output says: totals
// and the failures.
type TestSummary = ktap.Summary

// Excerpt is a stretch of a guest's console output as a call on the
// console took it: whole, or its start and its end with the middle left
// out to stay within a size, with what was found in it. Its bytes are as
// the guest sent them; what a reader sees of them is the caller's.
type Excerpt struct {
	// Since is the cursor the excerpt was asked from, clamped to the
	// output there was.
	Since int64
	// Start is the cursor of the excerpt's first byte: Since, unless the
	// front was cut to stay within the size or was lost.
	Start int64
	// Head, with Elided, is the start kept of a longer output: the bytes
	// [Start, Elided.Start). Nil when the excerpt keeps no start.
	Head []byte
	// Elided is the middle left out: [Start+len(Head), the first byte of
	// Tail). Nil when nothing was.
	Elided *Span
	// Tail is the bytes from Elided.End (or Start) to End: the whole
	// excerpt when nothing was left out.
	Tail []byte
	// End is the cursor just past the excerpt: where a reader goes on.
	End int64
	// Lost says bytes between Since and Start are gone for good: they
	// left memory and no transcript holds them.
	Lost bool
	// Truncated says there is output the excerpt does not hold, before
	// or after it, or in its elided middle.
	Truncated bool
	// Transcript is the console transcript's state when the excerpt was
	// taken: whether the file holds the whole output.
	Transcript serial.TranscriptStatus
	// Tests summarises the TAP or KTAP in the output the excerpt covers.
	Tests *TestSummary
	// KernelMessages are the kernel's log lines taken out of a command's
	// output, where they can be told apart (see shell.SplitKernel).
	KernelMessages []shell.KernelMessage
	// Exit is QEMU's exit, once it exited; nil while it runs.
	Exit *qemu.Exit
}

// LostBytes is how many bytes before Start are gone for good.
func (e Excerpt) LostBytes() int64 {
	if !e.Lost {
		return 0
	}
	return e.Start - e.Since
}

// maxTestScan bounds the output scanned for test results.
const maxTestScan = 8 << 20

// maxKernelMessages bounds the kernel messages an excerpt lists.
const maxKernelMessages = 20

// testsIn summarises the TAP or KTAP in the console's output [from, to).
func testsIn(buf *serial.Buffer, from, to int64) *TestSummary {
	if to <= from || to-from > maxTestScan {
		return nil
	}
	page, err := buf.ReadPage(from, int(to-from))
	if err != nil {
		return nil
	}
	if sum, ok := ktap.Parse(page.Data); ok {
		return &sum
	}
	return nil
}

// exitOf is mch's exit, nil while it runs.
func exitOf(mch *qemu.Process) *qemu.Exit {
	if mch == nil {
		return nil
	}
	if exit, ok := mch.Exited(); ok {
		return &exit
	}
	return nil
}

// waited makes the excerpt of a console wait's result: its output whole,
// or, where the wait kept a head, the head and the tail around the
// elided middle.
func waited(buf *serial.Buffer, res serial.Result) Excerpt {
	ex := Excerpt{
		Since: res.Since, Start: res.OutputStart, Tail: res.Output, End: res.Cursor,
		Lost: res.Lost, Truncated: res.OutputStart > res.Since && !res.Lost,
		Transcript: buf.TranscriptStatus(), Tests: testsIn(buf, res.Since, res.Cursor),
	}
	if res.Head != nil {
		ex.Head = res.Head
		ex.Elided = &Span{Start: res.Since + int64(len(res.Head)), End: res.OutputStart}
		ex.Start = res.Since
	}
	return ex
}

// pageOf reads at most size bytes from since on without waiting; whole
// ends a page that more output follows where an escape or UTF-8 sequence
// is complete, so that the next page starts with the rest of it.
func pageOf(buf *serial.Buffer, since int64, size int, whole bool) (Excerpt, error) {
	since = min(max(since, 0), buf.End())
	page, err := buf.ReadPage(since, size)
	if err != nil {
		return Excerpt{}, fmt.Errorf("read serial output: %w", err)
	}
	data := page.Data
	end := buf.End()
	if whole && page.Next < end {
		if k := serial.CompletePrefix(data); k > 0 {
			data = data[:k]
		}
	}
	ex := Excerpt{Since: since, Start: page.Start, Tail: data, End: page.Start + int64(len(data)), Lost: page.Lost > 0, Transcript: buf.TranscriptStatus()}
	ex.Truncated = ex.End < end
	return ex, nil
}

// commandOutput is the excerpt of a command's output [from, to): whole if
// it is at most size bytes, else its first quarter (with keepHead, ended
// where a sequence is complete) and the rest of size from its end. Kernel
// messages are taken out of both where uptime tells them apart; those of
// a start that is not kept are listed all the same.
func commandOutput(buf *serial.Buffer, from, to int64, uptime float64, size int, keepHead bool) (Excerpt, error) {
	ex := Excerpt{Since: from, Start: from, End: to, Transcript: buf.TranscriptStatus(), Tests: testsIn(buf, from, to)}
	read := func(at int64, n int) ([]byte, error) {
		if n <= 0 {
			return nil, nil
		}
		page, err := buf.ReadPage(at, n)
		if err != nil {
			return nil, fmt.Errorf("read the command's output: %w", err)
		}
		if page.Lost > 0 {
			ex.Truncated = true
		}
		return page.Data, nil
	}
	split := func(b []byte, at int64) []byte {
		kept, msgs := shell.SplitKernel(b, at, uptime)
		for _, m := range msgs {
			if len(ex.KernelMessages) < maxKernelMessages {
				ex.KernelMessages = append(ex.KernelMessages, m)
			}
		}
		return kept
	}
	if to-from <= int64(size) {
		b, err := read(from, int(to-from))
		if err != nil {
			return Excerpt{}, err
		}
		ex.Tail = split(b, from)
		return ex, nil
	}
	ex.Truncated = true
	head := size / 4
	headB, err := read(from, head)
	if err != nil {
		return Excerpt{}, err
	}
	if keepHead {
		if k := serial.CompletePrefix(headB); k > 0 {
			headB = headB[:k]
		}
	}
	tailFrom := to - int64(size-head)
	tailB, err := read(tailFrom, int(to-tailFrom))
	if err != nil {
		return Excerpt{}, err
	}
	headEnd := from + int64(len(headB))
	headB = split(headB, from)
	ex.Tail = split(tailB, tailFrom)
	if !keepHead {
		ex.Elided = &Span{Start: from, End: tailFrom}
		return ex, nil
	}
	if headB == nil {
		headB = []byte{}
	}
	ex.Head, ex.Elided = headB, &Span{Start: headEnd, End: tailFrom}
	return ex, nil
}
