package bth

// PSN is a 24-bit packet sequence number. Values produced by this package are
// always masked to 24 bits.
type PSN uint32

// PSNMask masks a value to the 24 bits of a PSN.
const PSNMask = 0xffffff

// Add returns p+n modulo 2^24; n may be negative.
func (p PSN) Add(n int) PSN { return PSN((uint32(p) + uint32(n)) & PSNMask) }

// Diff returns the signed distance p-q in the 24-bit sequence space: the
// result is in [-2^23, 2^23). A negative result means p is behind q.
func (p PSN) Diff(q PSN) int32 { return int32((uint32(p)-uint32(q))<<8) >> 8 }

// Before reports whether p lies in the half of the sequence space behind q.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p lies in the half of the sequence space ahead of q
// (p != q).
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }

const hexDigits = "0123456789abcdef"

// String formats p as six lower-case hex digits with a 0x prefix, e.g. "0x94b760".
func (p PSN) String() string {
	v := uint32(p) & PSNMask
	var buf [8]byte
	buf[0], buf[1] = '0', 'x'
	for i := 7; i >= 2; i-- {
		buf[i] = hexDigits[v&0xf]
		v >>= 4
	}
	return string(buf[:])
}
