// Package qcow2state reads guest RAM out of a machine state that QEMU
// saved in a qcow2 image (savevm, snapshot-save: a replay's checkpoints and
// a recording's state at instruction 0) without QEMU and without loading
// it: the snapshot's L1 and L2 tables locate its machine state past the
// virtual disk, and the state's migration stream is indexed page by page,
// so that reading a few bytes of RAM costs one read of the file.
//
// It understands what QEMU 7.2 to 11.x write for a snapshot taken with the
// default migration settings, and refuses the rest with an error that
// wraps ErrUnsupported (compressed or encrypted clusters, external data
// files, backing files, extended L2 entries, migration capabilities,
// XBZRLE or compressed pages, unknown record flags); an image that does not
// hold together wraps ErrDamaged. Callers fall back to loading the state.
//
// The formats, from QEMU's sources: docs/interop/qcow2.txt and
// block/qcow2*.c (header, snapshot table, L1/L2 tables, the state at
// l1_vm_state_index << (cluster_bits + l2_bits)); migration/savevm.c (the
// stream's header, configuration and sections) and migration/ram.c (the
// RAM section's records).
package qcow2state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Errors a caller tells apart with errors.Is.
var (
	// ErrNoState: the image holds no machine state under that tag.
	ErrNoState = errors.New("no machine state")
	// ErrUnsupported: the image or its state uses something this reader
	// does not understand.
	ErrUnsupported = errors.New("not understood by this reader")
	// ErrDamaged: the image or its state does not hold together.
	ErrDamaged = errors.New("damaged")
	// ErrNoPage: the address is not in the saved RAM.
	ErrNoPage = errors.New("not in the saved RAM")
)

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, a...)...)
}

func damaged(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrDamaged}, a...)...)
}

const (
	qcow2Magic = 0x514649fb // "QFI\xfb"

	// Incompatible feature bits (docs/interop/qcow2.txt).
	featDirty        = 1 << 0 // refcounts may be stale: the tables are fine
	featCorrupt      = 1 << 1
	featExternalData = 1 << 2
	featCompression  = 1 << 3 // the compression type: only compressed clusters use it
	featExtendedL2   = 1 << 4
	knownIncompat    = featDirty | featCorrupt | featExternalData | featCompression | featExtendedL2

	// L1 and (standard) L2 entries.
	offsetMask     = 0x00fffffffffffe00
	l1Reserved     = 0x7f000000000001ff
	l2Compressed   = 1 << 62
	l2Zero         = 1 << 0
	l2Reserved     = 0x3f000000000001fe
	maxL1Entries   = 1 << 25 // QEMU's QCOW_MAX_L1_SIZE (32 MiB) / 8
	maxSnapshots   = 65536
	maxExtraData   = 1024 // QCOW_MAX_SNAPSHOT_EXTRA_DATA
	minClusterBits = 9
	maxClusterBits = 21
)

// header is what this reader needs of a qcow2 header.
type header struct {
	version     uint32
	clusterBits uint
	size        uint64 // the virtual disk
	snapshots   uint32
	snapOffset  uint64
}

func readHeader(r io.ReaderAt, fileSize int64) (header, error) {
	var b [104]byte
	if n, err := r.ReadAt(b[:72], 0); n < 72 {
		return header{}, damaged("read the qcow2 header: %v", err)
	}
	be := binary.BigEndian
	if be.Uint32(b[0:]) != qcow2Magic {
		return header{}, damaged("not a qcow2 image")
	}
	h := header{version: be.Uint32(b[4:]), clusterBits: uint(be.Uint32(b[20:])), size: be.Uint64(b[24:]),
		snapshots: be.Uint32(b[60:]), snapOffset: be.Uint64(b[64:])}
	if h.version != 2 && h.version != 3 {
		return header{}, unsupported("qcow2 version %d", h.version)
	}
	if h.clusterBits < minClusterBits || h.clusterBits > maxClusterBits {
		return header{}, damaged("qcow2 cluster bits %d", h.clusterBits)
	}
	if be.Uint64(b[8:]) != 0 {
		return header{}, unsupported("a qcow2 image with a backing file")
	}
	if m := be.Uint32(b[32:]); m != 0 {
		return header{}, unsupported("an encrypted qcow2 image (method %d)", m)
	}
	if h.version == 3 {
		if n, err := r.ReadAt(b[72:104], 72); n < 32 {
			return header{}, damaged("read the qcow2 header: %v", err)
		}
		inc := be.Uint64(b[72:])
		switch {
		case inc&^knownIncompat != 0:
			return header{}, unsupported("qcow2 incompatible features %#x", inc&^knownIncompat)
		case inc&featCorrupt != 0:
			return header{}, unsupported("a qcow2 image marked corrupt")
		case inc&featExternalData != 0:
			return header{}, unsupported("a qcow2 image with an external data file")
		case inc&featExtendedL2 != 0:
			return header{}, unsupported("a qcow2 image with extended L2 entries")
		}
	}
	if h.snapshots > maxSnapshots || h.snapOffset > uint64(fileSize) {
		return header{}, damaged("qcow2 header names %d snapshots at %d", h.snapshots, h.snapOffset)
	}
	return h, nil
}

