// Package tap creates and removes the host side of a guest's network: one
// persistent TAP device per guest, under a name its server records so that a
// reaper can find and remove the TAP of a server that died (see
// DeleteIfTAP). Name gives a default name after a PID; callers with several
// guests per process name each device themselves.
//
// The device is created in TAP mode without packet-information headers
// (NO_PI), owned by the user QEMU runs as, with IPv6 switched off on it so
// that captures of the guest's traffic contain no MLD or neighbour-discovery
// frames from the host. It either gets a host address (default 10.0.2.2/24,
// the address QEMU's user-mode network gives the host) or joins an existing
// bridge. It is brought up, and stays until Delete (or Device.Close) removes
// it: TAPs are persistent, they outlive the process that made them.
//
// Everything here acts in the network namespace of the calling OS thread,
// which for an ordinary process is the process's namespace. QEMU must be
// started in the same namespace to attach to the device (QEMU looks the name
// up in its own namespace). This package never switches namespaces.
//
// Creating a TAP needs CAP_NET_ADMIN (root) and access to /dev/net/tun.
// Without them the error wraps ErrNoPrivilege (or ErrNoTUN) and suggests
// QEMU's user-mode network, which needs neither.
package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultCIDR is the host address a TAP gets when neither an address nor a
// bridge is asked for: the host's address in QEMU's user-mode network, so a
// guest configured for one works with the other.
const DefaultCIDR = "10.0.2.2/24"

// NamePrefix starts every TAP name this package makes. The reaper relies on
// it (with the PID that follows) to know which links are ours.
const NamePrefix = "qmcp"

// maxNameLen is IFNAMSIZ-1: the kernel's limit on interface names.
const maxNameLen = 15

// TunDevice is the clone device TAPs are made through.
const TunDevice = "/dev/net/tun"

var (
	// ErrNoPrivilege means the process may not create or change network
	// devices: it lacks CAP_NET_ADMIN or access to /dev/net/tun.
	ErrNoPrivilege = errors.New("not privileged for TAP networking")
	// ErrNoTUN means the kernel offers no /dev/net/tun (no tun module, or a
	// container without the device node).
	ErrNoTUN = errors.New("no TUN/TAP support")
	// ErrExists means a link of the requested name already exists.
	ErrExists = errors.New("link already exists")
	// ErrNotTAP means a link exists under the name but is not a TUN/TAP
	// device, so it is not ours and is left alone.
	ErrNotTAP = errors.New("link is not a TUN/TAP device")
)

// hint is appended to every privilege error: the tool layer shows it to a
// user who asked for a TAP, and the alternative needs no privileges at all.
const hint = `use network: "user" (QEMU's user-mode network, no privileges needed) instead`

// Name is the TAP name for the server with the given PID: "qmcp<pid>". A
// PID has at most 7 digits on Linux (pid_max <= 4194304), so the name fits
// the kernel's 15 characters.
func Name(pid int) string {
	return NamePrefix + strconv.Itoa(pid)
}

// PIDFromName is the inverse of Name: it reports the PID a TAP name was made
// from, and false for any other name.
func PIDFromName(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, NamePrefix)
	if !ok || digits == "" || len(digits) > 7 || digits[0] == '0' {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != digits {
		return 0, false
	}
	return pid, true
}

// GuestMAC is the MAC address for the guest's NIC of the server with the
// given PID (QEMU: -device virtio-net-device,netdev=n0,mac=<GuestMAC>):
// QEMU's own locally administered prefix 52:54:00 followed by the low 24 bits
// of the PID. Servers with different PIDs (below 2^24, so all of them in
// practice) give their guests different addresses, so guests of several
// servers on one bridge do not clash, and a MAC in a capture tells which
// server's guest sent it.
func GuestMAC(pid int) net.HardwareAddr {
	p := uint32(pid)
	return net.HardwareAddr{0x52, 0x54, 0x00, byte(p >> 16), byte(p >> 8), byte(p)}
}

// Options say how to make the TAP. The zero value (with PID set, or the
// defaults) gives qmcp<own pid>, owned by root, with 10.0.2.2/24.
type Options struct {
	// PID names the device (Name(PID)) and derives the guest's MAC
	// (GuestMAC(PID)). Zero means os.Getpid().
	PID int
	// Name overrides Name(PID). At most 15 characters.
	Name string
	// UID and GID own the device: the user QEMU runs as may attach to it
	// without CAP_NET_ADMIN. A negative value leaves that check off (only
	// privileged processes may attach). The zero value means root, which is
	// right when QEMU runs as root. Note that the kernel checks both: with a
	// GID set, the user must also be in that group.
	UID, GID int
	// CIDR is the host's address on the TAP, e.g. "192.0.2.1/24". Empty
	// means DefaultCIDR unless Bridge is set.
	CIDR string
	// Bridge, if set, names an existing bridge the TAP joins instead of
	// getting an address (CIDR must then be empty).
	Bridge string
	// MAC, if set, is the host side's MAC address. Empty lets the kernel
	// pick a random one. Never give the guest's address here.
	MAC net.HardwareAddr
	// GuestMAC is the address the caller gives the guest's NIC, reported
	// in Device.GuestMAC; empty means GuestMAC(PID).
	GuestMAC net.HardwareAddr
	// Replace deletes an existing TUN/TAP device of the same name first (one
	// left behind by a dead process whose PID this one reuses). A link of the
	// name that is not a TUN/TAP device is never touched: Create then fails
	// with ErrNotTAP. Without Replace an existing link gives ErrExists.
	Replace bool
}

