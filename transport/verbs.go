package transport

import (
	"fmt"
	"net/netip"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
)

// QPType is the transport service of a QP (libibverbs enum ibv_qp_type values).
type QPType uint8

// QP types.
const (
	// QPTypeRC is a Reliable Connected QP.
	QPTypeRC QPType = 2
	// QPTypeUC is an Unreliable Connected QP: SEND and RDMA WRITE (with
	// immediate) to one peer QP, no acknowledgements: a message with a
	// lost packet is dropped by the responder, the requester completes on
	// send.
	QPTypeUC QPType = 3
	// QPTypeUD is an Unreliable Datagram QP: SEND and SEND with
	// immediate to any QP an address handle names, one packet per
	// message (at most the port MTU), with a Q_Key.
	QPTypeUD QPType = 4
)

// String returns "RC", "UC" or "UD".
func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUD:
		return "UD"
	case QPTypeUC:
		return "UC"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is the state of a QP (libibverbs enum ibv_qp_state values).
type QPState uint8

// QP states.
const (
	QPSReset QPState = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
)

// String returns "RESET", "INIT", "RTR", "RTS", "SQD", "SQE" or "ERR".
func (s QPState) String() string {
	switch s {
	case QPSReset:
		return "RESET"
	case QPSInit:
		return "INIT"
	case QPSRTR:
		return "RTR"
	case QPSRTS:
		return "RTS"
	case QPSSQD:
		return "SQD"
	case QPSSQE:
		return "SQE"
	case QPSErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// MTU is an IB path MTU code (libibverbs enum ibv_mtu values, the codes
// CM messages carry), defined in package bth: one type with package cm's,
// so a path MTU passes between a QP and a connection request unconverted.
// Bytes, String and Valid are its methods.
type MTU = bth.MTU

// Path MTU values.
const (
	MTU256  = bth.MTU256
	MTU512  = bth.MTU512
	MTU1024 = bth.MTU1024
	MTU2048 = bth.MTU2048
	MTU4096 = bth.MTU4096
)

// MTUFromBytes returns the MTU code for 256, 512, 1024, 2048 or 4096.
func MTUFromBytes(n int) (MTU, bool) { return bth.MTUFromBytes(n) }

// AttrMask selects QPAttr fields in Modify (libibverbs enum ibv_qp_attr_mask values).
type AttrMask uint32

// Attribute mask bits.
const (
	AttrState           AttrMask = 1 << 0
	AttrCurState        AttrMask = 1 << 1
	AttrAccessFlags     AttrMask = 1 << 3
	AttrPKeyIndex       AttrMask = 1 << 4
	AttrPort            AttrMask = 1 << 5
	AttrQKey            AttrMask = 1 << 6
	AttrAV              AttrMask = 1 << 7
	AttrPathMTU         AttrMask = 1 << 8
	AttrTimeout         AttrMask = 1 << 9
	AttrRetryCnt        AttrMask = 1 << 10
	AttrRNRRetry        AttrMask = 1 << 11
	AttrRQPSN           AttrMask = 1 << 12
	AttrMaxQPRdAtomic   AttrMask = 1 << 13
	AttrMinRNRTimer     AttrMask = 1 << 15
	AttrSQPSN           AttrMask = 1 << 16
	AttrMaxDestRdAtomic AttrMask = 1 << 17
	AttrDestQPN         AttrMask = 1 << 20
	// AttrSelectiveRepeat selects QPAttr.SelectiveRepeat (this stack's
	// own bit, not a libibverbs one), optional at INIT -> RTR of an RC QP.
	AttrSelectiveRepeat AttrMask = 1 << 30
)

var attrNames = []struct {
	m    AttrMask
	name string
}{
	{AttrState, "state"}, {AttrCurState, "cur_state"}, {AttrAccessFlags, "access_flags"},
	{AttrPKeyIndex, "pkey_index"}, {AttrPort, "port"}, {AttrQKey, "qkey"}, {AttrAV, "av"}, {AttrPathMTU, "path_mtu"},
	{AttrTimeout, "timeout"}, {AttrRetryCnt, "retry_cnt"}, {AttrRNRRetry, "rnr_retry"},
	{AttrRQPSN, "rq_psn"}, {AttrMaxQPRdAtomic, "max_rd_atomic"}, {AttrMinRNRTimer, "min_rnr_timer"},
	{AttrSQPSN, "sq_psn"}, {AttrMaxDestRdAtomic, "max_dest_rd_atomic"}, {AttrDestQPN, "dest_qp_num"},
	{AttrSelectiveRepeat, "selective_repeat"},
}

// String lists the attribute names in the mask, e.g. "state|path_mtu".
func (m AttrMask) String() string {
	s := ""
	for _, a := range attrNames {
		if m&a.m != 0 {
			if s != "" {
				s += "|"
			}
			s += a.name
			m &^= a.m
		}
	}
	if m != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(m))
	}
	if s == "" {
		return "none"
	}
	return s
}

// AddressVector is the path to the peer.
type AddressVector struct {
	// Addr is the peer's IP address (IPv4, IPv6 or the IPv4-mapped GID).
	Addr netip.Addr
	// TrafficClass is the IP TOS / traffic class to send with.
	TrafficClass uint8
}

