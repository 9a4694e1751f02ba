package transport

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
)

// QPType is the transport service of a QP (libibverbs enum ibv_qp_type values).
type QPType uint8

// QPTypeRC is a Reliable Connected QP, the only type this package implements.
const QPTypeRC QPType = 2

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

// MTU is an IB path MTU enum (libibverbs enum ibv_mtu values).
type MTU uint8

// Path MTU values.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the MTU enum for 256, 512, 1024, 2048 or 4096.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// String returns the size in bytes, e.g. "1024".
func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// AttrMask selects QPAttr fields in Modify (libibverbs enum ibv_qp_attr_mask values).
type AttrMask uint32

// Attribute mask bits.
const (
	AttrState           AttrMask = 1 << 0
	AttrCurState        AttrMask = 1 << 1
	AttrAccessFlags     AttrMask = 1 << 3
	AttrPKeyIndex       AttrMask = 1 << 4
	AttrPort            AttrMask = 1 << 5
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
)

var attrNames = []struct {
	m    AttrMask
	name string
}{
	{AttrState, "state"}, {AttrCurState, "cur_state"}, {AttrAccessFlags, "access_flags"},
	{AttrPKeyIndex, "pkey_index"}, {AttrPort, "port"}, {AttrAV, "av"}, {AttrPathMTU, "path_mtu"},
	{AttrTimeout, "timeout"}, {AttrRetryCnt, "retry_cnt"}, {AttrRNRRetry, "rnr_retry"},
	{AttrRQPSN, "rq_psn"}, {AttrMaxQPRdAtomic, "max_rd_atomic"}, {AttrMinRNRTimer, "min_rnr_timer"},
	{AttrSQPSN, "sq_psn"}, {AttrMaxDestRdAtomic, "max_dest_rd_atomic"}, {AttrDestQPN, "dest_qp_num"},
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
	Timeout         uint8 // local ACK timeout 4.096 µs × 2^Timeout; 0 = infinite
	RetryCnt        uint8 // 0..7
	RNRRetry        uint8 // 0..7, 7 = infinite
	MinRNRTimer     uint8 // RNR NAK timer code 0..31 the responder advertises
	MaxQPRdAtomic   uint8 // outstanding READ/atomic requests as requester
	MaxDestRdAtomic uint8 // saved READ/atomic responder resources
}

// QPInitAttr are the creation parameters of a QP.
type QPInitAttr struct {
	Type      QPType
	SendCQ    *CQ
	RecvCQ    *CQ
	MaxSendWR int
	MaxRecvWR int
	MaxSGE    int  // per work request, send and receive (default 1)
	SigAll    bool // every send WR generates a completion
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
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags are the send_flags of a work request (ibv_send_flags values).
type SendFlags uint8

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
)

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
}

// RecvWR is a receive work request.
type RecvWR struct {
	WRID uint64
	SGEs []memreg.SGE
}

type sendWQE struct {
	wr        SendWR
	sges      []memreg.SGE
	length    uint32
	npkts     int
	firstPSN  bth.PSN
	signaled  bool
	rdCounted bool
	done      bool
	status    WCStatus
	rsl       memreg.ScatterList // RDMA READ: places the response data into sges
}

type recvWQE struct {
	wrid   uint64
	sges   []memreg.SGE
	length uint64
}

// rdRes is a saved responder resource for a READ or atomic request.
type rdRes struct {
	valid    bool
	atomic   bool
	firstPSN bth.PSN
	lastPSN  bth.PSN
	va       uint64
	rkey     uint32
	length   uint32
	orig     uint64
}

const outBatch = 32

