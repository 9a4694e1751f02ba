package rocelayer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Link types of capture files (tcpdump.org/linktypes.html). They are
// 16 bits in pcapng and 32 in a pcap header, while gopacket's
// layers.LinkType is 8 bits: LINUX_SLL2 (276), what `tcpdump -i any`
// writes, reads there as 20. Capture readers take the link type from the
// file with FileLinkType and the decoder from LinkDecoder.
const (
	LinkTypeNull      = 0   // BSD loopback: 4-byte host-order address family
	LinkTypeEthernet  = 1   // Ethernet II
	LinkTypeRawOld    = 12  // DLT_RAW on some BSDs: raw IPv4 or IPv6
	LinkTypeRawOld2   = 14  // DLT_RAW on others
	LinkTypeRaw       = 101 // raw IPv4 or IPv6
	LinkTypeLoop      = 108 // OpenBSD loopback: 4-byte network-order family
	LinkTypeLinuxSLL  = 113 // Linux cooked capture v1 (tcpdump -y LINUX_SLL)
	LinkTypeIPv4      = 228 // raw IPv4
	LinkTypeIPv6      = 229 // raw IPv6
	LinkTypeLinuxSLL2 = 276 // Linux cooked capture v2 (tcpdump -i any, 4.99)
)

// LinuxSLL2Len is the length of a LINUX_SLL2 header.
const LinuxSLL2Len = 20

// Offsets in a LINUX_SLL2 header (all multi-byte fields big-endian).
const (
	sll2Protocol = 0  // 2: EtherType of the payload
	sll2IfIndex  = 4  // 4: interface index (after 2 reserved bytes)
	sll2ARPHRD   = 8  // 2: ARPHRD_ type of the interface
	sll2PktType  = 10 // 1: PACKET_HOST, PACKET_OUTGOING, ...
	sll2AddrLen  = 11 // 1: length of the link-layer address
	sll2Addr     = 12 // 8: link-layer address, zero padded
)

// layerNumLinuxSLL2 follows the RoCEv2 layer numbers; layerNumFETH came
// later.
const (
	layerNumLinuxSLL2 = layerNumRDETH + 1
	layerNumFETH      = layerNumLinuxSLL2 + 1
)

// LayerTypeLinuxSLL2 is the LINUX_SLL2 pseudo link-layer header (20
// bytes), which gopacket does not decode.
var LayerTypeLinuxSLL2 = gopacket.RegisterLayerType(layerNumLinuxSLL2,
	gopacket.LayerTypeMetadata{Name: "LinuxSLL2", Decoder: gopacket.DecodeFunc(decodeLinuxSLL2)})

// LinuxSLL2 is a LINUX_SLL2 header: what Linux's "any" device puts before
// each packet in place of its link-layer header.
type LinuxSLL2 struct {
	layers.BaseLayer
	// ProtocolType is the EtherType of what follows.
	ProtocolType layers.EthernetType
	// InterfaceIndex is the index of the interface the packet crossed.
	InterfaceIndex uint32
	// ARPHRDType is the interface's hardware type (1: Ethernet, 772: loopback).
	ARPHRDType uint16
	// PacketType says who the packet was for (host, broadcast, multicast,
	// other host, outgoing).
	PacketType layers.LinuxSLLPacketType
	// Addr is the link-layer source address (at most 8 bytes).
	Addr net.HardwareAddr
}

// LayerType returns LayerTypeLinuxSLL2.
func (s *LinuxSLL2) LayerType() gopacket.LayerType { return LayerTypeLinuxSLL2 }

// CanDecode returns LayerTypeLinuxSLL2.
func (s *LinuxSLL2) CanDecode() gopacket.LayerClass { return LayerTypeLinuxSLL2 }

// NextLayerType is the layer of the EtherType in ProtocolType.
func (s *LinuxSLL2) NextLayerType() gopacket.LayerType { return s.ProtocolType.LayerType() }

// ErrShortSLL2 is returned for data shorter than a LINUX_SLL2 header.
var ErrShortSLL2 = errors.New("LINUX_SLL2 header truncated")

