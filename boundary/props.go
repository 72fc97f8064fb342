package boundary

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// PropertyTypes is what one QEMU binary says its device classes and their
// properties are (QMP device-list-properties and qom-list-properties) and
// which values its enumerations have (query-qmp-schema). It answers for the
// classes its PropertySource was asked about.
type PropertyTypes interface {
	// Class reports whether name is a device class of the binary,
	// concrete or abstract.
	Class(name string) bool
	// Type is the type QEMU gives property prop of class ("bool",
	// "uint32", "size", "OnOffAuto", "str", "link<iothread>"...) and its
	// description ("" if none); ok is false when class has no such
	// property.
	Type(class, prop string) (typ, desc string, ok bool)
	// EnumValue reports whether v is a value of one of the enumerations of
	// the binary's QMP schema.
	EnumValue(v string) bool
}

// PropertySource gives the PropertyTypes of the QEMU binary the server
// boots, asking the binary about the named classes when they are not known
// yet (once per binary and class: see qemu/caps). An error means they
// could not be learnt; the checks then apply the fixed allow-lists only.
type PropertySource interface {
	PropertyTypes(ctx context.Context, classes ...string) (PropertyTypes, error)
}

// StringProperties are the device properties that pass although QEMU types
// them as strings (or, for a PCI address, as an integer with its own
// syntax): a PCI slot.function, a USB port path, a disk's or a USB
// device's serial number. No other string passes by its type: QEMU types
// drive=, netdev=, chardev=, romfile= and a loader's file= as "str" too.
var StringProperties = map[string]bool{"addr": true, "port": true, "serial": true}

// deviceOptions are -device and device_add keys that are no properties:
// the device's QOM id and the guest bus it plugs into.
var deviceOptions = map[string]bool{"id": true, "bus": true}

// qomInternal are QOM properties every device has that -global and
// -device must not set: the object's type and its realization state.
var qomInternal = map[string]bool{"type": true, "realized": true, "hotplugged": true, "hotpluggable": true, "parent_bus": true}

// intTypes are QEMU's integer property types: width and signedness.
var intTypes = map[string]struct {
	bits   int
	signed bool
}{
	"int8": {8, true}, "int16": {16, true}, "int32": {32, true}, "int64": {64, true}, "int": {64, true},
	"uint8": {8, false}, "uint16": {16, false}, "uint32": {32, false}, "uint64": {64, false},
}

// EnumTypes are the property types (QAPI enumerations) of QEMU 7.2 to 11.1
// devices whose values are names from a fixed list: OnOffAuto and the like.
// A type that is not listed here, not bool, not an integer and not size
// is refused, whatever QEMU calls it: a QAPI struct such as SocketAddress
// looks the same in device-list-properties.
var EnumTypes = map[string]bool{
	"OnOffAuto": true, "OnOffSplit": true, "OffAutoPCIBAR": true, "BlockdevOnError": true,
	"BiosAtaTranslation": true, "PCIELinkSpeed": true, "PCIELinkWidth": true, "MultiFDCompression": true,
	"MigMode": true, "ZeroPageDetection": true, "GranuleMode": true, "SpdmTransportType": true,
	"LostTickPolicy": true, "FdcDriveType": true, "EndianMode": true,
}

// plainType reports whether typ is one of the types whose values never
// name a host resource.
func plainType(typ string) bool {
	_, isInt := intTypes[typ]
	return isInt || typ == "bool" || typ == "size" || EnumTypes[typ]
}

// propEnv is what a check may learn about the QEMU binary's properties.
type propEnv struct {
	ctx context.Context
	src PropertySource
	// failed is why the types could not be learnt in this check: not
	// asked again.
	failed string
	// own are the commands of the guest's board (Policy.Arch).
	own []string
}

// owns says whether command reads a device of the guest's own board.
func (e *propEnv) owns(command string) bool { return e != nil && slices.Contains(e.own, command) }

func newPropEnv(ctx context.Context, src PropertySource) *propEnv {
	if ctx == nil {
		ctx = context.Background()
	}
	return &propEnv{ctx: ctx, src: src}
}

// types returns the property types for classes, or why they are not known.
func (e *propEnv) types(classes ...string) (PropertyTypes, string) {
	switch {
	case e == nil || e.src == nil:
		return nil, "this QEMU's property types were not probed"
	case e.failed != "":
		return nil, e.failed
	}
	t, err := e.src.PropertyTypes(e.ctx, classes...)
	if err != nil {
		e.failed = "this QEMU's property types could not be probed (" + err.Error() + ")"
		return nil, e.failed
	}
	return t, ""
}

