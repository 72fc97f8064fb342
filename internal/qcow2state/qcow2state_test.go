package qcow2state

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func open(t *testing.T, b []byte, tag string) (*State, error) {
	t.Helper()
	return New(bytes.NewReader(b), int64(len(b)), tag)
}

func mustOpen(t *testing.T, b []byte) *State {
	t.Helper()
	st, err := open(t, b, "ck")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func read(t *testing.T, st *State, block string, off uint64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	if err := st.Read(block, off, p); err != nil {
		t.Fatalf("read %s+%#x: %v", block, off, err)
	}
	return p
}

// Every way QEMU saves a page reads back as the page: data, zero, a
// nonzero fill, a page saved again later (the later wins), a block
// continued; across pages; in images of 512-byte to 64 KiB clusters, the
// clusters in any order, zero clusters unallocated or flagged.
func TestRead(t *testing.T) {
	for _, im := range []image{{}, {clusterBits: 9, seed: 1}, {clusterBits: 12, seed: 2}, {clusterBits: 16, diskSize: 1 << 30, seed: 3}, {version: 2, clusterBits: 12}} {
		st := mustOpen(t, im.build(testState()))
		want := []struct {
			block string
			page  uint64
			fill  byte
		}{{"ram", 0, 0xc0}, {"ram", 1, 0}, {"ram", 2, 0xc2}, {"ram", 3, 0}, {"ram", 5, 0}, {"ram", 8, 0x88}, {"ram", 10, 0}, {"ram", 15, 0},
			{"dev/rom", 0, 0xb0}, {"dev/rom", 1, 0x5a}}
		for _, w := range want {
			if got := read(t, st, w.block, w.page<<12, 4096); !bytes.Equal(got, pageOf(w.fill)) {
				t.Errorf("%+v: page %s %d reads % x...", im, w.block, w.page, got[:8])
			}
		}
		if got := read(t, st, "ram", 4094, 4); !bytes.Equal(got, []byte{0xc0, 0xc0, 0, 0}) {
			t.Errorf("across pages: % x", got)
		}
		if b := st.Blocks(); len(b) != 2 || b[0] != (Block{"ram", 16 << 12}) || b[1] != (Block{"dev/rom", 2 << 12}) {
			t.Errorf("blocks: %+v", b)
		}
		for _, c := range []struct {
			block string
			off   uint64
			n     int
		}{{"ram", 9 << 12, 1}, {"ram", 8<<12 + 4095, 2}, {"ram", 9<<12 + 4095, 2}, {"ram", 16 << 12, 1}, {"ram", 16<<12 - 1, 2}, {"nvram", 0, 1}, {"ram", 1 << 63, 1}} {
			if err := st.Read(c.block, c.off, make([]byte, c.n)); !errors.Is(err, ErrNoPage) {
				t.Errorf("%d bytes of %s at %#x: %v, want ErrNoPage", c.n, c.block, c.off, err)
			}
		}
	}
}

// A stream without section footers, with the configuration's target page
// bits and UUID, and an empty multifd flush record, reads as well.
func TestStreamVariants(t *testing.T) {
	var s stream
	s.header(func(s *stream) {
		s.u8(secSubsection).str("configuration/target-page-bits").u32(1).u32(12)
	}, func(s *stream) {
		s.u8(secSubsection).str("configuration/uuid").u32(1)
		s.Write(make([]byte, 16))
	})
	s.sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 2 << 12}).u64(flagMultifdFlush).eos()
	s.u8(secEnd).u32(0).page("ram", 1<<12, pageOf(7)).zero("", 0, 0).eos()
	s.sectionStart(secFull, 1, "cpu", 1)
	st := mustOpen(t, image{}.build(s.Bytes()))
	if got := read(t, st, "ram", 4095, 2); !bytes.Equal(got, []byte{0, 7}) {
		t.Errorf("read: % x", got)
	}
}

