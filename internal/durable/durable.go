// Package durable writes files that survive a crash whole: a record is
// either all new or all old, never half written.
package durable

import (
	"os"
	"path/filepath"
	"syscall"
)

// WriteFile writes b to tmp, fsyncs it, renames it to path and fsyncs the
// directory: afterwards path holds all of b or, if anything failed or the
// process was killed, what it held before. With exclusive, tmp must not
// exist (a writer that owns its temporary name); otherwise a tmp left by a
// killed writer is overwritten.
func WriteFile(path, tmp string, b []byte, exclusive bool) error {
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC | syscall.O_NOFOLLOW
	if exclusive {
		flag = os.O_WRONLY | os.O_CREATE | os.O_EXCL | syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(tmp, flag, 0o600)
	if err != nil {
		return err
	}
	err = WriteClose(f, b)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// WriteClose writes b to f, fsyncs f and closes it, returning the first
// error. f is closed whatever happens.
func WriteClose(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SyncDir makes a directory's entries (a rename, a new file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
