package boundary

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/qemuopts"
)

// kv is one key=value element of an option string.
type kv struct {
	key   string
	value any // string, or a JSON scalar for -device {...} and QMP device_add
}

// parseOpts splits an option string as QEMU 7.2's QemuOpts parser
// (util/qemu-option.c, opts_do_parse) does (see internal/qemuopts).
// implied names the key of a first element without "=" ("driver" for
// -device); empty means none. The "id" key is kept.
//
// keyval strings (-machine) parse the same way for every input keyval
// accepts, except that keyval refuses flags; checking the QemuOpts reading
// is therefore at least as strict.
func parseOpts(s, implied string) []kv {
	var out []kv
	for _, p := range qemuopts.Parse(s, implied) {
		out = append(out, kv{p.Key, p.Value})
	}
	return out
}

// parseDevice reads a -device value as QEMU does: a JSON object when it
// starts with "{", else a QemuOpts string whose first bare element is the
// driver.
func parseDevice(value string) ([]kv, error) {
	if strings.HasPrefix(value, "{") {
		return parseJSONObject(value)
	}
	return parseOpts(value, "driver"), nil
}

// parseJSONObject decodes a flat JSON object as QEMU's -device {...} syntax
// takes it, refusing duplicate keys, nested values and trailing data, which
// Go and QEMU could read differently.
func parseJSONObject(s string) ([]kv, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var out []kv
	seen := make(map[string]bool)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := t.(string)
		if !ok {
			return nil, errors.New("malformed JSON object")
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && (raw[0] == '{' || raw[0] == '[') {
			return nil, fmt.Errorf("key %q: nested values are not supported", key)
		}
		var v any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, kv{key, v})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, errors.New("malformed JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return out, nil
}

// refusal is a rule name and reason, turned into a RefusedError by the caller
// who knows the kind and subject.
type refusal struct {
	rule, reason string
}

func (r *refusal) err(kind, subject string) error {
	if r == nil {
		return nil
	}
	return &RefusedError{Kind: kind, Subject: subject, Rule: r.rule, Reason: r.reason}
}

func refuse(rule, format string, a ...any) *refusal {
	return &refusal{rule, fmt.Sprintf(format, a...)}
}

// checkKeys refuses keys not in allowed, naming the rule of a known
// host-facing key when there is one.
func checkKeys(what string, props []kv, allowed map[string]bool, hostKeys map[string]string, fallback string) *refusal {
	for _, p := range props {
		if allowed[p.key] {
			continue
		}
		if rule, ok := hostKeys[p.key]; ok {
			return refuse(rule, "%s property %q reaches outside the guest (%s)", what, p.key, ruleSummary(rule))
		}
		return refuse(fallback, "%s property %q is not on the allow-list", what, p.key)
	}
	return nil
}

// ruleSummary is a short description of a refuse rule, for messages about
// properties.
func ruleSummary(rule string) string {
	switch rule {
	case RuleHostFile:
		return "a host file or directory"
	case RuleBlockLayer:
		return "a host block backend"
	case RuleHostChardev:
		return "a host character device"
	case RuleHostNetwork:
		return "a host network backend"
	case RuleHostBackend:
		return "a host-backed object"
	case RuleHostDevice:
		return "a host device"
	case RuleFDPassing:
		return "a host file descriptor"
	case RuleHostProcess:
		return "the QEMU process on the host"
	case RuleRecordReplay:
		return "a record/replay log file on the host"
	case RuleHostLog:
		return "a host log or trace file"
	}
	return rule
}