// Device is a TAP made by Create.
type Device struct {
	Name     string           // interface name, e.g. "qmcp1234"
	Index    int              // interface index in the namespace it was made in
	MAC      net.HardwareAddr // the host side's MAC address
	GuestMAC net.HardwareAddr // GuestMAC(PID): give it to QEMU's NIC
	CIDR     string           // host address, e.g. "10.0.2.2/24"; empty with Bridge
	Bridge   string           // bridge it joined; empty with CIDR
	UID, GID int              // owner and group (-1: none)
	// External says that someone else made the device (see Existing):
	// Close leaves it.
	External bool
	// Up says whether the device was up when Existing looked.
	Up bool

	closeOnce sync.Once
	closeErr  error
}

// Close removes the device (see DeleteIfTAP), once: the name is reused by
// the next boot of the same server, and a late second Close must not delete
// that newer device. It leaves alone a link of the same name that is no
// longer a TAP.
func (d *Device) Close() error {
	if d.External {
		return nil
	}
	d.closeOnce.Do(func() { _, d.closeErr = DeleteIfTAP(d.Name) })
	return d.closeErr
}

// Create makes, configures and brings up a TAP device as the options say,
// in the calling thread's network namespace. On failure nothing is left
// behind.
func Create(opts Options) (*Device, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}

	// Check everything that can be checked before the device exists, so
	// that a bad bridge name does not cost a create-and-delete.
	var bridge netlink.Link
	if o.Bridge != "" {
		if bridge, err = lookupBridge(o.Bridge); err != nil {
			return nil, err
		}
	}
	if err := clearName(o.Name, o.Replace); err != nil {
		return nil, err
	}

	if err := createTAP(o.Name, o.UID, o.GID); err != nil {
		return nil, err
	}
	dev, err := configure(o, bridge)
	if err == nil && afterConfigure != nil {
		err = afterConfigure(o.Name)
	}
	if err != nil {
		// Remove the half-made device; its error would only hide the first.
		_, _ = DeleteIfTAP(o.Name)
		return nil, err
	}
	return dev, nil
}

// afterConfigure, if set (by tests), runs after a successful configure and
// its error fails Create, to check that a failure leaves no device behind.
var afterConfigure func(name string) error

// resolved is Options with defaults filled in and values checked.
type resolved struct {
	Options
	addr *netlink.Addr
}

func (opts Options) resolve() (resolved, error) {
	o := resolved{Options: opts}
	if o.PID == 0 {
		o.PID = os.Getpid()
	}
	if o.PID < 0 {
		return o, fmt.Errorf("tap: invalid PID %d", o.PID)
	}
	if o.Name == "" {
		o.Name = Name(o.PID)
	}
	if o.GuestMAC == nil {
		o.GuestMAC = GuestMAC(o.PID)
	}
	if err := checkName(o.Name); err != nil {
		return o, err
	}
	if o.UID < 0 {
		o.UID = -1
	}
	if o.GID < 0 {
		o.GID = -1
	}
	if o.Bridge != "" {
		if o.CIDR != "" {
			return o, fmt.Errorf("tap: %s: give either a host address (%s) or a bridge (%s), not both", o.Name, o.CIDR, o.Bridge)
		}
		if err := checkName(o.Bridge); err != nil {
			return o, err
		}
	} else {
		if o.CIDR == "" {
			o.CIDR = DefaultCIDR
		}
		ip, ipnet, err := net.ParseCIDR(o.CIDR)
		if err != nil {
			return o, fmt.Errorf("tap: %s: host address %q is not an address with a prefix length like 192.0.2.1/24: %w", o.Name, o.CIDR, err)
		}
		if ip.To4() == nil {
			// IPv6 is switched off on the TAP (see disableIPv6), so the
			// kernel would refuse the address with a misleading EACCES.
			return o, fmt.Errorf("tap: %s: host address %s: only IPv4 host addresses are supported (IPv6 is off on the TAP to keep captures free of the host's own IPv6 traffic); the guest may still use IPv6 over it", o.Name, o.CIDR)
		}
		ipnet.IP = ip // keep the host part: ParseCIDR masks it off
		o.addr = &netlink.Addr{IPNet: ipnet}
	}
	if o.MAC != nil {
		if len(o.MAC) != 6 {
			return o, fmt.Errorf("tap: %s: MAC %s is not an Ethernet address", o.Name, o.MAC)
		}
		if o.MAC[0]&1 != 0 {
			return o, fmt.Errorf("tap: %s: MAC %s is a multicast address", o.Name, o.MAC)
		}
	}
	return o, nil
}

