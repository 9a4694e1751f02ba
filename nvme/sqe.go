package nvme

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// SQESize is the length of a submission queue entry.
const SQESize = 64

// CQESize is the length of a completion queue entry.
const CQESize = 16

// ErrShort is returned by the Parse functions for input shorter than the
// structure.
var ErrShort = errors.New("nvme: truncated")

var le = binary.LittleEndian

// Opcode is an NVMe command opcode. Admin and I/O opcodes overlap: the
// queue a command arrives on says which set it belongs to.
type Opcode uint8

// Admin command opcodes.
const (
	AdminGetLogPage   Opcode = 0x02
	AdminIdentify     Opcode = 0x06
	AdminAbort        Opcode = 0x08
	AdminSetFeatures  Opcode = 0x09
	AdminGetFeatures  Opcode = 0x0a
	AdminAsyncEvent   Opcode = 0x0c
	AdminKeepAlive    Opcode = 0x18
	OpcodeFabrics     Opcode = 0x7f // both queues: the fabrics command set (FCType)
	AdminSecuritySend Opcode = 0x81
	AdminSecurityRecv Opcode = 0x82
)

// NVM (I/O) command opcodes.
const (
	IOFlush       Opcode = 0x00
	IOWrite       Opcode = 0x01
	IORead        Opcode = 0x02
	IOWriteZeroes Opcode = 0x08
	IODSM         Opcode = 0x09
)

// DataDirection returns the data transfer of a command with this opcode:
// bits 1:0 of an NVMe opcode are 01 host-to-controller, 10
// controller-to-host (the Fabrics opcode 0x7F uses FCType instead).
func (o Opcode) DataDirection() Direction { return Direction(o & 3) }

// Direction is a command's data transfer direction.
type Direction uint8

// Directions.
const (
	DirNone          Direction = 0
	DirHostToCtrl    Direction = 1
	DirCtrlToHost    Direction = 2
	DirBidirectional Direction = 3
)

// FCType is the Fabrics command type (SQE byte 4 of opcode 0x7F).
type FCType uint8

// Fabrics command types.
const (
	FCPropertySet FCType = 0x00
	FCConnect     FCType = 0x01
	FCPropertyGet FCType = 0x04
	FCAuthSend    FCType = 0x05
	FCAuthRecv    FCType = 0x06
	FCDisconnect  FCType = 0x08
)

// DataDirection returns the data transfer of a Fabrics command type (bits
// 1:0 as for opcodes).
func (t FCType) DataDirection() Direction { return Direction(t & 3) }

const (
	sqeOpcode = 0
	sqeFlags  = 1
	sqeCID    = 2
	sqeNSID   = 4
	sqeMPTR   = 16
	sqeDPTR   = 24
)

// SQE flag bits (byte 1): PSDT (bits 7:6) selects SGLs; FUSE (bits 1:0)
// marks fused operations.
const (
	// FlagSGLMetabuf: PSDT 01, SGLs for data, metadata pointer is an address.
	FlagSGLMetabuf uint8 = 0x40
	// FlagSGLMetaSeg: PSDT 10, SGLs for data and metadata. Linux's fabrics
	// hosts send 0x40.
	FlagSGLMetaSeg uint8 = 0x80
	// FlagPSDTMask masks PSDT.
	FlagPSDTMask uint8 = 0xc0
	// FlagFuseMask masks FUSE (bits 1:0): 01b the first command of a
	// fused operation, 10b the second.
	FlagFuseMask uint8 = 0x03
)

// SQE is a view of a 64-byte submission queue entry. The caller
// guarantees len >= SQESize (ParseSQE checks).
type SQE []byte

// ParseSQE returns the SQE at the start of b, or ErrShort.
func ParseSQE(b []byte) (SQE, error) {
	if len(b) < SQESize {
		return nil, fmt.Errorf("%w: SQE of %d bytes", ErrShort, len(b))
	}
	return SQE(b[:SQESize:SQESize]), nil
}

// Opcode returns the command opcode (byte 0).
func (s SQE) Opcode() Opcode { return Opcode(s[sqeOpcode]) }

// SetOpcode sets the opcode.
func (s SQE) SetOpcode(o Opcode) { s[sqeOpcode] = byte(o) }

// Flags returns byte 1 (FUSE bits 1:0, PSDT bits 7:6).
func (s SQE) Flags() uint8 { return s[sqeFlags] }

// SetFlags sets byte 1.
func (s SQE) SetFlags(f uint8) { s[sqeFlags] = f }

// CID returns the command identifier.
func (s SQE) CID() uint16 { return le.Uint16(s[sqeCID:]) }

// SetCID sets the command identifier.
func (s SQE) SetCID(v uint16) { le.PutUint16(s[sqeCID:], v) }

// NSID returns the namespace identifier (dword 1).
func (s SQE) NSID() uint32 { return le.Uint32(s[sqeNSID:]) }

// SetNSID sets the namespace identifier.
func (s SQE) SetNSID(v uint32) { le.PutUint32(s[sqeNSID:], v) }

