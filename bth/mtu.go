package bth

import "strconv"

// MTU is an InfiniBand path MTU code: the values of libibverbs' enum
// ibv_mtu, which are also the 4-bit codes CM messages carry (package cm's
// MTU is this type). The MTU bounds the payload of each packet of a
// message (the BTH and the other headers come on top).
type MTU uint8

// Path MTU codes; 0 and 6..15 are reserved.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for a reserved code.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of the five defined codes.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// MTUFromBytes returns the code of an MTU of n bytes (256, 512, 1024, 2048
// or 4096) and whether n is one of them.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// String returns "1024" for MTU1024, or "MTU(7)" for a reserved code.
func (m MTU) String() string {
	if !m.Valid() {
		return "MTU(" + strconv.Itoa(int(m)) + ")"
	}
	return strconv.Itoa(m.Bytes())
}
