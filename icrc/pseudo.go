package icrc

import (
	"encoding/binary"
	"fmt"
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

// copyDst returns dst[:n] for a Copy variant, and panics (before anything
// is written) if dst is shorter than n: reslicing alone would reach into
// dst's spare capacity.
func copyDst(dst []byte, n int) []byte {
	if len(dst) < n {
		panic(fmt.Sprintf("icrc: copy destination of %d bytes for a %d-byte payload", len(dst), n))
	}
	return dst[:n]
}

// finishPayload finishes the ICRC of a packet whose pseudo-header is done: c
// is the CRC of the seed and the masked IP + UDP header (see Prefix), and
// udpPayload is covered in place with update; the masked BTH byte 4 is folded
// into the start value (see crc.go). A payload shorter than BTH + ICRC is
// covered as far as it goes (it is not a valid RoCEv2 packet, but this never
// panics). A non-nil dst receives a copy of udpPayload (all of it), made in the
// same pass over the bytes where the folding kernel runs; it is as long as
// udpPayload (see copyDst).
func finishPayload(c uint32, udpPayload, dst []byte) uint32 {
	cov := len(udpPayload) - Size
	if cov <= bthMaskOff {
		copy(dst, udpPayload)
		return softUpdate(c, udpPayload[:max(cov, 0)])
	}
	c ^= masks[mPayloadBTH4][udpPayload[bthMaskOff]]
	if dst == nil {
		return update(c, udpPayload[:cov])
	}
	c = updateCopy(c, dst, udpPayload[:cov])
	copy(dst[cov:], udpPayload[cov:])
	return c
}

// softShortPayload is finishPayload(c, p+trailer, nil) for a covered part
// p of 16 to 31 bytes (an ACK's BTH and AETH, a SEND of a few bytes), as
// Prefix.Compute runs it where clmulShort does not: the first 16 bytes as
// one slicing-by-16 step with the register folded in, where BTH byte 4,
// masked, is the constant maskedBTH4 instead of a lookup and a
// start-register correction, then tail's independent lookups for the
// rest, without the calls through update, updateSplit and softUpdate.
func softShortPayload(c uint32, p []byte) uint32 {
	_ = p[15]
	t := &sliceTable
	r := ^c ^ binary.LittleEndian.Uint32(p)
	r = t[15][byte(r)] ^ t[14][byte(r>>8)] ^ t[13][byte(r>>16)] ^ t[12][r>>24] ^
		maskedBTH4 ^ t[10][p[5]] ^ t[9][p[6]] ^ t[8][p[7]] ^
		t[7][p[8]] ^ t[6][p[9]] ^ t[5][p[10]] ^ t[4][p[11]] ^
		t[3][p[12]] ^ t[2][p[13]] ^ t[1][p[14]] ^ t[0][p[15]]
	q := p[16:]
	n := len(q)
	if n < 4 {
		for _, b := range q {
			r = t[0][byte(r)^b] ^ r>>8
		}
		return ^r
	}
	// As tail: the register folds into the first four bytes.
	s := t[:n:n] // s[n-1-j] serves byte j
	x := s[n-1][q[0]^byte(r)] ^ s[n-2][q[1]^byte(r>>8)] ^ s[n-3][q[2]^byte(r>>16)] ^ s[n-4][q[3]^byte(r>>24)]
	for j := 4; j < n; j++ {
		x ^= s[n-1-j][q[j]]
	}
	return ^x
}

// ComputeIPv4 returns the ICRC of a RoCEv2 packet sent over IPv4 with a
// 20-byte header, given its UDP payload (BTH .. ICRC; the last 4 bytes are not
// covered) and the header fields in h. It does not allocate.
func ComputeIPv4(h *IPv4Pseudo, udpPayload []byte) uint32 {
	p := NewIPv4Prefix(h)
	return p.Compute(h.ID, udpPayload)
}

// ComputeIPv4Copy is ComputeIPv4 that also copies udpPayload (ICRC
// included) to dst, in the same pass over the bytes on CPUs where the
// package's folding kernel runs, which is cheaper than a copy and a
// ComputeIPv4. It panics if dst is shorter than udpPayload; dst
// must not overlap udpPayload.
func ComputeIPv4Copy(h *IPv4Pseudo, dst, udpPayload []byte) uint32 {
	p := NewIPv4Prefix(h)
	return p.ComputeCopy(h.ID, dst, udpPayload)
}

// ComputeIPv6 returns the ICRC of a RoCEv2 packet sent over IPv6 without
// extension headers, given its UDP payload (BTH .. ICRC; the last 4 bytes are
// not covered) and the header fields in h. It does not allocate.
func ComputeIPv6(h *IPv6Pseudo, udpPayload []byte) uint32 {
	p := NewIPv6Prefix(h)
	return p.Compute(0, udpPayload)
}

// ComputeIPv6Copy is ComputeIPv6 that also copies udpPayload to dst (see
// ComputeIPv4Copy). It panics if dst is shorter than udpPayload; dst
// must not overlap udpPayload.
func ComputeIPv6Copy(h *IPv6Pseudo, dst, udpPayload []byte) uint32 {
	p := NewIPv6Prefix(h)
	return p.ComputeCopy(0, dst, udpPayload)
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
	p := NewIPv4Prefix(h)
	return p.SolveIPv4ID(udpPayload)
}

// SolveIPv4IDCopy is SolveIPv4ID that also copies udpPayload to dst, in
// the same pass over the bytes where the folding kernel runs (see
// ComputeIPv4Copy); the copy is made whatever the result. It panics if dst
// is shorter than udpPayload; dst must not overlap udpPayload.
func SolveIPv4IDCopy(h *IPv4Pseudo, dst, udpPayload []byte) (id uint16, ok bool) {
	p := NewIPv4Prefix(h)
	return p.SolveIPv4IDCopy(dst, udpPayload)
}
