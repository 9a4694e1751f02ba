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
	psn     bth.PSN // expected PSN
	msn     uint32  // completed messages (24 bits)
	nakSent bool    // a PSN sequence error NAK was sent for the current gap

	ucDropping bool // UC: the rest of the current message is being dropped

	op        uint8 // message in progress: opNone, opSend, opWrite
	wqeActive bool  // rq head is being filled by a multi-packet SEND
	offset    uint64
	rsl       memreg.ScatterList // the receive WQE a SEND in progress fills
	wt        memreg.BatchTarget // the RDMA WRITE in progress: checked once, at its first packet
	wlen      uint32

	res     []rdRes
	resNext int

	srqWQE  recvWQE // the WQE taken from the SRQ for the message in progress
	srqHeld bool    // srqWQE is valid
	f       packet.Fields
}

const (
	opNone = iota
	opSend
	opWrite
)

func (r *responder) reset(psn bth.PSN) {
	res := r.res
	for i := range res {
		res[i] = rdRes{}
	}
	*r = responder{psn: psn, res: res}
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

// respInput handles a request packet. Called with qp.mu held.
func (qp *QP) respInput(p *packetT) {
	r := &qp.resp
	psn := p.BTH.PSN()
	if qp.init.Type == QPTypeUC {
		if !qp.ucAccept(p, psn) {
			return
		}
		qp.respExecute(p, psn)
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
			qp.sendAck(aeth.NAK(aeth.NAKPSNSeqError), r.psn)
		}
		return
	}
	if d < 0 {
		inc(&qp.dev.ctr.DuplicateRequest)
		if qp.sr != nil && qp.srDuplicate(p) {
			return
		}
		qp.respDuplicate(p, psn)
		return
	}
	r.nakSent = false
	qp.respExecute(p, psn)
	if qp.sr != nil {
		qp.srDrain(psn)
	}
}

