package nvme

import "fmt"

// Discovery log page layout: a 1024-byte header, then 1024-byte entries.
const (
	DiscoveryHeaderSize = 1024
	DiscoveryEntrySize  = 1024
)

// Transport types, address families and subsystem types of entries.
const (
	TrtypeRDMA   = 1
	TrtypeTCP    = 3
	AdrfamIPv4   = 1
	AdrfamIPv6   = 2
	SubtypeNVMe  = 2
	SubtypeDisc  = 3
	TreqNotSpec  = 0
	RDMAQPTypeRC = 1
	RDMAPrtNone  = 1
	RDMACMSRDMA  = 1
)

// DiscoveryHeader is the log page's header.
type DiscoveryHeader struct {
	GenCtr uint64
	NumRec uint64
	RecFmt uint16
}

// DiscoveryHeaderOf decodes the header at the start of b, or ErrShort
// (it needs the first 18 bytes).
func DiscoveryHeaderOf(b []byte) (DiscoveryHeader, error) {
	if len(b) < 18 {
		return DiscoveryHeader{}, fmt.Errorf("%w: discovery log header of %d bytes", ErrShort, len(b))
	}
	return DiscoveryHeader{GenCtr: le.Uint64(b[0:]), NumRec: le.Uint64(b[8:]), RecFmt: le.Uint16(b[16:])}, nil
}

// Put writes the header into b (DiscoveryHeaderSize bytes, zero-filled).
func (h *DiscoveryHeader) Put(b []byte) {
	clear(b[:DiscoveryHeaderSize])
	le.PutUint64(b[0:], h.GenCtr)
	le.PutUint64(b[8:], h.NumRec)
	le.PutUint16(b[16:], h.RecFmt)
}

// DiscoveryEntry is one discovery log page entry (RDMA transport
// specific address subtype in the RDMA fields).
type DiscoveryEntry struct {
	TrType  uint8
	AdrFam  uint8
	SubType uint8
	TReq    uint8
	PortID  uint16
	CNTLID  uint16
	ASQSZ   uint16
	TrSvcID string
	SubNQN  string
	TrAddr  string
	// RDMA transport specific address subtype.
	RDMAQPType uint8
	RDMAPrType uint8
	RDMACMS    uint8
	RDMAPKey   uint16
}

// DiscoveryEntryOf decodes entry i of a log page b (header included);
// ErrShort if b does not hold it.
func DiscoveryEntryOf(b []byte, i int) (DiscoveryEntry, error) {
	o := DiscoveryHeaderSize + i*DiscoveryEntrySize
	if i < 0 || o+DiscoveryEntrySize > len(b) || o < 0 {
		return DiscoveryEntry{}, fmt.Errorf("%w: discovery log entry %d in %d bytes", ErrShort, i, len(b))
	}
	e := b[o : o+DiscoveryEntrySize]
	return DiscoveryEntry{TrType: e[0], AdrFam: e[1], SubType: e[2], TReq: e[3], PortID: le.Uint16(e[4:]),
		CNTLID: le.Uint16(e[6:]), ASQSZ: le.Uint16(e[8:]), TrSvcID: spaceString(e[32:64]),
		SubNQN: cstring(e[256:512]), TrAddr: spaceString(e[512:768]),
		RDMAQPType: e[768], RDMAPrType: e[769], RDMACMS: e[770], RDMAPKey: le.Uint16(e[776:])}, nil
}

// Put writes the entry into b (DiscoveryEntrySize bytes, zero-filled;
// TrSvcID and TrAddr space padded as Linux's target writes them).
func (d *DiscoveryEntry) Put(b []byte) {
	e := b[:DiscoveryEntrySize]
	clear(e)
	e[0], e[1], e[2], e[3] = d.TrType, d.AdrFam, d.SubType, d.TReq
	le.PutUint16(e[4:], d.PortID)
	le.PutUint16(e[6:], d.CNTLID)
	le.PutUint16(e[8:], d.ASQSZ)
	putSpace(e[32:64], d.TrSvcID)
	putString(e[256:512], d.SubNQN)
	putSpace(e[512:768], d.TrAddr)
	e[768], e[769], e[770] = d.RDMAQPType, d.RDMAPrType, d.RDMACMS
	le.PutUint16(e[776:], d.RDMAPKey)
}
