package icrc

import (
	"encoding/binary"
	"math/bits"
)

// Prefix is the ICRC state after the pseudo-header of one flow: the IP and
// UDP header fields that stay the same from packet to packet (addresses,
// ports, IPv4 flags) folded in once. The fields that change (the IP and
// UDP lengths, the IPv4 identification) are folded in per packet with six
// table lookups, where ComputeIPv4 and SolveIPv4ID run the CRC over the
// whole synthesized header each time. A link keeps the Prefix of the flow
// it last served. The zero value is not usable; use NewIPv4Prefix or
// NewIPv6Prefix.
type Prefix struct {
	base uint32 // CRC of the seed and the header with its variable bytes zero
	v6   bool
	ok   bool
}

// Positions of the variable header bytes, and their tables: varTable[k][v]
// is what byte value v at position k changes the CRC after the header by
// (CRC linearity: A^(n-1-i)(T(v)) for byte i of an n-byte header).
const (
	v4TotalLen   = iota // 2 bytes
	v4ID                // 2 bytes
	v4UDPLen            // 2 bytes
	v6PayloadLen        // 2 bytes
	v6UDPLen            // 2 bytes
	numVarFields
)

var varTable [numVarFields][2][256]uint32

// lenTable[v6][n] is the change of the header CRC for a UDP payload of n <
// lenTableSize bytes: both length fields of the header at once (IPv4
// total length and UDP length, or IPv6 payload length and UDP length),
// one lookup where vary takes four.
var lenTable [2][lenTableSize]uint32

// lenTableSize bounds the payload lengths lenTable serves: small packets,
// whose ICRC is short enough for the header's lookups to matter.
const lenTableSize = 512

func init() {
	pos := [numVarFields]struct{ off, n int }{
		v4TotalLen:   {ipv4TotalLenOff, ipv4MinSize + udpSize},
		v4ID:         {ipv4IDOff, ipv4MinSize + udpSize},
		v4UDPLen:     {ipv4MinSize + udpLenOff, ipv4MinSize + udpSize},
		v6PayloadLen: {ipv6PayloadLenOff, ipv6Size + udpSize},
		v6UDPLen:     {ipv6Size + udpLenOff, ipv6Size + udpSize},
	}
	for f, p := range pos {
		for b := range 2 { // the high byte at off, the low byte at off+1
			var hdr [ipv6Size + udpSize]byte
			h := hdr[:p.n]
			zero := softUpdate(0, h)
			for v := range 256 {
				h[p.off+b] = byte(v)
				varTable[f][b][v] = softUpdate(0, h) ^ zero
			}
		}
	}
	for n := range lenTableSize {
		ul := uint16(udpSize + n)
		lenTable[0][n] = vary(v4TotalLen, ul+ipv4MinSize) ^ vary(v4UDPLen, ul)
		lenTable[1][n] = vary(v6PayloadLen, ul) ^ vary(v6UDPLen, ul)
	}
}

// vary returns the change of the header CRC for field f holding v.
func vary(f int, v uint16) uint32 {
	t := &varTable[f]
	return t[0][v>>8] ^ t[1][v&0xff]
}

// NewIPv4Prefix returns the Prefix of IPv4 packets with a 20-byte header and
// the addresses, flags and ports of h (h.ID is ignored: each packet gives
// its own).
func NewIPv4Prefix(h *IPv4Pseudo) Prefix {
	var pre [ipv4MinSize + udpSize]byte
	pre[0] = 0x45
	pre[ipv4TOSOff] = 0xff
	binary.BigEndian.PutUint16(pre[ipv4FlagsOff:], h.FlagsFrag)
	pre[ipv4TTLOff] = 0xff
	pre[ipv4ProtoOff] = protoUDP
	pre[ipv4SumOff], pre[ipv4SumOff+1] = 0xff, 0xff
	copy(pre[ipv4SrcOff:], h.Src[:])
	copy(pre[ipv4DstOff:], h.Dst[:])
	putUDP(pre[ipv4MinSize:], h.SrcPort, h.DstPort, 0)
	return Prefix{base: softUpdate(seed, pre[:]), ok: true}
}

// NewIPv6Prefix returns the Prefix of IPv6 packets without extension headers
// and with the addresses and ports of h.
func NewIPv6Prefix(h *IPv6Pseudo) Prefix {
	var pre [ipv6Size + udpSize]byte
	pre[0], pre[1], pre[2], pre[3] = 0x6f, 0xff, 0xff, 0xff
	pre[ipv6NextHdrOff] = protoUDP
	pre[ipv6HopLimitOff] = 0xff
	copy(pre[ipv6SrcOff:], h.Src[:])
	copy(pre[ipv6DstOff:], h.Dst[:])
	putUDP(pre[ipv6Size:], h.SrcPort, h.DstPort, 0)
	return Prefix{base: softUpdate(seed, pre[:]), v6: true, ok: true}
}

