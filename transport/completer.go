package transport

import (
	"encoding/binary"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
)

// completer processes responses (ACK, NAK, READ responses, atomic ACKs)
// and completes send WQEs in order (rxe_comp.c).
type completer struct {
	qp           *QP     // the QP it belongs to (it is embedded there, as QP.comp)
	psn          bth.PSN // oldest unacknowledged PSN
	retryCnt     uint8
	rnrRetry     uint8
	retryPending bool // a go-back-N is under way and nothing was acked since
	scratch      [8]byte
	// lateRun counts ACK timer expiries in a row that spent no retry
	// because this process was behind (onRetransTimer); bounded, so that
	// a dead peer is found even on a process that is always behind.
	lateRun uint8
	// busySeen records that, since the last ACK timer expiry, READ
	// responses arrived beyond the gap a go-back-N is re-requesting: the
	// rest of the old response flight, so the peer is alive and busy.
	// busyRun counts the expiries it excused since the last retry or
	// progress (excuseBusy).
	busySeen bool
	busyRun  uint8
}

// reset starts the completer over at psn with the retry budgets of a
// (RTR→RTS).
func (c *completer) reset(psn bth.PSN, a *QPAttr) {
	*c = completer{qp: c.qp, psn: psn, retryCnt: a.RetryCnt, rnrRetry: a.RNRRetry}
}

// oldestUnacked returns the oldest PSN not yet acknowledged.
func (c *completer) oldestUnacked() bth.PSN { return c.psn }

// outstanding reports whether any sent request awaits a response.
func (c *completer) outstanding() bool { return c.psn != c.qp.req.nextPSN() }

// retry starts a go-back-N retransmission from the oldest unacknowledged
// PSN, or fails the QP when retry_cnt is exhausted.
func (c *completer) retry() {
	qp := c.qp
	if qp.sqHead == qp.sqEnd {
		return
	}
	if c.retryCnt == 0 {
		inc(&qp.dev.ctr.RetryExceededErr)
		qp.failWQE(qp.sqAt(qp.sqHead), WCRetryExcErr)
		return
	}
	c.retryCnt--
	c.busyRun = 0
	inc(&qp.dev.ctr.CompleterRetryErr)
	if qp.trace != nil {
		qp.trace("retry from %v (req.psn %v) retryCnt now %d", c.psn, qp.req.nextPSN(), c.retryCnt)
	}
	c.retryPending = true
	qp.req.rewind(c.psn)
	qp.req.progress()
}

// progressed records forward progress: retry counters are restored and the
// ACK timer is pushed out.
func (c *completer) progressed() {
	qp := c.qp
	c.retryCnt = qp.attr.RetryCnt
	c.rnrRetry = qp.attr.RNRRetry
	c.retryPending = false
	qp.srProgress()
	c.lateRun = 0
	c.busySeen, c.busyRun = false, 0
	if !qp.armRetransFast() {
		qp.armRetrans()
	}
}

// armRetransFast does what armRetrans would in its two cases after an ACK
// with the timer armed, and reports whether it did: requests still
// outstanding only mark the timer pushed (lazyPush), and a QP gone idle
// keeps a warm timer (not coldIdle). In line, where armRetrans is a call
// per ACK; TestArmRetransFast compares the two.
func (qp *QP) armRetransFast() bool {
	if qp.tmr.timerArmed && qp.timeout != 0 {
		if qp.comp.psn != qp.req.psn {
			if qp.dev.lazyPush {
				qp.tmr.pushed = true
				return true
			}
		} else if !qp.tmr.coldIdle {
			return true
		}
	}
	return false
}

// head returns the oldest WQE that was (at least partly) sent and has not
// completed, nil if there is none.
func (c *completer) head() *sendWQE {
	qp := c.qp
	if qp.sqHead == qp.sqEnd || !qp.req.started(qp.sqHead) {
		return nil
	}
	return qp.sqAt(qp.sqHead)
}

