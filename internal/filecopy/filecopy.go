// Package filecopy copies a file into a new one that nobody else can
// have made: the target must not exist and is not followed if a link.
package filecopy

import (
	"io"
	"os"
	"syscall"
)

// New copies src to dst, which it creates (mode 0600) and which must not
// exist; on failure dst is removed.
func New(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}