// snapshotEntry is one entry of the snapshot table.
type snapshotEntry struct {
	name        string
	l1Offset    uint64
	l1Size      uint32
	vmStateSize uint64
	// diskSize is the virtual disk's size when the snapshot was taken
	// (the state is placed past it); 0 when the entry does not say.
	diskSize uint64
}

// findSnapshot finds the snapshot tagged name in the snapshot table (the
// last of that name, as QEMU does not allow two).
func findSnapshot(r io.ReaderAt, h header, fileSize int64, name string) (snapshotEntry, error) {
	off := int64(h.snapOffset)
	be := binary.BigEndian
	var found *snapshotEntry
	for range h.snapshots {
		// l1_table_offset u64, l1_size u32, id_str_size u16, name_size
		// u16, date_sec u32, date_nsec u32, vm_clock_nsec u64,
		// vm_state_size u32, extra_data_size u32; extra data (version 3:
		// vm_state_size_large u64, disk_size u64, icount u64); id; name;
		// padding to 8 bytes.
		var e [40]byte
		if off < 0 || off+40 > fileSize {
			return snapshotEntry{}, damaged("the qcow2 snapshot table runs past the file")
		}
		if n, err := r.ReadAt(e[:], off); n < 40 {
			return snapshotEntry{}, damaged("read the qcow2 snapshot table: %v", err)
		}
		idLen, nameLen := int64(be.Uint16(e[12:])), int64(be.Uint16(e[14:]))
		extraLen := int64(be.Uint32(e[36:]))
		if extraLen > maxExtraData {
			return snapshotEntry{}, damaged("qcow2 snapshot entry with %d bytes of extra data", extraLen)
		}
		size := 40 + extraLen + idLen + nameLen
		if off+size > fileSize {
			return snapshotEntry{}, damaged("the qcow2 snapshot table runs past the file")
		}
		rest := make([]byte, extraLen+idLen+nameLen)
		if n, err := r.ReadAt(rest, off+40); n < len(rest) {
			return snapshotEntry{}, damaged("read the qcow2 snapshot table: %v", err)
		}
		if string(rest[extraLen+idLen:]) == name {
			s := snapshotEntry{name: name, l1Offset: be.Uint64(e[0:]), l1Size: be.Uint32(e[8:]),
				vmStateSize: uint64(be.Uint32(e[32:]))}
			if extraLen >= 8 {
				if big := be.Uint64(rest[0:]); big != 0 {
					s.vmStateSize = big
				}
			}
			if extraLen >= 16 {
				s.diskSize = be.Uint64(rest[8:])
			}
			found = &s
		}
		off += (size + 7) &^ 7
	}
	if found == nil || found.vmStateSize == 0 {
		return snapshotEntry{}, fmt.Errorf("%w %q in the image", ErrNoState, name)
	}
	return *found, nil
}

// clusterMap maps a snapshot's machine state, a byte stream at a virtual
// offset past the disk, to the file, cluster by cluster (through the
// snapshot's L1 table and the L2 tables it points to, read once when the
// map is made: afterwards it is read-only and safe for concurrent use).
type clusterMap struct {
	r           io.ReaderAt
	clusterBits uint
	size        int64   // the state's length
	hosts       []int64 // each state cluster's file offset, or zeroCluster
}

// zeroCluster is a cluster that reads as zeros (unallocated, or the zero
// flag).
const zeroCluster = -1

