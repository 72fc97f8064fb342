package qcow2state

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
)

// Images and streams made by hand, the way QEMU lays them out
// (docs/interop/qcow2.txt; migration/savevm.c and ram.c), for the tests.

// stream builds a migration stream.
type stream struct{ bytes.Buffer }

func (s *stream) u8(v byte) *stream { s.WriteByte(v); return s }
func (s *stream) u32(v uint32) *stream {
	s.Write(binary.BigEndian.AppendUint32(nil, v))
	return s
}
func (s *stream) u64(v uint64) *stream {
	s.Write(binary.BigEndian.AppendUint64(nil, v))
	return s
}
func (s *stream) str(v string) *stream { s.u8(byte(len(v))); s.WriteString(v); return s }

// header writes the magic, the version and a configuration naming the
// machine type, with the subsections given (already encoded).
func (s *stream) header(subsections ...func(*stream)) *stream {
	s.u32(streamMagic).u32(streamVersion)
	s.u8(secConfiguration).u32(4)
	s.WriteString("virt")
	for _, f := range subsections {
		f(s)
	}
	return s
}

func (s *stream) sectionStart(typ byte, id uint32, name string, version uint32) *stream {
	return s.u8(typ).u32(id).str(name).u32(0).u32(version)
}

type testBlock struct {
	name   string
	length uint64
}

func (s *stream) memSize(blocks ...testBlock) *stream {
	total := uint64(0)
	for _, b := range blocks {
		total += b.length
	}
	s.u64(total | flagMemSize)
	for _, b := range blocks {
		s.str(b.name).u64(b.length)
	}
	return s
}

// page writes a page record; block "" continues the last block.
func (s *stream) page(block string, addr uint64, data []byte) *stream {
	if block == "" {
		s.u64(addr | flagPage | flagContinue)
	} else {
		s.u64(addr | flagPage).str(block)
	}
	s.Write(data)
	return s
}

func (s *stream) zero(block string, addr uint64, fill byte) *stream {
	if block == "" {
		s.u64(addr | flagZero | flagContinue)
	} else {
		s.u64(addr | flagZero).str(block)
	}
	return s.u8(fill)
}

func (s *stream) eos() *stream             { return s.u64(flagEOS) }
func (s *stream) footer(id uint32) *stream { return s.u8(secFooter).u32(id) }

func pageOf(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }

// image is how a test image is laid out.
type image struct {
	clusterBits uint
	diskSize    uint64
	tag         string
	// incompat, backing, crypt and version go into the header (version
	// 0: 3).
	incompat uint64
	backing  bool
	crypt    uint32
	version  uint32
	// compressed marks the state's cluster compressed-1 compressed (0:
	// none).
	compressed int
	// seed shuffles where the state's clusters go in the file.
	seed uint64
}

