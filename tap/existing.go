package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrInUse means another program has the TAP open: a single-queue TAP
// serves one at a time.
var ErrInUse = errors.New("TAP is in use")

// capNetAdmin is CAP_NET_ADMIN's bit.
const capNetAdmin = 12

// hasNetAdmin reports whether the process has CAP_NET_ADMIN in effect.
func hasNetAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<capNetAdmin) != 0
}

// CheckCreate reports, without making anything, whether Create could make
// a TAP here (CAP_NET_ADMIN and /dev/net/tun) and join bridge (if not
// empty), with the errors Create would give.
func CheckCreate(bridge string) error {
	if !hasNetAdmin() {
		return fmt.Errorf("tap: %w: creating a TAP needs CAP_NET_ADMIN (root), which this process (%s) lacks; %s", ErrNoPrivilege, whoami(), hint)
	}
	if err := checkTunDevice(); err != nil {
		return err
	}
	if bridge != "" {
		if _, err := lookupBridge(bridge); err != nil {
			return err
		}
	}
	return nil
}

// checkTunDevice opens /dev/net/tun, as attaching to any TAP does.
func checkTunDevice() error {
	fd, err := unix.Open(TunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
			return fmt.Errorf("tap: %w: cannot open %s (%w): load the tun module or give the container the device", ErrNoTUN, TunDevice, err)
		case isPermission(err):
			mode := ""
			if fi, serr := os.Stat(TunDevice); serr == nil {
				mode = fmt.Sprintf(" (it is mode %#o here)", fi.Mode().Perm())
			}
			return fmt.Errorf("tap: %w: cannot open %s (%w): a TAP is attached through it, and it must be readable and writable by %s%s; Debian's udev makes it 0666 (safe: a user may attach only to TAPs made for them), so ask root to restore that: chmod 0666 %s",
				ErrNoPrivilege, TunDevice, err, whoami(), mode, TunDevice)
		}
		return fmt.Errorf("tap: open %s: %w", TunDevice, err)
	}
	unix.Close(fd)
	return nil
}

// Existing checks that name is a persistent TAP this process may attach a
// guest to as it is, and describes it. The device is someone else's (root
// made it for this user: ip tuntap add dev NAME mode tap user USER), so
// nothing here changes it, and the Device's Close leaves it. inUse says
// that an attached program is expected (the guest being restarted has it);
// otherwise a TAP in use is refused, since a second attach fails in QEMU.
func Existing(name string, inUse bool) (*Device, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("tap: there is no network interface %s in this network namespace; %s", name, MakeAdvice(name, whoName()))
		}
		return nil, fmt.Errorf("tap: look up %s: %w", name, err)
	}
	t, ok := l.(*netlink.Tuntap)
	if !ok {
		return nil, fmt.Errorf("tap: %w: %s is a %s link; %s", ErrNotTAP, name, l.Type(), MakeAdvice("<name>", whoName()))
	}
	if t.Mode != netlink.TUNTAP_MODE_TAP {
		return nil, fmt.Errorf("tap: %w: %s is a TUN device (IP packets, no Ethernet); a guest's network card needs a TAP: %s", ErrNotTAP, name, MakeAdvice("<name>", whoName()))
	}
	if t.NonPersist {
		return nil, fmt.Errorf("tap: %s is not persistent: it belongs to the program that made it and goes with it", name)
	}
	if t.Queues > 0 && !inUse {
		return nil, fmt.Errorf("tap: %w: %s is attached to another program already (a running QEMU?): a TAP serves one guest at a time", ErrInUse, name)
	}
	if err := checkTunDevice(); err != nil {
		return nil, err
	}
	if t.Queues == 0 {
		// Only the kernel knows whether it lets us attach (its owner and
		// group, or our capabilities): try, and let go at once. A
		// persistent TAP stays as it was.
		if err := probeAttach(name); err != nil {
			return nil, err
		}
	}
	d := &Device{Name: name, Index: l.Attrs().Index, MAC: l.Attrs().HardwareAddr, UID: -1, GID: -1, External: true,
		Up: l.Attrs().Flags&net.FlagUp != 0}
	return d, nil
}

// probeAttach attaches to the TAP and detaches again.
func probeAttach(name string) error {
	fd, err := unix.Open(TunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return checkTunDevice()
	}
	defer unix.Close(fd)
	var req ifreq
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI
	err = ioctl(fd, unix.TUNSETIFF, uintptr(unsafe.Pointer(&req)))
	switch {
	case err == nil:
		return nil
	case isPermission(err):
		return fmt.Errorf("tap: %w: the TAP %s is not yours to attach to (TUNSETIFF: %w): it must be made for you (%s), as root: ip tuntap del dev %s mode tap; ip tuntap add dev %s mode tap user %s",
			ErrNoPrivilege, name, err, whoami(), name, name, whoName())
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("tap: %w: %s is attached to another program (TUNSETIFF: %w): a TAP serves one guest at a time", ErrInUse, name, err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("tap: %s cannot be attached as a single-queue TAP (TUNSETIFF: %w): make it without multi_queue", name, err)
	}
	return fmt.Errorf("tap: attach to %s (TUNSETIFF): %w", name, err)
}

// MakeAdvice is what root runs to make a persistent TAP called name for
// user, and the address or bridge it needs: the usual way for an ordinary
// user to give guests a TAP, made once, used as it is.
func MakeAdvice(name, user string) string {
	return fmt.Sprintf("root makes a persistent TAP for you with: ip tuntap add dev %s mode tap user %s && ip link set %s up, "+
		"then gives it a host address (ip addr add 192.0.2.1/24 dev %s) or joins it to a bridge (ip link set %s master BRIDGE)",
		name, user, name, name, name)
}

func whoName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return strconv.Itoa(os.Geteuid())
}

func whoami() string {
	return "user " + whoName() + ", uid " + strconv.Itoa(os.Geteuid())
}
