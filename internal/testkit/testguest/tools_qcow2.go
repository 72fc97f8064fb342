package testguest

import (
	"encoding/binary"
	"os"
	"testing"
)

// DamageSnapshotState overwrites the machine state that a snapshot save
// left in the qcow2 image with junk, leaving the image's own tables and
// its snapshot table whole: the state's stream lies between the image's
// first tables and its snapshot table (the header's snapshots_offset), so
// every check that looks only at the image's structure still passes.
func DamageSnapshotState(t testing.TB, image string) {
	t.Helper()
	f, err := os.OpenFile(image, os.O_RDWR, 0)
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