// QP is a Reliable Connected queue pair. All methods are safe for
// concurrent use.
type QP struct {
	dev    *Device
	pd     *memreg.PD
	rv     memreg.QPView // remote-facing view of pd for this QP (type 2 windows)
	qpn    uint32
	sendCQ *CQ
	recvCQ *CQ
	init   QPInitAttr

	mu      sync.Mutex
	attr    QPAttr
	mtu     int
	srcPort uint16
	peer    netip.Addr
	timeout time.Duration // local ACK timeout, 0 = infinite

	// send queue: monotonic indexes, slot = index % len(sq)
	sq                   []sendWQE
	sqHead, sqCur, sqEnd uint64

	req  requester
	comp completer

	// receive queue
	rq            []recvWQE
	rqHead, rqEnd uint64

	resp responder

	retransTimer Timer
	rnrTimer     Timer

	trace func(format string, args ...any) // test hook, nil in production

	out       []udp.Packet
	outBufs   [][]byte
	nout      int
	ackSlot   int // nout when the last queued packet is a positive ACK that a newer one may replace, else 0
	destroyed bool
	rxQueued  bool // on dev.rxPending (receive goroutine only)
	rxBatch   bool // input from the receive goroutine is running: defer CQ wakeups
}

// pushWC stores a completion in cq. Inside a received batch the waiter is
// woken at the end of the batch (Device.wakePending), else right away.
func (qp *QP) pushWC(cq *CQ, wc *WC) {
	if qp.rxBatch && cq.dev == qp.dev {
		if _, wake := cq.store(wc); wake {
			qp.dev.deferWake(cq)
		}
		return
	}
	cq.push(wc)
}

// CreateQP creates an RC QP in the RESET state.
func (d *Device) CreateQP(pd *memreg.PD, a QPInitAttr) (*QP, error) {
	if d.isClosed() {
		return nil, ErrClosed
	}
	if a.Type != QPTypeRC {
		return nil, fmt.Errorf("transport: CreateQP: qp_type %d not supported (only RC): %w", a.Type, ErrInvalidConfig)
	}
	if pd == nil {
		return nil, fmt.Errorf("transport: CreateQP: nil pd: %w", ErrInvalidConfig)
	}
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, fmt.Errorf("transport: CreateQP: send_cq and recv_cq are required: %w", ErrInvalidConfig)
	}
	if a.MaxSendWR <= 0 || a.MaxSendWR > 1<<16 {
		return nil, fmt.Errorf("transport: CreateQP: max_send_wr %d out of range 1..%d: %w", a.MaxSendWR, 1<<16, ErrInvalidConfig)
	}
	if a.MaxRecvWR <= 0 || a.MaxRecvWR > 1<<16 {
		return nil, fmt.Errorf("transport: CreateQP: max_recv_wr %d out of range 1..%d: %w", a.MaxRecvWR, 1<<16, ErrInvalidConfig)
	}
	if a.MaxSGE == 0 {
		a.MaxSGE = 1
	}
	if a.MaxSGE < 0 || a.MaxSGE > 32 {
		return nil, fmt.Errorf("transport: CreateQP: max_sge %d out of range 1..32: %w", a.MaxSGE, ErrInvalidConfig)
	}
	qp := &QP{dev: d, pd: pd, sendCQ: a.SendCQ, recvCQ: a.RecvCQ, init: a}
	qp.sq = make([]sendWQE, a.MaxSendWR)
	for i := range qp.sq {
		qp.sq[i].sges = make([]memreg.SGE, 0, a.MaxSGE)
	}
	qp.rq = make([]recvWQE, a.MaxRecvWR)
	for i := range qp.rq {
		qp.rq[i].sges = make([]memreg.SGE, 0, a.MaxSGE)
	}
	qp.resp.res = make([]rdRes, d.cfg.MaxRdAtomic)
	qp.out = make([]udp.Packet, outBatch)
	qp.outBufs = make([][]byte, outBatch)
	for i := range qp.outBufs {
		qp.outBufs[i] = make([]byte, udp.MaxPacketSize)
	}
	qp.retransTimer = d.clock.AfterFunc(time.Hour, qp.onRetransTimer)
	qp.retransTimer.Stop()
	qp.rnrTimer = d.clock.AfterFunc(time.Hour, qp.onRNRTimer)
	qp.rnrTimer.Stop()

	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.qps) >= d.cfg.MaxQP {
		return nil, fmt.Errorf("transport: CreateQP: %d QPs: %w", len(d.qps), ErrLimit)
	}
	for {
		n := d.nextQPN
		d.nextQPN++
		if d.nextQPN > bth.PSNMask {
			d.nextQPN = firstQPN
		}
		if _, busy := d.qps[n]; !busy {
			qp.qpn = n
			break
		}
	}
	qp.rv = pd.ForQP(qp.qpn)
	d.qps[qp.qpn] = qp
	d.publishQPs()
	return qp, nil
}

