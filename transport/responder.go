package transport

import (
	"fmt"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
)

// responder is the receive side of a QP: it checks and executes incoming
// requests and generates ACKs, NAKs, READ responses and atomic ACKs
// (rxe_resp.c).
type responder struct {
	// What a WRITE's packet reads and writes comes first (QP's layout:
	// TestQPHotLayout).
	qp      *QP     // the QP it belongs to (it is embedded there, as QP.resp)
	psn     bth.PSN // expected PSN
	msn     uint32  // completed messages (24 bits)
	nakSent bool    // a PSN sequence error NAK was sent for the current gap

	ucDropping bool // UC: the rest of the current message is being dropped

	op        uint8 // message in progress: opNone, opSend, opWrite
	wqeActive bool  // rq head is taken: being filled by a SEND, or by an RC WRITE's packet with immediate
	srqHeld   bool  // srqWQE is valid
	wlen      uint32
	offset    uint64
	wt        memreg.BatchTarget // the RDMA WRITE in progress: checked once, at its first packet

	// rd is the READ response under way, sent a quantum at a time;
	// held are the request packets received meanwhile, executed after
	// it (readresp.go).
	rd   readResp
	held heldReqs

	rsl memreg.ScatterList // the receive WQE a SEND in progress fills

	res     []rdRes
	resNext int

	srqWQE recvWQE // the WQE taken from the SRQ for the message in progress
}

const (
	opNone = iota
	opSend
	opWrite
)

// reset starts the responder over at psn (INIT→RTR): the saved READ and
// atomic resources are cleared, their storage kept.
func (r *responder) reset(psn bth.PSN) {
	r.dropHeld()
	res := r.res
	for i := range res {
		res[i] = rdRes{}
	}
	*r = responder{qp: r.qp, psn: psn, res: res, held: heldReqs{q: r.held.q}}
}

// rxPins returns the pins of the current received batch when input comes
// from the device's receive goroutine, else nil (place under a pin per
// packet).
func (qp *QP) rxPins() *memreg.Pins {
	if qp.rxBatch {
		return &qp.dev.rxPins
	}
	return nil
}

// releasePins releases the pins of the current received batch (receive
// goroutine only; a no-op elsewhere).
func (qp *QP) releasePins() {
	if qp.rxBatch {
		qp.dev.rxPins.Release()
	}
}

// input handles a request packet. Called with qp.mu held. (QP.inputLocked
// has it in line.)
func (r *responder) input(p *packetT) {
	if r.rd.active || r.held.n() > 0 {
		// A READ response is under way: like everything else the
		// responder sends, this request's answer goes out after it, so
		// the request waits its turn (readresp.go).
		r.hold(p)
		return
	}
	r.inputNow(p)
}

// inputNow handles a request packet with no READ response under way.
// Called with qp.mu held.
func (r *responder) inputNow(p *packetT) {
	qp := r.qp
	psn := p.BTH.PSN()
	if qp.init.Type == QPTypeUC {
		if !r.ucAccept(p, psn) {
			return
		}
		r.execute(p, psn)
		return
	}
	d := psn.Diff(r.psn)
	if d > 0 && qp.sr != nil {
		qp.srHold(p, psn, d)
		return
	}
	if d > 0 {
		if !r.nakSent {
			r.nakSent = true
			inc(&qp.dev.ctr.OutOfSeqRequest)
			r.sendAck(aeth.NAK(aeth.NAKPSNSeqError), r.psn)
		}
		return
	}
	if d < 0 {
		inc(&qp.dev.ctr.DuplicateRequest)
		if qp.sr != nil && qp.srDuplicate(p) {
			return
		}
		r.duplicate(p, psn)
		return
	}
	r.nakSent = false
	r.execute(p, psn)
	if qp.sr != nil {
		qp.srDrain(psn)
	}
}

