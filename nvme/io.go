package nvme

// RW is a Read, Write or Write Zeroes command: SLBA in CDW10..11, NLB
// (0's based) in CDW12 bits 15:0, FUA bit 30, LR bit 31.
type RW struct {
	NSID uint32
	SLBA uint64
	NLB  uint16 // number of logical blocks, 0's based
	FUA  bool
	LR   bool
}

// RWOf decodes a Read/Write/Write Zeroes command.
func RWOf(s SQE) RW {
	d12 := s.CDW(12)
	return RW{NSID: s.NSID(), SLBA: uint64(s.CDW(10)) | uint64(s.CDW(11))<<32, NLB: uint16(d12),
		FUA: d12&(1<<30) != 0, LR: d12&(1<<31) != 0}
}

// Blocks returns the number of blocks (1's based).
func (r *RW) Blocks() uint32 { return uint32(r.NLB) + 1 }

// Put writes the command fields into s with opcode op.
func (r *RW) Put(s SQE, op Opcode) {
	s.SetOpcode(op)
	s.SetNSID(r.NSID)
	s.SetCDW(10, uint32(r.SLBA))
	s.SetCDW(11, uint32(r.SLBA>>32))
	d12 := uint32(r.NLB)
	if r.FUA {
		d12 |= 1 << 30
	}
	if r.LR {
		d12 |= 1 << 31
	}
	s.SetCDW(12, d12)
}

// DSMRangeSize is the length of one Dataset Management range.
const DSMRangeSize = 16

// DSM attribute bits (CDW11).
const DSMDeallocate = 1 << 2

// DSMRange is one Dataset Management range.
type DSMRange struct {
	Attr uint32
	NLB  uint32 // 1's based
	SLBA uint64
}

// DSM is a Dataset Management command: NR (0's based number of ranges)
// in CDW10, attributes in CDW11.
type DSM struct {
	NSID uint32
	NR   uint8 // 0's based
	Attr uint32
}

// DSMOf decodes a Dataset Management command.
func DSMOf(s SQE) DSM { return DSM{NSID: s.NSID(), NR: uint8(s.CDW(10)), Attr: s.CDW(11)} }

// Put writes the command fields into s.
func (d *DSM) Put(s SQE) {
	s.SetOpcode(IODSM)
	s.SetNSID(d.NSID)
	s.SetCDW(10, uint32(d.NR))
	s.SetCDW(11, d.Attr)
}

// DSMRanges decodes the ranges in b (stops at the end of whole ranges).
func DSMRanges(b []byte) []DSMRange {
	out := make([]DSMRange, 0, len(b)/DSMRangeSize)
	for i := 0; i+DSMRangeSize <= len(b); i += DSMRangeSize {
		out = append(out, DSMRange{Attr: le.Uint32(b[i:]), NLB: le.Uint32(b[i+4:]), SLBA: le.Uint64(b[i+8:])})
	}
	return out
}

// PutDSMRange writes r into b (at least DSMRangeSize bytes).
func PutDSMRange(b []byte, r DSMRange) {
	le.PutUint32(b[0:], r.Attr)
	le.PutUint32(b[4:], r.NLB)
	le.PutUint64(b[8:], r.SLBA)
}
