package qcow2state

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Region is guest-physical memory backed by RAM: Size bytes at Start are
// the bytes of memory region Name from Offset on.
type Region struct {
	Start, Size uint64
	Name        string
	Offset      uint64
}

// ParseFlatView reads where RAM is in a machine's physical address space
// (the address space "memory", which the CPUs see) from the output of
// QEMU's HMP command `info mtree -f`, whose lines read
//
//	0000000080000000-000000008fffffff (prio 0, ram): riscv_virt_board.ram
//
// with " @<offset>" after the name when the range starts inside the
// region. Only RAM-backed ranges (ram, rom, romd) are kept.
func ParseFlatView(out string) ([]Region, error) {
	var regions []Region
	inView, found := false, false
	for _, line := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "FlatView #"):
			if found {
				return sorted(regions), nil
			}
			inView = false
			continue
		case strings.HasPrefix(t, `AS "memory",`):
			inView, found = true, true
			continue
		}
		if !inView {
			continue
		}
		r, ok, err := parseRange(t)
		if err != nil {
			return nil, fmt.Errorf("info mtree -f: %q: %w", t, err)
		}
		if ok {
			regions = append(regions, r)
		}
	}
	if !found {
		return nil, fmt.Errorf("info mtree -f: no flat view of the address space \"memory\"")
	}
	return sorted(regions), nil
}

func sorted(rs []Region) []Region {
	slices.SortFunc(rs, func(a, b Region) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	return rs
}

// parseRange reads one range of a flat view; ok is false for a line that
// is not a RAM-backed range.
func parseRange(t string) (Region, bool, error) {
	span, rest, ok := strings.Cut(t, " (prio ")
	if !ok {
		return Region{}, false, nil
	}
	lo, hi, ok := strings.Cut(span, "-")
	if !ok {
		return Region{}, false, nil
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end < start {
		return Region{}, false, nil
	}
	attrs, name, ok := strings.Cut(rest, "): ")
	if !ok {
		return Region{}, false, fmt.Errorf("no region name")
	}
	_, kind, _ := strings.Cut(attrs, ", ")
	switch strings.Fields(kind + " x")[0] {
	case "ram", "rom", "romd":
	default:
		return Region{}, false, nil
	}
	r := Region{Start: start, Size: end - start + 1}
	if i := strings.LastIndex(name, " @"); i >= 0 {
		f := strings.Fields(name[i+2:])
		if len(f) > 0 {
			off, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				return Region{}, false, fmt.Errorf("offset %q", f[0])
			}
			r.Offset, name = off, name[:i]
		}
	}
	r.Name = strings.TrimSpace(name)
	if r.Name == "" {
		return Region{}, false, fmt.Errorf("no region name")
	}
	return r, true, nil
}

// regionAt is the region holding physical address pa.
func regionAt(regions []Region, pa uint64) (Region, bool) {
	for _, r := range regions {
		if pa >= r.Start && pa-r.Start < r.Size {
			return r, true
		}
	}
	return Region{}, false
}