// QPN returns the QP number.
func (qp *QP) QPN() uint32 { return qp.qpn }

// PD returns the QP's protection domain.
func (qp *QP) PD() *memreg.PD { return qp.pd }

// Destroy moves the QP to ERR (flushing its work requests) and removes it
// from the device.
func (qp *QP) Destroy() error {
	qp.mu.Lock()
	if !qp.destroyed {
		qp.toError()
		qp.stopTimersLocked()
		qp.destroyed = true
	}
	qp.mu.Unlock()
	qp.dev.mu.Lock()
	if qp.dev.qps[qp.qpn] == qp {
		delete(qp.dev.qps, qp.qpn)
		qp.dev.publishQPs()
	}
	qp.dev.mu.Unlock()
	return nil
}

// State returns the current QP state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.attr.State
}

// Query returns the QP's current attributes.
func (qp *QP) Query() (QPAttr, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	a := qp.attr
	if a.State >= QPSRTS {
		a.SQPSN = uint32(qp.req.psn)
	}
	if a.State >= QPSRTR {
		a.RQPSN = uint32(qp.resp.psn)
	}
	return a, nil
}

type transition struct{ req, opt AttrMask }

var transitions = map[[2]QPState]transition{
	{QPSReset, QPSInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
		opt: AttrAccessFlags | AttrPKeyIndex},
	{QPSRTR, QPSRTS}: {req: AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
		opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSRTS, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSRTS, QPSSQD}: {},
	{QPSSQD, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSSQD, QPSSQD}: {opt: AttrAV | AttrPKeyIndex | AttrPort | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
		AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrMinRNRTimer | AttrAccessFlags},
	{QPSSQE, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
}

// Modify changes the QP's state and attributes. Only the fields selected by
// mask are used. Each transition has required and optional attributes (the
// IBTA / libibverbs table for RC); a missing required attribute, an
// attribute the transition does not allow, an invalid value or an illegal
// transition returns an error naming it, and the QP is left unchanged.
// Any state may move to RESET or ERR without attributes.
func (qp *QP) Modify(attr *QPAttr, mask AttrMask) error {
	if attr == nil {
		return fmt.Errorf("transport: Modify: nil attr: %w", ErrInvalidAttr)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.destroyed {
		return fmt.Errorf("transport: Modify qp %#x: destroyed: %w", qp.qpn, ErrInvalidState)
	}
	cur := qp.attr.State
	next := cur
	if mask&AttrState != 0 {
		next = attr.State
		if next > QPSErr {
			return fmt.Errorf("transport: Modify qp %#x: state %d: %w", qp.qpn, next, ErrInvalidAttr)
		}
	}
	if mask&AttrCurState != 0 && attr.CurState != cur {
		return fmt.Errorf("transport: Modify qp %#x: cur_state %v, QP is in %v: %w", qp.qpn, attr.CurState, cur, ErrInvalidAttr)
	}
	var tr transition
	switch {
	case next == QPSReset || next == QPSErr:
		if mask&AttrState == 0 && cur == next {
			return fmt.Errorf("transport: Modify qp %#x: no attributes may change in %v: %w", qp.qpn, cur, ErrInvalidAttr)
		}
	default:
		var ok bool
		tr, ok = transitions[[2]QPState{cur, next}]
		if !ok {
			return fmt.Errorf("transport: Modify qp %#x: illegal transition %v -> %v: %w", qp.qpn, cur, next, ErrInvalidState)
		}
	}
	given := mask &^ (AttrState | AttrCurState)
	if missing := tr.req &^ given; missing != 0 {
		return fmt.Errorf("transport: Modify qp %#x %v -> %v: missing required attribute %v: %w", qp.qpn, cur, next, lowestAttr(missing), ErrMissingAttr)
	}
	if extra := given &^ (tr.req | tr.opt); extra != 0 {
		return fmt.Errorf("transport: Modify qp %#x %v -> %v: attribute %v not allowed: %w", qp.qpn, cur, next, lowestAttr(extra), ErrInvalidAttr)
	}
	if err := qp.checkValues(attr, given); err != nil {
		return err
	}
	// Apply.
	a := &qp.attr
	if given&AttrAccessFlags != 0 {
		a.AccessFlags = attr.AccessFlags
	}
	if given&AttrPKeyIndex != 0 {
		a.PKeyIndex = attr.PKeyIndex
	}
	if given&AttrPort != 0 {
		a.Port = attr.Port
	}
	if given&AttrAV != 0 {
		a.AV = attr.AV
		qp.peer = attr.AV.Addr.Unmap()
	}
	if given&AttrPathMTU != 0 {
		a.PathMTU = attr.PathMTU
		qp.mtu = attr.PathMTU.Bytes()
	}
	if given&AttrDestQPN != 0 {
		a.DestQPN = attr.DestQPN & bth.PSNMask
		qp.srcPort = udp.FlowSourcePort(qp.qpn, a.DestQPN)
	}
	if given&AttrRQPSN != 0 {
		a.RQPSN = attr.RQPSN & bth.PSNMask
	}
	if given&AttrSQPSN != 0 {
		a.SQPSN = attr.SQPSN & bth.PSNMask
	}
	if given&AttrTimeout != 0 {
		a.Timeout = attr.Timeout
		qp.timeout = AckTimeout(attr.Timeout)
	}
	if given&AttrRetryCnt != 0 {
		a.RetryCnt = attr.RetryCnt
	}
	if given&AttrRNRRetry != 0 {
		a.RNRRetry = attr.RNRRetry
	}
	if given&AttrMinRNRTimer != 0 {
		a.MinRNRTimer = attr.MinRNRTimer
	}
	if given&AttrMaxQPRdAtomic != 0 {
		a.MaxQPRdAtomic = attr.MaxQPRdAtomic
	}
	if given&AttrMaxDestRdAtomic != 0 {
		a.MaxDestRdAtomic = attr.MaxDestRdAtomic
	}
	switch {
	case next == QPSReset:
		qp.reset()
	case next == QPSErr:
		qp.toError()
	case cur == QPSInit && next == QPSRTR:
		a.State = QPSRTR
		qp.resp.reset(bth.PSN(a.RQPSN))
	case cur == QPSRTR && next == QPSRTS:
		a.State = QPSRTS
		qp.req.reset(bth.PSN(a.SQPSN))
		qp.comp.reset(bth.PSN(a.SQPSN), a)
	case cur == QPSSQD && next == QPSRTS, cur == QPSSQE && next == QPSRTS:
		a.State = QPSRTS
		qp.reqProgress()
		qp.flushOut()
	default:
		a.State = next
	}
	return nil
}

func lowestAttr(m AttrMask) AttrMask { return m & -m }

func (qp *QP) checkValues(attr *QPAttr, given AttrMask) error {
	bad := func(m AttrMask, format string, args ...any) error {
		return fmt.Errorf("transport: Modify qp %#x: %v: %s: %w", qp.qpn, m, fmt.Sprintf(format, args...), ErrInvalidAttr)
	}
	if given&AttrAccessFlags != 0 && attr.AccessFlags&^(memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic|memreg.AccessMWBind) != 0 {
		return bad(AttrAccessFlags, "unknown flags %#x", uint32(attr.AccessFlags))
	}
	if given&AttrPKeyIndex != 0 && attr.PKeyIndex != 0 {
		return bad(AttrPKeyIndex, "index %d (only 0, P_Key 0xffff, exists)", attr.PKeyIndex)
	}
	if given&AttrPort != 0 && attr.Port != 1 {
		return bad(AttrPort, "port %d (only port 1 exists)", attr.Port)
	}
	if given&AttrAV != 0 {
		pa := attr.AV.Addr.Unmap()
		if !pa.IsValid() || pa.IsUnspecified() {
			return bad(AttrAV, "peer address %v", attr.AV.Addr)
		}
		if pa.Is4() != qp.dev.addr.Is4() {
			return bad(AttrAV, "peer address %v is not in the device's address family (%v)", attr.AV.Addr, qp.dev.addr)
		}
	}
	if given&AttrPathMTU != 0 && attr.PathMTU.Bytes() == 0 {
		return bad(AttrPathMTU, "value %d (want MTU256..MTU4096)", attr.PathMTU)
	}
	if given&AttrDestQPN != 0 && (attr.DestQPN > bth.PSNMask || attr.DestQPN < 2) {
		return bad(AttrDestQPN, "%#x", attr.DestQPN)
	}
	if given&AttrRQPSN != 0 && attr.RQPSN > bth.PSNMask {
		return bad(AttrRQPSN, "%#x exceeds 24 bits", attr.RQPSN)
	}
	if given&AttrSQPSN != 0 && attr.SQPSN > bth.PSNMask {
		return bad(AttrSQPSN, "%#x exceeds 24 bits", attr.SQPSN)
	}
	if given&AttrTimeout != 0 && attr.Timeout > 31 {
		return bad(AttrTimeout, "%d > 31", attr.Timeout)
	}
	if given&AttrRetryCnt != 0 && attr.RetryCnt > 7 {
		return bad(AttrRetryCnt, "%d > 7", attr.RetryCnt)
	}
	if given&AttrRNRRetry != 0 && attr.RNRRetry > 7 {
		return bad(AttrRNRRetry, "%d > 7", attr.RNRRetry)
	}
	if given&AttrMinRNRTimer != 0 && attr.MinRNRTimer > 31 {
		return bad(AttrMinRNRTimer, "%d > 31", attr.MinRNRTimer)
	}
	if given&AttrMaxQPRdAtomic != 0 && int(attr.MaxQPRdAtomic) > qp.dev.cfg.MaxRdAtomic {
		return bad(AttrMaxQPRdAtomic, "%d > device limit %d", attr.MaxQPRdAtomic, qp.dev.cfg.MaxRdAtomic)
	}
	if given&AttrMaxDestRdAtomic != 0 && int(attr.MaxDestRdAtomic) > qp.dev.cfg.MaxRdAtomic {
		return bad(AttrMaxDestRdAtomic, "%d > device limit %d", attr.MaxDestRdAtomic, qp.dev.cfg.MaxRdAtomic)
	}
	return nil
}

// AckTimeout returns the local ACK timeout for a timeout attribute:
// 4.096 µs × 2^t, 0 meaning infinite (returned as 0).
func AckTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	if t > 31 {
		t = 31
	}
	return time.Duration(4096) * time.Nanosecond << t
}

// reset returns the QP to RESET: queues emptied without completions.
func (qp *QP) reset() {
	qp.stopTimersLocked()
	for i := range qp.sq {
		qp.sq[i] = sendWQE{sges: qp.sq[i].sges[:0]}
	}
	for i := range qp.rq {
		qp.rq[i] = recvWQE{sges: qp.rq[i].sges[:0]}
	}
	qp.sqHead, qp.sqCur, qp.sqEnd = 0, 0, 0
	qp.rqHead, qp.rqEnd = 0, 0
	qp.req = requester{}
	qp.comp = completer{}
	res := qp.resp.res
	for i := range res {
		res[i] = rdRes{}
	}
	qp.resp = responder{res: res}
	qp.nout = 0
	qp.ackSlot = 0
	qp.attr = QPAttr{}
	qp.mtu = 0
	qp.peer = netip.Addr{}
	qp.timeout = 0
}

func (qp *QP) stopTimersLocked() {
	qp.retransTimer.Stop()
	qp.rnrTimer.Stop()
	qp.comp.timerArmed = false
	qp.comp.rnrWait = false
}

// toError moves the QP to ERR and completes every outstanding work request:
// the send WQE that failed (if any) with its status, everything else with
// WCWRFlushErr. Called with qp.mu held.
func (qp *QP) toError() {
	qp.flushOut()
	qp.attr.State = QPSErr
	qp.stopTimersLocked()
	for qp.sqHead != qp.sqEnd {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		st := WCWRFlushErr
		if w.done && w.status != WCSuccess {
			st = w.status
		}
		qp.completeSend(w, st)
		qp.sqHead++
	}
	qp.sqCur = qp.sqHead
	for qp.rqHead != qp.rqEnd {
		r := &qp.rq[qp.rqHead%uint64(len(qp.rq))]
		qp.pushWC(qp.recvCQ, &WC{WRID: r.wrid, Status: WCWRFlushErr, Opcode: WCRecv, QPN: qp.qpn})
		qp.rqHead++
	}
	qp.resp.wqeActive = false
}

// completeSend generates the completion of a send WQE (always for errors,
// for success only when signaled).
func (qp *QP) completeSend(w *sendWQE, st WCStatus) {
	if st == WCSuccess && !w.signaled {
		return
	}
	wc := WC{WRID: w.wr.WRID, Status: st, QPN: qp.qpn}
	switch w.wr.Opcode {
	case WRSend, WRSendImm, WRSendInv:
		wc.Opcode = WCSend
	case WRWrite, WRWriteImm:
		wc.Opcode = WCRDMAWrite
	case WRRead:
		wc.Opcode = WCRDMARead
	case WRCompareSwap:
		wc.Opcode = WCCompSwap
	case WRFetchAdd:
		wc.Opcode = WCFetchAdd
	}
	if st == WCSuccess {
		switch w.wr.Opcode {
		case WRRead:
			wc.ByteLen = w.length
		case WRCompareSwap, WRFetchAdd:
			wc.ByteLen = 8
		}
	}
	qp.pushWC(qp.sendCQ, &wc)
}

// PostSend queues send work requests. Each WR is validated (opcode, SGE
// count, local keys and rights, atomic alignment); the first invalid WR
// stops posting and the error names it and its field. WRs before it stay
// posted. A full send queue returns ErrQueueFull. The QP must be in RTS or
// SQD, or in ERR (then the WRs complete with WCWRFlushErr).
func (qp *QP) PostSend(wrs ...SendWR) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	st := qp.attr.State
	if st != QPSRTS && st != QPSSQD && st != QPSErr {
		return fmt.Errorf("transport: PostSend qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
	}
	var err error
	for i := range wrs {
		if err = qp.postOne(i, &wrs[i]); err != nil {
			break
		}
	}
	if qp.attr.State == QPSErr {
		qp.toError()
	} else {
		qp.reqProgress()
	}
	qp.flushOut()
	return err
}

func (qp *QP) postOne(i int, wr *SendWR) error {
	if qp.sqEnd-qp.sqHead >= uint64(len(qp.sq)) {
		return fmt.Errorf("transport: PostSend wr %d: %d WRs outstanding: %w", i, len(qp.sq), ErrQueueFull)
	}
	if len(wr.SGEs) > qp.init.MaxSGE {
		return fmt.Errorf("transport: PostSend wr %d: %d SGEs > max_sge %d: %w", i, len(wr.SGEs), qp.init.MaxSGE, ErrInvalidWR)
	}
	var acc memreg.Access
	switch wr.Opcode {
	case WRSend, WRSendImm, WRSendInv, WRWrite, WRWriteImm:
	case WRRead, WRCompareSwap, WRFetchAdd:
		acc = memreg.AccessLocalWrite
	default:
		return fmt.Errorf("transport: PostSend wr %d: opcode %v: %w", i, wr.Opcode, ErrInvalidWR)
	}
	var total uint64
	for j := range wr.SGEs {
		n, err := qp.pd.CheckSGEs(wr.SGEs[j:j+1], acc)
		if err != nil {
			return fmt.Errorf("transport: PostSend wr %d: sge[%d].lkey %#x: %w", i, j, wr.SGEs[j].LKey, err)
		}
		total += n
	}
	if total > 1<<31 {
		return fmt.Errorf("transport: PostSend wr %d: length %d > 2^31: %w", i, total, ErrInvalidWR)
	}
	if wr.Opcode == WRCompareSwap || wr.Opcode == WRFetchAdd {
		if total != 8 {
			return fmt.Errorf("transport: PostSend wr %d: atomic sge length %d, want 8: %w", i, total, ErrInvalidWR)
		}
		if wr.RemoteAddr&7 != 0 {
			return fmt.Errorf("transport: PostSend wr %d: remote_addr %#x not 8-byte aligned: %w", i, wr.RemoteAddr, ErrInvalidWR)
		}
	}
	w := &qp.sq[qp.sqEnd%uint64(len(qp.sq))]
	sges := append(w.sges[:0], wr.SGEs...)
	// Field by field, so that the caller's SGE slice is not retained
	// (and does not escape).
	*w = sendWQE{wr: SendWR{WRID: wr.WRID, Opcode: wr.Opcode, SGEs: sges, Flags: wr.Flags, Imm: wr.Imm,
		InvRKey: wr.InvRKey, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey, CompareAdd: wr.CompareAdd, Swap: wr.Swap},
		sges: sges, length: uint32(total)}
	if wr.Opcode == WRRead {
		w.rsl = qp.pd.ScatterList(sges)
	}
	w.signaled = qp.init.SigAll || wr.Flags&SendSignaled != 0
	qp.sqEnd++
	return nil
}

// PostRecv queues receive work requests. The QP must not be in RESET.
// SGEs are checked for local write access; the first invalid WR stops
// posting and the error names it.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.attr.State == QPSReset {
		return fmt.Errorf("transport: PostRecv qp %#x: state %v: %w", qp.qpn, qp.attr.State, ErrInvalidState)
	}
	for i := range wrs {
		wr := &wrs[i]
		if qp.rqEnd-qp.rqHead >= uint64(len(qp.rq)) {
			return fmt.Errorf("transport: PostRecv wr %d: %d WRs outstanding: %w", i, len(qp.rq), ErrQueueFull)
		}
		if len(wr.SGEs) > qp.init.MaxSGE {
			return fmt.Errorf("transport: PostRecv wr %d: %d SGEs > max_sge %d: %w", i, len(wr.SGEs), qp.init.MaxSGE, ErrInvalidWR)
		}
		var total uint64
		for j := range wr.SGEs {
			n, err := qp.pd.CheckSGEs(wr.SGEs[j:j+1], memreg.AccessLocalWrite)
			if err != nil {
				return fmt.Errorf("transport: PostRecv wr %d: sge[%d].lkey %#x: %w", i, j, wr.SGEs[j].LKey, err)
			}
			total += n
		}
		r := &qp.rq[qp.rqEnd%uint64(len(qp.rq))]
		r.wrid = wr.WRID
		r.sges = append(r.sges[:0], wr.SGEs...)
		r.length = total
		qp.rqEnd++
		if qp.attr.State == QPSErr {
			qp.toError()
		}
	}
	return nil
}

