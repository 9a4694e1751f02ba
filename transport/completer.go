package transport

import (
	"encoding/binary"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
)

// completer processes responses (ACK, NAK, READ responses, atomic ACKs)
// and completes send WQEs in order (rxe_comp.c).
type completer struct {
	psn          bth.PSN // oldest unacknowledged PSN
	retryCnt     uint8
	rnrRetry     uint8
	retryPending bool    // a go-back-N is under way and nothing was acked since
	retryPSN     bth.PSN // the PSN it started from
	scratch      [8]byte
	// lateRun counts ACK timer expiries in a row that spent no retry
	// because this process was behind (onRetransTimer); bounded, so that
	// a dead peer is found even on a process that is always behind.
	lateRun uint8
}

func (c *completer) reset(psn bth.PSN, a *QPAttr) {
	*c = completer{psn: psn, retryCnt: a.RetryCnt, rnrRetry: a.RNRRetry}
}

// oldestUnacked returns the oldest PSN not yet acknowledged.
func (qp *QP) oldestUnacked() bth.PSN { return qp.comp.psn }

// outstanding reports whether any sent request awaits a response.
func (qp *QP) outstanding() bool { return qp.comp.psn != qp.req.nextPSN() }

// retry starts a go-back-N retransmission from the oldest unacknowledged
// PSN, or fails the QP when retry_cnt is exhausted.
func (qp *QP) retry() {
	if qp.sqHead == qp.sqEnd {
		return
	}
	if qp.comp.retryCnt == 0 {
		inc(&qp.dev.ctr.RetryExceededErr)
		qp.failWQE(qp.sqAt(qp.sqHead), WCRetryExcErr)
		return
	}
	qp.comp.retryCnt--
	inc(&qp.dev.ctr.CompleterRetryErr)
	if qp.trace != nil {
		qp.trace("retry from %v (req.psn %v) retryCnt now %d", qp.comp.psn, qp.req.nextPSN(), qp.comp.retryCnt)
	}
	qp.comp.retryPending, qp.comp.retryPSN = true, qp.comp.psn
	qp.req.rewind(qp.comp.psn)
	qp.req.progress()
}

// progress records forward progress: retry counters are restored and the
// ACK timer is pushed out.
func (qp *QP) progress() {
	qp.comp.retryCnt = qp.attr.RetryCnt
	qp.comp.rnrRetry = qp.attr.RNRRetry
	qp.comp.retryPending = false
	qp.srProgress()
	qp.comp.lateRun = 0
	qp.armRetrans()
}

