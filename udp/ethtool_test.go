package udp

import (
	"encoding/binary"
	"errors"
	"testing"
)

// bitsetBit builds one ETHTOOL_A_BITSET_BITS_BIT nest.
func bitsetBit(index uint32, name string, value bool) []byte {
	b := putAttr(nil, ethtoolBitIndex, u32Bytes(index))
	b = putAttr(b, ethtoolBitName, append([]byte(name), 0))
	if value {
		b = putAttr(b, ethtoolBitValue, nil)
	}
	return putAttr(nil, ethtoolBitsBit|0x8000, b)
}

// featuresReply builds the attributes of an ETHTOOL_MSG_FEATURES_GET_REPLY
// whose ACTIVE bitset holds bits (already built nests), with NOMASK when
// noMask.
func featuresReply(noMask bool, bits ...[]byte) []byte {
	var set []byte
	if noMask {
		set = putAttr(set, ethtoolBitsetNoMask, nil)
	}
	set = putAttr(set, ethtoolBitsetSize, u32Bytes(64))
	var list []byte
	for _, b := range bits {
		list = append(list, b...)
	}
	set = putAttr(set, ethtoolBitsetBits|0x8000, list)
	// A HW bitset first, so that the parser must pick ACTIVE.
	hw := putAttr(nil, ethtoolBitsetBits|0x8000, bitsetBit(5, "tx-udp-segmentation", true))
	r := putAttr(nil, 2|0x8000, hw)
	return putAttr(r, ethtoolFeaturesActive|0x8000, set)
}

func TestFeatureActive(t *testing.T) {
	const name = "tx-udp-segmentation"
	compact := putAttr(nil, ethtoolFeaturesActive|0x8000, putAttr(putAttr(nil, ethtoolBitsetSize, u32Bytes(64)), ethtoolBitsetValue, make([]byte, 8)))
	truncated := featuresReply(true, bitsetBit(61, name, false))
	truncated = truncated[:len(truncated)-3]
	badLen := featuresReply(true)
	binary.NativeEndian.PutUint16(badLen, 2) // shorter than an attribute header
	for _, c := range []struct {
		name          string
		reply         []byte
		active, found bool
		err           bool
	}{
		{name: "list, listed", reply: featuresReply(true, bitsetBit(3, "rx-gro", false), bitsetBit(61, name, false)), active: true, found: true},
		{name: "list, not listed", reply: featuresReply(true, bitsetBit(3, "rx-gro", false))},
		{name: "list, empty", reply: featuresReply(true)},
		{name: "mask, value set", reply: featuresReply(false, bitsetBit(61, name, true)), active: true, found: true},
		{name: "mask, value clear", reply: featuresReply(false, bitsetBit(61, name, false)), found: true},
		{name: "prefix name is another feature", reply: featuresReply(true, bitsetBit(61, name+"-x", false))},
		{name: "no active bitset", reply: putAttr(nil, 2|0x8000, nil), err: true},
		{name: "compact bitset", reply: compact, err: true},
		{name: "truncated", reply: truncated, err: true},
		{name: "bad attribute length", reply: badLen, err: true},
		{name: "empty", reply: nil, err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			active, found, err := featureActive(c.reply, name)
			if (err != nil) != c.err {
				t.Fatalf("err %v, want error %v", err, c.err)
			}
			if err != nil && !errors.Is(err, errNetlink) {
				t.Errorf("err %v does not match errNetlink", err)
			}
			if active != c.active || found != c.found {
				t.Errorf("active %v found %v, want %v %v", active, found, c.active, c.found)
			}
		})
	}
}

