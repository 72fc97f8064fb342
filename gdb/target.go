package gdb

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
)

// A Register is one register of the target description.
type Register struct {
	Name string `json:"name"`
	// Regnum is the number the stub knows the register by ('p', 'P').
	Regnum  int `json:"regnum"`
	Bitsize int `json:"bitsize"`
	// Feature is the description feature that declares it, such as
	// "org.gnu.gdb.riscv.cpu" or "org.gnu.gdb.riscv.csr".
	Feature string `json:"feature"`
	// Group is the description's group, or else one derived from the
	// feature: "general", "float", "vector", "csr" or "system".
	Group string `json:"group"`
	// Type is the description's type ("int", "code_ptr", ...), if any.
	Type string `json:"type,omitempty"`
}

// maxDescription bounds the target description and its includes together.
// QEMU's is about 12 KiB.
const maxDescription = 4 << 20

// description is a parsed target description.
type description struct {
	arch string
	regs []Register // in regnum order
}

// fetchFunc returns one document (annex) of the target description.
type fetchFunc func(annex string) ([]byte, error)

// parseDescription reads the document "target.xml" and every document it
// includes, numbering registers as gdb does: a register without a regnum
// attribute gets the number after the previous one, across documents.
func parseDescription(fetch fetchFunc) (description, error) {
	p := descParser{fetch: fetch, seen: map[string]bool{}}
	if err := p.doc("target.xml", 0); err != nil {
		return description{}, err
	}
	slices.SortStableFunc(p.d.regs, func(a, b Register) int { return a.Regnum - b.Regnum })
	return p.d, nil
}

type descParser struct {
	fetch fetchFunc
	seen  map[string]bool
	total int
	next  int
	d     description
}

func (p *descParser) doc(annex string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("target description: includes nested too deep at %s", annex)
	}
	if p.seen[annex] {
		return fmt.Errorf("target description: %s included twice", annex)
	}
	p.seen[annex] = true
	data, err := p.fetch(annex)
	if err != nil {
		return fmt.Errorf("target description %s: %w", annex, err)
	}
	if p.total += len(data); p.total > maxDescription {
		return fmt.Errorf("target description: more than %d bytes", maxDescription)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = false
	// The documents declare no encoding other than UTF-8; anything else is
	// read as is rather than refused.
	dec.CharsetReader = func(_ string, r io.Reader) (io.Reader, error) { return r, nil }
	var feature string
	var inArch bool
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("target description %s: %w", annex, err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			switch t.Name.Local {
			case "architecture":
				inArch = true
			case "include":
				href := attr(t, "href")
				if href == "" {
					return fmt.Errorf("target description %s: include without href", annex)
				}
				if err := p.doc(href, depth+1); err != nil {
					return err
				}
			case "feature":
				feature = attr(t, "name")
			case "reg":
				if err := p.reg(t, feature); err != nil {
					return fmt.Errorf("target description %s: %w", annex, err)
				}
			}
		case xml.EndElement:
			switch t.Name.Local {
			case "architecture":
				inArch = false
			case "feature":
				feature = ""
			}
		case xml.CharData:
			if inArch {
				p.d.arch += strings.TrimSpace(string(t))
			}
		}
	}
}

// maxBitsize bounds a register's width. The widest QEMU describes is
// AArch64's SME array ZA, a square of the streaming vector length: at
// -cpu max's 2048 bits, 256x256 bytes (524288 bits).
const maxBitsize = 1 << 20

func (p *descParser) reg(t xml.StartElement, feature string) error {
	r := Register{Name: attr(t, "name"), Feature: feature, Group: attr(t, "group"), Type: attr(t, "type")}
	if r.Name == "" {
		return errors.New("register without a name")
	}
	var err error
	if r.Bitsize, err = strconv.Atoi(attr(t, "bitsize")); err != nil || r.Bitsize <= 0 || r.Bitsize > maxBitsize {
		return fmt.Errorf("register %s: bad bitsize %q", r.Name, attr(t, "bitsize"))
	}
	r.Regnum = p.next
	if s := attr(t, "regnum"); s != "" {
		if r.Regnum, err = strconv.Atoi(s); err != nil || r.Regnum < 0 || r.Regnum > 1<<20 {
			return fmt.Errorf("register %s: bad regnum %q", r.Name, s)
		}
	}
	p.next = r.Regnum + 1
	if r.Group == "" {
		r.Group = groupOf(feature)
	}
	p.d.regs = append(p.d.regs, r)
	return nil
}

// groupOf guesses a register group from its feature's name, as the
// descriptions QEMU sends leave "group" out.
func groupOf(feature string) string {
	switch {
	case strings.HasSuffix(feature, ".cpu") || strings.HasSuffix(feature, ".core"):
		return "general"
	case strings.HasSuffix(feature, ".fpu"):
		return "float"
	case strings.HasSuffix(feature, ".vector"):
		return "vector"
	case strings.HasSuffix(feature, ".csr"):
		return "csr"
	}
	return "system"
}

func attr(t xml.StartElement, name string) string {
	for _, a := range t.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// fallback describes the 'g' registers of a stub of architecture a that
// offers no target description; none for an architecture the debugger
// does not know.
func fallback(a arch.Arch) description {
	d := a.Debugger()
	if d == nil {
		return description{}
	}
	g := d.Registers().GDB
	desc := description{arch: g.Arch}
	for i, n := range g.Fallback {
		r := Register{Name: n, Regnum: i, Bitsize: 64, Feature: g.FallbackFeature, Group: "general"}
		if i == len(g.Fallback)-1 {
			r.Type = "code_ptr" // the pc
		}
		desc.regs = append(desc.regs, r)
	}
	return desc
}

// aliases adds other names of the registers (x0..x31 and s0 on RISC-V)
// of the architecture whose features the description has, as that
// architecture gives them. Only names the description does not use itself
// are added.
func aliases(regs []Register, index map[string]int) {
	g, ok := layoutOf(regs)
	if !ok {
		return
	}
	for _, al := range g.Aliases {
		if _, taken := index[al[0]]; taken {
			continue
		}
		if i, ok := index[al[1]]; ok {
			index[al[0]] = i
		}
	}
}

// layoutOf is the gdbstub layout of the architecture whose features regs
// are, if the debugger knows it.
func layoutOf(regs []Register) (arch.GDB, bool) {
	for _, a := range archs.All() {
		d := a.Debugger()
		if d == nil {
			continue
		}
		g := d.Registers().GDB
		for _, r := range regs {
			if g.FeaturePrefix != "" && strings.HasPrefix(r.Feature, g.FeaturePrefix) {
				return g, true
			}
		}
	}
	return arch.GDB{}, false
}
