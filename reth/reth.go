// Package reth implements the RDMA Extended Transport Header (RETH) carried by
// RDMA WRITE first/only packets and RDMA READ requests.
//
// A wire package: it imports nothing of this module; packet and rocelayer
// build on it.
package reth

import "encoding/binary"

// Size is the length of a RETH in bytes.
const Size = 16

const (
	vaOff     = 0
	rkeyOff   = 8
	dmaLenOff = 12
)

// RETH is a view of an RDMA Extended Transport Header. The caller guarantees
// len >= Size.
type RETH []byte

// Fields holds the values of every RETH field.
type Fields struct {
	// VA is the remote virtual address.
	VA uint64
	// RKey is the remote key.
	RKey uint32
	// DMALength is the length in bytes of the whole RDMA operation.
	DMALength uint32
}

// VA returns the remote virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r[vaOff:]) }

// SetVA sets the remote virtual address.
func (r RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(r[vaOff:], v) }

// RKey returns the remote key.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[rkeyOff:]) }

// SetRKey sets the remote key.
func (r RETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(r[rkeyOff:], v) }

// DMALength returns the DMA length of the operation in bytes.
func (r RETH) DMALength() uint32 { return binary.BigEndian.Uint32(r[dmaLenOff:]) }

// SetDMALength sets the DMA length of the operation in bytes.
func (r RETH) SetDMALength(v uint32) { binary.BigEndian.PutUint32(r[dmaLenOff:], v) }

// Encode writes all Size bytes of the RETH from f.
func (r RETH) Encode(f *Fields) {
	_ = r[Size-1]
	r.SetVA(f.VA)
	r.SetRKey(f.RKey)
	r.SetDMALength(f.DMALength)
}

// Fields decodes every RETH field.
func (r RETH) Fields() Fields {
	_ = r[Size-1]
	return Fields{VA: r.VA(), RKey: r.RKey(), DMALength: r.DMALength()}
}