// failWQE fails the head WQE w with status st: the QP moves to ERR, w
// completes with st and every later WQE with WCWRFlushErr, and the device
// raises EventQPFatal.
func (qp *QP) failWQE(w *sendWQE, st WCStatus) {
	w.done, w.status = true, st
	qp.fail(EventQPFatal, &WCError{Status: st, Opcode: w.wcOpcode(), WRID: w.wr.WRID, QPN: qp.qpn})
}

// completeHead completes the head WQE successfully and advances.
func (c *completer) completeHead(w *sendWQE) {
	qp := c.qp
	w.done = true
	qp.req.rdComplete(w)
	switch w.wr.Opcode {
	case WRSend, WRSendImm, WRSendInv:
		inc(&qp.dev.ctr.RDMASends)
	}
	qp.completeSend(w, WCSuccess)
	qp.sqHead++
	c.psn = w.firstPSN.Add(w.npkts)
}

// ackUpTo applies a cumulative acknowledgement of every PSN up to and
// including psn. It reports true when the ACK covers a READ or atomic
// whose response is missing (the requester must retry).
//
// The SENDs and WRITEs it covers in full complete here as completeHead
// would one by one, but their completions go to the send CQ under one
// lock, taken at the first signaled one, and wake its waiters once
// (endRun): an ACK of a stream of small messages covers many. A
// completion the CQ cannot take is lost as completeHead's would be (and
// so is every later one: the CQ is in error then).
func (c *completer) ackUpTo(psn bth.PSN) (needRetry bool) {
	if psn.Before(c.psn) {
		return false
	}
	qp := c.qp
	from := c.psn
	moved := false
	var cq *CQ // the send CQ, locked, once a completion of the run went to it
	var run runState
	for qp.sqHead != qp.sqEnd && qp.req.started(qp.sqHead) { // c.head() != nil
		w := qp.sqAt(qp.sqHead)
		if psn.Before(w.firstPSN) {
			break
		}
		if w.npkts == 0 { // a local operation (bind, invalidate), done when reached
			if cq != nil { // completeHead stores through pushWC
				qp.endRun(cq, run)
				cq, run = nil, runState{}
			}
			c.completeHead(w)
			moved = true
			continue
		}
		if isRdAtomic(w.wr.Opcode) {
			needRetry = true
			break
		}
		last := w.firstPSN.Add(w.npkts - 1)
		if psn.Before(last) {
			c.psn = psn.Add(1)
			moved = true
			break
		}
		// completeHead and completeSend of a SEND or WRITE, in line.
		w.done = true
		qp.req.rdComplete(w)
		qp.roomFreed()
		if w.wr.Opcode == WRSend || w.wr.Opcode == WRSendImm || w.wr.Opcode == WRSendInv {
			inc(&qp.dev.ctr.RDMASends)
		}
		if w.probe {
			qp.probes-- // the QP's own: no completion (completeSend)
		} else if w.signaled {
			if cq == nil {
				cq = qp.sendCQ
				cq.mu.Lock()
			}
			slot, over := cq.slotFast(), false
			if slot == nil {
				slot, over = cq.slotLocked()
			}
			if slot != nil {
				op := WCSend
				if w.wr.Opcode == WRWrite || w.wr.Opcode == WRWriteImm {
					op = WCRDMAWrite
				}
				*slot = WC{WRID: w.wr.WRID, Status: WCSuccess, QPN: qp.qpn, Opcode: op}
				if cq.armed != notifyOff {
					cq.armedLocked(false, WCSuccess)
				}
				run.wake = true
			} else {
				run.lost = true
				if over {
					run.over, run.wake = true, true
				}
			}
		}
		qp.sqHead++
		c.psn = w.firstPSN.Add(w.npkts)
		moved = true
	}
	if cq != nil {
		qp.endRun(cq, run)
	}
	if moved {
		qp.req.smallGrow(c.psn.Diff(from))
		c.progressed()
	}
	return needRetry
}