// DecodeFromBytes decodes a LINUX_SLL2 header; the address keeps at most
// its 8 bytes whatever its length field says.
func (s *LinuxSLL2) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < LinuxSLL2Len {
		df.SetTruncated()
		return ErrShortSLL2
	}
	s.ProtocolType = layers.EthernetType(binary.BigEndian.Uint16(data[sll2Protocol:]))
	s.InterfaceIndex = binary.BigEndian.Uint32(data[sll2IfIndex:])
	s.ARPHRDType = binary.BigEndian.Uint16(data[sll2ARPHRD:])
	s.PacketType = layers.LinuxSLLPacketType(data[sll2PktType])
	n := int(data[sll2AddrLen])
	if n > 8 {
		n = 8
	}
	s.Addr = net.HardwareAddr(data[sll2Addr : sll2Addr+n])
	s.BaseLayer = layers.BaseLayer{Contents: data[:LinuxSLL2Len], Payload: data[LinuxSLL2Len:]}
	return nil
}

// SerializeTo writes the header (Addr up to 8 bytes) before the payload.
func (s *LinuxSLL2) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(LinuxSLL2Len)
	if err != nil {
		return err
	}
	clear(h)
	binary.BigEndian.PutUint16(h[sll2Protocol:], uint16(s.ProtocolType))
	binary.BigEndian.PutUint32(h[sll2IfIndex:], s.InterfaceIndex)
	binary.BigEndian.PutUint16(h[sll2ARPHRD:], s.ARPHRDType)
	h[sll2PktType] = byte(s.PacketType)
	n := copy(h[sll2Addr:sll2Addr+8], s.Addr)
	h[sll2AddrLen] = byte(n)
	return nil
}

func decodeLinuxSLL2(data []byte, p gopacket.PacketBuilder) error {
	s := &LinuxSLL2{}
	if err := s.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(s)
	p.SetLinkLayer(sll2Link{s})
	return p.NextDecoder(s.NextLayerType())
}

// sll2Link lets gopacket's LinkLayer() return the SLL2 header.
type sll2Link struct{ *LinuxSLL2 }

// LinkFlow is the flow of the source address (the header has no
// destination address).
func (l sll2Link) LinkFlow() gopacket.Flow {
	return gopacket.NewFlow(layers.EndpointMAC, l.Addr, nil)
}

// LinkDecoder returns the gopacket decoder of the frames of a capture with
// the given link type (the full number, as FileLinkType returns it):
// Ethernet, Linux SLL and SLL2, raw IP (101, 12, 14, 228, 229) and the BSD
// loopbacks (0, 108).
func LinkDecoder(linkType uint32) (gopacket.Decoder, error) {
	switch linkType {
	case LinkTypeEthernet:
		return layers.LayerTypeEthernet, nil
	case LinkTypeLinuxSLL:
		return layers.LayerTypeLinuxSLL, nil
	case LinkTypeLinuxSLL2:
		return LayerTypeLinuxSLL2, nil
	case LinkTypeRaw, LinkTypeRawOld, LinkTypeRawOld2:
		return layers.LinkTypeRaw, nil
	case LinkTypeIPv4:
		return layers.LayerTypeIPv4, nil
	case LinkTypeIPv6:
		return layers.LayerTypeIPv6, nil
	case LinkTypeNull, LinkTypeLoop:
		return layers.LayerTypeLoopback, nil
	}
	name := ""
	if linkType < 256 {
		name = " (" + layers.LinkType(linkType).String() + ")"
	}
	return nil, fmt.Errorf("unsupported link type %d%s", linkType, name)
}

// Capture file magic numbers.
const (
	pcapMagicMicro = 0xa1b2c3d4
	pcapMagicNano  = 0xa1b23c4d
	pcapngSHB      = 0x0a0d0d0a
	pcapngIDB      = 1
	pcapngBOM      = 0x1a2b3c4d
)

// ErrNoLinkType is returned by FileLinkType when head does not hold a
// capture file's link type.
var ErrNoLinkType = errors.New("no capture link type in the file's first bytes")

