package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/bth"
)

// PermissiveLID is the LID Linux's CM writes for both ends of a path that
// leaves the subnet, which is every RoCE path (hop limit > 1): 0xFFFF.
const PermissiveLID = 0xffff

// GID is a 128-bit global identifier as carried in CM paths. On RoCEv2 it
// is the port's IP address, an IPv4 address in its IPv4-mapped form
// (::ffff:a.b.c.d).
type GID [16]byte

// GIDFromAddr returns the GID of an IP address: IPv6 as is, IPv4 mapped.
// The zero netip.Addr gives the zero GID.
func GIDFromAddr(a netip.Addr) GID {
	if !a.IsValid() {
		return GID{}
	}
	return GID(a.As16())
}

// Addr returns the GID as an IP address; an IPv4-mapped GID gives the IPv4
// address.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// String formats the GID as its IP address.
func (g GID) String() string { return g.Addr().String() }

// MTU is an IB path MTU code as CM messages carry it (4 bits): package
// bth's MTU, one type with transport's, so that a path MTU passes between a
// QP and a connection request unconverted. Bytes, String and Valid are its
// methods.
type MTU = bth.MTU

// Path MTU codes; 0 and 6..15 are reserved.
const (
	MTU256  = bth.MTU256
	MTU512  = bth.MTU512
	MTU1024 = bth.MTU1024
	MTU2048 = bth.MTU2048
	MTU4096 = bth.MTU4096
)

// MTUFromBytes returns the code of an MTU of n bytes (256, 512, 1024, 2048
// or 4096) and whether n is one of them.
func MTUFromBytes(n int) (MTU, bool) { return bth.MTUFromBytes(n) }

// TransportType is the transport service type of a REQ (2 bits).
type TransportType uint8

// Transport service types. TransportExtended defers to the REQ's extended
// transport type, of which only ExtendedXRC is defined.
const (
	TransportRC       TransportType = 0
	TransportUC       TransportType = 1
	TransportRD       TransportType = 2
	TransportExtended TransportType = 3

	// ExtendedXRC is the extended transport type of an XRC connection.
	ExtendedXRC = 1
)

// String returns "RC", "UC", "RD" or "extended".
func (t TransportType) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportExtended:
		return "extended"
	}
	return fmt.Sprintf("TransportType(%d)", uint8(t))
}

// MsgKind says which message an MRA acknowledges or a REJ rejects (2 bits).
type MsgKind uint8

// Message kinds; 3 is reserved.
const (
	KindREQ MsgKind = 0
	KindREP MsgKind = 1
	// KindOther is a LAP for an MRA, "other" for a REJ.
	KindOther MsgKind = 2
)

// String returns "REQ", "REP", "other" or "MsgKind(3)".
func (k MsgKind) String() string {
	switch k {
	case KindREQ:
		return "REQ"
	case KindREP:
		return "REP"
	case KindOther:
		return "other"
	}
	return fmt.Sprintf("MsgKind(%d)", uint8(k))
}

// Failover values of a REP; 3 is reserved.
const (
	FailoverAccepted     = 0
	FailoverNotSupported = 1
	FailoverRejected     = 2
)

// RejectReason is the reason code of a REJ.
type RejectReason uint16

// REJ reason codes (IBTA vol. 1 §12.6.7.2; Linux enum ib_cm_rej_reason).
// rdma_cm's rdma_reject sends RejConsumer; an unknown service ID gives
// RejInvalidServiceID; a peer that gave up waiting sends RejTimeout.
const (
	RejNoQP                   RejectReason = 1
	RejNoEEC                  RejectReason = 2
	RejNoResources            RejectReason = 3
	RejTimeout                RejectReason = 4
	RejUnsupported            RejectReason = 5
	RejInvalidCommID          RejectReason = 6
	RejInvalidCommInstance    RejectReason = 7
	RejInvalidServiceID       RejectReason = 8
	RejInvalidTransportType   RejectReason = 9
	RejStaleConn              RejectReason = 10
	RejRDCNotExist            RejectReason = 11
	RejInvalidGID             RejectReason = 12
	RejInvalidLID             RejectReason = 13
	RejInvalidSL              RejectReason = 14
	RejInvalidTrafficClass    RejectReason = 15
	RejInvalidHopLimit        RejectReason = 16
	RejInvalidPacketRate      RejectReason = 17
	RejInvalidAltGID          RejectReason = 18
	RejInvalidAltLID          RejectReason = 19
	RejInvalidAltSL           RejectReason = 20
	RejInvalidAltTrafficClass RejectReason = 21
	RejInvalidAltHopLimit     RejectReason = 22
	RejInvalidAltPacketRate   RejectReason = 23
	RejPortCMRedirect         RejectReason = 24
	RejPortRedirect           RejectReason = 25
	RejInvalidMTU             RejectReason = 26
	RejInsufficientRespRes    RejectReason = 27
	RejConsumer               RejectReason = 28
	RejInvalidRNRRetry        RejectReason = 29
	RejDuplicateLocalCommID   RejectReason = 30
	RejInvalidClassVersion    RejectReason = 31
	RejInvalidFlowLabel       RejectReason = 32
	RejInvalidAltFlowLabel    RejectReason = 33
	RejVendorOptionNotSupp    RejectReason = 35
)