// outBuf returns a packet buffer of full capacity for the next outgoing
// packet; commit must follow.
func (qp *QP) outBuf() []byte {
	if qp.nout == len(qp.out) {
		qp.flushOut()
	}
	return qp.outBufs[qp.nout][:udp.MaxPacketSize]
}

// commit queues the packet built in the last outBuf with length n.
func (qp *QP) commit(n int) {
	p := &qp.out[qp.nout]
	p.Buf = qp.outBufs[qp.nout][:n]
	p.Addr = qp.peer
	p.SrcPort = qp.srcPort
	p.TOS = qp.attr.AV.TrafficClass
	qp.nout++
	qp.ackSlot = 0
}

// flushOut sends the queued packets. Called with qp.mu held so that a QP's
// packets leave in order.
func (qp *QP) flushOut() {
	if qp.nout == 0 {
		return
	}
	if qp.trace != nil {
		var p packetT
		for i := 0; i < qp.nout; i++ {
			if p.Parse(qp.out[i].Buf) == nil && p.BTH.Opcode() != bth.RCWriteMiddle && p.BTH.Opcode() != bth.RCSendMiddle {
				qp.trace("tx %v psn %v", p.BTH.Opcode(), p.BTH.PSN())
			}
		}
	}
	qp.dev.send(qp.out[:qp.nout])
	qp.nout = 0
	qp.ackSlot = 0
}

