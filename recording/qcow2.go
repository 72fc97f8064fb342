package recording

import (
	"encoding/binary"

	"github.com/qemu-mcp/qemu-mcp/internal/durable"
)

// A qcow2 image of no disk content, for QEMU to save machine states into
// (the recording's image, and each checkpoint's): written here, so that
// recording needs no qemu-img. Version 3, 64 KiB clusters: the header in
// cluster 0, the refcount table in cluster 1, its one refcount block
// (16-bit refcounts) in cluster 2, the L1 table in cluster 3; the four
// clusters in use have refcount 1. QEMU's docs/interop/qcow2.txt.
const (
	clusterBits = 16
	clusterSize = 1 << clusterBits
	imageSize   = 64 << 20 // the virtual disk, empty; states go past it
)

// newImage creates an empty qcow2 at path (which must not exist).
func newImage(path string) error {
	b := make([]byte, 4*clusterSize)
	be := binary.BigEndian
	be.PutUint32(b[0:], 0x514649fb) // "QFI\xfb"
	be.PutUint32(b[4:], 3)          // version
	be.PutUint32(b[20:], clusterBits)
	be.PutUint64(b[24:], imageSize)
	be.PutUint32(b[36:], 1)             // l1_size: one L2 table maps 512 MiB
	be.PutUint64(b[40:], 3*clusterSize) // l1_table_offset
	be.PutUint64(b[48:], 1*clusterSize) // refcount_table_offset
	be.PutUint32(b[56:], 1)             // refcount_table_clusters
	be.PutUint32(b[96:], 4)             // refcount_order: 16 bits
	be.PutUint32(b[100:], 104)          // header_length
	// The header extensions end at once (type 0, length 0) at 104.
	be.PutUint64(b[clusterSize:], 2*clusterSize) // the refcount block
	for k := range 4 {
		be.PutUint16(b[2*clusterSize+2*k:], 1)
	}
	return durable.CreateFile(path, b)
}

// NewImage creates the empty qcow2 a recording's QEMU saves the machine
// at instruction 0 into.
func (b *Begun) NewImage() error { return newImage(b.Meta.Image()) }

// NewImage creates the checkpoint's empty image.
func (ck Checkpoint) NewImage() error { return newImage(ck.Path) }
