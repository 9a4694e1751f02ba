// Package icrc computes and verifies the RoCEv2 Invariant CRC (ICRC).
//
// The ICRC is CRC-32/IEEE (hash/crc32's IEEE, the same as zlib) over:
//
//   - 8 bytes of 0xff, standing for the masked InfiniBand LRH;
//   - the IP header, with the IPv4 TOS, TTL and header checksum, or the IPv6
//     traffic class, flow label and hop limit, set to all ones;
//   - the UDP header with its checksum set to all ones;
//   - the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//   - everything after the BTH up to, not including, the ICRC (extension
//     headers, payload and pad).
//
// The result is stored little-endian in the last 4 bytes of the packet. Fields
// that are not masked (IPv4 total length, identification, flags, protocol,
// addresses; IPv6 payload length, next header, addresses; UDP ports and
// length) are covered.
//
// Compute, Verify and Put take a whole IP packet. ComputeIPv4, ComputeIPv6 and
// SolveIPv4ID serve paths such as plain UDP sockets that see only the UDP
// payload: the caller supplies the IP and UDP fields it knows. On such a path
// the receiver does not learn the IPv4 identification; SolveIPv4ID recovers the
// one value that makes the ICRC valid, if any, which leaves a 16-bit check.
//
// IPv4 options (IHL > 5) are accepted and covered as they are (only TOS, TTL
// and header checksum are masked). Linux rdma_rxe assumes a 20-byte IPv4
// header, so it will not agree on such packets; they take a slower path here.
// IPv6 extension headers are rejected (ErrNotUDP): the next header must be
// UDP. IPv4 fragments are rejected (ErrFragment).
//
// Nothing in this package allocates on success. Compute, Verify and Put run
// the CRC once over exactly the bytes of the packet, in place: the masked
// fields are accounted for by folding precomputed corrections into the CRC's
// start value, so the caller's buffer is never modified or copied. On amd64
// the CRC runs the package's own kernels: where the CPU has AVX-512
// VPCLMULQDQ, a folding kernel with four 512-bit accumulators for 256 bytes
// and more (fold_amd64.s); and from 24 bytes on, where hash/crc32 would end
// in table lookups (lengths below 128 or not a multiple of 16, and the
// folding kernel's tail), one PCLMULQDQ lane without tables (small_amd64.s).
// Otherwise (other architectures, -tags purego, other lengths) it is
// hash/crc32's hardware-accelerated Update over the longest multiple of 16
// bytes plus slicing-by-16 table lookups for the rest.
//
// Prefix.Compute has a path of its own for the short packets of a
// message-rate workload (16 to 23 covered UDP payload bytes on amd64, 16
// to 31 elsewhere: ACKs, SENDs of a few bytes): both length fields of the
// pseudo-header in one lookup, then, where PCLMULQDQ runs, one carry-less
// fold with the masked BTH byte applied in the kernel (clmulShort in
// small_amd64.s), or otherwise one slicing-by-16 step and independent
// lookups for the rest.
//
// # Layering
//
// A wire package: it imports nothing of this module (the standard library
// and golang.org/x/sys/cpu only). udp computes and checks the ICRC of
// every packet it moves with it; rocelayer, the pcap tools and the tests
// use the whole-packet functions.
package icrc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Size is the length of the ICRC trailer in bytes.
const Size = 4

// Header sizes and offsets used by the package.
const (
	ipv4MinSize = 20
	ipv4MaxSize = 60
	ipv6Size    = 40
	udpSize     = 8
	bthSize     = 12

	ipv4TOSOff      = 1
	ipv4TotalLenOff = 2
	ipv4IDOff       = 4
	ipv4FlagsOff    = 6
	ipv4TTLOff      = 8
	ipv4ProtoOff    = 9
	ipv4SumOff      = 10
	ipv4SrcOff      = 12
	ipv4DstOff      = 16

	ipv6PayloadLenOff = 4
	ipv6NextHdrOff    = 6
	ipv6HopLimitOff   = 7
	ipv6SrcOff        = 8
	ipv6DstOff        = 24

	udpSrcPortOff = 0
	udpDstPortOff = 2
	udpLenOff     = 4
	udpSumOff     = 6

	bthMaskOff = 4 // FECN, BECN, reserved

	protoUDP = 17

	ipv4FragMask = 0x3fff // MF flag and fragment offset
)

