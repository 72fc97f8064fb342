package gdb

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReadFrame(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		kind     byte
		bad      bool
	}{
		{"$OK#9a", "OK", '$', false},
		{"+$OK#9a", "", '+', false},
		{"garbage$OK#9A", "OK", '$', false},
		{"$OK#00", "", '$', true},
		{"$#00", "", '$', false},
		{"%Stop:T05#" + hex2(checksum("Stop:T05")), "Stop:T05", '%', false},
		{"$0* 1#" + hex2(checksum("0* 1")), "00001", '$', false},
		{"$x*!#" + hex2(checksum("x*!")), "xxxxx", '$', false},
		{"$abc$OK#9a", "OK", '$', false}, // a restart inside a packet
	} {
		kind, got, bad, err := readFrame(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil || kind != tc.kind || bad != tc.bad || string(got) != tc.want {
			t.Errorf("readFrame(%q) = %q, %q, %v, %v; want %q, %q, %v", tc.in, kind, got, bad, err, tc.kind, tc.want, tc.bad)
		}
	}
	for _, in := range []string{"$*#" + hex2(checksum("*")), "$a*#" + hex2(checksum("a*")), "$a*\x01#" + hex2(checksum("a*\x01"))} {
		if _, _, _, err := readFrame(bufio.NewReader(strings.NewReader(in))); !errors.Is(err, errMalformed) {
			t.Errorf("readFrame(%q) = %v, want errMalformed", in, err)
		}
	}
	if _, _, _, err := readFrame(bufio.NewReader(strings.NewReader("$OK#9"))); !errors.Is(err, io.EOF) {
		t.Errorf("truncated: %v", err)
	}
}

func hex2(b byte) string { return string([]byte{hexDigits[b>>4], hexDigits[b&0xf]}) }

func TestAppendPacketRoundTrip(t *testing.T) {
	for _, p := range []string{"", "m80200000,10", "X0,4:$#}*", "\x00\xff}]"} {
		b := appendPacket(nil, []byte(p))
		_, got, bad, err := readFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil || bad {
			t.Fatalf("%q framed as %q: %v, bad %v", p, b, err, bad)
		}
		if got, err = unescape(got); err != nil || string(got) != p {
			t.Errorf("%q framed as %q read back as %q, %v", p, b, got, err)
		}
	}
}

