package boundary

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// GuestDevices are the device models device_add (QMP and HMP) and -device
// accept without asking QEMU. Each is emulated entirely inside QEMU with no
// host backend, as long as only DeviceProperties are set. Other models pass
// once the QEMU binary's property types are known (Policy.Props): a model
// hostDeviceRule does not name, with every property passing by its type.
//
// virtio-rng is included on purpose: since QEMU 4.2 a virtio-rng device
// without an rng= property gets a built-in rng-builtin backend, which draws
// from QEMU's own getrandom()-seeded generator and opens no host file; the
// rng= property, which could name an rng-random (a host file or device) or
// rng-egd (a host socket) backend, is not allowed, and such backends could not
// be created anyway (object-add and -object are refused).
var GuestDevices = map[string]string{
	// Input: events come from QMP/HMP (send-key, input-send-event) or a
	// display the server does not open.
	"virtio-keyboard-device": "input",
	"virtio-keyboard-pci":    "input",
	"virtio-mouse-device":    "input",
	"virtio-mouse-pci":       "input",
	"virtio-tablet-device":   "input",
	"virtio-tablet-pci":      "input",
	"usb-kbd":                "input (needs a USB controller)",
	"usb-mouse":              "input (needs a USB controller)",
	"usb-tablet":             "input (needs a USB controller)",
	// USB controllers and hubs: guest-visible buses only.
	"qemu-xhci":    "USB controller",
	"nec-usb-xhci": "USB controller",
	"usb-ehci":     "USB controller",
	"pci-ohci":     "USB controller",
	"usb-hub":      "USB hub",
	// Entropy from QEMU's built-in generator (see above).
	"virtio-rng-device": "entropy (rng-builtin backend)",
	"virtio-rng-pci":    "entropy (rng-builtin backend)",
	// Memory balloon: moves guest memory only.
	"virtio-balloon-device": "memory balloon",
	"virtio-balloon-pci":    "memory balloon",
	// Display adapters render into QEMU memory; screendump reads them.
	"virtio-gpu-device": "display adapter",
	"virtio-gpu-pci":    "display adapter",
	"virtio-vga":        "display adapter",
	"VGA":               "display adapter",
	"bochs-display":     "display adapter",
	"ramfb":             "display adapter",
	// PCI topology.
	"pcie-root-port":  "PCI topology",
	"pci-bridge":      "PCI topology",
	"pcie-pci-bridge": "PCI topology",
	// Guest-only test and watchdog devices.
	"pvpanic-pci": "panic notifier",
	"i6300esb":    "watchdog",
	"edu":         "QEMU's educational test device",
	"pci-testdev": "PCI test device",
}

// DeviceProperties are the properties device_add and -device may set on
// GuestDevices without asking QEMU. All are numbers, booleans,
// guest-visible addresses or QOM ids. Every other property is refused
// unless QEMU types it as a plain value (see StringProperties and
// checkTyped), in particular romfile= (a host file loaded as option ROM),
// pcap= (USB traffic written to a host file) and every backend link
// (chardev=, netdev=, drive=, fsdev=, memdev=, rng=, iothread=, audiodev=).
var DeviceProperties = map[string]bool{
	"id": true, "bus": true, "addr": true, "multifunction": true,
	"port": true, "ports": true, "p2": true, "p3": true, "num-ports": true,
	"chassis": true, "chassis_nr": true, "slot": true,
	"xres": true, "yres": true, "max_outputs": true, "vgamem_mb": true,
	"max-bytes": true, "period": true,
	"deflate-on-oom": true, "free-page-reporting": true,
	"head": true, "wheel-axis": true,
}