// Errors returned by Compute, Verify and Put. Errors about malformed input wrap
// one of these and name the offending field; test with errors.Is.
var (
	// ErrMismatch means the stored ICRC does not match the computed one.
	ErrMismatch = errors.New("icrc: ICRC mismatch")
	// ErrTruncated means the buffer or a length field is too short to hold
	// the IP header, UDP header, BTH and ICRC.
	ErrTruncated = errors.New("icrc: packet truncated")
	// ErrVersion means the IP version nibble is neither 4 nor 6.
	ErrVersion = errors.New("icrc: IP version not 4 or 6")
	// ErrHeaderLength means the IPv4 IHL field is below 5.
	ErrHeaderLength = errors.New("icrc: bad IPv4 header length")
	// ErrNotUDP means the IPv4 protocol or IPv6 next header is not UDP (17);
	// IPv6 extension headers are not supported.
	ErrNotUDP = errors.New("icrc: not a UDP packet")
	// ErrFragment means the IPv4 packet is a fragment (MF set or non-zero
	// fragment offset); the ICRC of a fragment cannot be checked.
	ErrFragment = errors.New("icrc: IPv4 fragment")
	// ErrLength means the UDP length disagrees with the IP length fields.
	ErrLength = errors.New("icrc: inconsistent length fields")
)

// layout describes where the parts of a packet are.
type layout struct {
	hl  int  // IP header length
	end int  // end of the packet (by the IP length fields); the ICRC is at end-Size
	v6  bool // IPv6
}

// parse validates ip and locates its parts. Bytes after the end given by the
// IP length fields (link-layer padding) are ignored.
func parse(ip []byte) (layout, error) {
	if len(ip) == 0 {
		return layout{}, fmt.Errorf("%w: empty packet", ErrTruncated)
	}
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < ipv4MinSize {
			return layout{}, fmt.Errorf("%w: IPv4 header needs %d bytes, have %d", ErrTruncated, ipv4MinSize, len(ip))
		}
		hl := int(ip[0]&0x0f) * 4
		if hl < ipv4MinSize {
			return layout{}, fmt.Errorf("%w: IPv4 IHL %d (< 5)", ErrHeaderLength, hl/4)
		}
		tl := int(binary.BigEndian.Uint16(ip[ipv4TotalLenOff:]))
		if tl > len(ip) {
			return layout{}, fmt.Errorf("%w: IPv4 total length %d exceeds the %d-byte buffer", ErrTruncated, tl, len(ip))
		}
		if tl < hl+udpSize+bthSize+Size {
			return layout{}, fmt.Errorf("%w: IPv4 total length %d too small for a %d-byte IP header, UDP, BTH and ICRC", ErrTruncated, tl, hl)
		}
		if p := ip[ipv4ProtoOff]; p != protoUDP {
			return layout{}, fmt.Errorf("%w: IPv4 protocol %d", ErrNotUDP, p)
		}
		if ff := binary.BigEndian.Uint16(ip[ipv4FlagsOff:]); ff&ipv4FragMask != 0 {
			return layout{}, fmt.Errorf("%w: IPv4 flags/fragment offset %#06x", ErrFragment, ff)
		}
		if ul := int(binary.BigEndian.Uint16(ip[hl+udpLenOff:])); ul != tl-hl {
			return layout{}, fmt.Errorf("%w: UDP length %d, IPv4 payload %d", ErrLength, ul, tl-hl)
		}
		return layout{hl: hl, end: tl}, nil
	case 6:
		if len(ip) < ipv6Size {
			return layout{}, fmt.Errorf("%w: IPv6 header needs %d bytes, have %d", ErrTruncated, ipv6Size, len(ip))
		}
		if nh := ip[ipv6NextHdrOff]; nh != protoUDP {
			return layout{}, fmt.Errorf("%w: IPv6 next header %d (extension headers are not supported)", ErrNotUDP, nh)
		}
		pl := int(binary.BigEndian.Uint16(ip[ipv6PayloadLenOff:]))
		if ipv6Size+pl > len(ip) {
			return layout{}, fmt.Errorf("%w: IPv6 payload length %d exceeds the %d-byte buffer", ErrTruncated, pl, len(ip)-ipv6Size)
		}
		if pl < udpSize+bthSize+Size {
			return layout{}, fmt.Errorf("%w: IPv6 payload length %d too small for UDP, BTH and ICRC", ErrTruncated, pl)
		}
		if ul := int(binary.BigEndian.Uint16(ip[ipv6Size+udpLenOff:])); ul != pl {
			return layout{}, fmt.Errorf("%w: UDP length %d, IPv6 payload length %d", ErrLength, ul, pl)
		}
		return layout{hl: ipv6Size, end: ipv6Size + pl, v6: true}, nil
	default:
		return layout{}, fmt.Errorf("%w: IP version %d", ErrVersion, ip[0]>>4)
	}
}

