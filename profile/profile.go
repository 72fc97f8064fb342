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
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/qemu-mcp/qemu-mcp/internal/shellwords"
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
	Description string `json:"description,omitempty"`
	// CommandLine is the QEMU invocation the project runs (what its
	// `make -n qemu` prints); the fields below override what it says.
	CommandLine Line `json:"command_line,omitempty"`
	// Arch is the guest's architecture (package archs names them);
	// empty means the kernel's, else the default.
	Arch          string       `json:"arch,omitempty"`
	Kernel        string       `json:"kernel,omitempty"`
	Initrd        string       `json:"initrd,omitempty"`
	DTB           string       `json:"dtb,omitempty"`
	BIOS          string       `json:"bios,omitempty"`
	Memory        string       `json:"memory,omitempty"`
	SMP           int          `json:"smp,omitempty"`
	Append        string       `json:"append,omitempty"`
	Drives        []qemu.Drive `json:"drives,omitempty"`
	Shares        []qemu.Share `json:"shares,omitempty"`
	Network       string       `json:"network,omitempty"`
	GPU           bool         `json:"gpu,omitempty"`
	VirtioModern  bool         `json:"virtio_modern,omitempty"`
	GDB           bool         `json:"gdb,omitempty"`
	Symbols       string       `json:"symbols,omitempty"`
	Prompt        string       `json:"prompt,omitempty"`
	PanicPatterns []string     `json:"panic_patterns,omitempty"`
	ExtraArgs     []string     `json:"extra_args,omitempty"`
}

// Line is a QEMU invocation: in JSON one string, split into words as a
// shell splits it (quotes, backslashes, line continuations), or an array
// of its words.
type Line []string

// UnmarshalJSON takes a string or an array of strings.
func (l *Line) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		words, err := shellwords.Split(s)
		if err != nil {
			return fmt.Errorf("command_line: %w", err)
		}
		if words == nil {
			words = []string{}
		}
		*l = words
		return nil
	}
	var words []string
	if err := json.Unmarshal(b, &words); err != nil {
		return errors.New("command_line: want a string (as a shell would read it) or an array of its words")
	}
	*l = words
	return nil
}

// LineOf is v, a string or a list of strings as a JSON decoder gives
// them, as a Line; nil for nil.
func LineOf(v any) (Line, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var l Line
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, err
	}
	return l, nil
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
	for _, name := range slices.Sorted(maps.Keys(raw.Profiles)) {
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
			return nil, fmt.Errorf("%s: default names profile %q, which is not defined (profiles: %s)", path, f.Default, strings.Join(slices.Sorted(maps.Keys(raw.Profiles)), ", "))
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
		return Profile{}, false, fmt.Errorf("%s: no profile %q (profiles: %s)", f.Path, name, strings.Join(slices.Sorted(maps.Keys(f.Profiles)), ", "))
	}
	return p, true, nil
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
	set(&args.Arch, p.Arch)
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
	args.VirtioModern = args.VirtioModern || p.VirtioModern
	args.GDB = args.GDB || p.GDB
}

// ErrExists is a Put of a profile the file has already, without replace.
var ErrExists = errors.New("profile exists")

// Put writes p as profile name into root/.qemu-mcp.json, keeping the
// file's other profiles as they are; the file becomes one whose default
// is name if it had no default. An existing profile of that name is
// replaced only if replace is set. The file is replaced atomically and
// checked as Load checks it before it is.
func Put(root, name string, p Profile, replace bool) (path string, err error) {
	path = filepath.Join(root, FileName)
	if !nameRE.MatchString(name) {
		return path, fmt.Errorf("profile name %q: use letters, digits, '_', '.' and '-', starting with a letter or digit", name)
	}
	doc := map[string]json.RawMessage{}
	profiles := map[string]json.RawMessage{}
	old, err := os.ReadFile(path)
	mode := os.FileMode(0o644)
	switch {
	case err == nil:
		if _, err := Parse(path, old); err != nil {
			return path, fmt.Errorf("%w (fix it first: nothing was written)", err)
		}
		if err := json.Unmarshal(old, &doc); err != nil {
			return path, err
		}
		if err := json.Unmarshal(doc["profiles"], &profiles); err != nil {
			return path, err
		}
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	case !errors.Is(err, os.ErrNotExist):
		return path, err
	}
	if _, ok := profiles[name]; ok && !replace {
		return path, fmt.Errorf("%s: %w: %q (replace it, or give another name)", path, ErrExists, name)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return path, err
	}
	profiles[name] = b
	if doc["profiles"], err = json.Marshal(profiles); err != nil {
		return path, err
	}
	if _, ok := doc["default"]; !ok {
		doc["default"], _ = json.Marshal(name)
	}
	if _, ok := doc["$schema"]; !ok {
		doc["$schema"], _ = json.Marshal("https://github.com/qemu-mcp/qemu-mcp/profile/qemu-mcp.schema.json")
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return path, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return path, err
	}
	out.WriteByte('\n')
	if _, err := Parse(path, out.Bytes()); err != nil {
		return path, fmt.Errorf("the profile written would not load (nothing was written): %w", err)
	}
	tmp, err := os.CreateTemp(root, ".qemu-mcp.json.*")
	if err != nil {
		return path, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out.Bytes()); err != nil {
		tmp.Close()
		return path, err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return path, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return path, err
	}
	if err := tmp.Close(); err != nil {
		return path, err
	}
	return path, os.Rename(tmp.Name(), path)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
