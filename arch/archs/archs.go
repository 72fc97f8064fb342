// Package archs lists the guest architectures the server knows, finds one
// by name and recognises a kernel's.
package archs

import (
	"fmt"
	"io"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/arm64"
	"github.com/qemu-mcp/qemu-mcp/arch/riscv64"
	"github.com/qemu-mcp/qemu-mcp/arch/x86_64"
)

// all are the architectures, the default first.
var all = []arch.Arch{riscv64.Arch, arm64.Arch, x86_64.Arch}

// All returns the architectures the server knows, the default first.
func All() []arch.Arch { return append([]arch.Arch(nil), all...) }

// Default is the architecture of a boot that names none and whose kernel
// says none: riscv64, what the server booted before it knew others.
func Default() arch.Arch { return all[0] }

// Names are the architectures' names, the default first.
func Names() []string {
	n := make([]string, len(all))
	for i, a := range all {
		n[i] = a.Name()
	}
	return n
}

// UnknownError is a name no architecture answers to.
type UnknownError struct{ Name string }

func (e *UnknownError) Error() string {
	return fmt.Sprintf("architecture %q: want one of %s", e.Name, strings.Join(Names(), ", "))
}

// Lookup finds an architecture by its name or an alias; "" is the default.
func Lookup(name string) (arch.Arch, error) {
	if name == "" {
		return Default(), nil
	}
	for _, a := range all {
		if strings.EqualFold(name, a.Name()) {
			return a, nil
		}
		for _, al := range a.Aliases() {
			if strings.EqualFold(name, al) {
				return a, nil
			}
		}
	}
	return nil, &UnknownError{Name: name}
}

// Recognize says which architecture the kernel image r holds by its
// headers; ok is false for an image without one (a flat binary), which
// the caller boots as the default's.
func Recognize(r io.ReaderAt) (a arch.Arch, ok bool, err error) {
	head := make([]byte, arch.HeadSize)
	n, err := r.ReadAt(head, 0)
	if err != nil && err != io.EOF {
		return nil, false, err
	}
	for _, a := range all {
		if a.Kernel(head[:n]) {
			return a, true, nil
		}
	}
	return nil, false, nil
}
