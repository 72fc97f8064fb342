package hostpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// qcow2 header fields (QEMU's docs/interop/qcow2.txt).
const (
	qcow2Magic           = 0x514649fb // "QFI\xfb"
	qcow2BackingOffset   = 8          // u64: offset of the backing file name, 0 for none
	qcow2IncompatFeature = 72         // u64, version 3 only
	qcow2ExternalData    = 1 << 2     // incompatible feature: an external data file
)

// CheckImage refuses a disk image that would make QEMU open other host
// files by name, past this policy: only raw and qcow2 are allowed, and a
// qcow2 image may have neither a backing file nor an external data file.
// f is the image as opened by Open; format is QEMU's format name ("" is
// raw). With AllowAll everything passes.
func (s *Scope) CheckImage(what string, f *os.File, format string) error {
	if s.allowAll {
		return nil
	}
	switch format {
	case "", "raw":
		return nil
	case "qcow2":
	default:
		return fmt.Errorf("%s: format %q is refused: only raw and qcow2 images are allowed (other formats can name more host files); convert it with qemu-img convert, or use --allow-host-access", what, format)
	}
	var h [104]byte
	n, err := f.ReadAt(h[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: read the qcow2 header: %w", what, err)
	}
	if n < 72 || binary.BigEndian.Uint32(h[0:]) != qcow2Magic {
		return fmt.Errorf("%s is not a qcow2 image (no qcow2 header): give its real format", what)
	}
	if binary.BigEndian.Uint64(h[qcow2BackingOffset:]) != 0 {
		return fmt.Errorf("%s is refused: the qcow2 image has a backing file, which QEMU would open by name outside this policy; flatten it (qemu-img convert -O qcow2), or use --allow-host-access", what)
	}
	if version := binary.BigEndian.Uint32(h[4:]); version >= 3 && n >= qcow2IncompatFeature+8 &&
		binary.BigEndian.Uint64(h[qcow2IncompatFeature:])&qcow2ExternalData != 0 {
		return fmt.Errorf("%s is refused: the qcow2 image keeps its data in an external file, which QEMU would open by name; convert it, or use --allow-host-access", what)
	}
	return nil
}
