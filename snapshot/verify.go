package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// IncompleteError says which parts of a snapshot are missing or damaged:
// such a snapshot cannot be loaded, and a load refuses it before it touches
// the guest.
type IncompleteError struct {
	Name  string
	Parts []string
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("snapshot %q is incomplete: %s", e.Name, strings.Join(e.Parts, "; "))
}

// Reason is the parts, one sentence.
func (e *IncompleteError) Reason() string { return strings.Join(e.Parts, "; ") }

// Verify checks every part of the snapshot m, as its record names them,
// without QEMU and without touching any guest: the image (its size, and
// the machine state under the snapshot's tag) and each writable drive's
// part (the tag in the drive's snapshot table). It returns an
// *IncompleteError naming what is missing, or nil. Drives are read while a
// guest may hold them open, as qemu-img -U does: their snapshot tables
// change only through a save or delete, which the caller serialises.
func Verify(m Meta) error {
	if m.unreadable != "" {
		return &IncompleteError{Name: m.Name, Parts: []string{"its record is unreadable: " + m.unreadable}}
	}
	var parts []string
	if m.ID != "" && m.Tag != tagFor(m.Name, m.ID) {
		parts = append(parts, fmt.Sprintf("the record's tag %s is not its save's (%s)", m.Tag, m.ID))
	}
	if m.Path == "" {
		parts = append(parts, "the record names no image")
	} else if err := verifyImage(m); err != "" {
		parts = append(parts, err)
	}
	for _, d := range m.Drives {
		if err := verifyDrive(d, m.Tag); err != "" {
			parts = append(parts, err)
		}
	}
	if len(parts) > 0 {
		return &IncompleteError{Name: m.Name, Parts: parts}
	}
	return nil
}

func verifyImage(m Meta) string {
	f, err := os.Open(m.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return "its image " + m.Path + " is missing"
	}
	if err != nil {
		return "its image: " + err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "its image: " + err.Error()
	}
	if m.ImageSize > 0 && fi.Size() != m.ImageSize {
		return fmt.Sprintf("its image %s is %d bytes, the record says %d", m.Path, fi.Size(), m.ImageSize)
	}
	snap, ok, err := hasTag(f, m.Tag)
	switch {
	case err != nil:
		return "its image " + m.Path + ": " + err.Error()
	case !ok:
		return fmt.Sprintf("its image %s holds no state tagged %s", m.Path, m.Tag)
	case snap.VMStateSize == 0:
		return fmt.Sprintf("its image %s holds no machine state under %s", m.Path, m.Tag)
	}
	return ""
}

func verifyDrive(path, tag string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("drive %s: %v", path, err)
	}
	defer f.Close()
	_, ok, err := hasTag(f, tag)
	switch {
	case err != nil:
		return fmt.Sprintf("drive %s: %v", path, err)
	case !ok:
		return fmt.Sprintf("drive %s has no snapshot %s (its disk part)", path, tag)
	}
	return ""
}