// IsIPv6 reports whether p is for IPv6 packets.
func (p *Prefix) IsIPv6() bool { return p.v6 }

// header returns the CRC after the seed and the header of a packet with
// this prefix, identification id (IPv4) and a UDP payload of n bytes.
// Small enough to inline: the length fields of a small packet are one
// lenTable lookup, and an identification of 0 (every packet but GSO's
// later segments) adds nothing.
func (p *Prefix) header(id uint16, n int) uint32 {
	if !p.ok || uint(n) >= lenTableSize {
		return p.headerSlow(id, n)
	}
	if p.v6 {
		return p.base ^ lenTable[1][n]
	}
	c := p.base ^ lenTable[0][n]
	if id != 0 {
		c ^= vary(v4ID, id)
	}
	return c
}

// headerSlow is header for a zero Prefix (it panics) and long payloads.
func (p *Prefix) headerSlow(id uint16, n int) uint32 {
	if !p.ok {
		panic("icrc: zero Prefix (use NewIPv4Prefix or NewIPv6Prefix)")
	}
	ul := uint16(udpSize + n)
	if p.v6 {
		return p.base ^ vary(v6PayloadLen, ul) ^ vary(v6UDPLen, ul)
	}
	return p.base ^ vary(v4TotalLen, ul+ipv4MinSize) ^ vary(v4ID, id) ^ vary(v4UDPLen, ul)
}

// Compute returns the ICRC of a packet of this flow with IPv4
// identification id (ignored for IPv6) and UDP payload udpPayload (BTH ..
// ICRC): ComputeIPv4 or ComputeIPv6 with the prefix's header fields.
//
// A short packet (16 to 23 covered bytes where update would run the
// carry-less multiply kernel from 24, to 31 elsewhere: an ACK, a SEND of a
// few bytes) takes header's small-packet case, written out here, and
// clmulShort (one carry-less fold, BTH byte 4 masked in the kernel) or,
// without it, softShortPayload; a small one (24 to 127 covered bytes)
// with the kernel takes the same header case and clmulSmall directly.
func (p *Prefix) Compute(id uint16, udpPayload []byte) uint32 {
	n := len(udpPayload)
	if cov := n - Size; uint(cov-16) < 128-16 && p.ok { // 16 <= cov < 128
		c := p.base
		if p.v6 {
			c ^= lenTable[1][n]
		} else {
			c ^= lenTable[0][n]
			if id != 0 {
				c ^= vary(v4ID, id)
			}
		}
		if cov < smallMin {
			if hasSmall {
				return ^clmulShort(^c, udpPayload[:cov])
			}
			return softShortPayload(c, udpPayload[:cov])
		}
		if hasSmall {
			// A small packet (a 64-byte WRITE's 92 covered bytes):
			// finishPayload's masking and update's choice of
			// clmulSmall written out, without their calls.
			c ^= masks[mPayloadBTH4][udpPayload[bthMaskOff]]
			return ^clmulSmall(^c, udpPayload[:cov])
		}
		if cov < 32 {
			return softShortPayload(c, udpPayload[:cov])
		}
	}
	return finishPayload(p.header(id, n), udpPayload, nil)
}

// ComputeCopy is Compute that also copies udpPayload to dst (see
// ComputeIPv4Copy). It panics if dst is shorter than udpPayload; dst
// must not overlap udpPayload.
func (p *Prefix) ComputeCopy(id uint16, dst, udpPayload []byte) uint32 {
	return finishPayload(p.header(id, len(udpPayload)), udpPayload, copyDst(dst, len(udpPayload)))
}

// SolveIPv4ID is the package's SolveIPv4ID for a packet of this IPv4 flow.
// For an IPv6 prefix it reports ok=false.
func (p *Prefix) SolveIPv4ID(udpPayload []byte) (id uint16, ok bool) {
	return p.solve(udpPayload, nil)
}

// SolveIPv4IDCopy is SolveIPv4ID that also copies udpPayload to dst (see
// the package's SolveIPv4IDCopy). It panics if dst is shorter than
// udpPayload; dst must not overlap udpPayload.
func (p *Prefix) SolveIPv4IDCopy(dst, udpPayload []byte) (id uint16, ok bool) {
	return p.solve(udpPayload, copyDst(dst, len(udpPayload)))
}