// execute checks the opcode sequence of an in-sequence request and
// executes it.
func (r *responder) execute(p *packetT, psn bth.PSN) {
	// Opcode sequence: a message in progress continues with middle/last of
	// the same kind; otherwise only first/only packets may start one.
	kind, pos := p.Info.Kind, p.Info.Pos
	cont := pos == bth.PosMiddle || pos == bth.PosLast
	switch r.op {
	case opSend:
		if kind != bth.KindSend || !cont {
			r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	case opWrite:
		if kind != bth.KindWrite || !cont {
			r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	default:
		if cont {
			r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	}
	switch kind {
	case bth.KindSend:
		r.onSend(p, psn)
	case bth.KindWrite:
		r.onWrite(p, psn)
	case bth.KindReadRequest:
		r.onRead(p, psn)
	case bth.KindCompareSwap, bth.KindFetchAdd:
		r.onAtomic(p, psn)
	default:
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
	}
}

// fatal sends a NAK for psn and moves the QP to ERR; a receive WQE in
// progress completes with st. The device raises EventQPReqErr for an
// invalid request, EventQPAccessErr for a remote access error and
// EventQPFatal otherwise.
func (r *responder) fatal(code aeth.NAKCode, psn bth.PSN, st WCStatus) {
	qp := r.qp
	if qp.init.Type == QPTypeUC {
		r.ucError(st)
		return
	}
	r.wt, r.rsl = memreg.BatchTarget{}, memreg.ScatterList{}
	r.sendAck(aeth.NAK(code), psn)
	if r.wqeActive {
		r.completeRecv(st, WCRecv, 0, 0, 0, 0, false)
	}
	ev := EventQPFatal
	switch code {
	case aeth.NAKInvalidRequest:
		ev = EventQPReqErr
	case aeth.NAKRemoteAccessError:
		ev = EventQPAccessErr
	}
	qp.fail(ev, fmt.Errorf("responder sent NAK %v for psn %v", code, psn))
}

// checkLen enforces the packet length rules (IBTA 9.7.4.1.6): first and
// middle packets carry exactly one path MTU, last packets 1 to one path
// MTU, only packets at most one. (rxe checks the same since Linux 6.2;
// 6.1's check_length was a stub.)
func (r *responder) checkLen(p *packetT) bool {
	qp := r.qp
	n := len(p.Payload)
	switch p.Info.Pos {
	case bth.PosFirst, bth.PosMiddle:
		return n == qp.mtu
	case bth.PosLast:
		return n > 0 && n <= qp.mtu
	}
	return n <= qp.mtu
}

// completeRecv completes the receive WQE at the head of the receive queue.
// solicited is the SE bit of the message's last packet.
func (r *responder) completeRecv(st WCStatus, op WCOpcode, n uint32, flags WCFlags, imm, inv uint32, solicited bool) {
	r.completeWQE(r.qp.nextRecv(), st, op, n, flags, imm, inv, solicited)
}

// completeWQE is completeRecv for rw, the WQE nextRecv returned (a caller
// that holds it already spares looking it up again).
func (r *responder) completeWQE(rw *recvWQE, st WCStatus, op WCOpcode, n uint32, flags WCFlags, imm, inv uint32, solicited bool) {
	qp := r.qp
	wrid := rw.wrid
	qp.consumeRecv()
	r.wqeActive = false
	r.rsl = memreg.ScatterList{}
	inc(&qp.dev.ctr.RDMARecvs)
	// pushWC, with the completion written in place in the CQ's ring.
	cq := qp.recvCQ
	cq.mu.Lock()
	slot, over := cq.slotFast(), false
	if slot == nil {
		slot, over = cq.slotLocked()
	}
	if slot != nil {
		*slot = WC{WRID: wrid, Status: st, Opcode: op, ByteLen: n, Flags: flags, Imm: imm,
			InvalidatedRKey: inv, QPN: qp.qpn, SrcQP: qp.attr.DestQPN}
		if cq.armed != notifyOff {
			cq.armedLocked(solicited, st)
		}
	}
	cq.mu.Unlock()
	if slot == nil {
		qp.cqLost = true
		if !over {
			return
		}
		cq.overflowed()
	}
	if qp.rxBatch { // qp.wakeCQ, in line
		qp.dev.deferWake(cq)
	} else {
		cq.wake()
	}
}

// rnrNAK answers a request that needs a receive WQE when none is posted:
// an RNR NAK (RC), or the message is dropped (UC).
func (r *responder) rnrNAK(psn bth.PSN) {
	qp := r.qp
	if qp.init.Type == QPTypeUC { // no receive WQE: the message is dropped
		r.ucDrop()
		return
	}
	inc(&qp.dev.ctr.SendRNRErr)
	r.sendAck(aeth.RNRNAK(qp.attr.MinRNRTimer), psn)
}

// endRequest finishes an executed request packet: the expected PSN and
// (at a message's end) the MSN advance, and an ACK goes out if asked for.
func (r *responder) endRequest(p *packetT, psn bth.PSN) {
	qp := r.qp
	r.psn = psn.Add(1)
	if p.Info.Pos == bth.PosLast || p.Info.Pos == bth.PosOnly {
		r.op = opNone
		r.msn = (r.msn + 1) & 0xffffff
	}
	if qp.init.Type == QPTypeUC {
		return
	}
	if qp.cqLost && qp.attr.State != QPSErr {
		// The message's receive completion did not fit in the CQ: no
		// ACK, so the sender never sees SUCCESS for a message the
		// receiving application cannot learn about. The QP goes to ERR
		// now, as rxe's do_complete does on a failed rxe_cq_post
		// (RESPST_ERR_CQ_OVERFLOW, class G), before any later request in
		// the batch could be acknowledged.
		qp.settle()
		return
	}
	if p.BTH.AckReq() {
		r.sendAck(aeth.ACK(aeth.NoCreditLimit), psn)
	} else {
		inc(&qp.dev.ctr.AckDeferred)
	}
}

// ucAccept applies UC's sequence rule to a request packet: in sequence it
// is executed; after a gap (a lost packet) or while a message is being
// dropped, the rest of that message is dropped and the responder resumes
// at the next FIRST or ONLY packet, whatever its PSN. Each message lost
// this way is counted (uc_msgs_dropped).
func (r *responder) ucAccept(p *packetT, psn bth.PSN) bool {
	if !r.ucDropping && psn == r.psn {
		return true
	}
	start := p.Info.Pos == bth.PosFirst || p.Info.Pos == bth.PosOnly
	if !start {
		if !r.ucDropping {
			r.ucDrop()
		}
		return false
	}
	if !r.ucDropping && r.op != opNone {
		r.ucDrop() // the message in progress lost its tail
	}
	r.ucDropping = false
	r.psn = psn
	return true
}

// ucError handles a request a UC responder cannot execute; st is the
// status an RC responder would complete the receive WQE with. UC cannot
// NAK: the message is dropped and the QP carries on (rxe's classes D
// and E), and the receive WQE it had taken stays for the next message —
// unless the WQE itself is at fault, where keeping it would lose every
// later message too:
//
//   - a WQE whose memory cannot be written (st WCLocProtErr: an lkey
//     deregistered, out of bounds, without local write) completes with
//     that status and the QP goes to ERR, as on RC and UD (rxe:
//     RESPST_ERR_MALFORMED_WQE, class A for every QP type, completed
//     with IB_WC_LOC_QP_OP_ERR). Kept, it dropped every later SEND in
//     silence: no completion, no event.
//   - a WQE taken from an SRQ that is too short for the message (st
//     WCLocLenErr) completes with WCRemInvReqErr and the QP stays in
//     RTS (the IBTA's class E for UC, RESPST_ERR_LENGTH's branch in
//     rxe), as a UD QP's does. Kept, it stayed this QP's and turned
//     away every later message longer than it while larger WQEs waited
//     in the SRQ. A WQE of the QP's own receive queue stays (class D):
//     the next message takes it in order either way. (rxe 6.1 never
//     takes that branch for a SEND: its copy_data reports a WQE too
//     short as -EINVAL, not -ENOSPC, so send_data_in answers
//     RESPST_ERR_MALFORMED_WQE and the QP goes to ERR, SRQ or not. Only
//     the receiving application sees the difference: UC sends no NAK.)
func (r *responder) ucError(st WCStatus) {
	qp := r.qp
	if !r.wqeActive {
		r.ucDrop()
		return
	}
	switch {
	case st == WCLocProtErr:
		wrid := qp.nextRecv().wrid
		r.completeRecv(st, WCRecv, 0, 0, 0, 0, false)
		r.ucDrop()
		qp.fail(EventQPFatal, &WCError{Status: st, Opcode: WCRecv, WRID: wrid, QPN: qp.qpn})
		return
	case st == WCLocLenErr && qp.srq != nil:
		r.completeRecv(WCRemInvReqErr, WCRecv, 0, 0, 0, 0, false)
	}
	r.ucDrop()
}

// ucDrop abandons the UC message in progress: its receive WQE (if it had
// taken one) stays posted for the next message.
func (r *responder) ucDrop() {
	qp := r.qp
	r.ucDropping = true
	r.op = opNone
	r.wqeActive = false
	r.offset = 0
	r.wt, r.rsl = memreg.BatchTarget{}, memreg.ScatterList{}
	inc(&qp.dev.ctr.UCMsgsDropped)
}

// onSend places a SEND packet into the receive WQE at the head of the
// receive queue and completes it at the message's last packet.
func (r *responder) onSend(p *packetT, psn bth.PSN) {
	qp := r.qp
	pos := p.Info.Pos
	// The WQE the message fills: taken at its first packet, and the
	// same one (the head) until its completion.
	rw := qp.nextRecv()
	start := pos == bth.PosFirst || pos == bth.PosOnly
	if start {
		if rw == nil {
			r.rnrNAK(psn)
			return
		}
		r.wqeActive = true
		r.offset = 0
		r.op = opSend
	}
	if !r.checkLen(p) {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	n := uint64(len(p.Payload))
	if r.offset+n > rw.length {
		r.fatal(aeth.NAKInvalidRequest, psn, WCLocLenErr)
		return
	}
	if pos == bth.PosOnly {
		// The whole message in one packet: placed in one call, with no
		// ScatterList kept for packets after it (memreg.PD.ScatterRef).
		if n > 0 {
			if err := qp.pd.ScatterRef(qp.rxPins(), rw.sges, rw.ref, p.Payload); err != nil {
				r.fatal(aeth.NAKRemoteOperationalError, psn, WCLocProtErr)
				return
			}
		}
	} else {
		if start {
			r.rsl.InitRef(qp.pd, rw.sges, rw.ref)
		}
		if n > 0 {
			// Inside a received batch the regions written stay pinned
			// until the batch ends (Device.rxPins): a packet inside the
			// SGE the previous one wrote is a bounds check and a copy.
			if err := r.rsl.Scatter(qp.rxPins(), r.offset, p.Payload); err != nil {
				r.fatal(aeth.NAKRemoteOperationalError, psn, WCLocProtErr)
				return
			}
		}
	}
	r.offset += n
	if pos == bth.PosLast || pos == bth.PosOnly {
		var flags WCFlags
		var imm, inv uint32
		if p.Info.Imm {
			flags |= WCWithImm
			imm = p.ImmDt.Imm()
		}
		if p.Info.Inv {
			inv = p.IETH.RKey()
			// Invalidation waits until the window's pins are released:
			// release this batch's first (one of them may be it).
			qp.releasePins()
			// READ responses queued before this request may carry
			// their payload from the window (zero-copy): they leave
			// now, while it is still bound.
			qp.flushZeroCopy()
			if err := qp.rv.InvalidateRemote(inv); err != nil {
				r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
				return
			}
			flags |= WCWithInv
		}
		r.completeWQE(rw, WCSuccess, WCRecv, uint32(r.offset), flags, imm, inv, p.BTH.SolicitedEvent())
	}
	r.endRequest(p, psn)
}

// onWrite places an RDMA WRITE packet into the region its RETH named at
// the message's first packet.
func (r *responder) onWrite(p *packetT, psn bth.PSN) {
	qp := r.qp
	pos := p.Info.Pos
	// A zero-length WRITE ONLY without immediate touches no memory: it is
	// what keep-alive probes are (QP.Probe), and a QP that grants no
	// remote write answers it too. (rxe NAKs it without remote write;
	// Linux's CM grants remote write on every QP it connects.)
	probe := pos == bth.PosOnly && !p.Info.Imm && p.RETH.DMALength() == 0 && len(p.Payload) == 0
	if qp.attr.AccessFlags&memreg.AccessRemoteWrite == 0 && !probe {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	// A WRITE with immediate consumes a receive WQE: check for one before
	// any side effect so that an RNR NAK leaves nothing half done.
	if p.Info.Imm {
		if qp.nextRecv() == nil {
			r.rnrNAK(psn)
			return
		}
		// The packet carrying the immediate takes the WQE before its
		// rkey and length are checked, as rxe's check_resource does
		// (RXE_RWR_MASK): a class C error from here on completes it
		// with the error's status (fatal; rxe's do_complete), not
		// flushed behind it (TestWriteImmRKeyErrorCompletesRecv). UC
		// keeps its WQE for the next message (ucError).
		if qp.init.Type == QPTypeRC {
			r.wqeActive = true
		}
	}
	if pos == bth.PosFirst || pos == bth.PosOnly {
		va, rkey, n := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength()
		tg, err := qp.rv.Lookup(rkey, va, n, memreg.AccessRemoteWrite)
		if err != nil {
			r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
		r.wt, r.wlen, r.offset = tg.Batched(), n, 0
		r.op = opWrite
	}
	if !r.checkLen(p) {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	n := uint64(len(p.Payload))
	if r.offset+n > uint64(r.wlen) {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	if n > 0 {
		// The bounds were checked above; the target was checked at the
		// first packet. Inside a received batch the region stays pinned
		// until the batch ends (Device.rxPins), so this is a bounds
		// check and a copy; it fails (ErrStaleKey) once the region or
		// window is gone.
		if err := r.wt.Write(qp.rxPins(), r.offset, p.Payload); err != nil {
			r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
	}
	r.offset += n
	if pos == bth.PosLast || pos == bth.PosOnly {
		r.wt = memreg.BatchTarget{} // do not keep the region reachable
		if r.offset != uint64(r.wlen) {
			r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
		if p.Info.Imm {
			r.completeRecv(WCSuccess, WCRecvRDMAImm, r.wlen, WCWithImm, p.ImmDt.Imm(), 0, p.BTH.SolicitedEvent())
		}
	}
	r.endRequest(p, psn)
}

// maxDestRd returns how many READ/atomic resources the responder keeps
// (max_dest_rd_atomic, at least 1, at most what was allocated).
func (r *responder) maxDestRd() int {
	qp := r.qp
	n := int(qp.attr.MaxDestRdAtomic)
	if n < 1 {
		n = 1
	}
	if n > len(r.res) {
		n = len(r.res)
	}
	return n
}

// saveRes keeps x for replaying a duplicate READ or atomic, replacing the
// oldest resource once all are used. A saved resource whose PSNs overlap
// x's is from a request 2^24 PSNs (or a multiple) before — the PSN space
// went round while fewer READs and atomics than the resources came — and
// is dropped: findRes returns the first resource covering a PSN, so a
// duplicate of x was answered from it (an atomic with the old original
// value, silently; a READ not at all, as its RETH did not match).
func (r *responder) saveRes(x rdRes) {
	for i := range r.res {
		if o := &r.res[i]; o.valid && x.lastPSN.Diff(o.firstPSN) >= 0 && o.lastPSN.Diff(x.firstPSN) >= 0 {
			o.valid = false
		}
	}
	if r.resNext >= r.maxDestRd() {
		r.resNext = 0
	}
	x.valid = true
	r.res[r.resNext] = x
	r.resNext++
}

// onRead checks an RDMA READ request, saves it as a resource and answers
// it with READ responses (readReply: the first quantum now, the rest in
// the QP's scheduler turns). A QP without remote read, or with no
// responder resources (max_dest_rd_atomic 0), takes no READ: NAK invalid
// request (rxe's RESPST_ERR_UNSUPPORTED_OPCODE and
// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, class C); atomics likewise. More
// READs and atomics than the resources are executed, the oldest saved
// resource giving way (rxe: "it is the requesters job").
func (r *responder) onRead(p *packetT, psn bth.PSN) {
	qp := r.qp
	if qp.attr.AccessFlags&memreg.AccessRemoteRead == 0 || qp.attr.MaxDestRdAtomic == 0 {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	va, rkey, n := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength()
	if n > 1<<31 {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	if err := qp.rv.CheckRemote(rkey, va, n, memreg.AccessRemoteRead); err != nil {
		r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
		return
	}
	np := npkts(n, qp.mtu)
	r.saveRes(rdRes{firstPSN: psn, lastPSN: psn.Add(np - 1), va: va, rkey: rkey, length: n})
	r.msn = (r.msn + 1) & 0xffffff
	r.psn = psn.Add(np)
	r.readReply(psn, va, rkey, n, true, true)
}

// onAtomic executes an atomic request once, saves its result for
// replays and answers with an ATOMIC ACK.
func (r *responder) onAtomic(p *packetT, psn bth.PSN) {
	qp := r.qp
	if qp.attr.AccessFlags&memreg.AccessRemoteAtomic == 0 || qp.attr.MaxDestRdAtomic == 0 {
		r.fatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	a := p.AtomicETH
	var orig uint64
	var err error
	if p.Info.Kind == bth.KindCompareSwap {
		orig, err = qp.rv.CompareSwap(a.RKey(), a.VA(), a.Compare(), a.SwapAdd())
	} else {
		orig, err = qp.rv.FetchAdd(a.RKey(), a.VA(), a.SwapAdd())
	}
	if err != nil {
		r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
		return
	}
	r.saveRes(rdRes{atomic: true, firstPSN: psn, lastPSN: psn, orig: orig})
	r.msn = (r.msn + 1) & 0xffffff
	r.psn = psn.Add(1)
	r.sendAtomicAck(psn, orig)
}

// sendAtomicAck queues an ATOMIC ACKNOWLEDGE for psn carrying orig.
func (r *responder) sendAtomicAck(psn bth.PSN, orig uint64) {
	qp := r.qp
	f := &qp.respF
	*f = packet.Fields{}
	f.BTH.Opcode = bth.RCAtomicAck
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = psn
	f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
	f.AETH.MSN = r.msn
	f.AtomicAckOrig = orig
	buf := qp.outBufN(packet.Len(bth.RCAtomicAck, 0))
	if n, err := packet.Build(buf, f); err == nil {
		qp.commit(n)
	}
}

// sendAck sends an ACKNOWLEDGE with syndrome syn for psn and the current MSN.
//
// Positive ACKs are coalesced (IBTA 9.7.5.1.3): while the packets a received
// batch makes this QP send are queued, an ACK that would follow a queued
// positive ACK with nothing in between replaces it. The newer ACK covers
// every PSN and MSN the older one did, and a requester completes everything
// up to the PSN it acknowledges. Small messages, which each ask for an ACK,
// then cost one ACK per batch instead of one per message. NAKs are never
// merged and always end a run.
func (r *responder) sendAck(syn aeth.Syndrome, psn bth.PSN) {
	qp := r.qp
	positive := syn.Type() == aeth.TypeACK
	if positive && qp.ackSlot != 0 && qp.ackSlot == qp.nout {
		// The queued ACK was built by this function for this QP: only its
		// PSN, syndrome and MSN change.
		b := qp.out[qp.nout-1].Buf
		bth.BTH(b[:bth.Size]).SetPSN(psn)
		a := aeth.AETH(b[bth.Size : bth.Size+aeth.Size])
		a.SetSyndrome(syn)
		a.SetMSN(r.msn)
		inc(&qp.dev.ctr.AckDeferred)
		return
	}
	// Built directly (packet.BuildAck: the bytes packet.Build writes
	// for it), without clearing and walking a packet.Fields, in place in
	// the slot outPkt queues (as the requester builds its data packets):
	// an ACK cannot fail to build in AckLen bytes, so the outBufN and
	// commit pair had nothing to undo.
	packet.BuildAck(qp.outPkt(packet.AckLen), bth.DefaultPKey, qp.attr.DestQPN, psn, syn, r.msn)
	if positive {
		qp.ackSlot = qp.nout
	}
}

// findRes returns the saved READ (or atomic) resource covering psn, nil
// if none does.
func (r *responder) findRes(psn bth.PSN, atomic bool) *rdRes {
	for i := range r.res {
		x := &r.res[i]
		if x.valid && x.atomic == atomic && psn.Diff(x.firstPSN) >= 0 && x.lastPSN.Diff(psn) >= 0 {
			return x
		}
	}
	return nil
}

// duplicate handles a request behind the expected PSN: SEND/WRITE are
// re-acknowledged, READ and atomics are replayed from the saved responder
// resources (never executed again).
func (r *responder) duplicate(p *packetT, psn bth.PSN) {
	qp := r.qp
	switch p.Info.Kind {
	case bth.KindSend, bth.KindWrite:
		r.sendAck(aeth.ACK(aeth.NoCreditLimit), r.psn.Add(-1))
	case bth.KindReadRequest:
		x := r.findRes(psn, false)
		if qp.trace != nil {
			qp.trace("dup READ psn %v found %v", psn, x != nil)
		}
		if x == nil {
			return
		}
		va, n, rkey := p.RETH.VA(), p.RETH.DMALength(), p.RETH.RKey()
		if rkey != x.rkey || va < x.va || uint64(va)+uint64(n) > x.va+uint64(x.length) {
			if qp.trace != nil {
				qp.trace("dup READ psn %v mismatch va %#x n %d rkey %#x vs res va %#x len %d rkey %#x", psn, va, n, rkey, x.va, x.length, x.rkey)
			}
			return
		}
		// The rkey is checked again, as rxe's read_reply does
		// (rxe_recheck_mr): a region deregistered or a window
		// invalidated since the first execution gets a Remote Access
		// Error NAK (the requester completes with REM_ACCESS_ERR at
		// once), not silence that costs it its whole retry budget.
		if err := qp.rv.CheckRemote(rkey, va, n, memreg.AccessRemoteRead); err != nil {
			r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
		r.readReply(psn, va, rkey, n, psn == x.firstPSN, false)
	case bth.KindCompareSwap, bth.KindFetchAdd:
		x := r.findRes(psn, true)
		if x == nil {
			return
		}
		r.sendAtomicAck(psn, x.orig)
	}
}
