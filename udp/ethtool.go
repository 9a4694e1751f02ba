package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// DeviceOffload is what a network device says about UDP segmentation: its
// ethtool feature "tx-udp-segmentation" (read over ethtool's generic
// netlink family, ETHTOOL_MSG_FEATURES_GET) and whether it is a virtual
// device (no parent bus device: lo, veth, bridge, ifb, ...; read over
// rtnetlink, IFLA_PARENT_DEV_NAME). See DeviceOffloadOf.
type DeviceOffload struct {
	Name  string // interface name
	Index int    // interface index
	// Virtual is true when the device has no parent (bus) device.
	Virtual bool
	// TxUDPSegmentation is true when "tx-udp-segmentation" is active: the
	// device takes UDP GSO datagrams whole. Virtual devices (lo, veth)
	// report it active and pass the datagram on unsegmented (the receiving
	// socket or GRO handles it); a NIC reporting it cuts the segments in
	// hardware (USO). A device without it gets segments the kernel cut in
	// software.
	TxUDPSegmentation bool
}

// HardwareSegmentation reports whether a NIC cuts UDP GSO datagrams into
// segments itself: "tx-udp-segmentation" is active on a device that is not
// virtual. On such a path the NIC numbers the segments' IPv4
// identifications, which the ICRC covers, its own way; everywhere else the
// kernel cuts them (or never needs to) and numbers them 0, 1, 2, ...
func (o DeviceOffload) HardwareSegmentation() bool { return o.TxUDPSegmentation && !o.Virtual }

// GSODefault is the rule SocketOptions.GSOAuto applies: GSO on unless the
// device segments UDP in hardware.
func (o DeviceOffload) GSODefault() bool { return !o.HardwareSegmentation() }

// String describes the device and the rule's outcome, e.g.
// "lo (virtual, tx-udp-segmentation on): software segmentation".
func (o DeviceOffload) String() string {
	kind := "physical"
	if o.Virtual {
		kind = "virtual"
	}
	seg := "off"
	if o.TxUDPSegmentation {
		seg = "on"
	}
	where := "software segmentation"
	if o.HardwareSegmentation() {
		where = "hardware segmentation"
	}
	return fmt.Sprintf("%s (%s, tx-udp-segmentation %s): %s", o.Name, kind, seg, where)
}

// The netlink message and attribute parsing below is platform independent
// (and fuzzed everywhere); only the socket that carries it is Linux's.

// errNetlink marks malformed netlink input.
var errNetlink = errors.New("udp: malformed netlink message")

// nlAttr is one netlink attribute: its type (without the NLA_F_NESTED and
// NLA_F_NET_BYTEORDER bits) and its value.
type nlAttr struct {
	typ uint16
	val []byte
}

const (
	nlaHdrLen     = 4
	nlaTypeMask   = 0x3fff // ^(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
	nlmsgHdrLen   = 16
	genlHdrLen    = 4
	nlmsgError    = 0x2
	nlmsgDone     = 0x3
	nlmFMulti     = 0x2
	ifinfomsgSize = 16
)

func nlAlign(n int) int { return (n + 3) &^ 3 }

// parseAttrs splits b into netlink attributes. An attribute whose length
// field is shorter than its header or runs past b is an error; the
// padding after the last one may be missing.
func parseAttrs(b []byte) ([]nlAttr, error) {
	var as []nlAttr
	for len(b) > 0 {
		if len(b) < nlaHdrLen {
			return nil, fmt.Errorf("%w: %d trailing bytes", errNetlink, len(b))
		}
		n := int(binary.NativeEndian.Uint16(b))
		if n < nlaHdrLen || n > len(b) {
			return nil, fmt.Errorf("%w: attribute length %d of %d bytes", errNetlink, n, len(b))
		}
		as = append(as, nlAttr{typ: binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask, val: b[nlaHdrLen:n]})
		b = b[min(nlAlign(n), len(b)):]
	}
	return as, nil
}

// attr returns the value of the first attribute of type typ.
func attr(as []nlAttr, typ uint16) ([]byte, bool) {
	for _, a := range as {
		if a.typ == typ {
			return a.val, true
		}
	}
	return nil, false
}