func TestParseStop(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Stop
	}{
		{"S05", Stop{Signal: 5, Reason: ReasonBreakpoint}},
		{"T02thread:01;", Stop{Signal: 2, Reason: ReasonSignal, Thread: "01"}},
		{"T05thread:p01.01;watch:0000000080204148;", Stop{Signal: 5, Reason: ReasonWatch, Addr: 0x80204148, Thread: "p01.01"}},
		{"T05thread:01;rwatch:10;", Stop{Signal: 5, Reason: ReasonRWatch, Addr: 0x10, Thread: "01"}},
		{"T05awatch:ff;thread:02;", Stop{Signal: 5, Reason: ReasonAWatch, Addr: 0xff, Thread: "02"}},
		{"T05swbreak:;20:0010208000000000;thread:01;core:0;", Stop{Signal: 5, Reason: ReasonBreakpoint, Thread: "01"}},
		{"T0bhwbreak:;", Stop{Signal: 11, Reason: ReasonBreakpoint}},
		{"W00", Stop{Reason: ReasonExited}},
		{"W07;process:1", Stop{Reason: ReasonExited, ExitStatus: 7}},
		{"X09", Stop{Reason: ReasonTerminated, Signal: 9}},
	} {
		got, err := parseStop([]byte(tc.in))
		tc.want.Raw = tc.in
		if err != nil || got != tc.want {
			t.Errorf("parseStop(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"OK", "E14", "", "S5", "S05x", "PacketSize=1000", "QC01", "Wxx", "T05watch:zz;"} {
		if _, err := parseStop([]byte(in)); err == nil {
			t.Errorf("parseStop(%q) succeeded", in)
		}
	}
}

func TestParseFeatures(t *testing.T) {
	got := parseFeatures([]byte("PacketSize=1000;qXfer:features:read+;multiprocess-;swbreak?;;x"))
	want := map[string]string{"PacketSize": "1000", "qXfer:features:read": "+", "multiprocess": "-", "swbreak": "?"}
	if len(got) != len(want) {
		t.Fatalf("parseFeatures = %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestDescriptionErrors(t *testing.T) {
	for name, docs := range map[string]map[string]string{
		"cycle":     {"target.xml": `<target><xi:include href="a.xml"/></target>`, "a.xml": `<feature><xi:include href="target.xml"/></feature>`},
		"missing":   {"target.xml": `<target><xi:include href="a.xml"/></target>`},
		"bitsize":   {"target.xml": `<target><feature name="f"><reg name="r" bitsize="many"/></feature></target>`},
		"no name":   {"target.xml": `<target><feature name="f"><reg bitsize="8"/></feature></target>`},
		"too wide":  {"target.xml": `<target><feature name="f"><reg name="r" bitsize="2097152"/></feature></target>`},
		"malformed": {"target.xml": `<target><feature`},
	} {
		_, err := parseDescription(func(annex string) ([]byte, error) {
			if d, ok := docs[annex]; ok {
				return []byte(d), nil
			}
			return nil, errors.New("no such annex")
		})
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestDescriptionSME: QEMU 11.1's aarch64 -cpu max describes SME's ZA
// at 524288 bits; the description parses and keeps the registers.
func TestDescriptionSME(t *testing.T) {
	d, err := parseDescription(func(annex string) ([]byte, error) {
		return []byte(`<target><feature name="org.gnu.gdb.aarch64.sme"><reg name="svg" bitsize="64"/>` +
			`<reg name="za" bitsize="524288"/></feature></target>`), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.regs) != 2 || d.regs[1].Name != "za" || d.regs[1].Bitsize != 524288 {
		t.Errorf("registers %+v, want svg and za (524288 bits)", d.regs)
	}
}

// FuzzDecodePacket feeds arbitrary bytes through everything that parses
// what a stub sends; none of it may panic, and framing must round-trip.
func FuzzDecodePacket(f *testing.F) {
	for _, s := range []string{
		"$OK#9a", "+$T05thread:01;#07", "$0* 1#00", "%Stop:T05#00", "$l<target/>#00", "$E14#aa",
		"$m}]}\x03#00", "$a*", "$*#2a", "-", "$T05watch:80204148;#00", "$W00;process:1#00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		for {
			kind, p, bad, err := readFrame(r)
			if err != nil {
				break
			}
			if bad || kind == frameAck || kind == frameNack {
				continue
			}
			if len(p) > maxPacket {
				t.Fatalf("payload of %d bytes", len(p))
			}
			unescape(p)
			if isStopReply(p) {
				if _, err := parseStop(p); err != nil && !errors.Is(err, errMalformed) {
					t.Fatalf("parseStop: %v", err)
				}
			}
			replyError([]byte("m0,1"), p)
			parseFeatures(p)
			decodeHex(p)
		}
		// Whatever the payload, framing it and reading it back gives it.
		b := appendPacket(nil, data)
		_, got, bad, err := readFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil || bad {
			t.Fatalf("own packet unreadable: %v, bad %v", err, bad)
		}
		if got, err = unescape(got); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip: %q -> %q (%v)", data, got, err)
		}
	})
}

// FuzzDescription parses arbitrary target descriptions.
func FuzzDescription(f *testing.F) {
	f.Add([]byte(`<target><architecture>riscv:rv64</architecture><xi:include href="a.xml"/></target>`))
	f.Add([]byte(`<feature name="org.gnu.gdb.riscv.cpu"><reg name="zero" bitsize="64"/><reg name="x" bitsize="32" regnum="100"/></feature>`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		d, err := parseDescription(func(annex string) ([]byte, error) {
			if annex == "target.xml" {
				return doc, nil
			}
			return []byte(`<feature name="f"><reg name="r" bitsize="8"/></feature>`), nil
		})
		if err != nil {
			return
		}
		index := map[string]int{}
		for i, r := range d.regs {
			index[r.Name] = i
		}
		aliases(d.regs, index)
	})
}
