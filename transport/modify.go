package transport

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
)

type transition struct{ req, opt AttrMask }

var transitions = map[[2]QPState]transition{
	{QPSReset, QPSInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
		opt: AttrAccessFlags | AttrPKeyIndex | AttrSelectiveRepeat},
	{QPSRTR, QPSRTS}: {req: AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
		opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSRTS, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSRTS, QPSSQD}: {},
	{QPSSQD, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
	{QPSSQD, QPSSQD}: {opt: AttrAV | AttrPKeyIndex | AttrPort | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
		AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrMinRNRTimer | AttrAccessFlags},
	{QPSSQE, QPSRTS}: {opt: AttrAccessFlags | AttrMinRNRTimer},
}

// ucTransitions is the transition table of UC QPs: a path and a peer, no
// acknowledgements, no READ/atomic resources.
var ucTransitions = map[[2]QPState]transition{
	{QPSReset, QPSInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSRTR}:   {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, opt: AttrAccessFlags | AttrPKeyIndex},
	{QPSRTR, QPSRTS}:    {req: AttrSQPSN, opt: AttrAccessFlags},
	{QPSRTS, QPSRTS}:    {opt: AttrAccessFlags},
	{QPSRTS, QPSSQD}:    {},
	{QPSSQD, QPSRTS}:    {opt: AttrAccessFlags},
	{QPSSQD, QPSSQD}:    {opt: AttrAV | AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSSQE, QPSRTS}:    {opt: AttrAccessFlags},
}

// udTransitions is the transition table of UD QPs: no path, no peer, a
// Q_Key.
var udTransitions = map[[2]QPState]transition{
	{QPSReset, QPSInit}: {req: AttrPKeyIndex | AttrPort | AttrQKey},
	{QPSInit, QPSInit}:  {opt: AttrPKeyIndex | AttrPort | AttrQKey},
	{QPSInit, QPSRTR}:   {opt: AttrPKeyIndex | AttrQKey},
	{QPSRTR, QPSRTS}:    {req: AttrSQPSN, opt: AttrQKey},
	{QPSRTS, QPSRTS}:    {opt: AttrQKey},
	{QPSRTS, QPSSQD}:    {},
	{QPSSQD, QPSRTS}:    {opt: AttrQKey},
	{QPSSQD, QPSSQD}:    {opt: AttrPKeyIndex | AttrQKey},
	{QPSSQE, QPSRTS}:    {opt: AttrQKey},
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
	if qp.dev.isClosed() {
		return fmt.Errorf("transport: Modify qp %#x: %w", qp.qpn, ErrClosed)
	}
	if qp.destroyed {
		return fmt.Errorf("transport: Modify qp %#x: %w", qp.qpn, qp.destroyedErr())
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
		table := transitions
		switch qp.init.Type {
		case QPTypeUD:
			table = udTransitions
		case QPTypeUC:
			table = ucTransitions
		}
		tr, ok = table[[2]QPState{cur, next}]
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
	if given&AttrQKey != 0 {
		a.QKey = attr.QKey
	}
	if given&AttrSelectiveRepeat != 0 {
		a.SelectiveRepeat = attr.SelectiveRepeat
	}
	switch {
	case next == QPSReset:
		qp.reset()
	case next == QPSErr:
		qp.toError()
	case cur == QPSInit && next == QPSRTR:
		a.State = QPSRTR
		qp.resp.reset(bth.PSN(a.RQPSN))
		qp.srEnable(a.SelectiveRepeat)
	case cur == QPSRTR && next == QPSRTS:
		a.State = QPSRTS
		qp.req.reset(bth.PSN(a.SQPSN))
		qp.comp.reset(bth.PSN(a.SQPSN), a)
		qp.srResetReq(bth.PSN(a.SQPSN))
	case cur == QPSSQD && next == QPSRTS, cur == QPSSQE && next == QPSRTS:
		a.State = QPSRTS
		qp.req.progress()
		qp.flushOut()
	case next == QPSSQD:
		a.State = QPSSQD
		if cur != QPSSQD {
			qp.sqdDrained = false
		}
		qp.settle()
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
	if given&AttrQKey != 0 && attr.QKey&ControlledQKey != 0 && qp.qpn != 1 {
		return bad(AttrQKey, "%#x has the high bit set: controlled Q_Keys are reserved for QP1", attr.QKey)
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
		if pa.IsMulticast() || pa == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return bad(AttrAV, "peer address %v is a group address: a connected QP has one peer", attr.AV.Addr)
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
	qp.srFree()
	qp.sr = nil
	for i := range qp.sq {
		qp.sq[i] = sendWQE{sges: qp.sq[i].sges[:0]}
	}
	for i := range qp.rq {
		qp.rq[i] = recvWQE{sges: qp.rq[i].sges[:0]}
	}
	qp.sqHead, qp.sqCur, qp.sqEnd = 0, 0, 0
	qp.rqHead, qp.rqEnd = 0, 0
	qp.req = requester{qp: qp}
	qp.comp = completer{qp: qp}
	res := qp.resp.res
	for i := range res {
		res[i] = rdRes{}
	}
	qp.resp.dropHeld()
	qp.resp = responder{qp: qp, res: res, srqWQE: recvWQE{sges: qp.resp.srqWQE.sges[:0]}, held: heldReqs{q: qp.resp.held.q}}
	qp.nout = 0
	qp.ackSlot = 0
	qp.releaseSlabs(false)
	qp.attr = QPAttr{}
	qp.mtu = 0
	qp.peer = netip.Addr{}
	qp.timeout = 0
	qp.stopPacing()
	qp.ccInit()
	qp.probes = 0
	if qp.failed {
		// A QP taken back to RESET from ERR can fail again.
		qp.failed, qp.failErr, qp.failCh = false, nil, make(chan struct{})
	}
}

// toError moves the QP to ERR and completes every outstanding work request:
// the oldest send WQE with its own status if it failed (failWQE), every
// other one with WCWRFlushErr, as verbs reports only the first error.
// A QP attached to an SRQ that enters ERR raises EventQPLastWQEReached
// once, after it has flushed the WQE it held (see enterError).
// Called with qp.mu held.
func (qp *QP) toError() { qp.enterError(true) }

// enterError is toError; lastWQE false leaves out EventQPLastWQEReached
// (Destroy and Device.Close: the QP is gone before anyone could act on
// the event).
func (qp *QP) enterError(lastWQE bool) {
	wasErr := qp.attr.State == QPSErr
	qp.flushOut()
	qp.attr.State = QPSErr
	qp.stopTimersLocked()
	qp.srFree()
	// A READ response under way ends; what was held behind it is not
	// executed (as a QP in ERR drops what it receives).
	qp.resp.rd = readResp{}
	qp.resp.dropHeld()
	first := true
	for qp.sqHead != qp.sqEnd {
		w := qp.sqAt(qp.sqHead)
		st := WCWRFlushErr
		if first && w.done && w.status != WCSuccess {
			st = w.status
		}
		first = false
		qp.completeSend(w, st)
		qp.sqHead++
	}
	qp.sqCur = qp.sqHead
	if qp.resp.srqHeld {
		// Taken from the SRQ for a message that will not complete; the
		// SRQ's other WRs stay for the other QPs.
		qp.resp.srqHeld = false
		qp.pushWC(qp.recvCQ, &WC{WRID: qp.resp.srqWQE.wrid, Status: WCWRFlushErr, Opcode: WCRecv, QPN: qp.qpn}, false)
	}
	for qp.rqHead != qp.rqEnd {
		r := qp.rqAt(qp.rqHead)
		qp.pushWC(qp.recvCQ, &WC{WRID: r.wrid, Status: WCWRFlushErr, Opcode: WCRecv, QPN: qp.qpn}, false)
		qp.rqHead++
	}
	qp.resp.wqeActive = false
	qp.markFailed()
	if lastWQE && !wasErr && qp.srq != nil {
		// IBTA's affiliated event "Last WQE Reached": the QP will take
		// no more WQEs from its SRQ, and the one it held has completed
		// (flushed above). mlx5 raises it, and Linux's ib_drain_rq waits
		// for it before destroying an SRQ-attached QP.
		qp.dev.raise(AsyncEvent{Type: EventQPLastWQEReached, QP: qp, SRQ: qp.srq})
	}
}
