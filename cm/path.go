package cm

// PathSize is the length of a path description in a REQ (twice) or LAP.
const PathSize = 44

// Offsets in a path description, from its start. The REQ and the LAP order
// the packet rate, traffic class and hop limit differently.
const (
	pathLocalLIDOff  = 0
	pathRemoteLIDOff = 2
	pathLocalGIDOff  = 4
	pathRemoteGIDOff = 20
	pathFlowOff      = 36 // flow label: the top 20 bits of the word here
	pathSLOff        = 42 // SL:4, subnet local:1, reserved:3
	pathACKOff       = 43 // local ACK timeout:5, reserved:3 (REQ alternate: SAP supported at bit 2)

	reqPathRateOff = 39 // reserved:2, packet rate:6
	reqPathTCOff   = 40
	reqPathHLOff   = 41
	lapPathTCOff   = 39
	lapPathHLOff   = 40
	lapPathRateOff = 41
)

// path implements both layouts.
type path struct{ rate, tc, hl int }

var (
	reqLayout = path{rate: reqPathRateOff, tc: reqPathTCOff, hl: reqPathHLOff}
	lapLayout = path{rate: lapPathRateOff, tc: lapPathTCOff, hl: lapPathHLOff}
)

func (l path) flowLabel(b []byte) uint32 { return be32(b[pathFlowOff:]) >> 12 }

func (l path) setFlowLabel(b []byte, v uint32) {
	w := be32(b[pathFlowOff:])
	put32(b[pathFlowOff:], (v&mask20)<<12|w&0xfff)
}

func (l path) fields(b []byte) Path {
	_ = b[PathSize-1]
	return Path{
		LocalLID:        be16(b[pathLocalLIDOff:]),
		RemoteLID:       be16(b[pathRemoteLIDOff:]),
		LocalGID:        gid(b[pathLocalGIDOff:]),
		RemoteGID:       gid(b[pathRemoteGIDOff:]),
		FlowLabel:       l.flowLabel(b),
		PacketRate:      b[l.rate] & mask6,
		TrafficClass:    b[l.tc],
		HopLimit:        b[l.hl],
		SL:              getBits(b[pathSLOff], 4, mask4),
		SubnetLocal:     getBits(b[pathSLOff], 3, 1) != 0,
		LocalACKTimeout: getBits(b[pathACKOff], 3, mask5),
	}
}

// encode writes all PathSize bytes; reserved bits are zero.
func (l path) encode(b []byte, p *Path) {
	_ = b[PathSize-1]
	put16(b[pathLocalLIDOff:], p.LocalLID)
	put16(b[pathRemoteLIDOff:], p.RemoteLID)
	putGID(b[pathLocalGIDOff:], p.LocalGID)
	putGID(b[pathRemoteGIDOff:], p.RemoteGID)
	put32(b[pathFlowOff:], (p.FlowLabel&mask20)<<12)
	b[l.rate] = p.PacketRate & mask6
	b[l.tc] = p.TrafficClass
	b[l.hl] = p.HopLimit
	b[pathSLOff] = (p.SL&mask4)<<4 | b2u(p.SubnetLocal)<<3
	b[pathACKOff] = (p.LocalACKTimeout & mask5) << 3
}

// REQPath is a view of a path description inside a REQ (REQ.Primary,
// REQ.Alternate): PathSize bytes.
type REQPath []byte

// LocalLID returns the local port's LID.
func (p REQPath) LocalLID() uint16 { return be16(p[pathLocalLIDOff:]) }

// SetLocalLID sets the local port's LID.
func (p REQPath) SetLocalLID(v uint16) { put16(p[pathLocalLIDOff:], v) }

// RemoteLID returns the remote port's LID.
func (p REQPath) RemoteLID() uint16 { return be16(p[pathRemoteLIDOff:]) }

// SetRemoteLID sets the remote port's LID.
func (p REQPath) SetRemoteLID(v uint16) { put16(p[pathRemoteLIDOff:], v) }

// LocalGID returns the local port's GID.
func (p REQPath) LocalGID() GID { return gid(p[pathLocalGIDOff : pathLocalGIDOff+16]) }

// SetLocalGID sets the local port's GID.
func (p REQPath) SetLocalGID(g GID) { putGID(p[pathLocalGIDOff:pathLocalGIDOff+16], g) }

// RemoteGID returns the remote port's GID.
func (p REQPath) RemoteGID() GID { return gid(p[pathRemoteGIDOff : pathRemoteGIDOff+16]) }

// SetRemoteGID sets the remote port's GID.
func (p REQPath) SetRemoteGID(g GID) { putGID(p[pathRemoteGIDOff:pathRemoteGIDOff+16], g) }

// FlowLabel returns the 20-bit flow label.
func (p REQPath) FlowLabel() uint32 { return reqLayout.flowLabel(p) }

// SetFlowLabel sets the flow label; only the low 20 bits are used.
func (p REQPath) SetFlowLabel(v uint32) { reqLayout.setFlowLabel(p, v) }

// PacketRate returns the 6-bit packet rate code.
func (p REQPath) PacketRate() uint8 { return p[reqPathRateOff] & mask6 }

// SetPacketRate sets the packet rate code; only the low 6 bits are used.
func (p REQPath) SetPacketRate(v uint8) { setBits(&p[reqPathRateOff], 0, mask6, v) }

// TrafficClass returns the traffic class.
func (p REQPath) TrafficClass() uint8 { return p[reqPathTCOff] }

// SetTrafficClass sets the traffic class.
func (p REQPath) SetTrafficClass(v uint8) { p[reqPathTCOff] = v }

