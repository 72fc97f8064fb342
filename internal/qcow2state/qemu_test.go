package qcow2state

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/qemu-mcp/qemu-mcp/internal/testkit/testguest"
)

// qmpConn is just enough QMP for these tests: commands and their returns,
// events skipped.
type qmpConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialQMP(t *testing.T, path string, p *testguest.Process) *qmpConn {
	t.Helper()
	var c net.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		select {
		case <-p.Done:
			t.Fatalf("QEMU exited: %s", p.Stderr())
		default:
		}
	}
	if err != nil {
		t.Fatalf("QMP: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	q := &qmpConn{t: t, c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		t.Fatalf("QMP greeting: %v", err)
	}
	q.cmd("qmp_capabilities", nil)
	return q
}

func (q *qmpConn) cmd(name string, args any) json.RawMessage {
	q.t.Helper()
	req := map[string]any{"execute": name}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	q.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		q.t.Fatalf("QMP %s: %v", name, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			q.t.Fatalf("QMP %s: %v", name, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			q.t.Fatalf("QMP %s: %q: %v", name, line, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			q.t.Fatalf("QMP %s: %s", name, resp.Error.Desc)
		}
		return resp.Return
	}
}

// hmp runs an HMP command and returns what it printed.
func (q *qmpConn) hmp(line string) string {
	q.t.Helper()
	var out string
	if err := json.Unmarshal(q.cmd("human-monitor-command", map[string]any{"command-line": line}), &out); err != nil {
		q.t.Fatalf("HMP %s: %v", line, err)
	}
	return out
}

// savedGuest is a QEMU of the tiny kernel, paused at its start, with a
// device-less qcow2 image to save its state into.
type savedGuest struct {
	q     *qmpConn
	image string
	dir   string
}

func startSaved(t *testing.T, imgOpts string) *savedGuest {
	t.Helper()
	tiny := testguest.Tiny(t)
	testguest.QEMUImg(t)
	dir := t.TempDir()
	image := filepath.Join(dir, "vm.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-o", imgOpts, image, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v %s", err, out)
	}
	sock := filepath.Join(dir, "q.sock")
	if len(sock) > 100 {
		d, err := os.MkdirTemp("", "qs")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		sock = filepath.Join(d, "q.sock")
	}
	p := testguest.StartQEMU(t, dir, "-S", "-M", "virt", "-m", "64M", "-bios", "default", "-display", "none",
		"-nodefaults", "-kernel", tiny, "-qmp", "unix:"+sock+",server=on,wait=off",
		"-blockdev", "driver=qcow2,node-name=snap0,file.driver=file,file.filename="+image)
	return &savedGuest{q: dialQMP(t, sock, p), image: image, dir: dir}
}

// save stops the guest, saves its state as tag and dumps its RAM (and
// the boot ROM) as QEMU sees it.
func (g *savedGuest) save(tag string) (ram, mrom []byte) {
	g.q.t.Helper()
	g.q.cmd("stop", nil)
	if out := g.q.hmp("savevm " + tag); out != "" {
		g.q.t.Fatalf("savevm: %s", out)
	}
	dump := func(addr, size uint64) []byte {
		f := filepath.Join(g.dir, tag+"-"+strconv.FormatUint(addr, 16)+".bin")
		g.q.cmd("pmemsave", map[string]any{"val": addr, "size": size, "filename": f})
		b, err := os.ReadFile(f)
		if err != nil || uint64(len(b)) != size {
			g.q.t.Fatalf("pmemsave: %d bytes, %v", len(b), err)
		}
		return b
	}
	return dump(0x80000000, 64<<20), dump(0x1000, 0xf000)
}

// compare reads [pa, pa+len(want)) from the image's state tag through the
// machine's flat view and compares it with want, page by page.
func compare(t *testing.T, st *State, regions []Region, pa uint64, want []byte) {
	t.Helper()
	got := make([]byte, 4096)
	bad := 0
	for off := 0; off < len(want); off += len(got) {
		n := min(len(got), len(want)-off)
		if err := st.ReadPhysical(regions, pa+uint64(off), got[:n]); err != nil {
			t.Fatalf("read %#x: %v", pa+uint64(off), err)
		}
		if !bytes.Equal(got[:n], want[off:off+n]) {
			if bad++; bad <= 5 {
				t.Errorf("physical %#x: the saved state differs from the guest's memory", pa+uint64(off))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d pages of %d at %#x differ", bad, (len(want)+4095)/4096, pa)
	}
	// A read across pages, at an odd place.
	odd := pa + 4093
	b := make([]byte, 7)
	if err := st.ReadPhysical(regions, odd, b); err != nil || !bytes.Equal(b, want[4093:4100]) {
		t.Errorf("7 bytes at %#x: % x, %v; want % x", odd, b, err, want[4093:4100])
	}
}

// The RAM of the tiny kernel's machine, saved by QEMU (savevm) into qcow2
// images of 64 KiB and 4 KiB clusters (the state then spans many L2
// tables), reads from the image exactly as QEMU's pmemsave dumped it:
// before the guest ran, and after it booted, each from its own snapshot.
func TestQEMUSavedRAM(t *testing.T) {
	for _, c := range []struct{ name, opts string }{{"clusters64k", "cluster_size=65536"}, {"clusters4k", "cluster_size=4096"}} {
		opts := c.opts
		t.Run(c.name, func(t *testing.T) {
			g := startSaved(t, opts)
			ram0, mrom := g.save("start")
			regions, err := ParseFlatView(g.q.hmp("info mtree -f"))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RAM regions: %+v", regions)
			g.q.cmd("cont", nil)
			time.Sleep(300 * time.Millisecond) // the firmware and kernel run
			ram1, _ := g.save("booted")
			if bytes.Equal(ram0, ram1) {
				t.Fatal("the guest's RAM did not change as it ran")
			}
			for _, s := range []struct {
				tag string
				ram []byte
			}{{"start", ram0}, {"booted", ram1}} {
				t0 := time.Now()
				st, err := Open(g.image, s.tag)
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				t.Logf("%s: indexed in %v: blocks %+v", s.tag, time.Since(t0), st.Blocks())
				compare(t, st, regions, 0x80000000, s.ram)
				compare(t, st, regions, 0x1000, mrom)
			}
			if _, err := Open(g.image, "three"); !errors.Is(err, ErrNoState) {
				t.Errorf("a tag not in the image: %v, want ErrNoState", err)
			}
		})
	}
}

// An image whose L2 entries are extended (subclusters) is refused as not
// understood, not misread.
func TestQEMUExtendedL2Refused(t *testing.T) {
	g := startSaved(t, "extended_l2=on")
	g.save("one")
	_, err := Open(g.image, "one")
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("extended L2: %v, want ErrUnsupported", err)
	}
	t.Log(err)
}
