package doctor_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/doctor"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/storetest"
)

// testdata/json-keys.golden and testdata/report.golden are what the code
// of commit ff3bbbc made of a Result with every field set (their
// generator: git show ff3bbbc:doctor/golden_gen_test.go): scripts read
// `doctor --json`, and people read its text, so neither changes by
// accident.

var goldenTime = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fill sets every exported field v reaches: strings to their field's name,
// numbers and booleans to one and true, one element in each list and map.
func fill(v reflect.Value, name string, depth int) {
	if depth > 8 || !v.CanSet() {
		return
	}
	if v.Type() == reflect.TypeOf(time.Time{}) {
		v.Set(reflect.ValueOf(goldenTime))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(name)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), name, depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), name, depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, name, depth+1)
		fill(e, name, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				fill(v.Field(i), f.Name, depth+1)
			}
		}
	}
}

// filledResult is a Result with every field set.
func filledResult() doctor.Result {
	var res doctor.Result
	fill(reflect.ValueOf(&res).Elem(), "Result", 0)
	// The stores share one report type; each fills only its own parts.
	res.Snapshots.Cut = nil
	r := res.Recordings
	r.Left, r.Broken = nil, nil
	for i := range r.Removed {
		r.Removed[i].Tag, r.Removed[i].Held = "", false
	}
	return res
}

// jsonKeys lists the key paths of a JSON document in their order:
// "snapshot_leftovers.removed[].path".
func jsonKeys(t *testing.T, b []byte) string {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	var out []string
	var walk func(path string)
	walk = func(path string) {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		switch tok {
		case json.Delim('{'):
			for d.More() {
				k, err := d.Token()
				if err != nil {
					t.Fatal(err)
				}
				p := strings.TrimPrefix(path+"."+k.(string), ".")
				out = append(out, p)
				walk(p)
			}
			d.Token()
		case json.Delim('['):
			for d.More() {
				walk(path + "[]")
			}
			d.Token()
		}
	}
	walk("")
	return strings.Join(out, "\n") + "\n"
}

// goldenReport is the text of the filled Result: as a listing, after a
// cleanup, and with the server's record usable.
func goldenReport(t *testing.T) []byte {
	t.Helper()
	var out bytes.Buffer
	res := filledResult()
	listed := res
	listed.Cleanup = nil
	// A server whose record could be used.
	usable := filledResult()
	usable.Servers[0].Error = ""
	for _, r := range []doctor.Result{listed, res, usable} {
		if err := r.WriteText(&out, goldenTime.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		out.WriteString("----\n")
	}
	return out.Bytes()
}

func goldenKeys(t *testing.T) []byte {
	t.Helper()
	b, err := json.Marshal(filledResult())
	if err != nil {
		t.Fatal(err)
	}
	return []byte(jsonKeys(t, b))
}

// `doctor --json` has the keys, in the order, it always had.
func TestJSONKeysUnchanged(t *testing.T) {
	storetest.Golden(t, "testdata/json-keys.golden", goldenKeys(t))
}

// The text report says what it always said.
func TestReportUnchanged(t *testing.T) {
	storetest.Golden(t, "testdata/report.golden", goldenReport(t))
}
