package qemu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// logVersions caches LogVersion per binary (path, size, modification time).
var logVersions sync.Map

type binKey struct {
	path  string
	size  int64
	mtime int64
}

// LogVersion is the version word a binary writes at the start of its
// record/replay logs (its log format: a log replays only in a QEMU of the
// same). QEMU writes it only when a recording ends, so the server learns
// it from a recording of nothing (-machine none, about 50 ms), once per
// binary. dir is where that log is made (and removed).
func LogVersion(ctx context.Context, bin, dir string) (uint32, error) {
	path, err := Config{Binary: bin}.resolveBinary()
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	key := binKey{path, fi.Size(), fi.ModTime().UnixNano()}
	if v, ok := logVersions.Load(key); ok {
		return v.(uint32), nil
	}
	f, err := os.CreateTemp(dir, ".rrversion-*")
	if err != nil {
		return 0, fmt.Errorf("learn QEMU's log version: %w", err)
	}
	log := f.Name()
	f.Close()
	defer os.Remove(log)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.Command(path, "-machine", "none", "-nodefaults", "-display", "none", "-S",
		"-icount", "shift=auto,rr=record,rrfile="+escapeOpt(log), "-qmp", "stdio")
	// QEMU ends the recording, writing the log's header, when it quits.
	cmd.Stdin = bytes.NewReader([]byte(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartProcess(cmd); err != nil {
		return 0, fmt.Errorf("learn QEMU's log version: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return 0, fmt.Errorf("learn QEMU's log version: %s did not quit: %w", filepath.Base(path), ctx.Err())
	}
	if err != nil {
		return 0, fmt.Errorf("learn QEMU's log version: %s: %w: %s", filepath.Base(path), err, bytes.TrimSpace(out.Bytes()))
	}
	b, err := os.ReadFile(log)
	if err != nil || len(b) < 4 {
		return 0, errors.New("learn QEMU's log version: QEMU wrote no log")
	}
	v := binary.BigEndian.Uint32(b)
	if v == 0 {
		return 0, errors.New("learn QEMU's log version: QEMU left the log's header empty")
	}
	logVersions.Store(key, v)
	return v, nil
}
