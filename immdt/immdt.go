// Package immdt implements the two 4-byte extension headers that follow the
// other headers of a packet: ImmDt (immediate data, on *_WITH_IMMEDIATE
// opcodes) and IETH (the R_Key to invalidate, on *_WITH_INVALIDATE opcodes).
//
// A wire package: it imports nothing of this module; packet and rocelayer
// build on it.
package immdt

import "encoding/binary"

// Size is the length of an ImmDt header in bytes.
const Size = 4

// IETHSize is the length of an IETH header in bytes.
const IETHSize = 4

// ImmDt is a view of an immediate data header. The caller guarantees len >= Size.
type ImmDt []byte

// Imm returns the immediate data: the 4 bytes as a big-endian uint32 (the
// value libibverbs hands out in network byte order as imm_data).
func (d ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(d) }

// SetImm sets the immediate data, written big-endian.
func (d ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(d, v) }

// IETH is a view of an Invalidate Extended Transport Header. The caller
// guarantees len >= IETHSize.
type IETH []byte

// RKey returns the remote key to invalidate.
func (e IETH) RKey() uint32 { return binary.BigEndian.Uint32(e) }

// SetRKey sets the remote key to invalidate.
func (e IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(e, v) }
