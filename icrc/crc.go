package icrc

import (
	"hash/crc32"
	"math/bits"
	"sync/atomic"
)

// This file holds the CRC-32 machinery behind the package: a slicing-by-16
// routine for the short header prefixes the package synthesizes on the stack
// (crc32.Update would move such a buffer to the heap, because it calls through
// a function variable) and for the sub-16-byte tails that hash/crc32's CLMUL
// path leaves to a byte-at-a-time loop; per-position correction tables that
// let Compute run a single hardware-accelerated crc32.Update over the packet in
// place; and GF(2)[x] arithmetic modulo the CRC polynomial for SolveIPv4ID.
//
// Notation. Go's crc32.Update keeps a register R = ^crc and, per byte b,
// computes R' = A(R) ^ T(b) with A(R) = T(R&0xff) ^ R>>8 and T the IEEE table.
// Both A and T are GF(2)-linear. After n bytes b_0..b_{n-1},
//
//	R_n = A^n(R_0) ^ sum_i A^(n-1-i)(T(b_i)).
//
// Changing byte i by d therefore changes R_n by A^(n-1-i)(T(d)); changing the
// start register by e changes it by A^n(e). The two are equal for
// e = A^-(i+1)(T(d)), which does not depend on n: a change to a byte at a fixed
// offset from the start of the data can be folded into the start register.
// That is how the masked fields (TOS, TTL, checksums, BTH byte 4) are handled
// without copying the packet.
//
// In the reflected bit order used by CRC-32/IEEE a register value is a
// polynomial of degree < 32 with the coefficient of x^k in bit 31-k, A is
// multiplication by x^8 modulo P, and one bit step (see mulX) is
// multiplication by x.

// poly is the reflected CRC-32/IEEE polynomial (without the x^32 term).
const poly = 0xedb88320

// xPow0 is the polynomial 1 (x^0) in reflected representation.
const xPow0 = 1 << 31

var (
	// sliceTable[k][b] is the register after byte b followed by k zero
	// bytes, starting from a zero register (slicing-by-16).
	sliceTable [16][256]uint32

	// invTop[T(x)>>24] = x; the top bytes of the table entries are a
	// permutation of 0..255, which makes A invertible.
	invTop [256]byte

	// seed is the CRC value (Go convention) after the 8 bytes of 0xff that
	// stand for the masked LRH.
	seed uint32

	// x2n[k] = x^(2^k) mod P; xInv2n[k] = x^-(2^k) mod P.
	x2n, xInv2n [64]uint32

	// inv4Table[k][b] = A^-4(b << 8k), so that A^-4(r) is the XOR of four
	// lookups (see undoTrailer).
	inv4Table [4][256]uint32

	// residue is the CRC (hash/crc32 convention) of any byte string followed
	// by its own CRC stored little-endian: 0x2144df1c for CRC-32/IEEE.
	residue uint32

	// masks holds the correction tables of the fast paths (see maskTable).
	masks [numMaskPos][256]uint32

	// maskedBTH4 is sliceTable[11][0xff]: the masked BTH byte 4 in the
	// first 16-byte block of a UDP payload (see shortPayload).
	maskedBTH4 uint32

	// invCache[n] caches x^-(8n-16) mod P for SolveIPv4ID; 0 means not yet
	// computed (the value is never 0).
	invCache [invCacheLen]atomic.Uint32
)

const invCacheLen = 1 << 14

// Indexes into masks. IPv4 offsets assume a 20-byte header (IHL 5).
const (
	mIPv4TOS     = iota // IPv4 byte 1; also IPv6 byte 1 (traffic class low nibble, flow label high nibble)
	mIPv4TTL            // IPv4 byte 8
	mIPv4Sum0           // IPv4 byte 10
	mIPv4Sum1           // IPv4 byte 11
	mIPv4UDPSum0        // IPv4 byte 26
	mIPv4UDPSum1        // IPv4 byte 27
	mIPv4BTH4           // IPv4 byte 32
	mIPv6Byte0          // IPv6 byte 0, low nibble only (traffic class high nibble)
	mIPv6Byte2          // IPv6 byte 2 (flow label)
	mIPv6Byte3          // IPv6 byte 3 (flow label)
	mIPv6Hop            // IPv6 byte 7
	mIPv6UDPSum0        // IPv6 byte 46
	mIPv6UDPSum1        // IPv6 byte 47
	mIPv6BTH4           // IPv6 byte 52
	mPayloadBTH4        // UDP payload byte 4, for ComputeIPv4/ComputeIPv6
	numMaskPos
)

