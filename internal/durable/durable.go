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
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if exclusive {
		flag = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	}
	if err := write(tmp, flag, b); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// CreateFile writes b to path, which must not exist, and fsyncs it: a
// file written in place, which a record names only once it is whole. If
// writing fails, the file is removed.
func CreateFile(path string, b []byte) error {
	return write(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, b)
}

// write writes b to the file path opened with flag (never through a
// link) and fsyncs it. A file it opened but could not write whole is
// removed; one it could not open is not its own, and stays.
func write(path string, flag int, b []byte) error {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = WriteClose(f, b)
	if err != nil {
		os.Remove(path)
	}
	return err
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