// typeDesc describes a property type for messages.
func typeDesc(typ string) string {
	switch {
	case typ == "str" || typ == "string":
		return "a string (" + typ + ")"
	case strings.HasPrefix(typ, "link<"):
		return "a link to another object (" + typ + ")"
	case strings.HasPrefix(typ, "child<"):
		return "a child object (" + typ + ")"
	case typ == "":
		return "of a type QEMU does not name"
	case typ == "bool", typ == "size", intTypes[typ].bits != 0:
		return "a " + typ
	case EnumTypes[typ]:
		return "an enumeration (" + typ + ")"
	}
	return "of type " + typ
}

const plainTypesHint = "only booleans, integers, sizes and enumerations pass by their type, and of the strings only " +
	"addr, port and serial (a string may name a host file, socket or backend)"

// hostPropRefusal refuses a host-facing property (hostDeviceProps) of one
// of classes, naming its type when the binary's types are known.
func hostPropRefusal(env *propEnv, classes []string, prop, rule string) *refusal {
	what := fmt.Sprintf("property %s of %s", prop, strings.Join(classes, "/"))
	if t, _ := env.types(classes...); t != nil {
		for _, c := range classes {
			if typ, _, ok := t.Type(c, prop); ok {
				return refuse(rule, "%s is %s and may name %s", what, typeDesc(typ), ruleSummary(rule))
			}
		}
	}
	return refuse(rule, "%s may name %s", what, ruleSummary(rule))
}

// checkTyped checks property prop=value of class by its type in t: a
// plain type with a value of that type, or an allow-listed string.
func checkTyped(t PropertyTypes, class, prop string, value any) *refusal {
	typ, desc, ok := t.Type(class, prop)
	if !ok || qomInternal[prop] {
		return refuse(RuleGuestDevice, "%s has no property %q in this QEMU", class, prop)
	}
	if StringProperties[prop] && (typ == "str" || plainType(typ)) {
		return nil
	}
	if !plainType(typ) {
		return refuse(RuleGuestDevice, "property %s of %s is %s; %s", prop, class, typeDesc(typ), plainTypesHint)
	}
	if why := checkValue(t, typ, desc, value); why != "" {
		return refuse(RuleGuestDevice, "property %s of %s (%s): %s", prop, class, typ, why)
	}
	return nil
}

var (
	decimalRe = regexp.MustCompile(`^[0-9]+$`)
	hexRe     = regexp.MustCompile(`^0[xX][0-9a-fA-F]+$`)
	sizeRe    = regexp.MustCompile(`^(?:[0-9]+(?:\.[0-9]+)?[BKMGTPEbkmgtpe]?|0[xX][0-9a-fA-F]+)$`)
	enumRe    = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)
	// enumListRe finds a list of values in a property's description:
	// "on/off/auto", "Error handling policy, report/ignore/enospc/stop/auto".
	enumListRe = regexp.MustCompile(`[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)+`)
)

// checkValue says why value is not one of type typ, "" if it is. Values
// from option strings are strings; QMP and JSON give booleans and numbers
// too.
func checkValue(t PropertyTypes, typ, desc string, value any) string {
	s, isString := value.(string)
	_, isBool := value.(bool)
	if value == nil {
		return "null is no value of it"
	}
	switch {
	case typ == "bool":
		if isBool {
			return ""
		}
		switch s {
		case "on", "off", "yes", "no", "true", "false":
			return ""
		}
		return fmt.Sprintf("%s is not on, off, yes, no, true or false", describe(value))
	case intTypes[typ].bits != 0:
		if isBool {
			return fmt.Sprintf("%s is not an integer", describe(value))
		}
		if !isString {
			s = numberString(value)
		}
		it := intTypes[typ]
		digits, neg := s, false
		if it.signed && digits != "" && (digits[0] == '-' || digits[0] == '+') {
			neg, digits = digits[0] == '-', digits[1:]
		}
		base := 10
		switch {
		case hexRe.MatchString(digits):
			base, digits = 16, digits[2:]
		case !decimalRe.MatchString(digits):
			return fmt.Sprintf("%s is not a decimal or 0x hexadecimal integer", describe(value))
		}
		if neg {
			digits = "-" + digits
		}
		var err error
		if it.signed {
			_, err = strconv.ParseInt(digits, base, it.bits)
		} else {
			_, err = strconv.ParseUint(digits, base, it.bits)
		}
		if err != nil {
			return fmt.Sprintf("%s is out of the range of a %s", describe(value), typ)
		}
		return ""
	case typ == "size":
		if isBool {
			return fmt.Sprintf("%s is not a size", describe(value))
		}
		if !isString {
			s = numberString(value)
		}
		if !sizeRe.MatchString(s) {
			return fmt.Sprintf("%s is not a size (a number with an optional K, M, G, T suffix)", describe(value))
		}
		return ""
	case EnumTypes[typ]:
		if !isString || !enumRe.MatchString(s) || !t.EnumValue(s) {
			return fmt.Sprintf("%s is not a value of any of this QEMU's enumerations", describe(value))
		}
		if list := enumList(t, desc); list != nil && !list[s] {
			return fmt.Sprintf("%s is not one of %s", describe(value), strings.Join(slices.Sorted(maps.Keys(list)), ", "))
		}
		return ""
	}
	return "not a plain type" // unreachable: plainType(typ) was checked
}

