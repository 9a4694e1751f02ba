// Package atomiceth implements the Atomic Extended Transport Header
// (AtomicETH) carried by COMPARE_SWAP and FETCH_ADD requests.
//
// A wire package: it imports nothing of this module; packet and rocelayer
// build on it.
package atomiceth

import "encoding/binary"

// Size is the length of an AtomicETH in bytes.
const Size = 28

const (
	vaOff      = 0
	rkeyOff    = 8
	swapAddOff = 12
	compareOff = 20
)

// AtomicETH is a view of an Atomic Extended Transport Header. The caller
// guarantees len >= Size.
type AtomicETH []byte

// Fields holds the values of every AtomicETH field.
type Fields struct {
	// VA is the remote virtual address of the 8-byte target.
	VA uint64
	// RKey is the remote key.
	RKey uint32
	// SwapAdd is the swap value (COMPARE_SWAP) or the addend (FETCH_ADD).
	SwapAdd uint64
	// Compare is the compare value (COMPARE_SWAP; ignored by FETCH_ADD).
	Compare uint64
}

// VA returns the remote virtual address.
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a[vaOff:]) }

// SetVA sets the remote virtual address.
func (a AtomicETH) SetVA(v uint64) { binary.BigEndian.PutUint64(a[vaOff:], v) }

// RKey returns the remote key.
func (a AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(a[rkeyOff:]) }

// SetRKey sets the remote key.
func (a AtomicETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(a[rkeyOff:], v) }

// SwapAdd returns the swap value or addend.
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[swapAddOff:]) }

// SetSwapAdd sets the swap value or addend.
func (a AtomicETH) SetSwapAdd(v uint64) { binary.BigEndian.PutUint64(a[swapAddOff:], v) }

// Compare returns the compare value.
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[compareOff:]) }

// SetCompare sets the compare value.
func (a AtomicETH) SetCompare(v uint64) { binary.BigEndian.PutUint64(a[compareOff:], v) }

// Encode writes all Size bytes of the AtomicETH from f.
func (a AtomicETH) Encode(f *Fields) {
	_ = a[Size-1]
	a.SetVA(f.VA)
	a.SetRKey(f.RKey)
	a.SetSwapAdd(f.SwapAdd)
	a.SetCompare(f.Compare)
}

// Fields decodes every AtomicETH field.
func (a AtomicETH) Fields() Fields {
	_ = a[Size-1]
	return Fields{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
}