// runState is what ackUpTo's stores of a run of completions reported.
type runState struct {
	wake bool // a completion was stored, or the CQ overflowed
	lost bool // a completion was lost (overflow, or a CQ in error)
	over bool // this run overflowed the CQ
}

// endRun ends a run of completions ackUpTo stored in cq: it unlocks cq,
// marks the QP for the error state if one was lost (settle), raises an
// overflow, and wakes cq's waiters as pushWC does.
func (qp *QP) endRun(cq *CQ, run runState) {
	cq.mu.Unlock()
	if run.lost {
		qp.cqLost = true
	}
	if run.over {
		cq.overflowed()
	}
	if run.wake {
		qp.wakeCQ(cq)
	}
}

// input handles a response packet. Called with qp.mu held.
func (c *completer) input(p *packetT) {
	qp := c.qp
	psn := p.BTH.PSN()
	if qp.trace != nil {
		var syn string
		if p.AETH != nil {
			syn = p.AETH.Syndrome().String()
		}
		qp.trace("rx %v psn %v %s (comp.psn %v req.psn %v)", p.BTH.Opcode(), psn, syn, c.psn, qp.req.nextPSN())
	}
	if (!psn.Before(qp.req.nextPSN()) || psn.Before(c.psn)) && !(qp.sr != nil && qp.srAtNext(p, psn)) {
		return // not for an outstanding PSN (stale duplicate or bogus)
	}
	switch p.Info.Kind {
	case bth.KindAck:
		if qp.sr == nil && p.AETH.Syndrome().Type() == aeth.TypeACK {
			// onAck's first case, without its call (every ACK).
			if c.ackUpTo(psn) {
				c.retryOnGap()
			}
		} else {
			c.onAck(p, psn)
		}
	case bth.KindReadResponse:
		c.onReadResponse(p, psn)
	case bth.KindAtomicAck:
		c.onAtomicAck(p, psn)
	}
	if qp.sqHead != qp.sqEnd && qp.sqAt(qp.sqHead).done {
		// The head is done before it completed only when the
		// requester gave up on it (failLocal).
		qp.req.failAtHead()
	}
	if st := qp.attr.State; st == QPSRTS || st == QPSSQD {
		if qp.sqCur != qp.sqEnd || qp.sr != nil || qp.tmr.rnrWait || qp.mtu == 0 {
			qp.req.progress()
		} else {
			// Nothing left to send (every ACK of a ping-pong): all
			// progress would do is mark the pacer idle
			// (TestAckNothingToSendIsProgress).
			qp.cc.rp.Idle()
		}
	}
}

