package qemuopts

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		s, implied string
		want       []KV
	}{
		{"file=fs.img,if=none,format=raw,id=x0", "", []KV{{"file", "fs.img"}, {"if", "none"}, {"format", "raw"}, {"id", "x0"}}},
		{"virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0", "driver", []KV{{"driver", "virtio-blk-device"}, {"drive", "x0"}, {"bus", "virtio-mmio-bus.0"}}},
		{"file=a,,b.img,readonly,nosnapshot", "", []KV{{"file", "a,b.img"}, {"readonly", "on"}, {"snapshot", "off"}}},
		{"user", "type", []KV{{"type", "user"}}},
		{"", "type", nil},
	} {
		if got := Parse(tc.s, tc.implied); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q, %q) = %q, want %q", tc.s, tc.implied, got, tc.want)
		}
	}
	if v, ok := Get(Parse("a=1,b=2,a=3", ""), "a"); !ok || v != "3" {
		t.Errorf("Get = %q, %v; want the last, 3", v, ok)
	}
	if got := Parse("file="+Escape("x,y"), ""); got[0].Value != "x,y" {
		t.Errorf("Escape does not round-trip: %q", got)
	}
}