// input dispatches a received packet. Called from the device receive
// goroutine with batched set: what the packet makes the QP send is queued
// and flushed at the end of the received batch (Device.flushPending).
// Without batched it is sent before input returns.
func (qp *QP) input(p *packetT, src netip.Addr, batched bool) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	st := qp.attr.State
	if st < QPSRTR || st == QPSErr || qp.destroyed || src.Unmap() != qp.peer || p.BTH.PKey()&0x7fff != bth.DefaultPKey&0x7fff {
		inc(&qp.dev.ctr.UnknownQP)
		if qp.trace != nil && st != QPSErr {
			qp.trace("drop %v psn %v state %v src %v", p.BTH.Opcode(), p.BTH.PSN(), st, src)
		}
		return
	}
	inc(&qp.dev.ctr.RcvdPkts)
	qp.rxBatch = batched
	if qp.trace != nil && p.Info.Request && p.Info.Kind != bth.KindSend && p.Info.Kind != bth.KindWrite {
		qp.trace("rx req %v psn %v (resp.psn %v)", p.BTH.Opcode(), p.BTH.PSN(), qp.resp.psn)
	}
	if p.Info.Request {
		qp.respInput(p)
	} else if st >= QPSRTS {
		qp.compInput(p)
	}
	qp.rxBatch = false
	if !batched {
		qp.flushOut()
	} else if qp.nout > 0 && !qp.rxQueued {
		qp.rxQueued = true
		qp.dev.rxPending = append(qp.dev.rxPending, qp)
	}
}

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("transport: "+format+": %w", append(args, sentinel)...)
}