// What the reader does not understand, it refuses as such, naming it.
func TestUnsupported(t *testing.T) {
	withRAM := func(records func(*stream)) []byte {
		var s stream
		s.header()
		s.sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 4 << 12}).eos().footer(0)
		s.u8(secEnd).u32(0)
		records(&s)
		s.eos().footer(0)
		return s.Bytes()
	}
	var caps stream
	caps.header(func(s *stream) {
		s.u8(secSubsection).str("configuration/capabilities").u32(1).u32(1).str("x-ignore-shared")
	})
	var other stream
	other.header().sectionStart(secStart, 0, "dirty-bitmap", 1)
	var device stream
	device.header().sectionStart(secFull, 0, "cpu", 1)
	var v2 stream
	v2.u32(streamMagic).u32(2)
	var sub stream
	sub.header(func(s *stream) { s.u8(secSubsection).str("configuration/new-thing").u32(1) })
	var ramv stream
	ramv.header().sectionStart(secStart, 0, "ram", 5)
	for _, c := range []struct {
		name  string
		image []byte
		says  string
	}{
		{"compressed cluster", image{compressed: 1}.build(testState()), "compressed cluster"},
		{"encrypted", image{crypt: 2}.build(testState()), "encrypted"},
		{"backing file", image{backing: true}.build(testState()), "backing file"},
		{"external data file", image{incompat: featExternalData}.build(testState()), "external data"},
		{"extended L2", image{incompat: featExtendedL2}.build(testState()), "extended L2"},
		{"marked corrupt", image{incompat: featCorrupt}.build(testState()), "corrupt"},
		{"unknown feature", image{incompat: 1 << 20}.build(testState()), "incompatible features"},
		{"qcow2 version 4", image{version: 4}.build(testState()), "version 4"},
		{"XBZRLE page", image{}.build(withRAM(func(s *stream) { s.u64(flagXBZRLE).str("ram") })), "XBZRLE"},
		{"compressed page", image{}.build(withRAM(func(s *stream) { s.u64(flagCompressPage).str("ram") })), "compressed page"},
		{"RDMA hook", image{}.build(withRAM(func(s *stream) { s.u64(flagHook) })), "RDMA"},
		{"page and zero", image{}.build(withRAM(func(s *stream) { s.u64(flagPage | flagZero).str("ram") })), "flags 0xa"},
		{"capabilities", image{}.build(caps.Bytes()), "x-ignore-shared"},
		{"another live section", image{}.build(other.Bytes()), "dirty-bitmap"},
		{"a device before RAM", image{}.build(device.Bytes()), `"cpu"`},
		{"stream version 2", image{}.build(v2.Bytes()), "version 2"},
		{"unknown subsection", image{}.build(sub.Bytes()), "new-thing"},
		{"RAM version 5", image{}.build(ramv.Bytes()), "version 5"},
	} {
		_, err := open(t, c.image, "ck")
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrUnsupported saying %q", c.name, err, c.says)
		}
	}
}

// A damaged image or stream is reported as damaged; a tag the image does
// not hold (or holds without a machine state) as no state.
func TestDamaged(t *testing.T) {
	good := image{}.build(testState())
	if _, err := open(t, good, "nope"); !errors.Is(err, ErrNoState) {
		t.Errorf("missing tag: %v", err)
	}
	if _, err := open(t, good, "disk"); !errors.Is(err, ErrNoState) {
		t.Errorf("disk-only snapshot: %v", err)
	}
	st := testState()
	var noRAMEnd stream
	noRAMEnd.header().u8(secEOF)
	var twice stream
	twice.header().sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 4096}).memSize(testBlock{"ram", 4096})
	var unnamed stream
	unnamed.header().sectionStart(secStart, 0, "ram", 4).memSize().eos().footer(0).u8(secEnd).u32(0).zero("rom", 0, 0)
	var past stream
	past.header().sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 4096}).eos().u8(secEnd).u32(0).zero("ram", 4096, 0)
	var cont stream
	cont.header().sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 4096}).eos().u8(secEnd).u32(0).zero("", 0, 0)
	var foot stream
	foot.header().sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"ram", 4096}).eos().footer(9)
	for _, c := range []struct {
		name  string
		image []byte
	}{
		{"not qcow2", append([]byte("QFI\xfc"), good[4:]...)},
		{"truncated header", good[:50]},
		{"truncated image", good[:len(good)/2]},
		{"stream cut", image{}.build(st[:len(st)/2])},
		{"not a stream", image{}.build([]byte("this is not QEMU's stream"))},
		{"stream ends before RAM", image{}.build(noRAMEnd.Bytes())},
		{"blocks twice", image{}.build(twice.Bytes())},
		{"unknown block", image{}.build(unnamed.Bytes())},
		{"page past its block", image{}.build(past.Bytes())},
		{"continue with no block", image{}.build(cont.Bytes())},
		{"wrong footer", image{}.build(foot.Bytes())},
	} {
		_, err := open(t, c.image, "ck")
		if !errors.Is(err, ErrDamaged) {
			t.Errorf("%s: %v, want ErrDamaged", c.name, err)
		}
	}
}