// respExecute checks the opcode sequence of an in-sequence request and
// executes it.
func (qp *QP) respExecute(p *packetT, psn bth.PSN) {
	r := &qp.resp
	// Opcode sequence: a message in progress continues with middle/last of
	// the same kind; otherwise only first/only packets may start one.
	kind, pos := p.Info.Kind, p.Info.Pos
	cont := pos == bth.PosMiddle || pos == bth.PosLast
	switch r.op {
	case opSend:
		if kind != bth.KindSend || !cont {
			qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	case opWrite:
		if kind != bth.KindWrite || !cont {
			qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	default:
		if cont {
			qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
	}
	switch kind {
	case bth.KindSend:
		qp.respSend(p, psn)
	case bth.KindWrite:
		qp.respWrite(p, psn)
	case bth.KindReadRequest:
		qp.respRead(p, psn)
	case bth.KindCompareSwap, bth.KindFetchAdd:
		qp.respAtomic(p, psn)
	default:
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
	}
}

// respFatal sends a NAK for psn and moves the QP to ERR; a receive WQE in
// progress completes with st. The device raises EventQPReqErr for an
// invalid request, EventQPAccessErr for a remote access error and
// EventQPFatal otherwise.
func (qp *QP) respFatal(code aeth.NAKCode, psn bth.PSN, st WCStatus) {
	if qp.init.Type == QPTypeUC {
		// UC cannot NAK: the message is dropped, the QP carries on.
		qp.ucDrop()
		return
	}
	qp.resp.wt, qp.resp.rsl = memreg.BatchTarget{}, memreg.ScatterList{}
	qp.sendAck(aeth.NAK(code), psn)
	if qp.resp.wqeActive {
		qp.completeRecv(st, WCRecv, 0, 0, 0, 0, false)
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

// checkLen enforces the packet length rules: first and middle packets carry
// exactly one path MTU, last and only packets at most one.
func (qp *QP) checkLen(p *packetT) bool {
	n := len(p.Payload)
	switch p.Info.Pos {
	case bth.PosFirst, bth.PosMiddle:
		return n == qp.mtu
	}
	return n <= qp.mtu
}

// completeRecv completes the receive WQE at the head of the receive queue.
// solicited is the SE bit of the message's last packet.
func (qp *QP) completeRecv(st WCStatus, op WCOpcode, n uint32, flags WCFlags, imm, inv uint32, solicited bool) {
	rw := qp.nextRecv()
	wc := WC{WRID: rw.wrid, Status: st, Opcode: op, ByteLen: n, Flags: flags, Imm: imm,
		InvalidatedRKey: inv, QPN: qp.qpn, SrcQP: qp.attr.DestQPN}
	qp.consumeRecv()
	qp.resp.wqeActive = false
	qp.resp.rsl = memreg.ScatterList{}
	inc(&qp.dev.ctr.RDMARecvs)
	qp.pushWC(qp.recvCQ, &wc, solicited)
}

func (qp *QP) rnrNAK(psn bth.PSN) {
	if qp.init.Type == QPTypeUC { // no receive WQE: the message is dropped
		qp.ucDrop()
		return
	}
	inc(&qp.dev.ctr.SendRNRErr)
	qp.sendAck(aeth.RNRNAK(qp.attr.MinRNRTimer), psn)
}

func (qp *QP) endRequest(p *packetT, psn bth.PSN) {
	r := &qp.resp
	r.psn = psn.Add(1)
	if p.Info.Pos == bth.PosLast || p.Info.Pos == bth.PosOnly {
		r.op = opNone
		r.msn = (r.msn + 1) & 0xffffff
	}
	if qp.init.Type == QPTypeUC {
		return
	}
	if p.BTH.AckReq() {
		qp.sendAck(aeth.ACK(aeth.NoCreditLimit), psn)
	} else {
		inc(&qp.dev.ctr.AckDeferred)
	}
}

// ucAccept applies UC's sequence rule to a request packet: in sequence it
// is executed; after a gap (a lost packet) or while a message is being
// dropped, the rest of that message is dropped and the responder resumes
// at the next FIRST or ONLY packet, whatever its PSN. Each message lost
// this way is counted (uc_msgs_dropped).
func (qp *QP) ucAccept(p *packetT, psn bth.PSN) bool {
	r := &qp.resp
	if !r.ucDropping && psn == r.psn {
		return true
	}
	start := p.Info.Pos == bth.PosFirst || p.Info.Pos == bth.PosOnly
	if !start {
		if !r.ucDropping {
			qp.ucDrop()
		}
		return false
	}
	if !r.ucDropping && r.op != opNone {
		qp.ucDrop() // the message in progress lost its tail
	}
	r.ucDropping = false
	r.psn = psn
	return true
}

// ucDrop abandons the UC message in progress: its receive WQE (if it had
// taken one) stays posted for the next message.
func (qp *QP) ucDrop() {
	r := &qp.resp
	r.ucDropping = true
	r.op = opNone
	r.wqeActive = false
	r.offset = 0
	r.wt, r.rsl = memreg.BatchTarget{}, memreg.ScatterList{}
	inc(&qp.dev.ctr.UCMsgsDropped)
}

func (qp *QP) respSend(p *packetT, psn bth.PSN) {
	r := &qp.resp
	pos := p.Info.Pos
	if pos == bth.PosFirst || pos == bth.PosOnly {
		if qp.nextRecv() == nil {
			qp.rnrNAK(psn)
			return
		}
		r.wqeActive = true
		r.offset = 0
		r.op = opSend
	}
	if !qp.checkLen(p) {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	rw := qp.nextRecv()
	if pos == bth.PosFirst || pos == bth.PosOnly {
		r.rsl = qp.pd.ScatterList(rw.sges)
	}
	n := uint64(len(p.Payload))
	if r.offset+n > rw.length {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCLocLenErr)
		return
	}
	if n > 0 {
		// Inside a received batch the regions written stay pinned until
		// the batch ends (Device.rxPins): a packet inside the SGE the
		// previous one wrote is a bounds check and a copy.
		if err := r.rsl.Scatter(qp.rxPins(), r.offset, p.Payload); err != nil {
			qp.respFatal(aeth.NAKRemoteOperationalError, psn, WCLocProtErr)
			return
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
			if err := qp.rv.InvalidateRemote(inv); err != nil {
				qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
				return
			}
			flags |= WCWithInv
		}
		qp.completeRecv(WCSuccess, WCRecv, uint32(r.offset), flags, imm, inv, p.BTH.SolicitedEvent())
	}
	qp.endRequest(p, psn)
}

func (qp *QP) respWrite(p *packetT, psn bth.PSN) {
	r := &qp.resp
	pos := p.Info.Pos
	// A zero-length WRITE ONLY without immediate touches no memory: it is
	// what keep-alive probes are (QP.Probe), and a QP that grants no
	// remote write answers it too. (rxe NAKs it without remote write;
	// Linux's CM grants remote write on every QP it connects.)
	probe := pos == bth.PosOnly && !p.Info.Imm && p.RETH.DMALength() == 0 && len(p.Payload) == 0
	if qp.attr.AccessFlags&memreg.AccessRemoteWrite == 0 && !probe {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	// A WRITE with immediate consumes a receive WQE: check for one before
	// any side effect so that an RNR NAK leaves nothing half done.
	if p.Info.Imm && qp.nextRecv() == nil {
		qp.rnrNAK(psn)
		return
	}
	if pos == bth.PosFirst || pos == bth.PosOnly {
		va, rkey, n := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength()
		tg, err := qp.rv.Lookup(rkey, va, n, memreg.AccessRemoteWrite)
		if err != nil {
			qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
		r.wt, r.wlen, r.offset = tg.Batched(), n, 0
		r.op = opWrite
	}
	if !qp.checkLen(p) {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	n := uint64(len(p.Payload))
	if r.offset+n > uint64(r.wlen) {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	if n > 0 {
		// The bounds were checked above; the target was checked at the
		// first packet. Inside a received batch the region stays pinned
		// until the batch ends (Device.rxPins), so this is a bounds
		// check and a copy; it fails (ErrStaleKey) once the region or
		// window is gone.
		if err := r.wt.Write(qp.rxPins(), r.offset, p.Payload); err != nil {
			qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
	}
	r.offset += n
	if pos == bth.PosLast || pos == bth.PosOnly {
		r.wt = memreg.BatchTarget{} // do not keep the region reachable
		if r.offset != uint64(r.wlen) {
			qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
			return
		}
		if p.Info.Imm {
			qp.completeRecv(WCSuccess, WCRecvRDMAImm, r.wlen, WCWithImm, p.ImmDt.Imm(), 0, p.BTH.SolicitedEvent())
		}
	}
	qp.endRequest(p, psn)
}

func (qp *QP) maxDestRd() int {
	n := int(qp.attr.MaxDestRdAtomic)
	if n < 1 {
		n = 1
	}
	if n > len(qp.resp.res) {
		n = len(qp.resp.res)
	}
	return n
}

func (qp *QP) saveRes(x rdRes) {
	r := &qp.resp
	if r.resNext >= qp.maxDestRd() {
		r.resNext = 0
	}
	x.valid = true
	r.res[r.resNext] = x
	r.resNext++
}

func (qp *QP) respRead(p *packetT, psn bth.PSN) {
	r := &qp.resp
	if qp.attr.AccessFlags&memreg.AccessRemoteRead == 0 {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	va, rkey, n := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength()
	if n > 1<<31 {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
		return
	}
	if err := qp.rv.CheckRemote(rkey, va, n, memreg.AccessRemoteRead); err != nil {
		qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
		return
	}
	np := npkts(n, qp.mtu)
	qp.saveRes(rdRes{firstPSN: psn, lastPSN: psn.Add(np - 1), va: va, rkey: rkey, length: n})
	r.msn = (r.msn + 1) & 0xffffff
	r.psn = psn.Add(np)
	qp.readReply(psn, va, rkey, n, true, false)
}

// readReply sends READ response packets for [va, va+n) starting at psn.
// A new request starts with FIRST/ONLY; a replay of a partly answered
// request (first == false) starts with MIDDLE/LAST, as rxe does. A replay
// (duplicate request) that can no longer read the memory is dropped, never
// fatal.
func (qp *QP) readReply(psn bth.PSN, va uint64, rkey uint32, n uint32, first, replay bool) {
	r := &qp.resp
	mtu := uint32(qp.mtu)
	f := &r.f
	rest := n
	for i := 0; ; i++ {
		isFirst := i == 0 && first
		isLast := rest <= mtu
		var op bth.Opcode
		switch {
		case isFirst && isLast:
			op = bth.RCReadResponseOnly
		case isFirst:
			op = bth.RCReadResponseFirst
		case isLast:
			op = bth.RCReadResponseLast
		default:
			op = bth.RCReadResponseMiddle
		}
		plen := rest
		if plen > mtu {
			plen = mtu
		}
		*f = packet.Fields{}
		f.BTH.Opcode = op
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = qp.attr.DestQPN
		f.BTH.PSN = psn
		f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
		f.AETH.MSN = r.msn
		buf := qp.outBuf()
		if plen >= zcMinPayload && qp.dev.zc {
			// Zero-copy: the response's payload leaves from the region.
			view, err := qp.rv.ReadView(rkey, va, int(plen))
			if err != nil {
				if replay {
					return // as below
				}
				qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
				return
			}
			k, err := packet.BuildSplit(buf, f, int(plen))
			if err != nil {
				return
			}
			qp.commitPayload(k, view)
		} else {
			if plen > 0 {
				hdr := bth.Size + op.Info().HeaderLen
				slot := buf[hdr : hdr+int(plen)]
				if err := qp.rv.ReadRemote(rkey, va, slot); err != nil {
					if replay {
						// A late duplicate (e.g. after the region was
						// deregistered) is never fatal: drop it, as rxe
						// does for a class D duplicate it cannot serve.
						return
					}
					qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
					return
				}
				f.Payload = slot
			}
			k, err := packet.Build(buf, f)
			if err != nil {
				return
			}
			qp.commit(k)
		}
		if isLast {
			return
		}
		rest -= plen
		va += uint64(plen)
		psn = psn.Add(1)
	}
}

func (qp *QP) respAtomic(p *packetT, psn bth.PSN) {
	r := &qp.resp
	if qp.attr.AccessFlags&memreg.AccessRemoteAtomic == 0 {
		qp.respFatal(aeth.NAKInvalidRequest, psn, WCRemInvReqErr)
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
		qp.respFatal(memreg.NAKCode(err), psn, WCRemAccessErr)
		return
	}
	qp.saveRes(rdRes{atomic: true, firstPSN: psn, lastPSN: psn, orig: orig})
	r.msn = (r.msn + 1) & 0xffffff
	r.psn = psn.Add(1)
	qp.sendAtomicAck(psn, orig)
}

func (qp *QP) sendAtomicAck(psn bth.PSN, orig uint64) {
	f := &qp.resp.f
	*f = packet.Fields{}
	f.BTH.Opcode = bth.RCAtomicAck
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = psn
	f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
	f.AETH.MSN = qp.resp.msn
	f.AtomicAckOrig = orig
	buf := qp.outBuf()
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
func (qp *QP) sendAck(syn aeth.Syndrome, psn bth.PSN) {
	positive := syn.Type() == aeth.TypeACK
	if positive && qp.ackSlot != 0 && qp.ackSlot == qp.nout {
		// The queued ACK was built by this function for this QP: only its
		// PSN, syndrome and MSN change.
		b := qp.out[qp.nout-1].Buf
		bth.BTH(b[:bth.Size]).SetPSN(psn)
		a := aeth.AETH(b[bth.Size : bth.Size+aeth.Size])
		a.SetSyndrome(syn)
		a.SetMSN(qp.resp.msn)
		inc(&qp.dev.ctr.AckDeferred)
		return
	}
	f := &qp.resp.f
	*f = packet.Fields{}
	f.BTH.Opcode = bth.RCAck
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = psn
	f.AETH.Syndrome = syn
	f.AETH.MSN = qp.resp.msn
	buf := qp.outBuf()
	if n, err := packet.Build(buf, f); err == nil {
		qp.commit(n)
		if positive {
			qp.ackSlot = qp.nout
		}
	}
}

func (qp *QP) findRes(psn bth.PSN, atomic bool) *rdRes {
	for i := range qp.resp.res {
		x := &qp.resp.res[i]
		if x.valid && x.atomic == atomic && psn.Diff(x.firstPSN) >= 0 && x.lastPSN.Diff(psn) >= 0 {
			return x
		}
	}
	return nil
}

// respDuplicate handles a request behind the expected PSN: SEND/WRITE are
// re-acknowledged, READ and atomics are replayed from the saved responder
// resources (never executed again).
func (qp *QP) respDuplicate(p *packetT, psn bth.PSN) {
	switch p.Info.Kind {
	case bth.KindSend, bth.KindWrite:
		qp.sendAck(aeth.ACK(aeth.NoCreditLimit), qp.resp.psn.Add(-1))
	case bth.KindReadRequest:
		x := qp.findRes(psn, false)
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
		qp.readReply(psn, va, rkey, n, psn == x.firstPSN, true)
	case bth.KindCompareSwap, bth.KindFetchAdd:
		x := qp.findRes(psn, true)
		if x == nil {
			return
		}
		qp.sendAtomicAck(psn, x.orig)
	}
}
