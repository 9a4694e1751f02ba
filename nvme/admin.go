package nvme

import "fmt"

// IdentifySize is the length of every Identify data structure.
const IdentifySize = 4096

// Identify CNS values.
const (
	CNSNamespace       = 0x00
	CNSController      = 0x01
	CNSActiveNSList    = 0x02
	CNSNSDescList      = 0x03
	CNSCSController    = 0x06
	CNSAllocatedNSList = 0x10
)

// Identify is an Identify command: CNS and CNTID in CDW10, NSID.
type Identify struct {
	CNS   uint8
	CNTID uint16
	NSID  uint32
	CSI   uint8 // CDW11 bits 31:24
}

// IdentifyOf decodes an Identify command.
func IdentifyOf(s SQE) Identify {
	return Identify{CNS: uint8(s.CDW(10)), CNTID: uint16(s.CDW(10) >> 16), NSID: s.NSID(), CSI: uint8(s.CDW(11) >> 24)}
}

// Put writes the opcode and command fields into s.
func (c *Identify) Put(s SQE) {
	s.SetOpcode(AdminIdentify)
	s.SetNSID(c.NSID)
	s.SetCDW(10, uint32(c.CNS)|uint32(c.CNTID)<<16)
	s.SetCDW(11, uint32(c.CSI)<<24)
}

// Feature identifiers.
const (
	FeatArbitration = 0x01
	FeatPowerMgmt   = 0x02
	FeatVolatileWC  = 0x06
	FeatNumQueues   = 0x07
	FeatIRQCoalesce = 0x08
	FeatAsyncEvent  = 0x0b
	FeatKATO        = 0x0f
	FeatHostID      = 0x81
)

// Features is a Get or Set Features command: FID in CDW10 bits 7:0 (Set:
// SV bit 31; Get: SEL bits 10:8), the value in CDW11.
type Features struct {
	FID   uint8
	SV    bool  // Set: save
	SEL   uint8 // Get: select (current, default, saved, capabilities)
	Value uint32
}

// FeaturesOf decodes a Get/Set Features command.
func FeaturesOf(s SQE) Features {
	d := s.CDW(10)
	return Features{FID: uint8(d), SV: d&(1<<31) != 0, SEL: uint8(d>>8) & 7, Value: s.CDW(11)}
}

// Put writes the command fields into s with opcode op (AdminGetFeatures
// or AdminSetFeatures).
func (f *Features) Put(s SQE, op Opcode) {
	s.SetOpcode(op)
	d := uint32(f.FID) | uint32(f.SEL&7)<<8
	if f.SV {
		d |= 1 << 31
	}
	s.SetCDW(10, d)
	s.SetCDW(11, f.Value)
}

// NumQueues returns the Number of Queues value (CDW11 or completion
// DW0) for n submission and n completion I/O queues (0's based).
func NumQueues(nsq, ncq uint16) uint32 { return uint32(nsq-1) | uint32(ncq-1)<<16 }

// SplitNumQueues returns the queue counts (1's based) in a Number of
// Queues value.
func SplitNumQueues(v uint32) (nsq, ncq int) { return int(uint16(v)) + 1, int(uint16(v>>16)) + 1 }

// Log page identifiers.
const (
	LogError         = 0x01
	LogSMART         = 0x02
	LogFWSlot        = 0x03
	LogChangedNS     = 0x04
	LogCmdEffects    = 0x05
	LogANA           = 0x0c
	LogDiscovery     = 0x70
	LogHostDiscovery = 0x71
)

// GetLogPage is a Get Log Page command.
type GetLogPage struct {
	LID    uint8
	LSP    uint8
	RAE    bool
	NumD   uint32 // number of dwords (1's based; decoded, 0 means 2^32: NUMD all ones)
	Offset uint64 // byte offset (LPOL/LPOU)
	NSID   uint32
}

// GetLogPageOf decodes a Get Log Page command.
func GetLogPageOf(s SQE) GetLogPage {
	d10, d11 := s.CDW(10), s.CDW(11)
	return GetLogPage{LID: uint8(d10), LSP: uint8(d10>>8) & 0x7f, RAE: d10&(1<<15) != 0,
		NumD: (d10>>16 | (d11&0xffff)<<16) + 1, Offset: uint64(s.CDW(12)) | uint64(s.CDW(13))<<32, NSID: s.NSID()}
}