// hostDeviceProps maps host-facing properties to the rule that explains them.
var hostDeviceProps = map[string]string{
	"chardev": RuleHostChardev, "netdev": RuleHostNetwork, "vlan": RuleHostNetwork,
	"drive": RuleBlockLayer, "drive_id": RuleBlockLayer,
	"fsdev": RuleHostFile, "rootdir": RuleHostFile, "romfile": RuleHostFile, "pcap": RuleHostFile,
	"file": RuleHostFile, "kernel": RuleHostFile, "initrd": RuleHostFile,
	"memdev": RuleHostBackend, "rng": RuleHostBackend, "iothread": RuleHostBackend,
	"host": RuleHostDevice, "hostbus": RuleHostDevice, "hostaddr": RuleHostDevice,
	"hostdevice": RuleHostDevice, "sysfsdev": RuleHostDevice, "evdev": RuleHostDevice,
	"audiodev": RuleHostDevice, "tpmdev": RuleHostDevice, "hidraw": RuleHostDevice,
	"vhostfd": RuleFDPassing, "vhostfds": RuleFDPassing, "fd": RuleFDPassing,
	// An integer, but a port on the host: nvme's SPDM responder socket.
	"spdm_port": RuleHostNetwork,
}

// hostDeviceRule names the rule explaining why a known host-backed device
// model is refused; other models fall back to RuleGuestDevice. A model it
// names is refused also without its backend property (a virtio-blk-device
// without drive=, a NIC without netdev=): such a device exists to reach the
// host, and without its backend it does nothing a guest could use.
func hostDeviceRule(driver string) string {
	switch {
	case driver == "loader" || driver == "guest-loader" || driver == "usb-mtp" ||
		strings.HasPrefix(driver, "virtio-9p") || strings.HasPrefix(driver, "ccid-card-emulated"):
		return RuleHostFile
	case strings.HasPrefix(driver, "vhost-") || strings.HasPrefix(driver, "vfio-") ||
		strings.HasPrefix(driver, "virtio-input-host") || strings.HasPrefix(driver, "tpm-") ||
		driver == "usb-host" || driver == "u2f-passthru" || driver == "usb-audio" ||
		strings.HasPrefix(driver, "hda-") || driver == "AC97" || driver == "ES1370" ||
		driver == "scsi-generic" || driver == "scsi-block" || driver == "pvrdma" ||
		// Sound cards play on a host audio device; GL and rutabaga GPUs
		// render on the host's GPU.
		strings.HasPrefix(driver, "virtio-sound") || strings.HasPrefix(driver, "virtio-snd") ||
		driver == "sb16" || driver == "adlib" || driver == "gus" || driver == "cs4231a" ||
		strings.HasSuffix(driver, "-gl") || strings.Contains(driver, "-gl-") ||
		strings.HasPrefix(driver, "virtio-gpu-rutabaga"):
		return RuleHostDevice
	case driver == "usb-redir" || driver == "usb-serial" || driver == "usb-braille" ||
		driver == "ccid-card-passthru" || driver == "virtconsole" || driver == "virtserialport" ||
		strings.HasPrefix(driver, "pci-serial") || driver == "ivshmem-doorbell" || driver == "serial" ||
		driver == "serial-mm" || driver == "isa-serial" || driver == "ipoctal232":
		return RuleHostChardev
	case strings.HasPrefix(driver, "virtio-net") || strings.HasPrefix(driver, "e1000") ||
		driver == "rtl8139" || driver == "usb-net" || driver == "ne2k_pci" || driver == "pcnet" ||
		driver == "vmxnet3" || driver == "tulip" || driver == "cadence_gem" || driver == "rocker" ||
		strings.HasPrefix(driver, "i8255") || strings.HasPrefix(driver, "i8256") ||
		driver == "i82801" || driver == "igb" || driver == "igbvf":
		return RuleHostNetwork
	case strings.HasPrefix(driver, "virtio-blk") || strings.HasPrefix(driver, "scsi-") ||
		strings.HasPrefix(driver, "ide-") || strings.HasPrefix(driver, "nvme") ||
		driver == "usb-storage" || driver == "usb-bot" || driver == "usb-uas" || driver == "sd-card" ||
		driver == "cfi.pflash01" || driver == "cfi.pflash02" || driver == "floppy" || driver == "ufs-lu":
		return RuleBlockLayer
	case driver == "ivshmem-plain" || driver == "nvdimm" || driver == "pc-dimm" ||
		strings.HasPrefix(driver, "virtio-pmem") || strings.HasPrefix(driver, "virtio-mem"):
		return RuleHostBackend
	}
	return RuleGuestDevice
}