// enumList is the list of values a description gives ("on/off/auto"),
// nil if it gives none that are values of the schema's enumerations.
func enumList(t PropertyTypes, desc string) map[string]bool {
	m := enumListRe.FindString(desc)
	if m == "" {
		return nil
	}
	list := make(map[string]bool)
	known := false
	for _, v := range strings.Split(m, "/") {
		list[v] = true
		known = known || t.EnumValue(v)
	}
	if !known {
		return nil
	}
	return list
}

// numberString is the decimal form of a JSON or Go number; "" for other
// values, which then fail the checks.
func numberString(v any) string {
	switch n := v.(type) {
	case float64:
		return strconv.FormatFloat(n, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(n), 'f', -1, 32)
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(n)
	case fmt.Stringer: // json.Number
		return n.String()
	}
	return ""
}

// parseGlobal splits a -global argument as QEMU's qemu_global_option
// does: first sscanf(str, "%63[^.=].%63[^=]%n") followed by "=" (the value
// is then the rest, commas and all), otherwise QemuOpts with the keys
// driver, property and value (the last of each counts).
func parseGlobal(s string) (driver, prop, value string, r *refusal) {
	i := 0
	for i < len(s) && i < 63 && s[i] != '.' && s[i] != '=' {
		i++
	}
	if i > 0 && i < len(s) && s[i] == '.' {
		j := i + 1
		k := j
		for k < len(s) && k-j < 63 && s[k] != '=' {
			k++
		}
		if k > j && k < len(s) && s[k] == '=' {
			return s[:i], s[j:k], s[k+1:], nil
		}
	}
	var have [3]bool
	for _, p := range parseOpts(s, "") {
		v, _ := p.value.(string)
		switch p.key {
		case "driver":
			driver, have[0] = v, true
		case "property":
			prop, have[1] = v, true
		case "value":
			value, have[2] = v, true
		case "id":
		default:
			return "", "", "", refuse(RuleSyntax, "-global takes DRIVER.PROPERTY=VALUE or driver=,property=,value=; %q is none of them", p.key)
		}
	}
	if !have[0] || !have[1] || !have[2] {
		return "", "", "", refuse(RuleSyntax, "-global needs DRIVER.PROPERTY=VALUE or all of driver=, property= and value=")
	}
	return driver, prop, value, nil
}

// checkGlobal checks -global driver.prop=value: driver must be a device
// class of this QEMU (a -global applies to its subclasses too, where the
// property has the same type) and prop pass by its type.
func checkGlobal(env *propEnv, value string) *refusal {
	driver, prop, val, r := parseGlobal(value)
	if r != nil {
		return r
	}
	if rule, ok := hostDeviceProps[prop]; ok {
		return hostPropRefusal(env, []string{driver}, prop, rule)
	}
	t, why := env.types(driver)
	if t == nil {
		return refuse(RuleGuestDevice, "-global sets property %s of %s, which passes only by its type, and %s", prop, driver, why)
	}
	if !t.Class(driver) {
		return refuse(RuleGuestDevice, "this QEMU has no device class %q", driver)
	}
	if qomInternal[prop] {
		return refuse(RuleGuestDevice, "%s is QOM's own state of every object (its type, realization, bus), not a device setting", prop)
	}
	if _, _, ok := t.Type(driver, prop); !ok {
		return refuse(RuleGuestDevice, "%s has no property %q in this QEMU: QEMU applies -global to the subclasses too, "+
			"but the property is checked on the class named, so name a class that has it (such as virtio-blk-pci rather than virtio-pci)", driver, prop)
	}
	return checkTyped(t, driver, prop, val)
}

// extraArgClasses are the device classes -device and -global arguments
// name, so that a check asks QEMU about all of them at once. It reads
// the arguments loosely: the checks read them again exactly.
func extraArgClasses(args []string) []string {
	seen := map[string]bool{}
	for i := 0; i < len(args); i++ {
		name, value, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if name != "device" && name != "global" {
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				break
			}
			i++
			value = args[i]
		}
		if name == "global" {
			if d, _, _, r := parseGlobal(value); r == nil {
				seen[d] = true
			}
			continue
		}
		props, _ := parseDevice(value)
		// A guest-only model with allow-listed properties needs no types.
		fixed := true
		for _, p := range props {
			if d, ok := p.value.(string); ok && p.key == "driver" {
				_, guest := GuestDevices[d]
				fixed = fixed && guest
			} else if !deviceOptions[p.key] && !DeviceProperties[p.key] {
				fixed = false
			}
		}
		for _, p := range props {
			if d, ok := p.value.(string); ok && p.key == "driver" && !fixed {
				seen[d] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
