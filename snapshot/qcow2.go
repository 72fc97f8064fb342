package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A qcow2 image's internal snapshots, read from its header and snapshot
// table (QEMU's docs/interop/qcow2.txt) without QEMU: a load checks every
// part of a snapshot before it touches the running guest, and the list and
// the reaper check drives that a guest holds open.
const (
	qcow2Magic       = 0x514649fb // "QFI\xfb"
	qcow2NbSnapshots = 60         // u32
	qcow2SnapOffset  = 64         // u64
	// maxSnapshots bounds what a damaged header can make us read.
	maxSnapshots = 65536
)

// InternalSnapshot is one entry of a qcow2 image's snapshot table.
type InternalSnapshot struct {
	Name string
	// VMStateSize is the machine state the snapshot holds, 0 for a disk
	// only snapshot.
	VMStateSize uint64
}

// ErrNotQCOW2 is a file that is not a qcow2 image.
var ErrNotQCOW2 = errors.New("not a qcow2 image")

// InternalSnapshots lists the snapshots in the qcow2 image r.
func InternalSnapshots(r io.ReaderAt) ([]InternalSnapshot, error) {
	var h [72]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return nil, fmt.Errorf("read the qcow2 header: %w", err)
	}
	if binary.BigEndian.Uint32(h[0:]) != qcow2Magic {
		return nil, ErrNotQCOW2
	}
	n := binary.BigEndian.Uint32(h[qcow2NbSnapshots:])
	off := int64(binary.BigEndian.Uint64(h[qcow2SnapOffset:]))
	if n > maxSnapshots || off < 0 {
		return nil, fmt.Errorf("qcow2 header names %d snapshots at %d: damaged", n, off)
	}
	out := make([]InternalSnapshot, 0, n)
	for range n {
		// l1_table_offset u64, l1_size u32, id_str_size u16, name_size
		// u16, date_sec u32, date_nsec u32, vm_clock_nsec u64,
		// vm_state_size u32, extra_data_size u32.
		var e [40]byte
		if _, err := r.ReadAt(e[:], off); err != nil {
			return nil, fmt.Errorf("read the qcow2 snapshot table: %w", err)
		}
		idLen := int64(binary.BigEndian.Uint16(e[12:]))
		nameLen := int64(binary.BigEndian.Uint16(e[14:]))
		vmstate := uint64(binary.BigEndian.Uint32(e[32:]))
		extraLen := int64(binary.BigEndian.Uint32(e[36:]))
		if extraLen > 1<<16 {
			return nil, fmt.Errorf("qcow2 snapshot entry at %d: %d bytes of extra data: damaged", off, extraLen)
		}
		if extraLen >= 8 {
			// Version 3: the state's size as 64 bits.
			var x [8]byte
			if _, err := r.ReadAt(x[:], off+40); err != nil {
				return nil, fmt.Errorf("read the qcow2 snapshot table: %w", err)
			}
			if big := binary.BigEndian.Uint64(x[:]); big != 0 {
				vmstate = big
			}
		}
		name := make([]byte, nameLen)
		if _, err := r.ReadAt(name, off+40+extraLen+idLen); err != nil {
			return nil, fmt.Errorf("read the qcow2 snapshot table: %w", err)
		}
		out = append(out, InternalSnapshot{Name: string(name), VMStateSize: vmstate})
		size := 40 + extraLen + idLen + nameLen
		off += (size + 7) &^ 7
	}
	return out, nil
}

// hasTag finds tag among an image's snapshots.
func hasTag(r io.ReaderAt, tag string) (InternalSnapshot, bool, error) {
	snaps, err := InternalSnapshots(r)
	if err != nil {
		return InternalSnapshot{}, false, err
	}
	for _, s := range snaps {
		if s.Name == tag {
			return s, true, nil
		}
	}
	return InternalSnapshot{}, false, nil
}
