package qcow2state

import (
	"bytes"
	"testing"
)

// readAll reads a few bytes of every page of every block a state names,
// and of the physical ranges a flat view places them in: whatever the
// input, no panic and no unbounded work.
func readAll(st *State) {
	p := make([]byte, 16)
	for _, b := range st.Blocks() {
		for off := uint64(0); off < b.Length && off < 64<<12; off += 4096 - 8 {
			st.Read(b.Name, off, p)
		}
		st.Read(b.Name, b.Length-1, p[:1])
	}
	st.ReadPhysical([]Region{{Start: 0x1000, Size: 0x8000, Name: "ram"}, {Start: 0x9000, Size: 0x2000, Name: "rom", Offset: 0x1000}}, 0x1000, make([]byte, 0x9000))
}

// smallState is a stream of 1 KiB pages (the configuration says so), for
// inputs the fuzzer handles quickly.
func smallState() []byte {
	var s stream
	s.header(func(s *stream) { s.u8(secSubsection).str("configuration/target-page-bits").u32(1).u32(10) })
	s.sectionStart(secStart, 2, "ram", 4).memSize(testBlock{"ram", 4 << 10}, testBlock{"dev/rom", 1 << 10}).eos().footer(2)
	s.u8(secPart).u32(2).page("ram", 0, bytes.Repeat([]byte{1}, 1024)).zero("", 1<<10, 0).zero("", 2<<10, 3).eos().footer(2)
	s.u8(secEnd).u32(2).page("dev/rom", 0, bytes.Repeat([]byte{2}, 1024)).zero("ram", 0, 0).u64(flagMultifdFlush).eos().footer(2)
	s.u8(secEOF)
	return s.Bytes()
}

// small is an image of small clusters right past a small disk.
var small = image{clusterBits: 9, diskSize: 4096}

// A damaged image never panics or hangs the reader: it is refused or read.
func FuzzImage(f *testing.F) {
	f.Add(small.build(smallState()))
	f.Add(image{clusterBits: 9, diskSize: 4096, version: 2, seed: 3}.build(smallState()))
	f.Fuzz(func(t *testing.T, b []byte) {
		if st, err := New(bytes.NewReader(b), int64(len(b)), "ck"); err == nil {
			readAll(st)
		}
	})
}

// A damaged migration stream, in a sound image, never panics or hangs the
// reader.
func FuzzStream(f *testing.F) {
	f.Add(smallState())
	f.Fuzz(func(t *testing.T, b []byte) {
		im := small.build(b)
		if st, err := New(bytes.NewReader(im), int64(len(im)), "ck"); err == nil {
			readAll(st)
		}
	})
}

// Any text QEMU (or something else) prints parses or is refused.
func FuzzFlatView(f *testing.F) {
	f.Add("FlatView #2\n AS \"memory\", root: system\n  0000000080000000-000000008fffffff (prio 0, ram): riscv_virt_board.ram @0000000000001000\n")
	f.Fuzz(func(t *testing.T, s string) {
		regions, err := ParseFlatView(s)
		if err != nil {
			return
		}
		st := mustOpen(t, image{}.build(testState()))
		for _, r := range regions {
			st.ReadPhysical(regions, r.Start, make([]byte, 8))
			st.ReadPhysical(regions, r.Start+r.Size-1, make([]byte, 8))
		}
	})
}