// The flat view QEMU 7.2 prints for a riscv64 virt machine, and a range
// that starts inside its region, place physical addresses in RAM blocks.
func TestFlatView(t *testing.T) {
	out := "FlatView #0\r\n AS \"gpex-root\", root: bus master container\r\n Root memory region: (none)\r\n  No rendered FlatView\r\n\r\n" +
		"FlatView #1\r\n AS \"I/O\", root: io\r\n Root memory region: io\r\n  0000000000000000-000000000000ffff (prio 0, i/o): io\r\n\r\n" +
		"FlatView #2\r\n AS \"memory\", root: system\r\n AS \"cpu-memory-0\", root: system\r\n Root memory region: system\r\n" +
		"  0000000000001000-0000000000001fff (prio 0, rom): rom\r\n" +
		"  0000000000100000-0000000000100fff (prio 0, i/o): riscv.sifive.test\r\n" +
		"  0000000020000000-0000000021ffffff (prio 0, romd): virt.flash0\r\n" +
		"  0000000040000000-000000007fffffff (prio 0, i/o): gpex_mmio_window @0000000040000000\r\n" +
		"  0000000080000000-0000000080003fff (prio 0, ram): ram\r\n" +
		"  0000000090000000-0000000090003fff (prio 0, ram): ram @0000000000004000\r\n\r\n" +
		"FlatView #3\r\n AS \"other\", root: other\r\n  0000000000000000-0000000000000fff (prio 0, ram): elsewhere\r\n"
	regions, err := ParseFlatView(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Region{{0x1000, 0x1000, "rom", 0}, {0x20000000, 0x2000000, "virt.flash0", 0}, {0x80000000, 0x4000, "ram", 0}, {0x90000000, 0x4000, "ram", 0x4000}}
	if len(regions) != len(want) {
		t.Fatalf("regions: %+v", regions)
	}
	for i := range want {
		if regions[i] != want[i] {
			t.Errorf("region %d: %+v, want %+v", i, regions[i], want[i])
		}
	}
	st := mustOpen(t, image{}.build(testState()))
	p := make([]byte, 3)
	// 0x90001fff is ram+0x5fff: the end of page 5 (zero) and page 6.
	if err := st.ReadPhysical(regions, 0x80000ffe, p); err != nil || !bytes.Equal(p, []byte{0xc0, 0xc0, 0}) {
		t.Errorf("physical 0x80000ffe: % x %v", p, err)
	}
	if err := st.ReadPhysical(regions, 0x1ffe, p); !errors.Is(err, ErrNoPage) {
		t.Errorf("the end of a region: %v", err)
	}
	// "rom" is "dev/rom"'s region: a device's block.
	if err := st.ReadPhysical(regions, 0x1000, p); err != nil || !bytes.Equal(p, []byte{0xb0, 0xb0, 0xb0}) {
		t.Errorf("physical 0x1000 (dev/rom): % x %v", p, err)
	}
	if err := st.ReadPhysical(regions, 0x90000000, p); err != nil || !bytes.Equal(p, []byte{0, 0, 0}) {
		t.Errorf("physical 0x90000000 (ram+0x4000): % x %v", p, err)
	}
	if err := st.ReadPhysical(regions, 0x100000, p); !errors.Is(err, ErrNoPage) {
		t.Errorf("I/O: %v", err)
	}
	if _, err := ParseFlatView("FlatView #0\n AS \"I/O\", root: io\n"); err == nil {
		t.Error("no memory address space: no error")
	}
}

// The cache indexes an image once, again when it changes, and keeps no
// more than it was told to.
func TestCache(t *testing.T) {
	dir := t.TempDir()
	c := NewCache(2)
	defer c.Close()
	paths := make([]string, 3)
	for i := range paths {
		paths[i] = filepath.Join(dir, string(rune('a'+i))+".qcow2")
		if err := os.WriteFile(paths[i], image{seed: uint64(i)}.build(testState()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var first *State
	use := func(path string) *State {
		t.Helper()
		var got *State
		if err := c.Use(path, "ck", func(st *State) error { got = st; return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	first = use(paths[0])
	if use(paths[0]) != first {
		t.Error("the same image was indexed twice")
	}
	use(paths[1])
	use(paths[2]) // evicts paths[0], the least recently used
	if len(c.entries) != 2 {
		t.Errorf("%d entries, want 2", len(c.entries))
	}
	if first.f != nil {
		if _, err := first.f.Stat(); err == nil {
			t.Error("an evicted state's file is still open")
		}
	}
	// A new file at the path is indexed again: its state differs.
	var s stream
	s.header().sectionStart(secStart, 0, "ram", 4).memSize(testBlock{"other", 4096}).eos().u8(secEnd).u32(0).zero("other", 0, 0).eos()
	if err := os.WriteFile(paths[2]+".new", image{}.build(s.Bytes()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(paths[2]+".new", paths[2]); err != nil {
		t.Fatal(err)
	}
	changed := use(paths[2])
	if b := changed.Blocks(); len(b) != 1 || b[0].Name != "other" {
		t.Errorf("after the file changed: %+v", b)
	}
	c.Forget(paths[2])
	if _, err := changed.f.Stat(); err == nil || len(c.entries) != 1 {
		t.Errorf("forgotten: the file is still open (%v) or cached (%d entries)", err, len(c.entries))
	}
	// A state that cannot be read says so, every time.
	bad := filepath.Join(dir, "bad.qcow2")
	os.WriteFile(bad, image{compressed: 1}.build(testState()), 0o600)
	for range 2 {
		if err := c.Use(bad, "ck", func(*State) error { return nil }); !errors.Is(err, ErrUnsupported) {
			t.Errorf("compressed: %v", err)
		}
	}
	if err := c.Use(filepath.Join(dir, "none"), "ck", func(*State) error { return nil }); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no file: %v", err)
	}
	c.Close()
	if err := c.Use(paths[0], "ck", func(*State) error { return nil }); !errors.Is(err, ErrClosed) || len(c.entries) != 0 {
		t.Errorf("after Close: %v, %d entries", err, len(c.entries))
	}
}

// The fuzzers' seed reads as written: 1 KiB pages.
func TestSmallPages(t *testing.T) {
	st := mustOpen(t, small.build(smallState()))
	for _, c := range []struct {
		block string
		off   uint64
		want  byte
	}{{"ram", 0, 0}, {"ram", 1 << 10, 0}, {"ram", 2<<10 + 1023, 3}, {"dev/rom", 1023, 2}} {
		if got := read(t, st, c.block, c.off, 1); got[0] != c.want {
			t.Errorf("%s+%#x: %#x, want %#x", c.block, c.off, got[0], c.want)
		}
	}
	if err := st.Read("ram", 3<<10, make([]byte, 1)); !errors.Is(err, ErrNoPage) {
		t.Errorf("page 3: %v", err)
	}
}
