package nvme

import "fmt"

// SGLSize is the length of an SGL descriptor.
const SGLSize = 16

// SGL descriptor types (byte 15, bits 7:4).
const (
	SGLTypeDataBlock      = 0x0
	SGLTypeBitBucket      = 0x1
	SGLTypeSegment        = 0x2
	SGLTypeLastSegment    = 0x3
	SGLTypeKeyedDataBlock = 0x4
)

// SGL descriptor subtypes (byte 15, bits 3:0).
const (
	// SGLSubAddress: the address is a host memory address.
	SGLSubAddress = 0x0
	// SGLSubOffset: the address is an offset into the capsule's data
	// (in-capsule data; NVMe-oF).
	SGLSubOffset = 0x1
	// SGLSubInvalidate: keyed data block whose key the controller should
	// invalidate remotely (RDMA SEND with Invalidate) when it answers.
	SGLSubInvalidate = 0xf
)

// SGL descriptor identifiers Linux's nvme-rdma host sends.
const (
	// SGLKeyed is a keyed data block (0x40); with length 0 and key 0 it
	// says "no data".
	SGLKeyed = SGLTypeKeyedDataBlock<<4 | SGLSubAddress
	// SGLKeyedInvalidate is a keyed data block to be invalidated (0x4F).
	SGLKeyedInvalidate = SGLTypeKeyedDataBlock<<4 | SGLSubInvalidate
	// SGLInCapsule is a data block at an offset into the capsule (0x01).
	SGLInCapsule = SGLTypeDataBlock<<4 | SGLSubOffset
)

// MaxKeyedLength is the largest length a keyed data block can carry (24 bits).
const MaxKeyedLength = 1<<24 - 1

// SGL is a view of a 16-byte SGL descriptor. The caller guarantees
// len >= SGLSize.
type SGL []byte

// Addr returns the address (or, subtype offset, the offset) field.
func (g SGL) Addr() uint64 { return le.Uint64(g[0:]) }

// ID returns the descriptor identifier (type << 4 | subtype).
func (g SGL) ID() uint8 { return g[15] }

// Type returns the descriptor type.
func (g SGL) Type() uint8 { return g[15] >> 4 }

// Subtype returns the descriptor subtype.
func (g SGL) Subtype() uint8 { return g[15] & 0xf }

// Keyed reports a keyed data block.
func (g SGL) Keyed() bool { return g.Type() == SGLTypeKeyedDataBlock }

// Length returns the length: 24 bits in a keyed data block, 32 otherwise.
func (g SGL) Length() uint32 {
	if g.Keyed() {
		return uint32(g[8]) | uint32(g[9])<<8 | uint32(g[10])<<16
	}
	return le.Uint32(g[8:])
}

// Key returns the key of a keyed data block (0 for other types).
func (g SGL) Key() uint32 {
	if g.Keyed() {
		return le.Uint32(g[11:])
	}
	return 0
}

// SGLFields holds an SGL descriptor's fields. For types other than a
// keyed data block, Key is not encoded and Reserved holds bytes 12..14;
// for a keyed data block Reserved must be zero.
type SGLFields struct {
	Type, Subtype uint8
	Addr          uint64
	Length        uint32
	Key           uint32
	Reserved      [3]byte
}

// Fields decodes the descriptor.
func (g SGL) Fields() SGLFields {
	_ = g[SGLSize-1]
	f := SGLFields{Type: g.Type(), Subtype: g.Subtype(), Addr: g.Addr(), Length: g.Length(), Key: g.Key()}
	if !g.Keyed() {
		copy(f.Reserved[:], g[12:15])
	}
	return f
}

// Encode writes all SGLSize bytes from f. A keyed length above
// MaxKeyedLength is truncated to 24 bits (check with Validate).
func (g SGL) Encode(f *SGLFields) {
	_ = g[SGLSize-1]
	le.PutUint64(g[0:], f.Addr)
	if f.Type == SGLTypeKeyedDataBlock {
		g[8], g[9], g[10] = byte(f.Length), byte(f.Length>>8), byte(f.Length>>16)
		le.PutUint32(g[11:], f.Key)
	} else {
		le.PutUint32(g[8:], f.Length)
		copy(g[12:15], f.Reserved[:])
	}
	g[15] = f.Type<<4 | f.Subtype&0xf
}

// Validate reports fields that do not fit the wire.
func (f *SGLFields) Validate() error {
	if f.Type > 0xf || f.Subtype > 0xf {
		return fmt.Errorf("nvme: SGL type %#x subtype %#x", f.Type, f.Subtype)
	}
	if f.Type == SGLTypeKeyedDataBlock && f.Length > MaxKeyedLength {
		return fmt.Errorf("nvme: SGL keyed length %d exceeds 24 bits", f.Length)
	}
	return nil
}

// Keyed returns the fields of a keyed data block for (addr, length, key),
// with the invalidate subtype when inv is set.
func Keyed(addr uint64, length, key uint32, inv bool) SGLFields {
	f := SGLFields{Type: SGLTypeKeyedDataBlock, Addr: addr, Length: length, Key: key}
	if inv {
		f.Subtype = SGLSubInvalidate
	}
	return f
}

// InCapsule returns the fields of an in-capsule data block of length
// bytes at offset off into the capsule's data.
func InCapsule(off uint64, length uint32) SGLFields {
	return SGLFields{Type: SGLTypeDataBlock, Subtype: SGLSubOffset, Addr: off, Length: length}
}