// checkName rejects names the kernel would refuse or that would escape the
// /proc/sys path the sysctls are written to.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("tap: empty interface name")
	case len(name) > maxNameLen:
		return fmt.Errorf("tap: interface name %q is longer than %d characters", name, maxNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("tap: invalid interface name %q", name)
	case strings.ContainsAny(name, "/:% \t\n\x00"):
		return fmt.Errorf("tap: interface name %q contains a character the kernel refuses", name)
	}
	return nil
}

func lookupBridge(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("tap: bridge %s does not exist", name)
		}
		return nil, wrapPrivilege(err, "look up bridge "+name)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("tap: %s is a %s link, not a bridge", name, l.Type())
	}
	return l, nil
}

// clearName makes sure no link is named name, deleting a stale TAP if
// replace allows it.
func clearName(name string, replace bool) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return wrapPrivilege(err, "look up "+name)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		if replace {
			return fmt.Errorf("tap: %w: %s is a %s link; not replacing it", ErrNotTAP, name, l.Type())
		}
		return fmt.Errorf("tap: %w: %s (a %s link)", ErrExists, name, l.Type())
	}
	if !replace {
		return fmt.Errorf("tap: %w: %s is a TUN/TAP device already (a dead server's? DeleteIfTAP removes it)", ErrExists, name)
	}
	if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
		return wrapPrivilege(err, "delete the stale TAP "+name)
	}
	return nil
}

// ifreq is struct ifreq as TUNSETIFF reads it: a name and the flags, padded
// to the size of the union.
type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

// createTAP makes a persistent TAP through /dev/net/tun. netlink.LinkAdd
// does the same, but formats the ioctl's errno into a string, which loses
// EPERM (needed for ErrNoPrivilege) and EBUSY (needed for ErrExists), and it
// leaks the descriptor when TUNSETOWNER fails. The descriptor is closed at
// the end: the device persists, and QEMU opens its own.
func createTAP(name string, uid, gid int) error {
	fd, err := unix.Open(TunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
			return fmt.Errorf("tap: %w: cannot open %s (%w): load the tun module or give the container the device; or %s", ErrNoTUN, TunDevice, err, hint)
		case isPermission(err):
			return fmt.Errorf("tap: %w: cannot open %s (%w): creating a TAP needs root (CAP_NET_ADMIN) and read-write access to %s; %s", ErrNoPrivilege, TunDevice, err, TunDevice, hint)
		}
		return fmt.Errorf("tap: open %s: %w", TunDevice, err)
	}
	defer unix.Close(fd)

	var req ifreq
	copy(req.name[:], name)
	// TUN_EXCL: fail (EBUSY) instead of silently attaching to a device
	// that appeared since clearName looked.
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_ONE_QUEUE | unix.IFF_TUN_EXCL
	if err := ioctl(fd, unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); err != nil {
		switch {
		case isPermission(err):
			return fmt.Errorf("tap: %w: creating TAP %s (TUNSETIFF: %w) needs CAP_NET_ADMIN (root); %s", ErrNoPrivilege, name, err, hint)
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("tap: %w: %s (TUNSETIFF: %w)", ErrExists, name, err)
		}
		return fmt.Errorf("tap: create TAP %s (TUNSETIFF): %w", name, err)
	}
	// From here the device exists only as long as fd is open, until
	// TUNSETPERSIST: an early return removes it.
	//
	// A new device has no owner and no group (only privileged processes
	// may attach); the kernel refuses -1 as a value, so skip the ioctl.
	if uid >= 0 {
		if err := ioctl(fd, unix.TUNSETOWNER, uintptr(uid)); err != nil {
			return fmt.Errorf("tap: set owner of %s to uid %d (TUNSETOWNER): %w", name, uid, err)
		}
	}
	if gid >= 0 {
		if err := ioctl(fd, unix.TUNSETGROUP, uintptr(gid)); err != nil {
			return fmt.Errorf("tap: set group of %s to gid %d (TUNSETGROUP): %w", name, gid, err)
		}
	}
	if err := ioctl(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("tap: make %s persistent (TUNSETPERSIST): %w", name, err)
	}
	return nil
}

func ioctl(fd int, req uint, arg uintptr) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), arg)
	if errno != 0 {
		return errno
	}
	return nil
}