// build makes a qcow2 image holding state as the machine state of
// snapshot im.tag (and a disk-only snapshot before it). The state's
// clusters are placed in a shuffled order; clusters of zeros are left
// unallocated or given the zero flag, alternately.
func (im image) build(state []byte) []byte {
	if im.clusterBits == 0 {
		im.clusterBits = 16
	}
	if im.diskSize == 0 {
		im.diskSize = 64 << 20
	}
	if im.tag == "" {
		im.tag = "ck"
	}
	if im.version == 0 {
		im.version = 3
	}
	be := binary.BigEndian
	cs := uint64(1) << im.clusterBits
	l2Entries := cs / 8
	span := cs * l2Entries
	base := (im.diskSize + span - 1) / span * span
	nClusters := (uint64(len(state)) + cs - 1) / cs
	firstL1 := base / span
	lastL1 := (base + nClusters*cs - 1) / span
	if nClusters == 0 {
		lastL1 = firstL1
	}
	l1Size := lastL1 + 1
	// Cluster 0: header; 1: snapshot table; 2..: the L1 table; then L2
	// tables; then the data clusters.
	l1Clusters := (l1Size*8 + cs - 1) / cs
	next := 2 + l1Clusters
	l2At := map[uint64]uint64{} // L1 index -> cluster
	for i := firstL1; i <= lastL1; i++ {
		l2At[i] = next
		next++
	}
	order := make([]uint64, nClusters)
	for i := range order {
		order[i] = uint64(i)
	}
	rng := rand.New(rand.NewPCG(im.seed, 1))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	dataAt := make([]uint64, nClusters)
	for _, k := range order {
		dataAt[k] = next
		next++
	}
	f := make([]byte, next*cs)
	// Header.
	be.PutUint32(f[0:], qcow2Magic)
	be.PutUint32(f[4:], im.version)
	if im.backing {
		be.PutUint64(f[8:], 200)
		be.PutUint32(f[16:], 4)
		copy(f[200:], "base")
	}
	be.PutUint32(f[20:], uint32(im.clusterBits))
	be.PutUint64(f[24:], im.diskSize)
	be.PutUint32(f[32:], im.crypt)
	be.PutUint32(f[36:], 1)
	be.PutUint64(f[40:], 0) // the active L1 table: empty
	be.PutUint32(f[60:], 2)
	be.PutUint64(f[64:], cs)
	be.PutUint64(f[72:], im.incompat)
	be.PutUint32(f[96:], 4)
	be.PutUint32(f[100:], 104)
	// Snapshot table: a disk-only snapshot, then ours.
	off := cs
	entry := func(name string, l1Off uint64, l1Size uint32, vmSize uint64) {
		e := f[off:]
		be.PutUint64(e[0:], l1Off)
		be.PutUint32(e[8:], l1Size)
		be.PutUint16(e[12:], 1)
		be.PutUint16(e[14:], uint16(len(name)))
		be.PutUint32(e[32:], uint32(min(vmSize, 1<<32-1)))
		be.PutUint32(e[36:], 24)
		be.PutUint64(e[40:], vmSize)
		be.PutUint64(e[48:], im.diskSize)
		be.PutUint64(e[56:], ^uint64(0))
		e[64] = '1'
		copy(e[65:], name)
		off += (65 + uint64(len(name)) + 7) &^ 7
	}
	entry("disk", 0, 0, 0)
	entry(im.tag, 2*cs, uint32(l1Size), uint64(len(state)))
	// L1 and L2 tables, and the data.
	for i, c := range l2At {
		be.PutUint64(f[2*cs+8*i:], c*cs|1<<63)
	}
	for k := range nClusters {
		v := base + k*cs
		chunk := state[k*cs : min(uint64(len(state)), (k+1)*cs)]
		e := dataAt[k] * cs
		switch {
		case int(k) == im.compressed-1:
			e |= l2Compressed
		case bytes.Count(chunk, []byte{0}) == len(chunk):
			e = 0
			if k%2 == 1 {
				e = l2Zero
			}
		default:
			e |= 1 << 63
		}
		be.PutUint64(f[l2At[v/span]*cs+8*((v/cs)%l2Entries):], e)
		copy(f[dataAt[k]*cs:], chunk)
	}
	return f
}

// testState is a stream holding two RAM blocks, "ram" (16 pages) and
// "dev/rom" (2 pages), with pages saved every way QEMU saves them: data,
// zero, a nonzero fill, a page saved twice (the later wins), a block
// continued, also in the next section; page 9 of "ram" is not saved.
func testState() []byte {
	var s stream
	s.header()
	s.sectionStart(secStart, 2, "ram", 4).memSize(testBlock{"ram", 16 << 12}, testBlock{"dev/rom", 2 << 12}).eos().footer(2)
	s.u8(secPart).u32(2)
	s.page("ram", 0, pageOf(0xa0)).page("", 1<<12, pageOf(0xa1)).zero("", 2<<12, 0)
	for p := uint64(3); p < 9; p++ {
		s.zero("", p<<12, 0)
	}
	s.page("ram", 5<<12, pageOf(0)).page("dev/rom", 0, pageOf(0xb0)).zero("", 1<<12, 0x5a)
	s.eos().footer(2)
	s.u8(secPart).u32(2)
	// Continues "dev/rom", the block of the last section.
	s.zero("", 1<<12, 0x5a).page("ram", 8<<12, pageOf(0x88))
	s.eos().footer(2)
	s.u8(secPart).u32(2)
	// A section's first page may continue the block of the section
	// before (QEMU sends a state in parts of about 50 ms each).
	s.zero("", 10<<12, 0)
	s.eos().footer(2)
	s.u8(secEnd).u32(2)
	// Later occurrences win: page 2 (zero) now data, page 1 (data) now
	// zero, page 0 data again.
	s.page("ram", 2<<12, pageOf(0xc2)).zero("", 1<<12, 0).page("", 0, pageOf(0xc0))
	for p := uint64(11); p < 16; p++ {
		s.zero("", p<<12, 0)
	}
	s.eos().footer(2)
	// A device's state, then the end: never read.
	s.sectionStart(secFull, 3, "cpu", 1)
	s.WriteString("device state the reader cannot parse")
	s.footer(3).u8(secEOF)
	return s.Bytes()
}