var rejNames = map[RejectReason]string{
	RejNoQP:                   "no QP",
	RejNoEEC:                  "no EEC",
	RejNoResources:            "no resources",
	RejTimeout:                "timeout",
	RejUnsupported:            "unsupported request",
	RejInvalidCommID:          "invalid communication ID",
	RejInvalidCommInstance:    "invalid communication instance",
	RejInvalidServiceID:       "invalid service ID",
	RejInvalidTransportType:   "invalid transport service type",
	RejStaleConn:              "stale connection",
	RejRDCNotExist:            "RDC does not exist",
	RejInvalidGID:             "invalid GID",
	RejInvalidLID:             "invalid LID",
	RejInvalidSL:              "invalid SL",
	RejInvalidTrafficClass:    "invalid traffic class",
	RejInvalidHopLimit:        "invalid hop limit",
	RejInvalidPacketRate:      "invalid packet rate",
	RejInvalidAltGID:          "invalid alternate GID",
	RejInvalidAltLID:          "invalid alternate LID",
	RejInvalidAltSL:           "invalid alternate SL",
	RejInvalidAltTrafficClass: "invalid alternate traffic class",
	RejInvalidAltHopLimit:     "invalid alternate hop limit",
	RejInvalidAltPacketRate:   "invalid alternate packet rate",
	RejPortCMRedirect:         "port and CM redirection",
	RejPortRedirect:           "port redirection",
	RejInvalidMTU:             "invalid path MTU",
	RejInsufficientRespRes:    "insufficient responder resources",
	RejConsumer:               "consumer reject",
	RejInvalidRNRRetry:        "invalid RNR NAK retry count",
	RejDuplicateLocalCommID:   "duplicate local communication ID",
	RejInvalidClassVersion:    "invalid class version",
	RejInvalidFlowLabel:       "invalid flow label",
	RejInvalidAltFlowLabel:    "invalid alternate flow label",
	RejVendorOptionNotSupp:    "vendor option not supported",
}

// String returns the reason's description, e.g. "consumer reject".
func (r RejectReason) String() string {
	if s, ok := rejNames[r]; ok {
		return s
	}
	return fmt.Sprintf("RejectReason(%d)", uint16(r))
}

// SIDRStatus is the status of a SIDR_REP.
type SIDRStatus uint8

// SIDR_REP status codes.
const (
	SIDRSuccess            SIDRStatus = 0
	SIDRUnsupported        SIDRStatus = 1 // service ID not supported
	SIDRReject             SIDRStatus = 2 // rejected by the service provider
	SIDRNoQP               SIDRStatus = 3
	SIDRRedirect           SIDRStatus = 4
	SIDRUnsupportedVersion SIDRStatus = 5
)

// String returns the status's name.
func (s SIDRStatus) String() string {
	switch s {
	case SIDRSuccess:
		return "success"
	case SIDRUnsupported:
		return "service ID not supported"
	case SIDRReject:
		return "rejected"
	case SIDRNoQP:
		return "no QP"
	case SIDRRedirect:
		return "redirect"
	case SIDRUnsupportedVersion:
		return "unsupported class version"
	}
	return fmt.Sprintf("SIDRStatus(%d)", uint8(s))
}

// APRStatus is the AP status of an APR (the answer to a LAP).
type APRStatus uint8