func (qp *QP) head() *sendWQE {
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
func (qp *QP) completeHead(w *sendWQE) {
	w.done = true
	qp.req.rdComplete(w)
	switch w.wr.Opcode {
	case WRSend, WRSendImm, WRSendInv:
		inc(&qp.dev.ctr.RDMASends)
	}
	qp.completeSend(w, WCSuccess)
	qp.sqHead++
	qp.comp.psn = w.firstPSN.Add(w.npkts)
}

// ackUpTo applies a cumulative acknowledgement of every PSN up to and
// including psn. It reports true when the ACK covers a READ or atomic
// whose response is missing (the requester must retry).
func (qp *QP) ackUpTo(psn bth.PSN) (needRetry bool) {
	if psn.Before(qp.comp.psn) {
		return false
	}
	moved := false
	for {
		w := qp.head()
		if w == nil || psn.Before(w.firstPSN) {
			break
		}
		if w.npkts == 0 { // a local operation (bind, invalidate), done when reached
			qp.completeHead(w)
			moved = true
			continue
		}
		if isRdAtomic(w.wr.Opcode) {
			needRetry = true
			break
		}
		last := w.firstPSN.Add(w.npkts - 1)
		if psn.Before(last) {
			qp.comp.psn = psn.Add(1)
			moved = true
			break
		}
		qp.completeHead(w)
		moved = true
	}
	if moved {
		qp.progress()
	}
	return needRetry
}

// compInput handles a response packet. Called with qp.mu held.
func (qp *QP) compInput(p *packetT) {
	psn := p.BTH.PSN()
	if qp.trace != nil {
		var syn string
		if p.AETH != nil {
			syn = p.AETH.Syndrome().String()
		}
		qp.trace("rx %v psn %v %s (comp.psn %v req.psn %v)", p.BTH.Opcode(), psn, syn, qp.comp.psn, qp.req.nextPSN())
	}
	if (!psn.Before(qp.req.nextPSN()) || psn.Before(qp.comp.psn)) && !(qp.sr != nil && qp.srAtNext(p, psn)) {
		return // not for an outstanding PSN (stale duplicate or bogus)
	}
	switch p.Info.Kind {
	case bth.KindAck:
		qp.onAck(p, psn)
	case bth.KindReadResponse:
		qp.onReadResponse(p, psn)
	case bth.KindAtomicAck:
		qp.onAtomicAck(p, psn)
	}
	qp.req.failAtHead()
	if qp.attr.State == QPSRTS || qp.attr.State == QPSSQD {
		qp.req.progress()
	}
}

func (qp *QP) onAck(p *packetT, psn bth.PSN) {
	if qp.sr != nil && qp.srOnAck(p, psn) {
		return
	}
	syn := p.AETH.Syndrome()
	switch syn.Type() {
	case aeth.TypeACK:
		if qp.ackUpTo(psn) {
			qp.retryOnGap()
		}
	case aeth.TypeRNRNAK:
		qp.ackUpTo(psn.Add(-1))
		w := qp.head()
		if w == nil || psn != qp.comp.psn {
			return
		}
		inc(&qp.dev.ctr.RcvdRNRErr)
		if qp.comp.rnrRetry == 0 {
			inc(&qp.dev.ctr.RetryRNRExceededErr)
			qp.failWQE(w, WCRNRRetryExcErr)
			return
		}
		if qp.comp.rnrRetry != 7 {
			qp.comp.rnrRetry--
		}
		qp.req.rewind(qp.comp.psn)
		qp.comp.retryPending, qp.comp.retryPSN = true, qp.comp.psn
		qp.startRNRWait(aeth.RNRTimeout(syn.RNRTimer()))
	case aeth.TypeNAK:
		code := syn.NAKCode()
		if code == aeth.NAKPSNSeqError {
			qp.ackUpTo(psn.Add(-1))
			inc(&qp.dev.ctr.RcvdSeqErr)
			qp.retryOnGap()
			return
		}
		if qp.ackUpTo(psn.Add(-1)) {
			qp.retryOnGap()
			return
		}
		w := qp.head()
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
			w.status = WCBadRespErr
		}
		qp.failWQE(w, w.status)
	}
}

func (qp *QP) onReadResponse(p *packetT, psn bth.PSN) {
	if qp.sr != nil {
		qp.srOnReadResponse(p, psn)
		return
	}
	// A READ response implicitly acknowledges every earlier SEND/WRITE.
	if qp.ackUpTo(psn.Add(-1)) {
		// An earlier READ/atomic is still missing its response.
		qp.retryOnGap()
		return
	}
	w := qp.head()
	if w == nil || w.wr.Opcode != WRRead {
		return
	}
	if psn != qp.comp.psn {
		qp.retryOnGap()
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
	qp.comp.psn = psn.Add(1)
	if lastPkt {
		qp.completeHead(w)
	}
	qp.progress()
}

// retryOnGap retransmits after a response revealed a gap (a PSN sequence
// NAK, a response beyond a missing one, an ACK beyond an unanswered READ).
// While a retransmission is under way and nothing new has been
// acknowledged, further such signals come from the old flight and are
// ignored, so one loss costs one go-back-N (rxe's started_retry).
func (qp *QP) retryOnGap() {
	if qp.sr != nil { // selective repeat: resend what is missing
		qp.srLost(qp.req.nextPSN())
		return
	}
	if qp.comp.retryPending {
		return
	}
	qp.retry()
}

func (qp *QP) onAtomicAck(p *packetT, psn bth.PSN) {
	if qp.sr != nil {
		qp.srOnAtomicAck(p, psn)
		return
	}
	if qp.ackUpTo(psn.Add(-1)) {
		qp.retryOnGap()
		return
	}
	w := qp.head()
	if w == nil || (w.wr.Opcode != WRCompareSwap && w.wr.Opcode != WRFetchAdd) {
		return
	}
	if psn != qp.comp.psn || psn != w.firstPSN || p.AETH.Syndrome().Type() != aeth.TypeACK {
		return
	}
	binary.NativeEndian.PutUint64(qp.comp.scratch[:], p.AtomicAck.OrigData())
	if err := qp.pd.Scatter(w.sges, 0, qp.comp.scratch[:]); err != nil {
		qp.failWQE(w, WCLocProtErr)
		return
	}
	qp.completeHead(w)
	qp.progress()
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