// putAttr appends a netlink attribute to b.
func putAttr(b []byte, typ uint16, val []byte) []byte {
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[:], uint16(nlaHdrLen+len(val)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b = append(append(b, h[:]...), val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u32Bytes(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// nlString returns a NUL-terminated string attribute's value.
func nlString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// nlMessage is one netlink message: its type, flags and payload.
type nlMessage struct {
	typ, flags uint16
	seq        uint32
	data       []byte
}

// parseMessages splits a netlink datagram into messages.
func parseMessages(b []byte) ([]nlMessage, error) {
	var ms []nlMessage
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return nil, fmt.Errorf("%w: %d trailing bytes", errNetlink, len(b))
		}
		n := int(binary.NativeEndian.Uint32(b))
		if n < nlmsgHdrLen || n > len(b) {
			return nil, fmt.Errorf("%w: message length %d of %d bytes", errNetlink, n, len(b))
		}
		ms = append(ms, nlMessage{typ: binary.NativeEndian.Uint16(b[4:]), flags: binary.NativeEndian.Uint16(b[6:]),
			seq: binary.NativeEndian.Uint32(b[8:]), data: b[nlmsgHdrLen:n]})
		b = b[min(nlAlign(n), len(b)):]
	}
	return ms, nil
}

// nlErrno returns the error code of an NLMSG_ERROR payload (0: an ACK).
func nlErrno(data []byte) (int32, error) {
	if len(data) < 4 {
		return 0, fmt.Errorf("%w: NLMSG_ERROR of %d bytes", errNetlink, len(data))
	}
	return int32(binary.NativeEndian.Uint32(data)), nil
}

// ethtool generic netlink numbers (include/uapi/linux/ethtool_netlink.h).
const (
	ethtoolFeaturesActive = 4 // ETHTOOL_A_FEATURES_ACTIVE
	ethtoolBitsetNoMask   = 1 // ETHTOOL_A_BITSET_NOMASK
	ethtoolBitsetSize     = 2 // ETHTOOL_A_BITSET_SIZE
	ethtoolBitsetBits     = 3 // ETHTOOL_A_BITSET_BITS
	ethtoolBitsetValue    = 4 // ETHTOOL_A_BITSET_VALUE (compact form)
	ethtoolBitsBit        = 1 // ETHTOOL_A_BITSET_BITS_BIT
	ethtoolBitIndex       = 1 // ETHTOOL_A_BITSET_BIT_INDEX
	ethtoolBitName        = 2 // ETHTOOL_A_BITSET_BIT_NAME
	ethtoolBitValue       = 3 // ETHTOOL_A_BITSET_BIT_VALUE
)

// featureActive finds the feature called name in the attributes of an
// ETHTOOL_MSG_FEATURES_GET_REPLY (after the generic netlink header) and
// reports whether it is active. The reply's bitsets must be in the verbose
// form (bits with names), which is what a request without
// ETHTOOL_FLAG_COMPACT_BITSETS gets. In a bitset with NOMASK the bits
// listed are the set ones; otherwise a bit is set when it carries
// ETHTOOL_A_BITSET_BIT_VALUE. found is false when the device has no such
// feature.
func featureActive(reply []byte, name string) (active, found bool, err error) {
	as, err := parseAttrs(reply)
	if err != nil {
		return false, false, err
	}
	set, ok := attr(as, ethtoolFeaturesActive)
	if !ok {
		return false, false, fmt.Errorf("%w: no ETHTOOL_A_FEATURES_ACTIVE", errNetlink)
	}
	bs, err := parseAttrs(set)
	if err != nil {
		return false, false, err
	}
	_, noMask := attr(bs, ethtoolBitsetNoMask)
	bits, ok := attr(bs, ethtoolBitsetBits)
	if !ok {
		if _, compact := attr(bs, ethtoolBitsetValue); compact {
			return false, false, fmt.Errorf("%w: compact bitset, names needed", errNetlink)
		}
		// A verbose bitset with no bit set at all.
		if _, ok := attr(bs, ethtoolBitsetSize); ok && noMask {
			return false, false, nil
		}
		return false, false, fmt.Errorf("%w: bitset without bits", errNetlink)
	}
	list, err := parseAttrs(bits)
	if err != nil {
		return false, false, err
	}
	for _, b := range list {
		if b.typ != ethtoolBitsBit {
			continue
		}
		fs, err := parseAttrs(b.val)
		if err != nil {
			return false, false, err
		}
		n, ok := attr(fs, ethtoolBitName)
		if !ok || nlString(n) != name {
			continue
		}
		_, val := attr(fs, ethtoolBitValue)
		return noMask || val, true, nil
	}
	return false, false, nil
}
