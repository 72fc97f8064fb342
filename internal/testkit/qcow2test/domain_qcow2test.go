// Package qcow2test damages qcow2 images the way tests of loading them
// need: inside, where checks of the image's parts do not see it.
package qcow2test

import (
	"encoding/binary"
	"os"
	"testing"
)

// DamageState overwrites most of the machine state QEMU saved in the
// qcow2 image at path: the state's stream lies between the image's first
// tables and its snapshot table (the header's snapshots_offset), and the
// last three quarters of that stretch get bytes no stream holds. The
// image's header, tables and snapshot table stay whole, so the image
// still verifies; only a load finds the damage.
func DamageState(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h [72]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		t.Fatal(err)
	}
	table := int64(binary.BigEndian.Uint64(h[64:]))
	junk := make([]byte, table-table/4)
	for k := range junk {
		junk[k] = byte(k*7 + 1)
	}
	if _, err := f.WriteAt(junk, table/4); err != nil {
		t.Fatal(err)
	}
}