// QPAttr holds the attributes of a QP, as in struct ibv_qp_attr.
type QPAttr struct {
	State           QPState
	CurState        QPState       // with AttrCurState: the state the caller believes the QP is in
	AccessFlags     memreg.Access // remote rights the responder grants: REMOTE_WRITE/READ/ATOMIC
	PKeyIndex       uint16
	Port            uint8
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32 // receive (responder) starting PSN
	SQPSN           uint32 // send (requester) starting PSN
	AV              AddressVector
	Timeout         uint8  // local ACK timeout 4.096 µs × 2^Timeout; 0 = infinite
	RetryCnt        uint8  // 0..7
	RNRRetry        uint8  // 0..7, 7 = infinite
	MinRNRTimer     uint8  // RNR NAK timer code 0..31 the responder advertises
	MaxQPRdAtomic   uint8  // outstanding READ/atomic requests as requester
	MaxDestRdAtomic uint8  // saved READ/atomic responder resources; 0: READ and atomic requests are NAKed (invalid request)
	QKey            uint32 // UD: the Q_Key received datagrams must carry (high bit reserved for privileged QPs)
	// SelectiveRepeat (AttrSelectiveRepeat, at INIT -> RTR of an RC QP)
	// runs selective repeat with the peer instead of go-back-N. Both
	// ends must set it: the responder then holds out-of-order packets
	// and sends selective NAKs, which only a rocev2 peer understands.
	// The CM sets it when the ECE exchange negotiated it.
	SelectiveRepeat bool
}

// QPInitAttr are the creation parameters of a QP.
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	// MaxSendWR and MaxRecvWR (0..65536) bound the outstanding work
	// requests of each queue. 0 is allowed, as in verbs: the QP has no
	// such queue (e.g. a WRITE/READ-only requester without receives),
	// and posting to it fails with ErrQueueFull.
	MaxSendWR int
	MaxRecvWR int
	MaxSGE    int // per work request, send and receive (default 1)
	// SRQ, if set, is the shared receive queue the QP takes its receive
	// WRs from (RC, UC or UD; same PD); MaxRecvWR is then ignored and
	// PostRecv on the QP is refused.
	SRQ    *SRQ
	SigAll bool // every send WR generates a completion
}

// WROpcode is the operation of a send work request (libibverbs enum ibv_wr_opcode values).
type WROpcode uint8

// Send work request opcodes.
const (
	WRWrite       WROpcode = 0
	WRWriteImm    WROpcode = 1
	WRSend        WROpcode = 2
	WRSendImm     WROpcode = 3
	WRRead        WROpcode = 4
	WRCompareSwap WROpcode = 5
	WRFetchAdd    WROpcode = 6
	WRLocalInv    WROpcode = 7 // invalidate a type 2 window's rkey (InvRKey)
	WRBindMW      WROpcode = 8 // bind a type 2 window (MW, Bind, RKey's key byte)
	WRSendInv     WROpcode = 9
)

// String returns the verbs-style name.
func (o WROpcode) String() string {
	switch o {
	case WRWrite:
		return "RDMA_WRITE"
	case WRWriteImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendImm:
		return "SEND_WITH_IMM"
	case WRRead:
		return "RDMA_READ"
	case WRCompareSwap:
		return "ATOMIC_CMP_AND_SWP"
	case WRFetchAdd:
		return "ATOMIC_FETCH_AND_ADD"
	case WRSendInv:
		return "SEND_WITH_INV"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRBindMW:
		return "BIND_MW"
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags are the send_flags of a work request (ibv_send_flags values).
// Only the bits below are supported; PostSend refuses others.
type SendFlags uint8

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	// SendNoAckReq (a rocev2 extension, not an ibv_send_flags value)
	// leaves AckReq clear in the last packet of an RC WRITE or SEND whose
	// next work request is already posted, is a WRITE or SEND (no fence)
	// and fits in the window behind it: that request's acknowledgement
	// covers both (ACKs are cumulative), and the responder sends one ACK
	// instead of two. An NVMe-oF target's RDMA WRITE followed by its
	// response is the use. The request is sent as without the flag when
	// any of that does not hold, in a retransmission, and with selective
	// repeat; AckReq every DeviceConfig.MaxPktsPerAck packets still holds.
	SendNoAckReq SendFlags = 0x80
)

// knownSendFlags are the SendFlags bits PostSend and BindMW take; any
// other bit (IBV_SEND_INLINE 8, IBV_SEND_IP_CSUM 16, ...) is refused with
// a *WRError naming send_flags, so that code relying on a flag this
// library does not implement fails loudly.
const knownSendFlags = SendFence | SendSignaled | SendSolicited | SendNoAckReq

// SendWR is a send work request.
type SendWR struct {
	WRID       uint64
	Opcode     WROpcode
	SGEs       []memreg.SGE // local memory; copied by PostSend
	Flags      SendFlags
	Imm        uint32 // WRSendImm, WRWriteImm (host order; sent big-endian)
	InvRKey    uint32 // WRSendInv
	RemoteAddr uint64 // WRWrite*, WRRead, atomics
	RKey       uint32
	CompareAdd uint64 // WRCompareSwap: compare; WRFetchAdd: add
	Swap       uint64 // WRCompareSwap
	// UD only: the destination. AH is the address handle (CreateAH),
	// RemoteQPN the destination QP and RemoteQKey its Q_Key; a Q_Key
	// with the high bit set means "use this QP's own Q_Key" (IBTA 10.2.5).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
	// WRBindMW only: the type 2 window and what to bind it to; RKey's low
	// byte is the window's new key byte (ibv_send_wr.bind_mw).
	MW   *memreg.MW
	Bind MWBindInfo
}

// RecvWR is a receive work request.
type RecvWR struct {
	WRID uint64
	SGEs []memreg.SGE
}

// MWBindInfo is what a memory window is bound to (ibv_mw_bind_info): a
// range of a region, in its IOVA space, with remote rights. A zero Length
// unbinds a type 1 window.
type MWBindInfo struct {
	MR     *memreg.MR
	Addr   uint64
	Length uint64
	Access memreg.Access // remote rights: AccessRemoteWrite, AccessRemoteRead, AccessRemoteAtomic
}