// Put writes the command fields into s (NumD must be at least 1).
func (g *GetLogPage) Put(s SQE) {
	s.SetOpcode(AdminGetLogPage)
	s.SetNSID(g.NSID)
	n := g.NumD - 1
	d10 := uint32(g.LID) | uint32(g.LSP&0x7f)<<8 | (n&0xffff)<<16
	if g.RAE {
		d10 |= 1 << 15
	}
	s.SetCDW(10, d10)
	s.SetCDW(11, n>>16)
	s.SetCDW(12, uint32(g.Offset))
	s.SetCDW(13, uint32(g.Offset>>32))
}

// Asynchronous event types (completion DW0 bits 2:0).
const (
	AEError  = 0
	AESMART  = 1
	AENotice = 2
)

// AsyncEvent is the completion result of an Asynchronous Event Request.
type AsyncEvent struct {
	Type uint8
	Info uint8
	LID  uint8
}

// Result encodes the event as completion DW0.
func (e AsyncEvent) Result() uint64 {
	return uint64(e.Type&7) | uint64(e.Info)<<8 | uint64(e.LID)<<16
}

// ParseAsyncEvent decodes completion DW0 of an AER.
func ParseAsyncEvent(r uint64) AsyncEvent {
	return AsyncEvent{Type: uint8(r) & 7, Info: uint8(r >> 8), LID: uint8(r >> 16)}
}

// SGLS bits of Identify Controller.
const (
	SGLSSupported = 1 << 0
	SGLSKeyed     = 1 << 2
	SGLSOffset    = 1 << 20
)

// ONCS bits.
const (
	ONCSDSM         = 1 << 2
	ONCSWriteZeroes = 1 << 3
)

// CTRATT bits.
const (
	CtrattHostID128 = 1 << 0
	CtrattTBKAS     = 1 << 6
)

// Controller types (Identify Controller CNTRLTYPE, byte 111; 0 is
// "not reported", which controllers of NVMe 1.3 and before may say).
const (
	CntrlTypeIO        = 1
	CntrlTypeDiscovery = 2
)

// IdentifyController is a view of the 4096-byte Identify Controller data.
type IdentifyController []byte

// IdentifyControllerFields holds the fields a fabrics host and target use;
// Encode zeroes the rest.
type IdentifyControllerFields struct {
	VID, SSVID uint16
	SN         string // 20
	MN         string // 40
	FR         string // 8
	RAB        uint8
	CMIC       uint8
	MDTS       uint8
	CNTLID     uint16
	VER        uint32
	OAES       uint32
	CTRATT     uint32
	CNTRLTYPE  uint8
	OACS       uint16
	ACL        uint8
	AERL       uint8
	FRMW       uint8
	LPA        uint8
	ELPE       uint8
	KAS        uint16
	SQES, CQES uint8
	MAXCMD     uint16
	NN         uint32
	ONCS       uint16
	VWC        uint8
	SGLS       uint32
	SubNQN     string
	IOCCSZ     uint32
	IORCSZ     uint32
	ICDOFF     uint16
	FCATT      uint8
	MSDBD      uint8
	OFCS       uint16
	PSD0       [32]byte
}

// ParseIdentifyController returns the structure at the start of b, or ErrShort.
func ParseIdentifyController(b []byte) (IdentifyController, error) {
	if len(b) < IdentifySize {
		return nil, fmt.Errorf("%w: Identify Controller of %d bytes", ErrShort, len(b))
	}
	return IdentifyController(b[:IdentifySize:IdentifySize]), nil
}

// spaceString decodes an ASCII field padded with spaces (or NULs).
func spaceString(b []byte) string {
	b = b[:len(b)]
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return string(b)
}