func TestParseMessages(t *testing.T) {
	msg := func(typ, flags uint16, seq uint32, data []byte) []byte {
		b := make([]byte, nlmsgHdrLen, nlmsgHdrLen+len(data)+3)
		binary.NativeEndian.PutUint32(b, uint32(nlmsgHdrLen+len(data)))
		binary.NativeEndian.PutUint16(b[4:], typ)
		binary.NativeEndian.PutUint16(b[6:], flags)
		binary.NativeEndian.PutUint32(b[8:], seq)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	two := append(msg(20, nlmFMulti, 7, []byte{1, 2, 3}), msg(nlmsgDone, nlmFMulti, 7, []byte{0, 0, 0, 0})...)
	ms, err := parseMessages(two)
	if err != nil || len(ms) != 2 {
		t.Fatalf("%d messages, %v", len(ms), err)
	}
	if ms[0].typ != 20 || ms[0].seq != 7 || string(ms[0].data) != "\x01\x02\x03" || ms[1].typ != nlmsgDone {
		t.Errorf("parsed %+v", ms)
	}
	errMsg := msg(nlmsgError, 0, 1, binary.NativeEndian.AppendUint32(nil, uint32(0xffffffed))) // -19 ENODEV
	ms, err = parseMessages(errMsg)
	if err != nil || len(ms) != 1 {
		t.Fatalf("%d messages, %v", len(ms), err)
	}
	if code, err := nlErrno(ms[0].data); err != nil || code != -19 {
		t.Errorf("errno %d, %v; want -19", code, err)
	}
	for _, bad := range [][]byte{two[:10], two[:nlmsgHdrLen+1], {0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := parseMessages(bad); !errors.Is(err, errNetlink) {
			t.Errorf("parseMessages(% x) = %v, want errNetlink", bad, err)
		}
	}
	if _, err := nlErrno([]byte{1}); !errors.Is(err, errNetlink) {
		t.Errorf("short NLMSG_ERROR: %v", err)
	}
}

func TestDeviceOffloadRule(t *testing.T) {
	for _, c := range []struct {
		o    DeviceOffload
		hw   bool
		desc string
	}{
		{DeviceOffload{Name: "lo", Virtual: true, TxUDPSegmentation: true}, false, "lo (virtual, tx-udp-segmentation on): software segmentation"},
		{DeviceOffload{Name: "veth0", Virtual: true, TxUDPSegmentation: true}, false, "veth0 (virtual, tx-udp-segmentation on): software segmentation"},
		{DeviceOffload{Name: "eth0", TxUDPSegmentation: false}, false, "eth0 (physical, tx-udp-segmentation off): software segmentation"},
		{DeviceOffload{Name: "ens1f0", TxUDPSegmentation: true}, true, "ens1f0 (physical, tx-udp-segmentation on): hardware segmentation"},
	} {
		if c.o.HardwareSegmentation() != c.hw || c.o.GSODefault() == c.hw || c.o.String() != c.desc {
			t.Errorf("%+v: hardware %v GSO default %v %q, want hardware %v %q", c.o, c.o.HardwareSegmentation(), c.o.GSODefault(), c.o.String(), c.hw, c.desc)
		}
	}
}

// FuzzFeatureActive feeds arbitrary bytes to the FEATURES_GET reply parser
// (and the message and attribute parsers under it): it must never panic,
// and a feature found must have come from a well-formed reply.
func FuzzFeatureActive(f *testing.F) {
	f.Add(featuresReply(true, bitsetBit(61, "tx-udp-segmentation", false)))
	f.Add(featuresReply(false, bitsetBit(61, "tx-udp-segmentation", true)))
	f.Add([]byte{4, 0, 4, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		active, found, err := featureActive(b, "tx-udp-segmentation")
		if err != nil && (active || found) {
			t.Fatalf("error %v with active %v found %v", err, active, found)
		}
		if active && !found {
			t.Fatal("active but not found")
		}
		ms, err := parseMessages(b)
		if err == nil {
			total := 0
			for _, m := range ms {
				total += nlmsgHdrLen + len(m.data)
			}
			if total > len(b) {
				t.Fatalf("messages cover %d of %d bytes", total, len(b))
			}
		}
	})
}
