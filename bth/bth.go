// Package bth implements the InfiniBand Base Transport Header (BTH) as carried
// in RoCEv2 UDP payloads, the opcode table of the IB transport, 24-bit
// packet sequence number (PSN) arithmetic and the path MTU codes (MTU;
// package cm and transport use this type).
//
// The BTH view follows the style of gVisor's pkg/tcpip/header: a BTH is a
// []byte of at least Size bytes with getters and setters that never allocate.
//
// # Layering
//
// A wire package: it imports nothing of this module. packet and rocelayer
// build headers with it; transport uses the opcode table and PSN
// arithmetic directly.
package bth

import "encoding/binary"

// Size is the length of a BTH in bytes.
const Size = 12

// DefaultPKey is the default partition key (full membership, default partition).
const DefaultPKey = 0xffff

// Byte offsets and bit masks of the BTH fields.
const (
	opcodeOff = 0
	flagsOff  = 1 // SE, MigReq, PadCnt, TVer
	pkeyOff   = 2
	ecnOff    = 4 // FECN, BECN, reserved
	destQPOff = 5 // 3 bytes
	ackReqOff = 8 // AckReq, reserved
	psnOff    = 9 // 3 bytes

	seBit      = 0x80
	migReqBit  = 0x40
	padMask    = 0x30
	padShift   = 4
	tverMask   = 0x0f
	fecnBit    = 0x80
	becnBit    = 0x40
	ackReqBit  = 0x80
	qpnMask    = 0xffffff
	uint24Mask = 0xffffff
)

// BTH is a view of a Base Transport Header. The caller guarantees len >= Size.
type BTH []byte

// Fields holds the values of every BTH field, for Encode and Fields.
type Fields struct {
	// Opcode is the transport opcode.
	Opcode Opcode
	// SolicitedEvent is the SE bit.
	SolicitedEvent bool
	// MigReq is the migration request bit (M).
	MigReq bool
	// PadCount is the number of pad bytes (0..3) after the payload.
	PadCount uint8
	// TVer is the transport header version (0 for RoCEv2).
	TVer uint8
	// PKey is the partition key.
	PKey uint16
	// FECN is the forward explicit congestion notification bit.
	FECN bool
	// BECN is the backward explicit congestion notification bit.
	BECN bool
	// DestQP is the 24-bit destination queue pair number.
	DestQP uint32
	// AckReq is the acknowledge request bit (A).
	AckReq bool
	// PSN is the 24-bit packet sequence number.
	PSN PSN
}

func setBit(b *byte, mask byte, v bool) {
	if v {
		*b |= mask
	} else {
		*b &^= mask
	}
}

func get24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

func put24(b []byte, v uint32) {
	_ = b[2]
	b[0] = byte(v >> 16)
	b[1] = byte(v >> 8)
	b[2] = byte(v)
}

// Opcode returns the opcode field.
func (b BTH) Opcode() Opcode { return Opcode(b[opcodeOff]) }

// SetOpcode sets the opcode field.
func (b BTH) SetOpcode(o Opcode) { b[opcodeOff] = byte(o) }

// SolicitedEvent reports whether the solicited event (SE) bit is set.
func (b BTH) SolicitedEvent() bool { return b[flagsOff]&seBit != 0 }

// SetSolicitedEvent sets or clears the solicited event (SE) bit.
func (b BTH) SetSolicitedEvent(v bool) { setBit(&b[flagsOff], seBit, v) }

// MigReq reports whether the migration request (M) bit is set.
func (b BTH) MigReq() bool { return b[flagsOff]&migReqBit != 0 }

// SetMigReq sets or clears the migration request (M) bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[flagsOff], migReqBit, v) }

// PadCount returns the pad count (0..3): the number of bytes that pad the
// payload to a multiple of 4.
func (b BTH) PadCount() int { return int(b[flagsOff]&padMask) >> padShift }

// SetPadCount sets the pad count; only the low two bits of n are used.
func (b BTH) SetPadCount(n int) {
	b[flagsOff] = b[flagsOff]&^padMask | byte(n&3)<<padShift
}