// FCType returns the Fabrics command type (byte 4; opcode 0x7F only).
func (s SQE) FCType() FCType { return FCType(s[sqeNSID]) }

// SetFCType sets the Fabrics command type.
func (s SQE) SetFCType(t FCType) { s[sqeNSID] = byte(t) }

// CDW returns command dword i (0..15).
func (s SQE) CDW(i int) uint32 { return le.Uint32(s[4*i:]) }

// SetCDW sets command dword i (0..15).
func (s SQE) SetCDW(i int, v uint32) { le.PutUint32(s[4*i:], v) }

// MPTR returns the metadata pointer (bytes 16..23).
func (s SQE) MPTR() uint64 { return le.Uint64(s[sqeMPTR:]) }

// SGL returns the view of the first SGL descriptor (DPTR, bytes 24..39).
func (s SQE) SGL() SGL { return SGL(s[sqeDPTR : sqeDPTR+SGLSize : sqeDPTR+SGLSize]) }

// SQEFields holds every field of an SQE, raw: the command-specific
// dwords are CDW10..CDW15 (and CDW2, CDW3), as the command's own field
// struct encodes them.
type SQEFields struct {
	Opcode     Opcode
	Flags      uint8
	CID        uint16
	NSID       uint32 // Fabrics: byte 4 is FCType, bytes 5..7 reserved
	CDW2, CDW3 uint32
	MPTR       uint64
	SGL        SGLFields
	CDW10      uint32
	CDW11      uint32
	CDW12      uint32
	CDW13      uint32
	CDW14      uint32
	CDW15      uint32
}

// Fields decodes every field.
func (s SQE) Fields() SQEFields {
	_ = s[SQESize-1]
	return SQEFields{Opcode: s.Opcode(), Flags: s.Flags(), CID: s.CID(), NSID: s.NSID(),
		CDW2: s.CDW(2), CDW3: s.CDW(3), MPTR: s.MPTR(), SGL: s.SGL().Fields(),
		CDW10: s.CDW(10), CDW11: s.CDW(11), CDW12: s.CDW(12), CDW13: s.CDW(13), CDW14: s.CDW(14), CDW15: s.CDW(15)}
}

// Encode writes all SQESize bytes from f.
func (s SQE) Encode(f *SQEFields) {
	_ = s[SQESize-1]
	s.SetOpcode(f.Opcode)
	s.SetFlags(f.Flags)
	s.SetCID(f.CID)
	s.SetNSID(f.NSID)
	s.SetCDW(2, f.CDW2)
	s.SetCDW(3, f.CDW3)
	le.PutUint64(s[sqeMPTR:], f.MPTR)
	s.SGL().Encode(&f.SGL)
	for i, v := range [6]uint32{f.CDW10, f.CDW11, f.CDW12, f.CDW13, f.CDW14, f.CDW15} {
		s.SetCDW(10+i, v)
	}
}

// CQE is a view of a 16-byte completion queue entry. The caller
// guarantees len >= CQESize (ParseCQE checks).
type CQE []byte

// ParseCQE returns the CQE at the start of b, or ErrShort.
func ParseCQE(b []byte) (CQE, error) {
	if len(b) < CQESize {
		return nil, fmt.Errorf("%w: CQE of %d bytes", ErrShort, len(b))
	}
	return CQE(b[:CQESize:CQESize]), nil
}

// Result returns the command-specific result (dwords 0 and 1).
func (c CQE) Result() uint64 { return le.Uint64(c[0:]) }

// SetResult sets the command-specific result.
func (c CQE) SetResult(v uint64) { le.PutUint64(c[0:], v) }

// SQHead returns the submission queue head pointer.
func (c CQE) SQHead() uint16 { return le.Uint16(c[8:]) }

// SQID returns the submission queue identifier.
func (c CQE) SQID() uint16 { return le.Uint16(c[10:]) }

// CID returns the identifier of the command this completes.
func (c CQE) CID() uint16 { return le.Uint16(c[12:]) }

// Status returns the status (without the phase bit).
func (c CQE) Status() Status { return Status(le.Uint16(c[14:]) >> 1) }

// Phase returns the phase tag (bit 0 of the status field).
func (c CQE) Phase() bool { return c[14]&1 != 0 }

// CQEFields holds every field of a CQE.
type CQEFields struct {
	Result uint64
	SQHead uint16
	SQID   uint16
	CID    uint16
	Status Status
	Phase  bool
}

// Fields decodes every field.
func (c CQE) Fields() CQEFields {
	_ = c[CQESize-1]
	return CQEFields{Result: c.Result(), SQHead: c.SQHead(), SQID: c.SQID(), CID: c.CID(), Status: c.Status(), Phase: c.Phase()}
}

// Encode writes all CQESize bytes from f.
func (c CQE) Encode(f *CQEFields) {
	_ = c[CQESize-1]
	c.SetResult(f.Result)
	le.PutUint16(c[8:], f.SQHead)
	le.PutUint16(c[10:], f.SQID)
	le.PutUint16(c[12:], f.CID)
	st := uint16(f.Status&0x7fff) << 1
	if f.Phase {
		st |= 1
	}
	le.PutUint16(c[14:], st)
}