// configure does everything after the device exists: IPv6 off, MAC,
// address or bridge, up.
func configure(o resolved, bridge netlink.Link) (*Device, error) {
	link, err := netlink.LinkByName(o.Name)
	if err != nil {
		return nil, wrapPrivilege(err, "look up the new TAP "+o.Name)
	}
	// Before the link is up: the kernel sends MLD reports and router
	// solicitations as soon as IPv6 comes up on it, and they would be the
	// first frames of every capture.
	if err := disableIPv6(o.Name); err != nil {
		return nil, err
	}
	if o.MAC != nil {
		if err := netlink.LinkSetHardwareAddr(link, o.MAC); err != nil {
			return nil, wrapPrivilege(err, fmt.Sprintf("set MAC %s on %s", o.MAC, o.Name))
		}
	}
	if bridge != nil {
		if err := netlink.LinkSetMaster(link, bridge); err != nil {
			return nil, wrapPrivilege(err, fmt.Sprintf("attach %s to bridge %s", o.Name, o.Bridge))
		}
	} else {
		if err := netlink.AddrAdd(link, o.addr); err != nil {
			return nil, wrapPrivilege(err, fmt.Sprintf("add address %s to %s", o.CIDR, o.Name))
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, wrapPrivilege(err, "bring up "+o.Name)
	}
	// Read back what the kernel has (the MAC it chose, for one).
	if link, err = netlink.LinkByName(o.Name); err != nil {
		return nil, wrapPrivilege(err, "look up the new TAP "+o.Name)
	}
	d := &Device{
		Name:     o.Name,
		Index:    link.Attrs().Index,
		MAC:      link.Attrs().HardwareAddr,
		GuestMAC: o.GuestMAC,
		Bridge:   o.Bridge,
		UID:      o.UID,
		GID:      o.GID,
	}
	if o.addr != nil {
		d.CIDR = o.addr.IPNet.String()
	}
	return d, nil
}

// disableIPv6 switches IPv6 off on the interface, and with it every frame
// the host would send unasked (MLD, router and neighbour solicitations).
// accept_ra and autoconf are set to 0 as well, so that a later
// disable_ipv6=0 (by hand, for an IPv6 test) does not bring in router
// advertisements from a bridge. A kernel without IPv6 has no such files,
// and nothing to switch off.
func disableIPv6(name string) error {
	dir := filepath.Join("/proc/sys/net/ipv6/conf", name)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, s := range []struct{ key, val string }{
		{"accept_ra", "0"},
		{"autoconf", "0"},
		{"disable_ipv6", "1"},
	} {
		path := filepath.Join(dir, s.key)
		if err := os.WriteFile(path, []byte(s.val+"\n"), 0); err != nil {
			if errors.Is(err, os.ErrNotExist) && s.key != "disable_ipv6" {
				continue
			}
			return wrapPrivilege(err, fmt.Sprintf("write %s to %s", s.val, path))
		}
	}
	return nil
}

// Delete removes the link called name, whatever its type. A link that does
// not exist is not an error: Delete is for cleanup. Prefer DeleteIfTAP for a
// name read from somewhere else (a registry record).
func Delete(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return wrapPrivilege(err, "look up "+name)
	}
	if err := netlink.LinkDel(l); err != nil {
		if isNotFound(err) {
			return nil // gone in between: what was wanted
		}
		return wrapPrivilege(err, "delete "+name)
	}
	return nil
}

// DeleteIfTAP removes the link called name if it exists and is a TUN/TAP
// device, and reports whether it did. This is what the reaper calls for a
// dead server's TAP named in its record: a link of that name that is not a
// TUN/TAP device (someone else's) is never deleted; that case returns false
// and an error wrapping ErrNotTAP. A missing link returns false and nil.
func DeleteIfTAP(name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, wrapPrivilege(err, "look up "+name)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		return false, fmt.Errorf("tap: %w: %s is a %s link; not deleting it", ErrNotTAP, name, l.Type())
	}
	// Delete by index, not by name: if the TAP was replaced by another link
	// of the same name since the lookup, the index no longer matches and
	// nothing else is deleted.
	if err := netlink.LinkDel(l); err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, wrapPrivilege(err, "delete TAP "+name)
	}
	return true, nil
}

// isNotFound recognises netlink's answers for a missing link: its own
// LinkNotFoundError, or ENODEV from the kernel.
func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func isPermission(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}

// wrapPrivilege gives a failed step its context, and turns EPERM/EACCES
// into ErrNoPrivilege with the hint.
func wrapPrivilege(err error, what string) error {
	if isPermission(err) {
		return fmt.Errorf("tap: %w: %s: %w: needs CAP_NET_ADMIN (root); %s", ErrNoPrivilege, what, err, hint)
	}
	return fmt.Errorf("tap: %s: %w", what, err)
}