func init() {
	tab := crc32.IEEETable
	sliceTable[0] = *tab
	for i := range 256 {
		c := tab[i]
		for k := 1; k < len(sliceTable); k++ {
			c = tab[c&0xff] ^ c>>8
			sliceTable[k][i] = c
		}
	}

	var seen [256]bool
	for x := range 256 {
		top := byte(tab[x] >> 24)
		if seen[top] {
			panic("icrc: CRC table top bytes are not a permutation")
		}
		seen[top] = true
		invTop[top] = byte(x)
	}

	var ff [8]byte
	for i := range ff {
		ff[i] = 0xff
	}
	seed = softUpdate(0, ff[:])
	var zero [4]byte
	residue = softUpdate(0, zero[:])

	for k := range inv4Table {
		for b := range 256 {
			r := uint32(b) << (8 * k)
			for range 4 {
				r = invA(r)
			}
			inv4Table[k][b] = r
		}
	}

	x2n[0] = xPow0 >> 1 // x^1
	// x^-1: in normal bit order x^-1 = (P ^ 1) / x = 0x82608edb (x^32 term
	// included before the shift); reflect it.
	xInv2n[0] = bits.Reverse32(0x82608edb)
	for k := 1; k < len(x2n); k++ {
		x2n[k] = multModP(x2n[k-1], x2n[k-1])
		xInv2n[k] = multModP(xInv2n[k-1], xInv2n[k-1])
	}
	if multModP(x2n[0], xInv2n[0]) != xPow0 {
		panic("icrc: bad x^-1 constant")
	}

	full := func(b byte) byte { return b ^ 0xff }
	masks[mIPv4TOS] = maskTable(1, full)
	masks[mIPv4TTL] = maskTable(8, full)
	masks[mIPv4Sum0] = maskTable(10, full)
	masks[mIPv4Sum1] = maskTable(11, full)
	masks[mIPv4UDPSum0] = maskTable(26, full)
	masks[mIPv4UDPSum1] = maskTable(27, full)
	masks[mIPv4BTH4] = maskTable(32, full)
	masks[mIPv6Byte0] = maskTable(0, func(b byte) byte { return (b ^ 0x0f) & 0x0f })
	masks[mIPv6Byte2] = maskTable(2, full)
	masks[mIPv6Byte3] = maskTable(3, full)
	masks[mIPv6Hop] = maskTable(7, full)
	masks[mIPv6UDPSum0] = maskTable(46, full)
	masks[mIPv6UDPSum1] = maskTable(47, full)
	masks[mIPv6BTH4] = maskTable(52, full)
	masks[mPayloadBTH4] = maskTable(bthMaskOff, full)
	maskedBTH4 = sliceTable[15-bthMaskOff][0xff]
}

// softUpdate is crc32.Update(crc, crc32.IEEETable, p) in portable code
// (slicing-by-16, then at most one round of table lookups for the last 1..15
// bytes). Unlike crc32.Update it does not make its argument escape, so it is
// used for short stack buffers.
func softUpdate(crc uint32, p []byte) uint32 {
	t := &sliceTable
	r := ^crc
	for len(p) >= 16 {
		r ^= uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
		r = t[15][byte(r)] ^ t[14][byte(r>>8)] ^ t[13][byte(r>>16)] ^ t[12][r>>24] ^
			t[11][p[4]] ^ t[10][p[5]] ^ t[9][p[6]] ^ t[8][p[7]] ^
			t[7][p[8]] ^ t[6][p[9]] ^ t[5][p[10]] ^ t[4][p[11]] ^
			t[3][p[12]] ^ t[2][p[13]] ^ t[1][p[14]] ^ t[0][p[15]]
		p = p[16:]
	}
	return ^tail(r, p)
}

// tail processes len(p) < 16 bytes into register r. For n >= 4 bytes the
// register folds into the first four, after which every byte is one
// independent lookup (byte j followed by n-1-j zero bytes); this replaces the
// byte-serial loop hash/crc32 runs after its CLMUL part.
func tail(r uint32, p []byte) uint32 {
	n := len(p)
	if n < 4 {
		for _, b := range p {
			r = sliceTable[0][byte(r)^b] ^ r>>8
		}
		return r
	}
	t := sliceTable[:n:n] // t[n-1-j] serves byte j
	x := t[n-1][p[0]^byte(r)] ^ t[n-2][p[1]^byte(r>>8)] ^ t[n-3][p[2]^byte(r>>16)] ^ t[n-4][p[3]^byte(r>>24)]
	for j := 4; j < n; j++ {
		x ^= t[n-1-j][p[j]]
	}
	return x
}