// checkDevice checks device properties as -device, QMP device_add and HMP
// device_add pass them. Every "driver" value must pass: QEMU uses the last
// one, and checking all of them needs no model of which. Host-facing
// properties are refused first, naming their rule (drive= is block-layer
// whatever the model); then each model must be a guest-only model or, with
// the binary's property types, a model of it that hostDeviceRule does not
// name; then every property must be allow-listed or pass by its type.
func checkDevice(props []kv, env *propEnv) *refusal {
	var drivers []string
	for _, p := range props {
		if p.key != "driver" {
			continue
		}
		d, ok := p.value.(string)
		if !ok {
			return refuse(RuleGuestDevice, "driver must be a string, not %v", p.value)
		}
		drivers = append(drivers, d)
	}
	if len(drivers) == 0 {
		return refuse(RuleGuestDevice, "no device model given")
	}
	for _, p := range props {
		if p.key == "driver" {
			continue
		}
		if !isScalar(p.value) {
			return refuse(RuleGuestDevice, "property %q has a %T value; only scalars are allowed", p.key, p.value)
		}
	}
	for _, p := range props {
		if rule, ok := hostDeviceProps[p.key]; ok {
			return hostPropRefusal(env, drivers, p.key, rule)
		}
	}
	for _, d := range drivers {
		if r := checkModel(env, d); r != nil {
			return r
		}
	}
	for _, p := range props {
		if p.key == "driver" || deviceOptions[p.key] {
			continue
		}
		for _, d := range drivers {
			if _, guest := GuestDevices[d]; guest && DeviceProperties[p.key] {
				continue
			}
			t, why := env.types(drivers...)
			if t == nil {
				if _, guest := GuestDevices[d]; !guest {
					continue // refused by checkModel already
				}
				return refuse(RuleGuestDevice, "device property %q is not on the allow-list, and %s", p.key, why)
			}
			if r := checkTyped(t, d, p.key, p.value); r != nil {
				return r
			}
		}
	}
	return nil
}

// checkModel checks one device model.
func checkModel(env *propEnv, d string) *refusal {
	if _, ok := GuestDevices[d]; ok {
		return nil
	}
	if rule := hostDeviceRule(d); rule != RuleGuestDevice {
		return refuse(rule, "device model %q uses %s, with or without its backend property", d, ruleSummary(rule))
	}
	t, why := env.types(d)
	if t == nil {
		return refuse(RuleGuestDevice, "device model %q is not on the list of guest-only models (%s), and %s", d, guestDeviceList(), why)
	}
	if !t.Class(d) {
		return refuse(RuleGuestDevice, "this QEMU has no device model %q", d)
	}
	return nil
}

func guestDeviceList() string {
	return strings.Join(slices.Sorted(maps.Keys(GuestDevices)), ", ")
}

// deviceFromMap turns QMP device_add arguments into properties.
func deviceFromMap(args map[string]any) []kv {
	props := make([]kv, 0, len(args))
	for _, k := range slices.Sorted(maps.Keys(args)) {
		props = append(props, kv{k, args[k]})
	}
	return props
}

func isScalar(v any) bool {
	switch v.(type) {
	case nil, string, bool, json.Number, float64, float32,
		int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return true
	}
	return false
}

// describe formats a value for messages without dumping huge inputs.
func describe(v any) string {
	s := fmt.Sprintf("%q", fmt.Sprint(v))
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
