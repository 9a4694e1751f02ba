// Package deth implements the Datagram Extended Transport Header (DETH)
// carried by UD packets.
//
// A wire package: it imports nothing of this module; packet and rocelayer
// build on it.
package deth

import "encoding/binary"

// Size is the length of a DETH in bytes.
const Size = 8

const (
	qkeyOff  = 0
	srcQPOff = 5 // byte 4 is reserved
	qpMask   = 0xffffff
)

// DETH is a view of a Datagram Extended Transport Header. The caller
// guarantees len >= Size.
type DETH []byte

// Fields holds the values of every DETH field.
type Fields struct {
	// QKey is the queue key.
	QKey uint32
	// SrcQP is the 24-bit source queue pair number.
	SrcQP uint32
}

// QKey returns the queue key.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d[qkeyOff:]) }

// SetQKey sets the queue key.
func (d DETH) SetQKey(v uint32) { binary.BigEndian.PutUint32(d[qkeyOff:], v) }

// SrcQP returns the 24-bit source queue pair number.
func (d DETH) SrcQP() uint32 {
	_ = d[Size-1]
	return uint32(d[srcQPOff])<<16 | uint32(d[srcQPOff+1])<<8 | uint32(d[srcQPOff+2])
}

// SetSrcQP sets the source queue pair number; only the low 24 bits are used.
func (d DETH) SetSrcQP(v uint32) {
	_ = d[Size-1]
	d[srcQPOff] = byte(v >> 16)
	d[srcQPOff+1] = byte(v >> 8)
	d[srcQPOff+2] = byte(v)
}

// Encode writes all Size bytes of the DETH from f; the reserved byte is zero.
func (d DETH) Encode(f *Fields) {
	_ = d[Size-1]
	d.SetQKey(f.QKey)
	d[4] = 0
	d.SetSrcQP(f.SrcQP & qpMask)
}

// Fields decodes every DETH field.
func (d DETH) Fields() Fields { return Fields{QKey: d.QKey(), SrcQP: d.SrcQP()} }