// update is crc32.Update(crc, crc32.IEEETable, p). From foldMin bytes on, on
// CPUs with AVX-512 VPCLMULQDQ, it runs the package's own folding kernel
// (fold_amd64.s), which keeps four 512-bit accumulators in flight where
// hash/crc32 keeps one (1.2-1.5x its speed on 4 KiB: BenchmarkUpdate). Below
// that, from smallMin bytes on, it runs clmulSmall (small_amd64.s: one
// carry-less multiply lane, any length, no lookup tables), except for a
// multiple of 16 from 128 bytes on, where hash/crc32's four lanes are
// quicker. Otherwise hash/crc32 (hardware) over the longest 16-byte multiple
// of p if that is at least hwMin bytes, then softUpdate over the rest. p must
// not be a stack buffer (it escapes).
func update(crc uint32, p []byte) uint32 {
	n := len(p)
	switch {
	case hasFold && n >= foldMin:
		return updateFold(crc, p)
	case hasSmall && n >= smallMin && (n < 128 || n&15 != 0):
		return ^clmulSmall(^crc, p)
	case n&15 == 0 && n >= hwMin:
		return crc32.Update(crc, crc32.IEEETable, p) // inlined fast case
	}
	return updateSplit(crc, p)
}

// smallMin is the length from which update uses clmulSmall. The kernel's
// final reduction costs about as much as slicing-by-16 over 24 bytes with
// the tables in L1; on the data path (a small packet's ~100 covered bytes,
// the tables often evicted by packet buffers) the tables' misses made
// softUpdate's tail alone 6 % of a 64-byte WRITE stream's CPU.
const smallMin = 24

// foldMin is the length from which update uses foldAVX512; below it the
// kernel's setup and final folds cost more than hash/crc32's loop.
const foldMin = 256

// updateFold is update through foldAVX512: the kernel folds the longest
// 16-byte multiple of p into 16 bytes with the same CRC, and finishFold
// runs over those and the rest of p.
func updateFold(crc uint32, p []byte) uint32 {
	var x [32]byte
	k := len(p) &^ 15
	foldAVX512(^crc, p[:k], (*[16]byte)(x[:16]))
	return finishFold(&x, p[k:])
}

// finishFold returns the CRC of the folding kernel's 16 output bytes in
// x[:16] (from a zero register) followed by rest (< 16 bytes, copied into
// x[16:]): clmulSmall over both where it runs, softUpdate otherwise.
func finishFold(x *[32]byte, rest []byte) uint32 {
	if hasSmall {
		n := 16 + copy(x[16:], rest)
		return ^clmulSmall(0, x[:n])
	}
	return softUpdate(softUpdate(^uint32(0), x[:16]), rest)
}

// updateCopy is update(crc, p) that also copies p to dst, which must be at
// least as long; with the folding kernel both happen in one pass over p.
func updateCopy(crc uint32, dst, p []byte) uint32 {
	if hasFold && len(p) >= foldMin {
		dst = dst[:len(p)] // panics, before the kernel runs, if dst is short (callers pass len(dst) == len(p))
		var x [32]byte
		k := len(p) &^ 15
		foldCopyAVX512(^crc, p[:k], &dst[0], (*[16]byte)(x[:16]))
		copy(dst[k:], p[k:])
		return finishFold(&x, p[k:])
	}
	copy(dst[:len(p)], p)
	return update(crc, p)
}

// updateSplit is update for lengths that are not a multiple of 16.
func updateSplit(crc uint32, p []byte) uint32 {
	if k := len(p) &^ 15; k >= hwMin {
		crc = crc32.Update(crc, crc32.IEEETable, p[:k])
		p = p[k:]
	}
	return softUpdate(crc, p)
}

// hwMin is the length from which hash/crc32 uses its CLMUL path on amd64.
const hwMin = 64

// undoTrailer returns the CRC (hash/crc32 convention) of a byte string m,
// given c, the CRC of m followed by the 4 bytes t. After those 4 bytes the
// register is A^4(R) ^ C(t), where C(t) is t's contribution from a zero
// register (four independent lookups in the slicing tables), so
// R = A^-4(r ^ C(t)), which is four more lookups.
func undoTrailer(c uint32, t []byte) uint32 {
	_ = t[3]
	s := &sliceTable
	r := ^c ^ s[3][t[0]] ^ s[2][t[1]] ^ s[1][t[2]] ^ s[0][t[3]]
	i := &inv4Table
	r = i[0][r&0xff] ^ i[1][r>>8&0xff] ^ i[2][r>>16&0xff] ^ i[3][r>>24]
	return ^r
}