// HopLimit returns the hop limit.
func (p REQPath) HopLimit() uint8 { return p[reqPathHLOff] }

// SetHopLimit sets the hop limit.
func (p REQPath) SetHopLimit(v uint8) { p[reqPathHLOff] = v }

// SL returns the 4-bit service level.
func (p REQPath) SL() uint8 { return getBits(p[pathSLOff], 4, mask4) }

// SetSL sets the service level; only the low 4 bits are used.
func (p REQPath) SetSL(v uint8) { setBits(&p[pathSLOff], 4, mask4, v) }

// SubnetLocal reports the subnet local bit.
func (p REQPath) SubnetLocal() bool { return getBits(p[pathSLOff], 3, 1) != 0 }

// SetSubnetLocal sets the subnet local bit.
func (p REQPath) SetSubnetLocal(v bool) { setBits(&p[pathSLOff], 3, 1, b2u(v)) }

// LocalACKTimeout returns the 5-bit local ACK timeout exponent.
func (p REQPath) LocalACKTimeout() uint8 { return getBits(p[pathACKOff], 3, mask5) }

// SetLocalACKTimeout sets the local ACK timeout; only the low 5 bits are
// used.
func (p REQPath) SetLocalACKTimeout(v uint8) { setBits(&p[pathACKOff], 3, mask5, v) }

// Fields decodes the path.
func (p REQPath) Fields() Path { return reqLayout.fields(p) }

// Encode writes the path from f; reserved bits are zero.
func (p REQPath) Encode(f *Path) { reqLayout.encode(p, f) }

// LAPPath is a view of the alternate path description of a LAP: PathSize
// bytes, laid out unlike a REQ's (traffic class, hop limit, then packet
// rate).
type LAPPath []byte

// LocalLID returns the local port's LID.
func (p LAPPath) LocalLID() uint16 { return be16(p[pathLocalLIDOff:]) }

// SetLocalLID sets the local port's LID.
func (p LAPPath) SetLocalLID(v uint16) { put16(p[pathLocalLIDOff:], v) }

// RemoteLID returns the remote port's LID.
func (p LAPPath) RemoteLID() uint16 { return be16(p[pathRemoteLIDOff:]) }

// SetRemoteLID sets the remote port's LID.
func (p LAPPath) SetRemoteLID(v uint16) { put16(p[pathRemoteLIDOff:], v) }

// LocalGID returns the local port's GID.
func (p LAPPath) LocalGID() GID { return gid(p[pathLocalGIDOff : pathLocalGIDOff+16]) }

// SetLocalGID sets the local port's GID.
func (p LAPPath) SetLocalGID(g GID) { putGID(p[pathLocalGIDOff:pathLocalGIDOff+16], g) }

// RemoteGID returns the remote port's GID.
func (p LAPPath) RemoteGID() GID { return gid(p[pathRemoteGIDOff : pathRemoteGIDOff+16]) }

// SetRemoteGID sets the remote port's GID.
func (p LAPPath) SetRemoteGID(g GID) { putGID(p[pathRemoteGIDOff:pathRemoteGIDOff+16], g) }

// FlowLabel returns the 20-bit flow label.
func (p LAPPath) FlowLabel() uint32 { return lapLayout.flowLabel(p) }

// SetFlowLabel sets the flow label; only the low 20 bits are used.
func (p LAPPath) SetFlowLabel(v uint32) { lapLayout.setFlowLabel(p, v) }

// PacketRate returns the 6-bit packet rate code.
func (p LAPPath) PacketRate() uint8 { return p[lapPathRateOff] & mask6 }

// SetPacketRate sets the packet rate code; only the low 6 bits are used.
func (p LAPPath) SetPacketRate(v uint8) { setBits(&p[lapPathRateOff], 0, mask6, v) }

// TrafficClass returns the traffic class.
func (p LAPPath) TrafficClass() uint8 { return p[lapPathTCOff] }

// SetTrafficClass sets the traffic class.
func (p LAPPath) SetTrafficClass(v uint8) { p[lapPathTCOff] = v }

// HopLimit returns the hop limit.
func (p LAPPath) HopLimit() uint8 { return p[lapPathHLOff] }

// SetHopLimit sets the hop limit.
func (p LAPPath) SetHopLimit(v uint8) { p[lapPathHLOff] = v }

// SL returns the 4-bit service level.
func (p LAPPath) SL() uint8 { return getBits(p[pathSLOff], 4, mask4) }

// SetSL sets the service level; only the low 4 bits are used.
func (p LAPPath) SetSL(v uint8) { setBits(&p[pathSLOff], 4, mask4, v) }

// SubnetLocal reports the subnet local bit.
func (p LAPPath) SubnetLocal() bool { return getBits(p[pathSLOff], 3, 1) != 0 }

// SetSubnetLocal sets the subnet local bit.
func (p LAPPath) SetSubnetLocal(v bool) { setBits(&p[pathSLOff], 3, 1, b2u(v)) }

// LocalACKTimeout returns the 5-bit local ACK timeout exponent.
func (p LAPPath) LocalACKTimeout() uint8 { return getBits(p[pathACKOff], 3, mask5) }

// SetLocalACKTimeout sets the local ACK timeout; only the low 5 bits are
// used.
func (p LAPPath) SetLocalACKTimeout(v uint8) { setBits(&p[pathACKOff], 3, mask5, v) }

// Fields decodes the path.
func (p LAPPath) Fields() Path { return lapLayout.fields(p) }

// Encode writes the path from f; reserved bits are zero.
func (p LAPPath) Encode(f *Path) { lapLayout.encode(p, f) }