// quickIPv4 recognises the common case, a well-formed IPv4 packet with a
// 20-byte header, with fewer branches than parse; it accepts exactly the
// packets with IHL 5 that parse accepts, with the same end.
func quickIPv4(ip []byte) (end int, ok bool) {
	if len(ip) < ipv4MinSize+udpSize+bthSize+Size || ip[0] != 0x45 || ip[ipv4ProtoOff] != protoUDP {
		return 0, false
	}
	tl := int(binary.BigEndian.Uint16(ip[ipv4TotalLenOff:]))
	if tl > len(ip) || tl < ipv4MinSize+udpSize+bthSize+Size ||
		binary.BigEndian.Uint16(ip[ipv4FlagsOff:])&ipv4FragMask != 0 ||
		int(binary.BigEndian.Uint16(ip[ipv4MinSize+udpLenOff:])) != tl-ipv4MinSize {
		return 0, false
	}
	return tl, true
}

// ipv4Delta returns the start-register correction for the masked fields of
// an IPv4 packet with a 20-byte header (see crc.go).
func ipv4Delta(ip []byte) uint32 {
	_ = ip[ipv4MinSize+udpSize+bthMaskOff] // bounds check hint
	m := &masks
	return m[mIPv4TOS][ip[ipv4TOSOff]] ^ m[mIPv4TTL][ip[ipv4TTLOff]] ^
		m[mIPv4Sum0][ip[ipv4SumOff]] ^ m[mIPv4Sum1][ip[ipv4SumOff+1]] ^
		m[mIPv4UDPSum0][ip[ipv4MinSize+udpSumOff]] ^ m[mIPv4UDPSum1][ip[ipv4MinSize+udpSumOff+1]] ^
		m[mIPv4BTH4][ip[ipv4MinSize+udpSize+bthMaskOff]]
}

// ipv6Delta returns the start-register correction for the masked fields of
// an IPv6 packet (see crc.go).
func ipv6Delta(ip []byte) uint32 {
	_ = ip[ipv6Size+udpSize+bthMaskOff] // bounds check hint
	m := &masks
	return m[mIPv6Byte0][ip[0]] ^ m[mIPv4TOS][ip[1]] ^ m[mIPv6Byte2][ip[2]] ^ m[mIPv6Byte3][ip[3]] ^
		m[mIPv6Hop][ip[ipv6HopLimitOff]] ^
		m[mIPv6UDPSum0][ip[ipv6Size+udpSumOff]] ^ m[mIPv6UDPSum1][ip[ipv6Size+udpSumOff+1]] ^
		m[mIPv6BTH4][ip[ipv6Size+udpSize+bthMaskOff]]
}

// crcThrough returns the CRC (hash/crc32 convention) of the masked packet
// including its stored ICRC bytes, for a packet with a 20-byte IPv4 header or
// an IPv6 header (fast reports whether the layout is one of those). This is a
// single crc32.Update over exactly the bytes of the packet, as they are: the
// masked fields are accounted for by start-register corrections (see crc.go).
// Running over the stored ICRC too keeps the hardware path on the same length
// as the packet (update runs hash/crc32's CLMUL code, AVX-512 from 1024 bytes,
// over len&^15 bytes and one round of table lookups over the rest); Verify
// then compares against the CRC residue, and Compute removes the trailer
// again with undoTrailer.
func crcThrough(ip []byte, l layout) (c uint32, fast bool) {
	switch {
	case l.v6:
		return update(seed^ipv6Delta(ip), ip[:l.end]), true
	case l.hl == ipv4MinSize:
		return update(seed^ipv4Delta(ip), ip[:l.end]), true
	}
	return 0, false
}