// invA applies the inverse of the zero-byte step A.
func invA(r uint32) uint32 {
	x := invTop[r>>24]
	return (r^crc32.IEEETable[x])<<8 | uint32(x)
}

// startDelta returns the change of the start register that has the same effect
// on the final CRC as XORing d into the data byte at offset i.
func startDelta(i int, d byte) uint32 {
	r := crc32.IEEETable[d]
	for range i + 1 {
		r = invA(r)
	}
	return r
}

// maskTable returns, for the data byte at offset i, the start-register
// correction for each byte value b that turns the CRC of the data as it is into
// the CRC of the data with byte i replaced by its masked value; diff(b) is b
// XOR its masked value.
func maskTable(i int, diff func(byte) byte) (t [256]uint32) {
	var basis [8]uint32
	for k := range basis {
		basis[k] = startDelta(i, 1<<k)
	}
	for b := range 256 {
		d := diff(byte(b))
		var r uint32
		for k := range basis {
			if d&(1<<k) != 0 {
				r ^= basis[k]
			}
		}
		t[b] = r
	}
	return t
}

// multModP returns a*b mod P (reflected representation).
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(xPow0); a != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		b = mulX(b)
	}
	return p
}

// mulModP is multModP computed with a carry-less multiplication in four-bit
// windows and a table-driven reduction, about five times as fast on random
// operands (the bit-serial multModP branches on every bit of a). In normal
// bit order (bits.Reverse32 of the reflected values) the product of two
// polynomials of degree < 32 is H*x^32 + L with H, L of degree < 32, and
// H*x^32 mod P is the XOR of redTable[i][byte i of H].
func mulModP(a, b uint32) uint32 {
	na, nb := uint64(bits.Reverse32(a)), uint64(bits.Reverse32(b))
	// win[k] = k(x) * nb(x) for the 16 polynomials k of degree < 4.
	var win [16]uint64
	win[1] = nb
	win[2] = nb << 1
	win[4] = nb << 2
	win[8] = nb << 3
	win[3] = win[2] ^ win[1]
	win[5] = win[4] ^ win[1]
	win[6] = win[4] ^ win[2]
	win[7] = win[4] ^ win[3]
	for k := 9; k < 16; k++ {
		win[k] = win[8] ^ win[k-8]
	}
	var c uint64
	for i := 0; i < 32; i += 4 {
		c ^= win[na>>i&15] << i
	}
	h := uint32(c >> 32)
	r := uint32(c) ^ redTable[0][byte(h)] ^ redTable[1][byte(h>>8)] ^ redTable[2][byte(h>>16)] ^ redTable[3][h>>24]
	return bits.Reverse32(r)
}

// redTable[i][v] = (v << 8i) * x^32 mod P in normal bit order (see mulModP).
var redTable = func() (t [4][256]uint32) {
	const pNormal = 0x04c11db7 // P without its x^32 term, normal bit order
	for i := range t {
		for v := range 256 {
			// Multiply (v << 8i) by x^32: 32 steps of shift-and-reduce.
			r := uint32(v) << (8 * i)
			for range 32 {
				if r&(1<<31) != 0 {
					r = r<<1 ^ pNormal
				} else {
					r <<= 1
				}
			}
			t[i][v] = r
		}
	}
	return t
}()

// mulX returns v*x mod P: one bit step of the CRC register with a zero data bit.
func mulX(v uint32) uint32 {
	return v>>1 ^ poly&-(v&1)
}

// xPow returns x^e mod P, using tab = x2n (positive powers) or xInv2n
// (negative powers).
func xPow(tab *[64]uint32, e uint64) uint32 {
	p := uint32(xPow0)
	for k := 0; e != 0; k, e = k+1, e>>1 {
		if e&1 != 0 {
			p = multModP(tab[k], p)
		}
	}
	return p
}

// idInverse returns x^-(8n-16) mod P for a covered length of n bytes (IP
// header start to ICRC, n >= 2), cached for small n. See SolveIPv4ID.
func idInverse(n int) uint32 {
	e := 8*uint64(n) - 16
	if n >= invCacheLen {
		return xPow(&xInv2n, e)
	}
	if v := invCache[n].Load(); v != 0 {
		return v
	}
	v := xPow(&xInv2n, e)
	invCache[n].Store(v)
	return v
}
