// Package qemuopts splits and joins QEMU's key=value option strings
// ("file=fs.img,if=none,id=x0") as QEMU's QemuOpts parser reads them
// (util/qemu-option.c): ",," is a comma inside a value, a first element
// without "=" names the option's implied key, and a later one is a flag
// ("foo" is foo=on, "nofoo" foo=off).
package qemuopts

import "strings"

// KV is one key=value element.
type KV struct {
	Key, Value string
}

// Parse splits s. implied names the key of a first element without "="
// ("driver" for -device, "type" for -machine and -netdev); empty means
// such an element is a flag like any other.
func Parse(s, implied string) []KV {
	var out []KV
	first := true
	for p := s; p != ""; {
		var key, val string
		n := strings.IndexAny(p, "=,")
		if n < 0 {
			n = len(p)
		}
		if n == len(p) || p[n] != '=' {
			if first && implied != "" {
				key = implied
				val, p = value(p)
			} else {
				key, p = p[:n], p[n:]
				if strings.HasPrefix(key, "no") {
					key, val = key[2:], "off"
				} else {
					val = "on"
				}
			}
		} else {
			key = p[:n]
			val, p = value(p[n+1:])
		}
		out = append(out, KV{key, val})
		first = false
		if p != "" {
			p = p[1:] // the separating comma
		}
	}
	return out
}

// value reads a value up to the first single comma, turning ",," into
// ",", and returns the rest starting at that comma.
func value(p string) (string, string) {
	var b strings.Builder
	for {
		i := strings.IndexByte(p, ',')
		if i < 0 {
			b.WriteString(p)
			return b.String(), ""
		}
		if i+1 < len(p) && p[i+1] == ',' {
			b.WriteString(p[:i+1])
			p = p[i+2:]
			continue
		}
		b.WriteString(p[:i])
		return b.String(), p[i:]
	}
}

// Escape doubles the commas of a value, so that it cannot end early.
func Escape(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// Get returns the last value of key (QEMU takes the last), and whether
// it is there.
func Get(kvs []KV, key string) (string, bool) {
	v, ok := "", false
	for _, kv := range kvs {
		if kv.Key == key {
			v, ok = kv.Value, true
		}
	}
	return v, ok
}