// debugState describes the QP's protocol state (for test failure messages).
func (qp *QP) debugState() string {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	s := fmt.Sprintf("qpn %#x %v req.psn %v maxPSN %v curPkt %d rdOut %d comp.psn %v retryCnt %d retryPending %v rnrWait %v sq[%d,%d,%d) resp.psn %v msn %d nakSent %v op %d",
		qp.qpn, qp.attr.State, qp.req.psn, qp.req.maxPSN, qp.req.curPkt, qp.req.rdOut, qp.comp.psn, qp.comp.retryCnt, qp.comp.retryPending, qp.comp.rnrWait,
		qp.sqHead, qp.sqCur, qp.sqEnd, qp.resp.psn, qp.resp.msn, qp.resp.nakSent, qp.resp.op)
	for i := qp.sqHead; i != qp.sqEnd && i < qp.sqHead+4; i++ {
		w := &qp.sq[i%uint64(len(qp.sq))]
		s += fmt.Sprintf("\n  wqe %d: %v len %d first %v npkts %d done %v status %v", w.wr.WRID, w.wr.Opcode, w.length, w.firstPSN, w.npkts, w.done, w.status)
	}
	for _, x := range qp.resp.res {
		if x.valid {
			s += fmt.Sprintf("\n  res atomic=%v [%v,%v] len %d", x.atomic, x.firstPSN, x.lastPSN, x.length)
		}
	}
	return s
}