func newClusterMap(r io.ReaderAt, h header, fileSize int64, sn snapshotEntry) (*clusterMap, error) {
	cb, l2b := h.clusterBits, h.clusterBits-3
	disk := sn.diskSize
	if disk == 0 {
		disk = h.size
	}
	span := uint64(1) << (cb + l2b) // what one L1 entry maps
	if disk > 1<<56 {
		return nil, damaged("qcow2 virtual disk of %d bytes", disk)
	}
	// QEMU's l1_vm_state_index: the first L1 entry past the disk.
	base := (disk + span - 1) / span * span
	// The state is written into clusters of the file (QEMU writes zero
	// pages as records, not runs of zeros): one bigger than the file is
	// not what QEMU saved.
	if sn.vmStateSize > uint64(fileSize) {
		return nil, damaged("a machine state of %d bytes in a file of %d", sn.vmStateSize, fileSize)
	}
	if sn.l1Size > maxL1Entries || sn.l1Offset%8 != 0 || sn.l1Offset+uint64(sn.l1Size)*8 > uint64(fileSize) {
		return nil, damaged("snapshot L1 table of %d entries at %d", sn.l1Size, sn.l1Offset)
	}
	if last := (base + sn.vmStateSize - 1) / span; last >= uint64(sn.l1Size) {
		return nil, damaged("the snapshot's L1 table (%d entries) does not cover its machine state", sn.l1Size)
	}
	be := binary.BigEndian
	cs := uint64(1) << cb
	n := (sn.vmStateSize + cs - 1) / cs
	m := &clusterMap{r: r, clusterBits: cb, size: int64(sn.vmStateSize), hosts: make([]int64, n)}
	var l2 []byte
	l2at, l1at, l1e := uint64(0), ^uint64(0), uint64(0)
	for k := range n {
		v := base + k*cs
		if l1i := v / span; l1i != l1at {
			var e [8]byte
			if got, err := r.ReadAt(e[:], int64(sn.l1Offset+8*l1i)); got < 8 {
				return nil, damaged("read the snapshot's L1 table: %v", err)
			}
			l1at, l1e = l1i, be.Uint64(e[:])
		}
		l1i := l1at
		if l1e&l1Reserved != 0 {
			return nil, damaged("L1 entry %d: reserved bits set (%#x)", l1i, l1e)
		}
		l2off := l1e & offsetMask
		if l2off == 0 {
			m.hosts[k] = zeroCluster
			continue
		}
		if l2off%cs != 0 || l2off+cs > uint64(fileSize) {
			return nil, damaged("L2 table at %d", l2off)
		}
		if l2 == nil || l2at != l2off {
			if l2 == nil {
				l2 = make([]byte, cs)
			}
			if got, err := r.ReadAt(l2, int64(l2off)); got < len(l2) {
				return nil, damaged("read the L2 table at %d: %v", l2off, err)
			}
			l2at = l2off
		}
		l2e := be.Uint64(l2[8*((v>>cb)&(1<<l2b-1)):])
		if l2e&l2Compressed != 0 {
			return nil, unsupported("a compressed cluster in the machine state")
		}
		if l2e&l2Reserved != 0 {
			return nil, damaged("L2 entry of state cluster %d: reserved bits set (%#x)", k, l2e)
		}
		off := l2e & offsetMask
		if l2e&l2Zero != 0 || off == 0 {
			m.hosts[k] = zeroCluster
			continue
		}
		if off%cs != 0 || off+cs > uint64(fileSize)+cs-1 {
			return nil, damaged("state cluster %d at %d", k, off)
		}
		m.hosts[k] = int64(off)
	}
	return m, nil
}

// readAt reads the state's bytes at off into p, whole.
func (m *clusterMap) readAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > m.size {
		return damaged("a read of %d bytes at %d runs past the machine state (%d bytes)", len(p), off, m.size)
	}
	cs := int64(1) << m.clusterBits
	for len(p) > 0 {
		k, in := off/cs, off%cs
		h := m.hosts[k]
		// Clusters that follow each other in the file too are read at
		// once.
		end := k + 1
		for end < int64(len(m.hosts)) && h != zeroCluster && m.hosts[end] == h+(end-k)*cs {
			end++
		}
		n := min(int64(len(p)), (end-k)*cs-in)
		if h == zeroCluster {
			clear(p[:n])
		} else if got, err := m.r.ReadAt(p[:n], h+in); int64(got) < n {
			return damaged("read the machine state at %d: %v", off, err)
		}
		p, off = p[n:], off+n
	}
	return nil
}
