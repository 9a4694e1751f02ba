package nvme

import (
	"bytes"
	"fmt"
)

// ConnectDataSize is the length of the Connect command's data.
const ConnectDataSize = 1024

// NQNSize is the size of an NQN field (NUL padded).
const NQNSize = 256

// DiscoveryNQN is the well-known NQN of a discovery controller.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// DynamicCNTLID asks the admin Connect for any controller ID.
const DynamicCNTLID = 0xffff

// Connect is the Fabrics Connect command (opcode 0x7F, FCType 0x01):
// SQE bytes 40.. hold RecFmt, QID, SQSize, CATTR and KATO.
type Connect struct {
	RecFmt uint16
	QID    uint16
	SQSize uint16 // 0's based
	CATTR  uint8
	KATO   uint32 // keep-alive timeout, ms
}

// ConnectOf decodes a Connect command.
func ConnectOf(s SQE) Connect {
	return Connect{RecFmt: le.Uint16(s[40:]), QID: le.Uint16(s[42:]), SQSize: le.Uint16(s[44:]), CATTR: s[46], KATO: le.Uint32(s[48:])}
}

// Put writes the command-specific bytes of a Connect into s, and its
// opcode and FCType.
func (c *Connect) Put(s SQE) {
	s.SetOpcode(OpcodeFabrics)
	s.SetFCType(FCConnect)
	le.PutUint16(s[40:], c.RecFmt)
	le.PutUint16(s[42:], c.QID)
	le.PutUint16(s[44:], c.SQSize)
	s[46] = c.CATTR
	s[47] = 0
	le.PutUint32(s[48:], c.KATO)
}

// ConnectData is a view of the Connect command's 1024-byte data.
type ConnectData []byte

// ConnectDataFields are the Connect data's fields.
type ConnectDataFields struct {
	HostID  [16]byte
	CNTLID  uint16
	SubNQN  string
	HostNQN string
}

// ParseConnectData returns the data at the start of b, or ErrShort.
func ParseConnectData(b []byte) (ConnectData, error) {
	if len(b) < ConnectDataSize {
		return nil, fmt.Errorf("%w: Connect data of %d bytes", ErrShort, len(b))
	}
	return ConnectData(b[:ConnectDataSize:ConnectDataSize]), nil
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// putString writes s NUL-padded into b (truncated to len(b)-1).
func putString(b []byte, s string) {
	clear(b)
	copy(b[:len(b)-1], s)
}

// Fields decodes the data.
func (d ConnectData) Fields() ConnectDataFields {
	_ = d[ConnectDataSize-1]
	var f ConnectDataFields
	copy(f.HostID[:], d[0:16])
	f.CNTLID = le.Uint16(d[16:])
	f.SubNQN = cstring(d[256:512])
	f.HostNQN = cstring(d[512:768])
	return f
}

// Encode writes all ConnectDataSize bytes (NQNs NUL-padded).
func (d ConnectData) Encode(f *ConnectDataFields) {
	_ = d[ConnectDataSize-1]
	clear(d)
	copy(d[0:16], f.HostID[:])
	le.PutUint16(d[16:], f.CNTLID)
	putString(d[256:512], f.SubNQN)
	putString(d[512:768], f.HostNQN)
}

// Property offsets (controller registers reached by Property Get/Set).
const (
	PropCAP  = 0x00
	PropVS   = 0x08
	PropCC   = 0x14
	PropCSTS = 0x1c
	PropNSSR = 0x20
)

// CC and CSTS bits.
const (
	CCEnable       = 1
	CCShnMask      = 3 << 14
	CCShnNormal    = 1 << 14
	CCShnAbrupt    = 2 << 14
	CSTSReady      = 1
	CSTSFatal      = 1 << 1
	CSTSShstMask   = 3 << 2
	CSTSShstOccur  = 1 << 2
	CSTSShstCmplt  = 2 << 2
	CCIOSQES6IOCQ4 = 6<<16 | 4<<20 // the queue entry sizes a fabrics host writes
)

// Property is a Property Get or Set command: Attrib bit 0 selects an
// 8-byte property; Value is the Set's value.
type Property struct {
	Set    bool
	Attrib uint8
	Offset uint32
	Value  uint64
}

// PropertyOf decodes a Property Get/Set command.
func PropertyOf(s SQE) Property {
	return Property{Set: s.FCType() == FCPropertySet, Attrib: s[40], Offset: le.Uint32(s[44:]), Value: le.Uint64(s[48:])}
}

// Size8 reports an 8-byte property access.
func (p *Property) Size8() bool { return p.Attrib&1 != 0 }

// Put writes the opcode, FCType and command-specific bytes into s.
func (p *Property) Put(s SQE) {
	s.SetOpcode(OpcodeFabrics)
	if p.Set {
		s.SetFCType(FCPropertySet)
	} else {
		s.SetFCType(FCPropertyGet)
	}
	s[40] = p.Attrib
	le.PutUint32(s[44:], p.Offset)
	if p.Set {
		le.PutUint64(s[48:], p.Value)
	}
}

// CAP fields.
type CAP struct {
	MQES   uint16 // max queue entries, 0's based
	CQR    bool   // contiguous queues required
	TO     uint8  // ready timeout, 500 ms units
	CSSNVM bool   // NVM command set supported (bit 37)
	MPSMin uint8
	MPSMax uint8
}

// Value encodes the 64-bit CAP property.
func (c CAP) Value() uint64 {
	v := uint64(c.MQES) | uint64(c.TO)<<24 | uint64(c.MPSMin&0xf)<<48 | uint64(c.MPSMax&0xf)<<52
	if c.CQR {
		v |= 1 << 16
	}
	if c.CSSNVM {
		v |= 1 << 37
	}
	return v
}

// ParseCAP decodes the CAP property.
func ParseCAP(v uint64) CAP {
	return CAP{MQES: uint16(v), CQR: v&(1<<16) != 0, TO: uint8(v >> 24), CSSNVM: v&(1<<37) != 0,
		MPSMin: uint8(v>>48) & 0xf, MPSMax: uint8(v>>52) & 0xf}
}

// Version returns the VS property value for major.minor.tertiary.
func Version(major, minor, tertiary uint8) uint32 {
	return uint32(major)<<16 | uint32(minor)<<8 | uint32(tertiary)
}