// FileLinkType returns the full link type of a capture file from its first
// bytes: a classic pcap header's (either byte order, micro- or nanosecond
// magic), or the first Interface Description Block's of a pcapng file
// (the block after the Section Header Block; head must reach it).
func FileLinkType(head []byte) (uint32, error) {
	if len(head) < 8 {
		return 0, ErrNoLinkType
	}
	for _, bo := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		switch bo.Uint32(head) {
		case pcapMagicMicro, pcapMagicNano:
			if len(head) < 24 {
				return 0, ErrNoLinkType
			}
			// The upper 16 bits may carry FCS information
			// (pcap-linktype(7)): the link type is the lower 16
			// (libpcap's LT_LINKTYPE).
			return bo.Uint32(head[20:]) & 0xffff, nil
		}
	}
	if binary.LittleEndian.Uint32(head) != pcapngSHB || len(head) < 12 {
		return 0, ErrNoLinkType
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if binary.BigEndian.Uint32(head[8:]) == pcapngBOM {
		bo = binary.BigEndian
	} else if binary.LittleEndian.Uint32(head[8:]) != pcapngBOM {
		return 0, ErrNoLinkType
	}
	off := 0
	for range 16 { // bounded: blocks before the first IDB
		if len(head)-off < 12 {
			return 0, ErrNoLinkType
		}
		typ, n := bo.Uint32(head[off:]), bo.Uint32(head[off+4:])
		if n < 12 || n%4 != 0 || uint64(n) > uint64(len(head)-off) && typ != pcapngIDB {
			return 0, ErrNoLinkType
		}
		if typ == pcapngIDB {
			return uint32(bo.Uint16(head[off+8:])), nil
		}
		off += int(n)
	}
	return 0, ErrNoLinkType
}

// NetworkPacket cuts the network-layer packet out of a frame of a capture
// with the given link type (the full number, see FileLinkType), without
// gopacket: it returns the EtherType of what follows the link-layer header
// (0x0800 IPv4, 0x86dd IPv6; for raw IP and the BSD loopbacks, derived from
// the IP version or address family) and the bytes from the IP header on.
// ok is false for a link type it does not know or a frame too short for
// its header.
func NetworkPacket(linkType uint32, frame []byte) (etherType uint16, pkt []byte, ok bool) {
	family := func(af uint32) uint16 {
		switch af {
		case 2:
			return 0x0800
		case 10, 24, 28, 30: // AF_INET6 on Linux, NetBSD/OpenBSD, FreeBSD, Darwin
			return 0x86dd
		}
		return 0
	}
	switch linkType {
	case LinkTypeEthernet:
		if len(frame) < 14 {
			return 0, nil, false
		}
		return binary.BigEndian.Uint16(frame[12:]), frame[14:], true
	case LinkTypeLinuxSLL:
		if len(frame) < 16 {
			return 0, nil, false
		}
		return binary.BigEndian.Uint16(frame[14:]), frame[16:], true
	case LinkTypeLinuxSLL2:
		if len(frame) < LinuxSLL2Len {
			return 0, nil, false
		}
		return binary.BigEndian.Uint16(frame[sll2Protocol:]), frame[LinuxSLL2Len:], true
	case LinkTypeRaw, LinkTypeRawOld, LinkTypeRawOld2, LinkTypeIPv4, LinkTypeIPv6:
		if len(frame) < 1 {
			return 0, nil, false
		}
		switch frame[0] >> 4 {
		case 4:
			return 0x0800, frame, true
		case 6:
			return 0x86dd, frame, true
		}
		return 0, frame, true
	case LinkTypeNull:
		if len(frame) < 4 {
			return 0, nil, false
		}
		// Host byte order of the capturing machine: either.
		af := binary.LittleEndian.Uint32(frame)
		if af > 0xffff {
			af = binary.BigEndian.Uint32(frame)
		}
		return family(af), frame[4:], true
	case LinkTypeLoop:
		if len(frame) < 4 {
			return 0, nil, false
		}
		return family(binary.BigEndian.Uint32(frame)), frame[4:], true
	}
	return 0, nil, false
}