// onAck handles an ACKNOWLEDGE: an ACK completes what it covers, an RNR
// NAK backs off and retries, a NAK retries (PSN sequence error) or fails
// the WQE it names.
func (c *completer) onAck(p *packetT, psn bth.PSN) {
	qp := c.qp
	if qp.sr != nil && qp.srOnAck(p, psn) {
		return
	}
	syn := p.AETH.Syndrome()
	switch syn.Type() {
	case aeth.TypeACK:
		if c.ackUpTo(psn) {
			c.retryOnGap()
		}
	case aeth.TypeRNRNAK:
		c.ackUpTo(psn.Add(-1))
		w := c.head()
		if w == nil || psn != c.psn {
			return
		}
		inc(&qp.dev.ctr.RcvdRNRErr)
		if c.rnrRetry == 0 {
			inc(&qp.dev.ctr.RetryRNRExceededErr)
			qp.failWQE(w, WCRNRRetryExcErr)
			return
		}
		if c.rnrRetry != 7 {
			c.rnrRetry--
		}
		qp.req.rewind(c.psn)
		c.retryPending = true
		qp.startRNRWait(aeth.RNRTimeout(syn.RNRTimer()))
	case aeth.TypeNAK:
		code := syn.NAKCode()
		if code == aeth.NAKPSNSeqError {
			c.ackUpTo(psn.Add(-1))
			inc(&qp.dev.ctr.RcvdSeqErr)
			c.retryOnGap()
			return
		}
		if c.ackUpTo(psn.Add(-1)) {
			c.retryOnGap()
			return
		}
		w := c.head()
		if w == nil || psn.Before(w.firstPSN) || !psn.Before(w.firstPSN.Add(w.npkts)) {
			return
		}
		switch code {
		case aeth.NAKInvalidRequest:
			w.status = WCRemInvReqErr
		case aeth.NAKRemoteAccessError:
			w.status = WCRemAccessErr
		case aeth.NAKRemoteOperationalError:
			w.status = WCRemOpErr
		case aeth.NAKInvalidRDRequest:
			w.status = WCRemInvRDReqErr
		default:
			// A reserved NAK code: the responder failed the request
			// for a reason the IBTA does not name. A remote operation
			// error, as rxe's check_ack ("unexpected nak").
			w.status = WCRemOpErr
		}
		qp.failWQE(w, w.status)
	default:
		// The reserved syndrome type (binary 10): no responder sends
		// it. Dropped as a malformed packet, as a header that fails
		// its checks is; the request is resent on its timeout.
		inc(&qp.dev.ctr.MalformedPkts)
	}
}

// onReadResponse places a READ response into the head READ WQE and
// completes it at the last one.
func (c *completer) onReadResponse(p *packetT, psn bth.PSN) {
	qp := c.qp
	if qp.sr != nil {
		qp.srOnReadResponse(p, psn)
		return
	}
	// A READ response implicitly acknowledges every earlier SEND/WRITE.
	if c.ackUpTo(psn.Add(-1)) {
		// An earlier READ/atomic is still missing its response.
		c.retryOnGap()
		c.sawStale()
		return
	}
	w := c.head()
	if w == nil || w.wr.Opcode != WRRead {
		return
	}
	if psn != c.psn {
		c.retryOnGap()
		c.sawStale()
		return
	}
	k := int(psn.Diff(w.firstPSN))
	if k < 0 || k >= w.npkts {
		return
	}
	// Position and length must fit the request.
	pos := p.Info.Pos
	lastPkt := k == w.npkts-1
	if lastPkt != (pos == bth.PosLast || pos == bth.PosOnly) {
		return
	}
	if p.AETH != nil && p.AETH.Syndrome().Type() != aeth.TypeACK {
		return
	}
	off := uint64(k) * uint64(qp.mtu)
	want := uint64(w.length) - off
	if want > uint64(qp.mtu) {
		want = uint64(qp.mtu)
	}
	if uint64(len(p.Payload)) != want {
		qp.failWQE(w, WCBadRespErr)
		return
	}
	if len(p.Payload) > 0 {
		// As the responder's SEND data: inside a received batch the
		// destination stays pinned until the batch ends.
		if err := w.rsl.Scatter(qp.rxPins(), off, p.Payload); err != nil {
			qp.failWQE(w, WCLocProtErr)
			return
		}
	}
	c.psn = psn.Add(1)
	if lastPkt {
		c.completeHead(w)
	}
	c.progressed()
}

// retryOnGap retransmits after a response revealed a gap (a PSN sequence
// NAK, a response beyond a missing one, an ACK beyond an unanswered READ).
// While a retransmission is under way and nothing new has been
// acknowledged, further such signals come from the old flight and are
// ignored, so one loss costs one go-back-N (rxe's started_retry).
func (c *completer) retryOnGap() {
	qp := c.qp
	if qp.sr != nil { // selective repeat: resend what is missing
		qp.srLost(qp.req.nextPSN())
		return
	}
	if c.retryPending {
		return
	}
	c.retry()
}