// SolveIPv4IDFrom is SolveIPv4ID that tries guess first: when the
// packet's identification is guess, the answer costs no more than
// Compute, without the GF(2) multiplication SolveIPv4ID runs for every
// identification but 0. A receiver that knows the likely one — segment k
// of a GRO buffer coalesced from one UDP GSO datagram has k — passes it;
// any other identification is still found (the result is the same as
// SolveIPv4ID's for every guess).
func (p *Prefix) SolveIPv4IDFrom(guess uint16, udpPayload []byte) (id uint16, ok bool) {
	if p.v6 || len(udpPayload) < bthSize+Size {
		return 0, false
	}
	// The identification enters the CRC linearly, so the ICRC for guess
	// differs from the stored one exactly as the ICRC for 0 does from the
	// stored one for the identification id XOR guess.
	delta := p.Compute(guess, udpPayload) ^ Load(udpPayload)
	if delta == 0 {
		return guess, true
	}
	x, ok := solveDelta(delta, ipv4MinSize+udpSize+len(udpPayload)-Size)
	return x ^ guess, ok
}

func (p *Prefix) solve(udpPayload, dst []byte) (id uint16, ok bool) {
	if p.v6 || len(udpPayload) < bthSize+Size {
		copy(dst, udpPayload)
		return 0, false
	}
	var c uint32
	if dst == nil {
		c = p.Compute(0, udpPayload)
	} else {
		c = finishPayload(p.header(0, len(udpPayload)), udpPayload, dst)
	}
	delta := c ^ Load(udpPayload)
	return solveDelta(delta, ipv4MinSize+udpSize+len(udpPayload)-Size)
}

// solveDelta finishes SolveIPv4ID: delta is the stored ICRC XOR the ICRC for
// identification 0, n the covered length from the IP header on.
func solveDelta(delta uint32, n int) (id uint16, ok bool) {
	if delta == 0 { // identification 0: every packet but GSO's later segments
		return 0, true
	}
	c := mulModP(delta, idInverse(n))
	// The coefficient of x^k sits in bit 31-k. ID bit 7 (the last one the CRC
	// sees) is x^0, ID bit 0 is x^7, ID bit 15 is x^8 and ID bit 8 is x^15, so
	// bits 31..24 hold the low byte, bits 23..16 the high byte, and the bits
	// for x^16 and above must be clear.
	if c&0xffff != 0 {
		return 0, false
	}
	return bits.ReverseBytes16(uint16(c >> 16)), true
}

// ComputeSplit returns the ICRC of a packet of this flow whose UDP payload
// is not contiguous: udpPayload[:at], then mid, then udpPayload[at:] (the
// last 4 bytes of udpPayload are the ICRC, not covered). It is Compute of
// that concatenation, made without building it: a link that sends a
// packet's payload straight from registered memory (zero-copy) keeps the
// headers in one small buffer and the payload where it lies. Each byte is
// read once. at must be at least the BTH's length (12) and at most
// len(udpPayload)-4; ComputeSplit panics otherwise.
func (p *Prefix) ComputeSplit(id uint16, udpPayload []byte, at int, mid []byte) uint32 {
	n := len(udpPayload)
	if at < bthSize || at > n-Size {
		panic("icrc: ComputeSplit: split point outside the packet's headers and trailer")
	}
	c := p.header(id, n+len(mid))
	c ^= masks[mPayloadBTH4][udpPayload[bthMaskOff]]
	c = softOrUpdate(c, udpPayload[:at])
	c = softOrUpdate(c, mid)
	return softOrUpdate(c, udpPayload[at:n-Size])
}

// ComputeSplitCopy is ComputeSplit that also puts the packet together in
// dst: udpPayload[:at], mid, udpPayload[at:], len(udpPayload)+len(mid)
// bytes, copied in the same pass that computes the ICRC (mid, the long
// part, through the folding kernel's copying variant where there is one).
// A capture of a zero-copy send records the packet this way, reading each
// byte once. It panics, before writing anything, if dst is shorter or at
// is outside the headers and trailer (as ComputeSplit); dst must not
// overlap udpPayload or mid.
func (p *Prefix) ComputeSplitCopy(id uint16, dst, udpPayload []byte, at int, mid []byte) uint32 {
	n := len(udpPayload)
	if at < bthSize || at > n-Size {
		panic("icrc: ComputeSplitCopy: split point outside the packet's headers and trailer")
	}
	dst = copyDst(dst, n+len(mid))
	c := p.header(id, n+len(mid))
	c ^= masks[mPayloadBTH4][udpPayload[bthMaskOff]]
	copy(dst, udpPayload[:at])
	c = softOrUpdate(c, udpPayload[:at])
	if len(mid) < hwMin {
		copy(dst[at:], mid)
		c = softUpdate(c, mid)
	} else {
		c = updateCopy(c, dst[at:at+len(mid)], mid)
	}
	copy(dst[at+len(mid):], udpPayload[at:])
	return softOrUpdate(c, udpPayload[at:n-Size])
}

// softOrUpdate is update, with the portable loop for a short piece (the
// headers and the pad+trailer around a split payload are a few dozen
// bytes: the hardware paths would only add their setup).
func softOrUpdate(c uint32, p []byte) uint32 {
	if len(p) < hwMin && (!hasSmall || len(p) < smallMin) {
		return softUpdate(c, p)
	}
	return update(c, p)
}
