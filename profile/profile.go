// Package profile reads a project's named boot profiles (.qemu-mcp.json in
// the project root), checked against the JSON Schema published beside it,
// with errors that name the file, the profile and the field.
package profile

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// FileName is the profile file in a project root.
const FileName = ".qemu-mcp.json"

// Schema is the JSON Schema of the profile file.
//
//go:embed qemu-mcp.schema.json
var Schema []byte

// Profile is one named way to boot the project.
type Profile struct {
	Description   string       `json:"description,omitempty"`
	Kernel        string       `json:"kernel,omitempty"`
	Initrd        string       `json:"initrd,omitempty"`
	DTB           string       `json:"dtb,omitempty"`
	BIOS          string       `json:"bios,omitempty"`
	Memory        string       `json:"memory,omitempty"`
	SMP           int          `json:"smp,omitempty"`
	Append        string       `json:"append,omitempty"`
	Drives        []qemu.Drive `json:"drives,omitempty"`
	Shares        []Share      `json:"shares,omitempty"`
	Network       string       `json:"network,omitempty"`
	GPU           bool         `json:"gpu,omitempty"`
	GDB           bool         `json:"gdb,omitempty"`
	Symbols       string       `json:"symbols,omitempty"`
	Prompt        string       `json:"prompt,omitempty"`
	PanicPatterns []string     `json:"panic_patterns,omitempty"`
	ExtraArgs     []string     `json:"extra_args,omitempty"`
}

// Share is a directory shared with the guest (qemu_boot's shares).
type Share struct {
	Path     string `json:"path"`
	Tag      string `json:"tag,omitempty"`
	Writable bool   `json:"writable,omitempty"`
}

// File is a parsed .qemu-mcp.json.
type File struct {
	Path     string
	Default  string
	Profiles map[string]Profile
}

var resolved = sync.OnceValues(func() (*jsonschema.Resolved, error) {
	var s jsonschema.Schema
	if err := json.Unmarshal(Schema, &s); err != nil {
		return nil, fmt.Errorf("profile schema: %w", err)
	}
	return s.Resolve(nil)
})

// Load reads root/.qemu-mcp.json. A missing file is (nil, nil): profiles
// are optional.
func Load(root string) (*File, error) {
	path := filepath.Join(root, FileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return Parse(path, b)
}

// Parse checks b against the schema and decodes it. path is for messages.
func Parse(path string, b []byte) (*File, error) {
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: not valid JSON: %w", path, err)
	}
	var raw struct {
		Default  string                     `json:"default"`
		Profiles map[string]json.RawMessage `json:"profiles"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f := &File{Path: path, Default: raw.Default, Profiles: map[string]Profile{}}
	// Decode each profile on its own first: Go's decoder names the exact
	// profile and field, which is a better message than the schema's.
	for _, name := range sortedKeys(raw.Profiles) {
		dec := json.NewDecoder(bytes.NewReader(raw.Profiles[name]))
		dec.DisallowUnknownFields()
		var p Profile
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("%s: profile %q: %s", path, name, fieldError(err))
		}
		if err := p.check(); err != nil {
			return nil, fmt.Errorf("%s: profile %q: %w", path, name, err)
		}
		f.Profiles[name] = p
	}
	rs, err := resolved()
	if err != nil {
		return nil, err
	}
	if err := rs.Validate(doc); err != nil {
		return nil, fmt.Errorf("%s: does not match the schema (profile/qemu-mcp.schema.json): %w", path, err)
	}
	if f.Default != "" {
		if _, ok := f.Profiles[f.Default]; !ok {
			return nil, fmt.Errorf("%s: default names profile %q, which is not defined (profiles: %s)", path, f.Default, strings.Join(sortedKeys(raw.Profiles), ", "))
		}
	}
	return f, nil
}

// fieldError rewords the decoder's errors around the field name.
func fieldError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
	}
	if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
		return "unknown field " + strings.TrimPrefix(msg, "json: unknown field ") + " (see profile/qemu-mcp.schema.json)"
	}
	return err.Error()
}

// check validates what the schema cannot: the regular expressions.
func (p Profile) check() error {
	if p.Prompt != "" {
		if _, err := regexp.Compile(p.Prompt); err != nil {
			return fmt.Errorf("field \"prompt\": %w", err)
		}
	}
	for i, pat := range p.PanicPatterns {
		if _, err := regexp.Compile(pat); err != nil {
			return fmt.Errorf("field \"panic_patterns\"[%d]: %w", i, err)
		}
	}
	return nil
}

// Pick returns the named profile, or the default when name is empty. ok
// is false when no profile applies (no name and no default).
func (f *File) Pick(name string) (p Profile, ok bool, err error) {
	if f == nil {
		if name != "" {
			return Profile{}, false, fmt.Errorf("profile %q: the project has no %s", name, FileName)
		}
		return Profile{}, false, nil
	}
	if name == "" {
		name = f.Default
		if name == "" {
			return Profile{}, false, nil
		}
	}
	p, ok = f.Profiles[name]
	if !ok {
		return Profile{}, false, fmt.Errorf("%s: no profile %q (profiles: %s)", f.Path, name, strings.Join(sortedKeys(f.Profiles), ", "))
	}
	return p, true, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Under fills what args leave empty from p: arguments a boot gives win
// over its profile, and the profile's switches (gpu, gdb) add to the
// boot's.
func (p Profile) Under(args *Profile) {
	set := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	set(&args.Kernel, p.Kernel)
	set(&args.Initrd, p.Initrd)
	set(&args.DTB, p.DTB)
	set(&args.BIOS, p.BIOS)
	set(&args.Memory, p.Memory)
	set(&args.Append, p.Append)
	set(&args.Network, p.Network)
	set(&args.Symbols, p.Symbols)
	set(&args.Prompt, p.Prompt)
	if args.SMP == 0 {
		args.SMP = p.SMP
	}
	if args.Drives == nil {
		args.Drives = p.Drives
	}
	if args.Shares == nil {
		args.Shares = p.Shares
	}
	if args.ExtraArgs == nil {
		args.ExtraArgs = p.ExtraArgs
	}
	if args.PanicPatterns == nil {
		args.PanicPatterns = p.PanicPatterns
	}
	args.GPU = args.GPU || p.GPU
	args.GDB = args.GDB || p.GDB
}
