package qemuline

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/qemu-mcp/qemu-mcp/internal/shellwords"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// xv6Line is what a teaching kernel's `make -n qemu` prints.
const xv6Line = `qemu-system-riscv64 -machine virt -bios none -kernel kernel/kernel -m 128M -smp 3 -nographic \
  -global virtio-mmio.force-legacy=false \
  -drive file=fs.img,if=none,format=raw,id=x0 -device virtio-blk-device,drive=x0,bus=virtio-mmio-bus.0`

func words(t *testing.T, line string) []string {
	t.Helper()
	w, err := shellwords.Split(line)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func options(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Option)
	}
	return out
}

func TestTeachingKernelLine(t *testing.T) {
	var checked [][]string
	p, rep := Parse(words(t, xv6Line), func(o []string) error { checked = append(checked, o); return nil })
	if len(rep.Refused) != 0 {
		t.Fatalf("refused: %+v", rep.Refused)
	}
	if got := options(rep.Replaced); !reflect.DeepEqual(got, []string{"qemu-system-riscv64", "-nographic"}) {
		t.Errorf("replaced %q, want the binary and -nographic", got)
	}
	if p.Kernel != "kernel/kernel" || p.BIOS != "none" || p.Memory != "128M" || p.SMP != 3 || !p.VirtioModern {
		t.Errorf("machine %+v", p)
	}
	want := []qemu.Drive{{Path: "fs.img", Format: "raw", Bus: "virtio-mmio-bus.0"}}
	if !reflect.DeepEqual(p.Drives, want) {
		t.Errorf("drives %+v, want %+v", p.Drives, want)
	}
	if len(p.ExtraArgs) != 0 || len(checked) != 0 {
		t.Errorf("extra args %q (checked %q), want none: every option has a field", p.ExtraArgs, checked)
	}
	if txt := rep.Text(); !strings.Contains(txt, "-nographic -> no window") {
		t.Errorf("text: %s", txt)
	}
}

func TestPassedOnAndChecked(t *testing.T) {
	line := `-M virt,aclint=on -cpu rv64,sv48=on -global virtio-blk-device.queue-size=256 -device virtio-rng-device -no-reboot -m size=256m -smp cpus=2 -append "console=ttyS0 quiet"`
	var checked [][]string
	p, rep := Parse(words(t, line), func(o []string) error {
		checked = append(checked, o)
		if o[0] == "-global" {
			return errors.New("no")
		}
		return nil
	})
	if got := options(rep.Refused); !reflect.DeepEqual(got, []string{"-global virtio-blk-device.queue-size=256"}) || rep.Refused[0].Reason != "no" {
		t.Errorf("refused %+v, want the -global with the checker's reason", rep.Refused)
	}
	wantExtra := []string{"-M", "virt,aclint=on", "-cpu", "rv64,sv48=on", "-device", "virtio-rng-device", "-no-reboot"}
	if !reflect.DeepEqual(p.ExtraArgs, wantExtra) {
		t.Errorf("extra args %q, want %q", p.ExtraArgs, wantExtra)
	}
	if p.Memory != "256M" || p.SMP != 2 || p.Append != "console=ttyS0 quiet" {
		t.Errorf("machine %+v", p)
	}
	if len(checked) != 5 {
		t.Errorf("checked %q, want each passed option once", checked)
	}
}

// A monitor or console on a host socket or file is refused, not replaced,
// and every refusal is named at once.
func TestHostSocketsRefused(t *testing.T) {
	line := `-serial stdio -monitor telnet::4444,server,nowait -drive file=/etc/shadow,format=raw -serial file:/tmp/x -chardev socket,id=c,path=/tmp/s -gdb tcp::1234 -S`
	p, rep := Parse(words(t, line), nil)
	refused := strings.Join(options(rep.Refused), "\n")
	for _, want := range []string{"-monitor telnet::4444,server,nowait", "-serial file:/tmp/x", "-chardev socket,id=c,path=/tmp/s"} {
		if !strings.Contains(refused, want) {
			t.Errorf("refused %q, want %s among them", refused, want)
		}
	}
	// The drive is taken here; its file is the boot's to check.
	if len(p.Drives) != 1 || p.Drives[0].Path != "/etc/shadow" {
		t.Errorf("drives %+v", p.Drives)
	}
	if got := options(rep.Replaced); !reflect.DeepEqual(got, []string{"-serial stdio", "-gdb tcp::1234", "-S"}) {
		t.Errorf("replaced %q", got)
	}
	if !p.GDB {
		t.Error("-gdb did not give gdb: true")
	}
	err := &RefusedError{Report: rep}
	if msg := err.Error(); !strings.Contains(msg, "nothing was started") || !strings.Contains(msg, "telnet::4444") {
		t.Errorf("error %q", msg)
	}
}

func TestDrivesAndNetwork(t *testing.T) {
	line := `-drive file=a.img,if=none,id=a,format=qcow2 -drive file=b.img,if=none,id=b,readonly=on
	-device virtio-blk-device,drive=b,bus=virtio-mmio-bus.0 -device virtio-blk-device,drive=a
	-netdev user,id=n0 -device virtio-net-device,netdev=n0
	-drive file=c.img,if=virtio -device virtio-blk-pci,drive=a -netdev user,id=n1,hostfwd=tcp::2222-:22 -device virtio-net-device,netdev=n1`
	p, rep := Parse(words(t, line), nil)
	want := []qemu.Drive{{Path: "b.img", ReadOnly: true, Bus: "virtio-mmio-bus.0"}, {Path: "a.img", Format: "qcow2"}}
	if !reflect.DeepEqual(p.Drives, want) {
		t.Errorf("drives %+v, want %+v (in the order of their devices)", p.Drives, want)
	}
	if p.Network != "user" {
		t.Errorf("network %q, want user", p.Network)
	}
	refused := strings.Join(options(rep.Refused), "\n")
	for _, want := range []string{"-drive file=c.img,if=virtio", "-device virtio-blk-pci,drive=a", "-netdev user,id=n1,hostfwd=tcp::2222-:22"} {
		if !strings.Contains(refused, want) {
			t.Errorf("refused %q, want %s among them", refused, want)
		}
	}
}

func TestOtherBinaryAndBareWords(t *testing.T) {
	_, rep := Parse([]string{"/usr/bin/qemu-system-mips", "-m", "1G", "disk.img"}, nil)
	if got := options(rep.Refused); !reflect.DeepEqual(got, []string{"/usr/bin/qemu-system-mips", "disk.img"}) {
		t.Errorf("refused %q", got)
	}
	p, rep := Parse([]string{"/usr/bin/qemu-system-x86_64", "-m", "1G", "disk.img"}, nil)
	if got := options(rep.Refused); p.Arch != "x86_64" || !reflect.DeepEqual(got, []string{"disk.img"}) {
		t.Errorf("qemu-system-x86_64: arch %q, refused %q", p.Arch, got)
	}
}