// compute returns the ICRC of a packet parse accepted.
func compute(ip []byte, l layout) uint32 {
	if c, ok := crcThrough(ip, l); ok {
		return undoTrailer(c, ip[l.end-Size:l.end])
	}
	return computeMaskedPrefix(ip, l)
}

// valid reports whether the stored ICRC of a packet parse accepted is right.
func valid(ip []byte, l layout) bool {
	if c, ok := crcThrough(ip, l); ok {
		return c == residue
	}
	return computeMaskedPrefix(ip, l) == binary.LittleEndian.Uint32(ip[l.end-Size:])
}

// computeMaskedPrefix computes the ICRC by copying the IP, UDP and BTH headers
// into a stack buffer, masking them there, and running crc32.Update over the
// rest (up to the ICRC) in place. It serves IPv4 packets with options and, in
// tests, as a cross-check of the table-driven fast path.
func computeMaskedPrefix(ip []byte, l layout) uint32 {
	var pre [ipv4MaxSize + udpSize + bthSize]byte
	k := copy(pre[:], ip[:l.hl+udpSize+bthSize])
	if l.v6 {
		pre[0] |= 0x0f
		pre[1], pre[2], pre[3] = 0xff, 0xff, 0xff
		pre[ipv6HopLimitOff] = 0xff
	} else {
		pre[ipv4TOSOff] = 0xff
		pre[ipv4TTLOff] = 0xff
		pre[ipv4SumOff], pre[ipv4SumOff+1] = 0xff, 0xff
	}
	pre[l.hl+udpSumOff], pre[l.hl+udpSumOff+1] = 0xff, 0xff
	pre[l.hl+udpSize+bthMaskOff] = 0xff
	c := softUpdate(seed, pre[:k])
	return update(c, ip[k:l.end-Size])
}

// Compute returns the ICRC of ip, a whole IPv4 or IPv6 packet from the IP
// header to the ICRC. The packet ends where the IP length fields say (IPv4
// total length, IPv6 header + payload length); the last 4 bytes before that
// end are the ICRC and are not covered. Any bytes after that end, such as
// Ethernet padding, are ignored. ip is not modified.
func Compute(ip []byte) (uint32, error) {
	if end, ok := quickIPv4(ip); ok {
		c := update(seed^ipv4Delta(ip), ip[:end])
		return undoTrailer(c, ip[end-Size:end]), nil
	}
	l, err := parse(ip)
	if err != nil {
		return 0, err
	}
	return compute(ip, l), nil
}

// Verify checks the ICRC stored in ip (see Compute for the framing). It
// returns nil if it is valid, ErrMismatch if it is not (without allocating), or
// a malformed-input error.
func Verify(ip []byte) error {
	if end, ok := quickIPv4(ip); ok {
		if update(seed^ipv4Delta(ip), ip[:end]) != residue {
			return ErrMismatch
		}
		return nil
	}
	l, err := parse(ip)
	if err != nil {
		return err
	}
	if !valid(ip, l) {
		return ErrMismatch
	}
	return nil
}

// Put computes the ICRC of ip (see Compute for the framing) and stores it,
// little-endian, in the packet's last 4 bytes.
func Put(ip []byte) error {
	if end, ok := quickIPv4(ip); ok {
		c := update(seed^ipv4Delta(ip), ip[:end])
		binary.LittleEndian.PutUint32(ip[end-Size:], undoTrailer(c, ip[end-Size:end]))
		return nil
	}
	l, err := parse(ip)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(ip[l.end-Size:], compute(ip, l))
	return nil
}

// Load returns the ICRC stored little-endian in the last 4 bytes of
// udpPayload (BTH .. ICRC). It returns 0 if udpPayload is shorter than Size.
func Load(udpPayload []byte) uint32 {
	if len(udpPayload) < Size {
		return 0
	}
	return binary.LittleEndian.Uint32(udpPayload[len(udpPayload)-Size:])
}

// Store writes v little-endian into the last 4 bytes of udpPayload (BTH ..
// ICRC). The caller guarantees len(udpPayload) >= Size.
func Store(udpPayload []byte, v uint32) {
	binary.LittleEndian.PutUint32(udpPayload[len(udpPayload)-Size:], v)
}
