package icrc

import (
	"encoding/binary"
	"math/bits"
)

// IPv4Pseudo holds the IPv4 and UDP header fields that the ICRC covers, for a
// caller that has only the UDP payload (a UDP socket). The version, IHL (5),
// protocol (UDP) and the IPv4 total and UDP lengths are implied; TOS, TTL and
// both checksums are masked and need not be known.
type IPv4Pseudo struct {
	// Src and Dst are the IPv4 source and destination addresses.
	Src, Dst [4]byte
	// ID is the IPv4 identification.
	ID uint16
	// FlagsFrag is the IPv4 flags and fragment offset field; 0x4000 = DF.
	FlagsFrag uint16
	// SrcPort and DstPort are the UDP ports (DstPort is 4791 for RoCEv2).
	SrcPort, DstPort uint16
}

// IPv6Pseudo holds the IPv6 and UDP header fields that the ICRC covers, for a
// caller that has only the UDP payload. The version, next header (UDP, no
// extension headers) and the payload and UDP lengths are implied; traffic
// class, flow label, hop limit and the UDP checksum are masked.
type IPv6Pseudo struct {
	// Src and Dst are the IPv6 source and destination addresses.
	Src, Dst [16]byte
	// SrcPort and DstPort are the UDP ports (DstPort is 4791 for RoCEv2).
	SrcPort, DstPort uint16
}

// putUDP writes a UDP header with a masked checksum.
func putUDP(b []byte, sport, dport uint16, length int) {
	binary.BigEndian.PutUint16(b[udpSrcPortOff:], sport)
	binary.BigEndian.PutUint16(b[udpDstPortOff:], dport)
	binary.BigEndian.PutUint16(b[udpLenOff:], uint16(length))
	b[udpSumOff], b[udpSumOff+1] = 0xff, 0xff
}

// computeSynth finishes the ICRC of a synthesized, already masked IP + UDP
// header hdr (a stack buffer, covered with softUpdate) followed by udpPayload,
// which is covered in place with update; the masked BTH byte 4 is folded into
// the start value (see crc.go). A payload shorter than BTH + ICRC is covered as
// far as it goes (it is not a valid RoCEv2 packet, but this never panics).
func computeSynth(hdr []byte, udpPayload []byte) uint32 {
	c := softUpdate(seed, hdr)
	cov := len(udpPayload) - Size
	if cov <= bthMaskOff {
		return softUpdate(c, udpPayload[:max(cov, 0)])
	}
	return update(c^masks[mPayloadBTH4][udpPayload[bthMaskOff]], udpPayload[:cov])
}

// ComputeIPv4 returns the ICRC of a RoCEv2 packet sent over IPv4 with a
// 20-byte header, given its UDP payload (BTH .. ICRC; the last 4 bytes are not
// covered) and the header fields in h. It does not allocate.
func ComputeIPv4(h *IPv4Pseudo, udpPayload []byte) uint32 {
	var pre [ipv4MinSize + udpSize]byte
	pre[0] = 0x45
	pre[ipv4TOSOff] = 0xff
	binary.BigEndian.PutUint16(pre[ipv4TotalLenOff:], uint16(ipv4MinSize+udpSize+len(udpPayload)))
	binary.BigEndian.PutUint16(pre[ipv4IDOff:], h.ID)
	binary.BigEndian.PutUint16(pre[ipv4FlagsOff:], h.FlagsFrag)
	pre[ipv4TTLOff] = 0xff
	pre[ipv4ProtoOff] = protoUDP
	pre[ipv4SumOff], pre[ipv4SumOff+1] = 0xff, 0xff
	copy(pre[ipv4SrcOff:], h.Src[:])
	copy(pre[ipv4DstOff:], h.Dst[:])
	putUDP(pre[ipv4MinSize:], h.SrcPort, h.DstPort, udpSize+len(udpPayload))
	return computeSynth(pre[:], udpPayload)
}

// ComputeIPv6 returns the ICRC of a RoCEv2 packet sent over IPv6 without
// extension headers, given its UDP payload (BTH .. ICRC; the last 4 bytes are
// not covered) and the header fields in h. It does not allocate.
func ComputeIPv6(h *IPv6Pseudo, udpPayload []byte) uint32 {
	var pre [ipv6Size + udpSize]byte
	pre[0], pre[1], pre[2], pre[3] = 0x6f, 0xff, 0xff, 0xff
	binary.BigEndian.PutUint16(pre[ipv6PayloadLenOff:], uint16(udpSize+len(udpPayload)))
	pre[ipv6NextHdrOff] = protoUDP
	pre[ipv6HopLimitOff] = 0xff
	copy(pre[ipv6SrcOff:], h.Src[:])
	copy(pre[ipv6DstOff:], h.Dst[:])
	putUDP(pre[ipv6Size:], h.SrcPort, h.DstPort, udpSize+len(udpPayload))
	return computeSynth(pre[:], udpPayload)
}

// SolveIPv4ID returns the IPv4 identification that makes the ICRC stored in
// udpPayload (BTH .. ICRC) valid for the other fields in h (h.ID is ignored),
// and ok=false if no identification does. A receiver on a UDP socket does not
// see the identification, so this is how it verifies IPv4 packets; the check
// is then 16 bits strong (a corrupted packet passes with probability about
// 2^-16). ok is false for a payload shorter than BTH + ICRC. It does not
// allocate.
//
// The CRC is affine in the 16 identification bits: with c0 the ICRC for ID 0,
// stored^c0 = id(x)*v mod P, where v = x^(8n-16) is the effect of the last
// identification bit on a packet whose covered part is n bytes long, and
// id(x) is the identification as a polynomial of degree < 16 (one CRC bit
// step, a multiplication by x, per bit position). So id(x) = (stored^c0) *
// v^-1 mod P; a solution exists exactly when the product has degree < 16. The
// inverse is cached per length, so this costs one CRC over the packet plus one
// 32x32-bit multiplication modulo P.
func SolveIPv4ID(h *IPv4Pseudo, udpPayload []byte) (id uint16, ok bool) {
	if len(udpPayload) < bthSize+Size {
		return 0, false
	}
	h0 := *h
	h0.ID = 0
	delta := ComputeIPv4(&h0, udpPayload) ^ Load(udpPayload)
	n := ipv4MinSize + udpSize + len(udpPayload) - Size
	c := multModP(delta, idInverse(n))
	// The coefficient of x^k sits in bit 31-k. ID bit 7 (the last one the CRC
	// sees) is x^0, ID bit 0 is x^7, ID bit 15 is x^8 and ID bit 8 is x^15, so
	// bits 31..24 hold the low byte, bits 23..16 the high byte, and the bits
	// for x^16 and above must be clear.
	if c&0xffff != 0 {
		return 0, false
	}
	return bits.ReverseBytes16(uint16(c >> 16)), true
}