// sawStale notes a READ response beyond the gap while a go-back-N is
// under way: the rest of the old flight, still streaming (excuseBusy).
func (c *completer) sawStale() {
	if c.retryPending {
		c.busySeen = true
	}
}

// maxBusyRun bounds the ACK timer expiries per retry that excuseBusy lets
// pass without spending a retry. 16 timeouts (about 1 s at the common
// timeout 14) cover the rest of a large READ's response flight from a
// slow peer (an 8 MiB READ is 8192 packets at MTU 1024); a peer that
// streams stale responses and never answers the re-request still fails
// the WQE, after at most (retry_cnt + 1) × 17 timeouts.
const maxBusyRun = 16

// excuseBusy reports, at an ACK timer expiry during a go-back-N, that
// READ responses of the old flight arrived since the previous expiry
// (sawStale) and fewer than maxBusyRun expiries were excused since the
// last retry or progress: the peer is alive and still sending what it
// was asked before the re-request, which it answers after that (rxe's
// responder works through its requests in order). The expiry then spends
// no retry and resends nothing (rxe's completer likewise lets a timer
// expiry that finds responses queued pass, and re-arms its timer after
// each one). An expiry with nothing received since the previous one is
// not excused: a dead peer is found after retry_cnt + 1 timeouts, as
// before. It consumes the mark.
func (c *completer) excuseBusy() bool {
	seen := c.busySeen
	c.busySeen = false
	if !seen || !c.retryPending || c.busyRun >= maxBusyRun {
		return false
	}
	c.busyRun++
	return true
}

// onAtomicAck stores an ATOMIC ACK's original value into the head atomic
// WQE's buffer and completes it.
func (c *completer) onAtomicAck(p *packetT, psn bth.PSN) {
	qp := c.qp
	if qp.sr != nil {
		qp.srOnAtomicAck(p, psn)
		return
	}
	if c.ackUpTo(psn.Add(-1)) {
		c.retryOnGap()
		return
	}
	w := c.head()
	if w == nil || (w.wr.Opcode != WRCompareSwap && w.wr.Opcode != WRFetchAdd) {
		return
	}
	if psn != c.psn || psn != w.firstPSN || p.AETH.Syndrome().Type() != aeth.TypeACK {
		return
	}
	binary.NativeEndian.PutUint64(c.scratch[:], p.AtomicAck.OrigData())
	if err := qp.pd.Scatter(w.sges, 0, c.scratch[:]); err != nil {
		qp.failWQE(w, WCLocProtErr)
		return
	}
	c.completeHead(w)
	c.progressed()
}

// completeSend generates the completion of a send WQE (always for errors,
// for success only when signaled).
func (qp *QP) completeSend(w *sendWQE, st WCStatus) {
	qp.roomFreed()
	if w.probe {
		// A keep-alive probe is the QP's own: its failure is the QP's
		// (Err), never a completion the application did not post.
		qp.probes--
		return
	}
	if st == WCSuccess && !w.signaled {
		return
	}
	wc := WC{WRID: w.wr.WRID, Status: st, QPN: qp.qpn, Opcode: w.wcOpcode()}
	if st == WCSuccess {
		switch w.wr.Opcode {
		case WRRead:
			wc.ByteLen = w.length
		case WRCompareSwap, WRFetchAdd:
			wc.ByteLen = 8
		}
	}
	qp.pushWC(qp.sendCQ, &wc, false)
}

// wcOpcode returns the completion opcode of the WQE's operation.
func (w *sendWQE) wcOpcode() WCOpcode {
	switch w.wr.Opcode {
	case WRWrite, WRWriteImm:
		return WCRDMAWrite
	case WRRead:
		return WCRDMARead
	case WRCompareSwap:
		return WCCompSwap
	case WRFetchAdd:
		return WCFetchAdd
	case WRBindMW:
		return WCBindMW
	case WRLocalInv:
		return WCLocalInv
	}
	return WCSend
}
