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

func (p *descParser) reg(t xml.StartElement, feature string) error {
	r := Register{Name: attr(t, "name"), Feature: feature, Group: attr(t, "group"), Type: attr(t, "type")}
	if r.Name == "" {
		return errors.New("register without a name")
	}
	var err error
	if r.Bitsize, err = strconv.Atoi(attr(t, "bitsize")); err != nil || r.Bitsize <= 0 || r.Bitsize > 4096 {
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

// riscvABINames are the general registers' numeric names, for lookups by
// "x5" where the description says "t0"; "s0" is the description's "fp".
var riscvABINames = [32]string{
	"zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2",
	"fp", "s1", "a0", "a1", "a2", "a3", "a4", "a5",
	"a6", "a7", "s2", "s3", "s4", "s5", "s6", "s7",
	"s8", "s9", "s10", "s11", "t3", "t4", "t5", "t6",
}

// fallbackRISCV64 describes the 'g' registers of a riscv64 stub that
// offers no target description.
func fallbackRISCV64() description {
	d := description{arch: "riscv:rv64"}
	for i, n := range riscvABINames {
		d.regs = append(d.regs, Register{Name: n, Regnum: i, Bitsize: 64, Feature: "org.gnu.gdb.riscv.cpu", Group: "general"})
	}
	d.regs = append(d.regs, Register{Name: "pc", Regnum: 32, Bitsize: 64, Feature: "org.gnu.gdb.riscv.cpu", Group: "general", Type: "code_ptr"})
	return d
}

// aliases maps other names of RISC-V registers to the description's: x0..x31
// and s0. Only names the description does not use itself are added.
func aliases(regs []Register, index map[string]int) {
	riscv := false
	for _, r := range regs {
		if strings.HasPrefix(r.Feature, "org.gnu.gdb.riscv.") {
			riscv = true
			break
		}
	}
	if !riscv {
		return
	}
	add := func(alias, name string) {
		if _, taken := index[alias]; taken {
			return
		}
		if i, ok := index[name]; ok {
			index[alias] = i
		}
	}
	for i, n := range riscvABINames {
		add("x"+strconv.Itoa(i), n)
	}
	add("s0", "fp")
}