// putSpace writes s space-padded into b.
func putSpace(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

// Fields decodes the structure's named fields.
func (c IdentifyController) Fields() IdentifyControllerFields {
	_ = c[IdentifySize-1]
	f := IdentifyControllerFields{VID: le.Uint16(c[0:]), SSVID: le.Uint16(c[2:]), SN: spaceString(c[4:24]),
		MN: spaceString(c[24:64]), FR: spaceString(c[64:72]), RAB: c[72], CMIC: c[76], MDTS: c[77],
		CNTLID: le.Uint16(c[78:]), VER: le.Uint32(c[80:]), OAES: le.Uint32(c[92:]), CTRATT: le.Uint32(c[96:]),
		CNTRLTYPE: c[111], OACS: le.Uint16(c[256:]), ACL: c[258], AERL: c[259], FRMW: c[260], LPA: c[261], ELPE: c[262],
		KAS: le.Uint16(c[320:]), SQES: c[512], CQES: c[513], MAXCMD: le.Uint16(c[514:]), NN: le.Uint32(c[516:]),
		ONCS: le.Uint16(c[520:]), VWC: c[525], SGLS: le.Uint32(c[536:]), SubNQN: cstring(c[768:1024]),
		IOCCSZ: le.Uint32(c[1792:]), IORCSZ: le.Uint32(c[1796:]), ICDOFF: le.Uint16(c[1800:]), FCATT: c[1802],
		MSDBD: c[1803], OFCS: le.Uint16(c[1804:])}
	copy(f.PSD0[:], c[2048:2080])
	return f
}

// Encode writes all IdentifySize bytes; fields f does not name are zero.
func (c IdentifyController) Encode(f *IdentifyControllerFields) {
	_ = c[IdentifySize-1]
	clear(c)
	le.PutUint16(c[0:], f.VID)
	le.PutUint16(c[2:], f.SSVID)
	putSpace(c[4:24], f.SN)
	putSpace(c[24:64], f.MN)
	putSpace(c[64:72], f.FR)
	c[72], c[76], c[77] = f.RAB, f.CMIC, f.MDTS
	le.PutUint16(c[78:], f.CNTLID)
	le.PutUint32(c[80:], f.VER)
	le.PutUint32(c[92:], f.OAES)
	le.PutUint32(c[96:], f.CTRATT)
	c[111] = f.CNTRLTYPE
	le.PutUint16(c[256:], f.OACS)
	c[258], c[259], c[260], c[261], c[262] = f.ACL, f.AERL, f.FRMW, f.LPA, f.ELPE
	le.PutUint16(c[320:], f.KAS)
	c[512], c[513] = f.SQES, f.CQES
	le.PutUint16(c[514:], f.MAXCMD)
	le.PutUint32(c[516:], f.NN)
	le.PutUint16(c[520:], f.ONCS)
	c[525] = f.VWC
	le.PutUint32(c[536:], f.SGLS)
	putString(c[768:1024], f.SubNQN)
	le.PutUint32(c[1792:], f.IOCCSZ)
	le.PutUint32(c[1796:], f.IORCSZ)
	le.PutUint16(c[1800:], f.ICDOFF)
	c[1802], c[1803] = f.FCATT, f.MSDBD
	le.PutUint16(c[1804:], f.OFCS)
	copy(c[2048:2080], f.PSD0[:])
}

// IdentifyNamespace is a view of the 4096-byte Identify Namespace data.
type IdentifyNamespace []byte

// LBAFormat is one LBA format descriptor.
type LBAFormat struct {
	MS    uint16 // metadata size
	LBADS uint8  // log2 of the LBA data size
	RP    uint8  // relative performance
}

// IdentifyNamespaceFields holds the fields of Identify Namespace a
// fabrics target fills; Encode zeroes the rest.
type IdentifyNamespaceFields struct {
	NSZE, NCAP, NUSE uint64
	NSFEAT           uint8
	NLBAF            uint8 // number of LBA formats, 0's based
	FLBAS            uint8
	NMIC             uint8
	NSATTR           uint8 // bit 0: write protected
	NGUID            [16]byte
	EUI64            [8]byte
	LBAF             [16]LBAFormat
}

// ParseIdentifyNamespace returns the structure at the start of b, or ErrShort.
func ParseIdentifyNamespace(b []byte) (IdentifyNamespace, error) {
	if len(b) < IdentifySize {
		return nil, fmt.Errorf("%w: Identify Namespace of %d bytes", ErrShort, len(b))
	}
	return IdentifyNamespace(b[:IdentifySize:IdentifySize]), nil
}

// Fields decodes the named fields.
func (n IdentifyNamespace) Fields() IdentifyNamespaceFields {
	_ = n[IdentifySize-1]
	f := IdentifyNamespaceFields{NSZE: le.Uint64(n[0:]), NCAP: le.Uint64(n[8:]), NUSE: le.Uint64(n[16:]),
		NSFEAT: n[24], NLBAF: n[25], FLBAS: n[26], NMIC: n[30], NSATTR: n[99]}
	copy(f.NGUID[:], n[104:120])
	copy(f.EUI64[:], n[120:128])
	for i := range f.LBAF {
		o := 128 + 4*i
		f.LBAF[i] = LBAFormat{MS: le.Uint16(n[o:]), LBADS: n[o+2], RP: n[o+3] & 3}
	}
	return f
}

// Encode writes all IdentifySize bytes; fields f does not name are zero.
func (n IdentifyNamespace) Encode(f *IdentifyNamespaceFields) {
	_ = n[IdentifySize-1]
	clear(n)
	le.PutUint64(n[0:], f.NSZE)
	le.PutUint64(n[8:], f.NCAP)
	le.PutUint64(n[16:], f.NUSE)
	n[24], n[25], n[26], n[30], n[99] = f.NSFEAT, f.NLBAF, f.FLBAS, f.NMIC, f.NSATTR
	copy(n[104:120], f.NGUID[:])
	copy(n[120:128], f.EUI64[:])
	for i, l := range f.LBAF {
		o := 128 + 4*i
		le.PutUint16(n[o:], l.MS)
		n[o+2], n[o+3] = l.LBADS, l.RP&3
	}
}

// BlockShift returns log2 of the block size of the formatted LBA format.
func (f *IdentifyNamespaceFields) BlockShift() uint8 { return f.LBAF[f.FLBAS&0xf].LBADS }

// ActiveNSList returns the NSIDs of an active namespace list (up to 1024
// ascending NSIDs, ended by the first zero).
func ActiveNSList(b []byte) []uint32 {
	var out []uint32
	for i := 0; i+4 <= len(b) && i < IdentifySize; i += 4 {
		v := le.Uint32(b[i:])
		if v == 0 {
			break
		}
		out = append(out, v)
	}
	return out
}

// PutActiveNSList writes nsids (at most 1024) as an active namespace list
// into b (IdentifySize bytes, zero-filled).
func PutActiveNSList(b []byte, nsids []uint32) {
	clear(b[:IdentifySize])
	for i, v := range nsids {
		if i >= IdentifySize/4 {
			break
		}
		le.PutUint32(b[4*i:], v)
	}
}

// Namespace identifier types of the descriptor list.
const (
	NIDTEUI64 = 1
	NIDTNGUID = 2
	NIDTUUID  = 3
	NIDTCSI   = 4
)

// NSDescriptor is one namespace identification descriptor.
type NSDescriptor struct {
	Type uint8
	ID   []byte
}

// NSDescriptors decodes a namespace identification descriptor list: it
// stops at a zero type or the end of b; a descriptor running past the
// end is an error.
func NSDescriptors(b []byte) ([]NSDescriptor, error) {
	var out []NSDescriptor
	for i := 0; i+4 <= len(b); {
		t, n := b[i], int(b[i+1])
		if t == 0 {
			break
		}
		if i+4+n > len(b) {
			return out, fmt.Errorf("%w: namespace descriptor of %d bytes at %d", ErrShort, n, i)
		}
		out = append(out, NSDescriptor{Type: t, ID: b[i+4 : i+4+n]})
		i += 4 + n
	}
	return out, nil
}

// PutNSDescriptors encodes ds into b (zero-filled); it returns the bytes
// used, or an error when they do not fit.
func PutNSDescriptors(b []byte, ds []NSDescriptor) (int, error) {
	clear(b)
	i := 0
	for _, d := range ds {
		if len(d.ID) > 255 || i+4+len(d.ID) > len(b) {
			return i, fmt.Errorf("nvme: namespace descriptors do not fit %d bytes", len(b))
		}
		b[i], b[i+1] = d.Type, byte(len(d.ID))
		copy(b[i+4:], d.ID)
		i += 4 + len(d.ID)
	}
	return i, nil
}