// APR status codes.
const (
	APRSuccess          APRStatus = 0
	APRInvalidCommID    APRStatus = 1
	APRUnsupported      APRStatus = 2
	APRReject           APRStatus = 3
	APRRedirect         APRStatus = 4
	APRIsCurrent        APRStatus = 5
	APRInvalidQPNEECN   APRStatus = 6
	APRInvalidLID       APRStatus = 7
	APRInvalidGID       APRStatus = 8
	APRInvalidFlowLabel APRStatus = 9
	APRInvalidTClass    APRStatus = 10
	APRInvalidHopLimit  APRStatus = 11
	APRInvalidRate      APRStatus = 12
	APRInvalidSL        APRStatus = 13
)

var aprNames = [...]string{
	APRSuccess:          "success",
	APRInvalidCommID:    "invalid communication ID",
	APRUnsupported:      "unsupported request",
	APRReject:           "rejected",
	APRRedirect:         "redirect",
	APRIsCurrent:        "path is the current one",
	APRInvalidQPNEECN:   "invalid QPN/EECN",
	APRInvalidLID:       "invalid LID",
	APRInvalidGID:       "invalid GID",
	APRInvalidFlowLabel: "invalid flow label",
	APRInvalidTClass:    "invalid traffic class",
	APRInvalidHopLimit:  "invalid hop limit",
	APRInvalidRate:      "invalid packet rate",
	APRInvalidSL:        "invalid SL",
}

// String returns the status's description.
func (s APRStatus) String() string {
	if int(s) < len(aprNames) {
		return aprNames[s]
	}
	return fmt.Sprintf("APRStatus(%d)", uint8(s))
}

// Timeout returns the duration of a 5-bit CM or local ACK timeout
// exponent: 4.096 µs × 2^exp (20, rdma_cm's CM response timeout, is about
// 4.3 s; 19 about 2.1 s). Bits above the low 5 are ignored.
func Timeout(exp uint8) time.Duration {
	return 4096 * time.Nanosecond << (exp & 0x1f)
}

// Path is the description of a primary or alternate path in a REQ or LAP.
type Path struct {
	// LocalLID and RemoteLID are the ports' LIDs; PermissiveLID on RoCE.
	LocalLID, RemoteLID uint16
	// LocalGID and RemoteGID are the ports' GIDs (IP addresses on RoCEv2).
	LocalGID, RemoteGID GID
	// FlowLabel is the 20-bit flow label. rxe derives the RC flow's UDP
	// source port from it.
	FlowLabel uint32
	// PacketRate is the 6-bit IB rate code (0 = port current rate).
	PacketRate uint8
	// TrafficClass is the GRH traffic class (the IP TOS on RoCEv2).
	TrafficClass uint8
	// HopLimit is the GRH hop limit (the IP TTL on RoCEv2).
	HopLimit uint8
	// SL is the 4-bit service level.
	SL uint8
	// SubnetLocal is set when the path stays in the subnet (Linux: hop
	// limit <= 1).
	SubnetLocal bool
	// LocalACKTimeout is the 5-bit local ACK timeout exponent (Timeout).
	LocalACKTimeout uint8
}

// Field widths.
const (
	mask24 = 0xffffff
	mask20 = 0xfffff
	mask6  = 0x3f
	mask5  = 0x1f
	mask4  = 0x0f
	mask3  = 0x07
	mask2  = 0x03
)

// get24 reads the 24-bit big-endian value at b[0:3].
func get24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

// put24 writes the low 24 bits of v big-endian at b[0:3].
func put24(b []byte, v uint32) {
	_ = b[2]
	b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v)
}

// getBits returns the width-bit field of b whose least significant bit is
// bit shift (0 = LSB).
func getBits(b byte, shift, mask uint8) uint8 { return b >> shift & mask }

// setBits sets the field of *b at shift with mask to v, keeping the other
// bits.
func setBits(b *byte, shift, mask, v uint8) {
	*b = *b&^(mask<<shift) | (v&mask)<<shift
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

func be16(b []byte) uint16     { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32     { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64     { return binary.BigEndian.Uint64(b) }
func put16(b []byte, v uint16) { binary.BigEndian.PutUint16(b, v) }
func put32(b []byte, v uint32) { binary.BigEndian.PutUint32(b, v) }
func put64(b []byte, v uint64) { binary.BigEndian.PutUint64(b, v) }
func clear232(b []byte)        { clear(b[:DataSize]) }
func gid(b []byte) (g GID)     { copy(g[:], b); return g }
func putGID(b []byte, g GID)   { copy(b, g[:]) }