// TVer returns the 4-bit transport header version.
func (b BTH) TVer() uint8 { return b[flagsOff] & tverMask }

// SetTVer sets the 4-bit transport header version; only the low 4 bits of v are used.
func (b BTH) SetTVer(v uint8) { b[flagsOff] = b[flagsOff]&^tverMask | v&tverMask }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[pkeyOff:]) }

// SetPKey sets the partition key.
func (b BTH) SetPKey(v uint16) { binary.BigEndian.PutUint16(b[pkeyOff:], v) }

// FECN reports whether the forward explicit congestion notification bit is set.
func (b BTH) FECN() bool { return b[ecnOff]&fecnBit != 0 }

// SetFECN sets or clears the forward explicit congestion notification bit.
func (b BTH) SetFECN(v bool) { setBit(&b[ecnOff], fecnBit, v) }

// BECN reports whether the backward explicit congestion notification bit is set.
func (b BTH) BECN() bool { return b[ecnOff]&becnBit != 0 }

// SetBECN sets or clears the backward explicit congestion notification bit.
func (b BTH) SetBECN(v bool) { setBit(&b[ecnOff], becnBit, v) }

// DestQP returns the 24-bit destination queue pair number.
func (b BTH) DestQP() uint32 { return get24(b[destQPOff:]) }

// SetDestQP sets the destination queue pair number; only the low 24 bits are used.
func (b BTH) SetDestQP(v uint32) { put24(b[destQPOff:], v&qpnMask) }

// AckReq reports whether the acknowledge request (A) bit is set.
func (b BTH) AckReq() bool { return b[ackReqOff]&ackReqBit != 0 }

// SetAckReq sets or clears the acknowledge request (A) bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[ackReqOff], ackReqBit, v) }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() PSN { return PSN(get24(b[psnOff:])) }

// SetPSN sets the packet sequence number; only the low 24 bits are used.
func (b BTH) SetPSN(p PSN) { put24(b[psnOff:], uint32(p)&uint24Mask) }

// Encode writes all Size bytes of the BTH from f. Reserved bits are written
// as zero; out-of-range values are masked to their field width. The header
// is assembled in registers and written with two stores (bytes 0..7 and
// 8..11).
func (b BTH) Encode(f *Fields) {
	_ = b[Size-1]
	fl := uint64(f.PadCount&3)<<padShift | uint64(f.TVer&tverMask) |
		uint64(b2u8(f.SolicitedEvent))<<7 | uint64(b2u8(f.MigReq))<<6
	ecn := uint64(b2u8(f.FECN))<<7 | uint64(b2u8(f.BECN))<<6
	binary.BigEndian.PutUint64(b, uint64(f.Opcode)<<56|fl<<48|uint64(f.PKey)<<32|ecn<<24|uint64(f.DestQP&qpnMask))
	binary.BigEndian.PutUint32(b[ackReqOff:], uint32(b2u8(f.AckReq))<<31|uint32(f.PSN)&uint24Mask)
}

// b2u8 returns 1 for true and 0 for false, without a branch.
func b2u8(v bool) uint8 {
	var x uint8
	if v {
		x = 1
	}
	return x
}

// Fields decodes every BTH field.
func (b BTH) Fields() Fields {
	_ = b[Size-1]
	return Fields{
		Opcode:         b.Opcode(),
		SolicitedEvent: b.SolicitedEvent(),
		MigReq:         b.MigReq(),
		PadCount:       uint8(b.PadCount()),
		TVer:           b.TVer(),
		PKey:           b.PKey(),
		FECN:           b.FECN(),
		BECN:           b.BECN(),
		DestQP:         b.DestQP(),
		AckReq:         b.AckReq(),
		PSN:            b.PSN(),
	}
}

// PadFor returns the pad count for a payload of payloadLen bytes: the number
// of zero bytes (0..3) that bring it to a multiple of 4.
func PadFor(payloadLen int) int { return -payloadLen & 3 }
