package transport

import (
	"encoding/binary"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/immdt"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

type packetT = packet.Packet

// requester is the send side of a QP: it turns send WQEs into request
// packets (rxe_req.c).
type requester struct {
	qp     *QP     // the QP it belongs to (it is embedded there, as QP.req)
	psn    bth.PSN // next PSN to send
	maxPSN bth.PSN // highest PSN ever sent + 1 (to count retransmissions)
	curPkt int     // packets (PSNs) of sq[sqCur] already sent
	noack  int     // packets sent since the last AckReq
	rdOut  int     // READ/atomic WQEs outstanding
	// forceAck and rdLimit shape a selective repeat resend (srResend):
	// AckReq set, a READ for at most rdLimit bytes (0: the rest).
	forceAck bool
	rdLimit  uint32
	// smallWin is the small-packet window now (window): 0 means
	// DeviceConfig.MaxUnackedSmallPSNs. A go-back-N rewind cuts it to
	// MaxUnackedPSNs — every loss resends the whole window, so a lossy
	// path keeps the window it had before small packets got a bigger one
	// — and acknowledged PSNs grow it back (smallGrow).
	smallWin int32
}

// reset starts the requester over at psn (RTR→RTS): every other field
// of its state is cleared.
func (r *requester) reset(psn bth.PSN) { *r = requester{qp: r.qp, psn: psn, maxPSN: psn} }

func isRdAtomic(op WROpcode) bool {
	return op == WRRead || op == WRCompareSwap || op == WRFetchAdd
}

// npkts returns the number of PSNs a message of n bytes takes at mtu (at least 1).
func npkts(n uint32, mtu int) int {
	if n == 0 {
		return 1
	}
	return int((uint64(n) + uint64(mtu) - 1) / uint64(mtu))
}

// progress sends as many request packets as the window, the
// READ/atomic limit and fences allow. Called with qp.mu held.
func (r *requester) progress() {
	qp := r.qp
	if qp.init.Type == QPTypeUD {
		qp.udProgress()
		return
	}
	st := qp.attr.State
	if (st != QPSRTS && st != QPSSQD) || qp.tmr.rnrWait || qp.mtu == 0 {
		return
	}
	maxRd := int(qp.attr.MaxQPRdAtomic)
	if maxRd < 1 {
		maxRd = 1
	}
	sent := false
	asked := false // schedHold asked outside a turn
	if qp.sr != nil {
		if qp.sr.due {
			nout := qp.nout
			qp.srRecover()
			sent = qp.nout != nout
			if qp.attr.State == QPSErr {
				return
			}
		}
	}
	for qp.sqCur != qp.sqEnd {
		w := qp.sqAt(qp.sqCur)
		// Nothing unacknowledged (a ping-pong's every request) fits any
		// window, which is at least 1 (TestRequesterWindowAtLeastOne):
		// window, not inlined, is asked only with PSNs outstanding.
		if qp.init.Type == QPTypeRC && r.psn != qp.comp.oldestUnacked() && r.psn.Diff(qp.comp.oldestUnacked()) >= r.window(w, r.curPkt) {
			break
		}
		if !asked {
			// schedHold's two cases asked in line first: outside a turn
			// on a device that does not defer, its call was a tenth of
			// the doorbell.
			if (qp.schedTurn || qp.dev.sched.deferring()) && qp.schedHold() {
				break // its turn comes (sched.go)
			}
			// Outside a turn asked once per call, not per packet: a
			// device that does not defer the first packet lets the
			// call send all it may (one doorbell per post). In a turn,
			// every packet counts against its quantum.
			asked = !qp.schedTurn
		}
		if w.stalled() {
			break
		}
		if w.wr.Opcode == WRBindMW || w.wr.Opcode == WRLocalInv {
			if st == QPSSQD || (w.wr.Flags&SendFence != 0 && r.rdOut > 0) {
				break
			}
			if !r.execLocal(w) {
				break
			}
			continue
		}
		if r.curPkt == 0 {
			if st == QPSSQD {
				break
			}
			if w.wr.Flags&SendFence != 0 && r.rdOut > 0 {
				break
			}
			if isRdAtomic(w.wr.Opcode) {
				if r.rdOut >= maxRd {
					break
				}
				r.rdOut++
				w.rdCounted = true
			}
			w.firstPSN = r.psn
			if w.wr.Opcode == WRCompareSwap || w.wr.Opcode == WRFetchAdd {
				w.npkts = 1
			} else {
				w.npkts = npkts(w.length, qp.mtu)
			}
		}
		if qp.paceHold() {
			break
		}
		// sendRequest written out: its call cost ~13 instructions per
		// packet.
		if isRdAtomic(w.wr.Opcode) {
			if !r.sendRdAtomic(w) {
				break
			}
		} else if !r.sendData(w) {
			break
		}
		if qp.cc.rp.Limited() {
			qp.paceSentLimited(qp.out[qp.nout-1].Len())
		}
		if qp.schedTurn {
			qp.schedLeft--
		}
		sent = true
	}
	if qp.sqCur == qp.sqEnd {
		qp.cc.rp.Idle()
	}
	if sent && qp.sr != nil {
		qp.srTimeSent()
	}
	if sent && qp.attr.State != QPSErr {
		if qp.tmr.inPost {
			qp.tmr.armDue = true
		} else {
			qp.armRetrans()
		}
	}
}

// fillsWindow reports whether the packet about to go (packet k of w, at
// r.psn) leaves an RC QP's window full: nothing more goes until an ACK
// comes, and a responder sends one only when asked (or at the message's
// end), so that packet asks. MaxPktsPerAck (64) is below the default
// window (128), but not below every window a device may be configured
// with.
func (r *requester) fillsWindow(w *sendWQE, k int) bool {
	return r.qp.init.Type == QPTypeRC && r.psn.Add(1).Diff(r.qp.comp.oldestUnacked()) >= r.window(w, k)
}

// sendRequest emits the next packet of w (a READ request covers all its
// remaining PSNs) and advances the requester. It reports false when the
// QP went to ERR.
func (r *requester) sendRequest(w *sendWQE) bool {
	switch w.wr.Opcode {
	case WRRead, WRCompareSwap, WRFetchAdd:
		return r.sendRdAtomic(w)
	}
	return r.sendData(w)
}

// sendData emits the next packet of a SEND or WRITE. Its headers are
// written straight into the packet buffer and its payload gathered into
// place, where packet.Build took a packet.Fields (cleared per packet) and
// copied the payload, already gathered into its slot, onto itself; the
// bytes are Build's (TestSendDataMatchesBuild).
func (r *requester) sendData(w *sendWQE) bool {
	qp := r.qp
	k := r.curPkt
	mtu := qp.mtu
	off := uint64(k) * uint64(mtu)
	rest := uint64(w.length) - off
	payloadLen := mtu
	if rest <= uint64(mtu) {
		payloadLen = int(rest)
	}
	op := w.wr.Opcode
	first, last := k == 0, k == w.npkts-1
	opc := dataOpcode(op, first, last)
	hdr := bth.Size
	if first && (op == WRWrite || op == WRWriteImm) {
		hdr += reth.Size
	}
	var ackReq, se bool
	if last {
		ackReq = w.wr.Flags&SendNoAckReq == 0 || !r.coveredByNext(w)
		se = w.wr.Flags&SendSolicited != 0 && op != WRWrite
		if op == WRSendImm || op == WRWriteImm || op == WRSendInv {
			hdr += immdt.Size // ImmDt or IETH, both 4 bytes
		}
	}
	r.noack++
	// The last packet of a scheduler turn (sched.go) asks for an ACK: a
	// message longer than the turn's quantum (a 64 KiB WRITE at MTU 1024
	// is 64 packets, four turns) would otherwise leave its first packets
	// unacknowledged until its last one, and with many such QPs midway
	// the device's inflight budget filled with packets no responder had
	// a reason to acknowledge: the scheduler stalled until ACK timeouts
	// (100 QPs with one 64 KiB WRITE each at the default MTU moved 8 MB/s
	// instead of ~1 GB/s).
	// So does a packet that fills the window (fillsWindow), looked at
	// last: most packets are decided before it.
	if !ackReq && (r.noack >= qp.dev.cfg.MaxPktsPerAck || r.forceAck || (qp.schedTurn && qp.schedLeft <= 1) ||
		(qp.sr != nil && r.noack >= qp.srAckEvery()) || r.fillsWindow(w, k)) {
		ackReq = true
	}
	if ackReq {
		r.noack = 0
	}
	if qp.init.Type == QPTypeUC {
		// The same operation in the UC transport (0x20 | op), never
		// asking for an acknowledgement.
		opc |= bth.Opcode(bth.TransportUC)
		ackReq = false
	}
	var zc []byte // the payload in registered memory (zero-copy send)
	var hold *memreg.Hold
	// Not on UC: its work request completes as soon as the last packet is
	// queued (below), before the link reads a zero-copy payload, and the
	// application may then reuse the memory (verbs allows it): UC copies.
	if payloadLen >= zcMinPayload && qp.dev.zc && qp.init.Type != QPTypeUC {
		var err error
		if zc, hold, err = qp.pd.GatherView(w.sges, off, payloadLen); err != nil {
			r.failLocal(w, WCLocProtErr)
			return false
		}
	}
	pad := bth.PadFor(payloadLen)
	n := hdr + pad + packet.ICRCSize
	if zc == nil {
		n += payloadLen
	}
	ackSlot := qp.ackSlot // for dropLast
	buf := qp.outPkt(n)
	// Pad and ICRC placeholder (4 to 7 bytes) zeroed with one store over
	// the last 8, before the headers and payload are written: n is at
	// least 16 (BTH and ICRC).
	binary.LittleEndian.PutUint64(buf[n-8:], 0)
	// The BTH as bth.BTH.Encode writes it (two stores), without its
	// call and the fields it takes: opcode; SE, M 0, pad count, TVer 0;
	// the P_Key; FECN, BECN 0; the destination QP; AckReq; the PSN.
	fl := uint64(pad) << 4
	if se {
		fl |= 0x80
	}
	psn := uint32(r.psn) & 0xffffff
	if ackReq {
		psn |= 1 << 31
	}
	binary.BigEndian.PutUint64(buf, uint64(opc)<<56|fl<<48|uint64(bth.DefaultPKey)<<32|uint64(qp.attr.DestQPN&0xffffff))
	binary.BigEndian.PutUint32(buf[8:], psn)
	o := bth.Size
	if first && (op == WRWrite || op == WRWriteImm) {
		t := reth.RETH(buf[o : o+reth.Size])
		t.SetVA(w.wr.RemoteAddr)
		t.SetRKey(w.wr.RKey)
		t.SetDMALength(w.length)
		o += reth.Size
	}
	if o != hdr {
		v := w.wr.Imm
		if op == WRSendInv {
			v = w.wr.InvRKey
		}
		binary.BigEndian.PutUint32(buf[o:], v) // ImmDt or IETH
	}
	if zc == nil && payloadLen > 0 {
		if err := qp.pd.GatherRef(w.sges, w.ref, off, buf[hdr:hdr+payloadLen]); err != nil {
			// The local memory went away after PostSend: local protection error.
			qp.dropLast(n, ackSlot)
			r.failLocal(w, WCLocProtErr)
			return false
		}
	}
	if zc != nil {
		// The link sends the payload from registered memory (Device.zc),
		// reading it only while hold is acquired (Device.send).
		p := &qp.out[qp.nout-1]
		p.Payload, p.Hold = zc, hold
	}
	if r.psn == r.maxPSN {
		// A first transmission (advance, written out for one PSN).
		r.psn = r.psn.Add(1)
		r.maxPSN = r.psn
		if r.curPkt++; r.curPkt >= w.npkts {
			r.endWQE(w)
		}
	} else {
		r.advanceResend(w, 1)
	}
	return true
}

// sendRdAtomic emits the READ request of w's remaining PSNs, or its
// atomic request, and advances the requester.
func (r *requester) sendRdAtomic(w *sendWQE) bool {
	qp := r.qp
	k := r.curPkt
	mtu := qp.mtu
	f := &qp.reqF
	*f = packet.Fields{}
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = r.psn
	consumed := 1
	if w.wr.Opcode == WRRead {
		off := uint64(k) * uint64(mtu)
		f.BTH.Opcode = bth.RCReadRequest
		f.BTH.AckReq = true
		f.RETH.VA = w.wr.RemoteAddr + off
		f.RETH.RKey = w.wr.RKey
		f.RETH.DMALength = w.length - uint32(off)
		if r.rdLimit != 0 && f.RETH.DMALength > r.rdLimit {
			f.RETH.DMALength = r.rdLimit
		}
		consumed = w.npkts - k
	} else {
		f.BTH.Opcode = bth.RCFetchAdd
		if w.wr.Opcode == WRCompareSwap {
			f.BTH.Opcode = bth.RCCompareSwap
			f.AtomicETH.SwapAdd = w.wr.Swap
			f.AtomicETH.Compare = w.wr.CompareAdd
		} else {
			f.AtomicETH.SwapAdd = w.wr.CompareAdd
		}
		f.BTH.AckReq = true
		f.AtomicETH.VA = w.wr.RemoteAddr
		f.AtomicETH.RKey = w.wr.RKey
	}
	// Both ask for an ACK (a response).
	r.noack = 0
	buf := qp.outBufN(packet.Len(f.BTH.Opcode, 0))
	n, err := packet.Build(buf, f)
	if err != nil {
		r.failLocal(w, WCLocQPOpErr)
		return false
	}
	qp.commit(n)
	r.advance(w, consumed)
	return true
}

// advance moves the requester past the consumed PSNs of w just queued.
func (r *requester) advance(w *sendWQE, consumed int) {
	if r.psn != r.maxPSN {
		r.advanceResend(w, consumed)
		return
	}
	r.psn = r.psn.Add(consumed)
	if r.maxPSN.Before(r.psn) {
		r.maxPSN = r.psn
	}
	r.curPkt += consumed
	if r.curPkt >= w.npkts {
		r.endWQE(w)
	}
}

// advanceResend is advance of a resent packet (counted).
func (r *requester) advanceResend(w *sendWQE, consumed int) {
	if r.psn.Before(r.maxPSN) {
		inc(&r.qp.dev.ctr.RetransmittedPkts)
	}
	r.psn = r.psn.Add(consumed)
	if r.maxPSN.Before(r.psn) {
		r.maxPSN = r.psn
	}
	r.curPkt += consumed
	if r.curPkt >= w.npkts {
		r.endWQE(w)
	}
}

// endWQE moves the requester past w, all of whose packets were queued.
func (r *requester) endWQE(w *sendWQE) {
	qp := r.qp
	r.curPkt = 0
	qp.sqCur++
	if qp.init.Type == QPTypeUC {
		// No acknowledgement will come: done once sent.
		qp.comp.completeHead(w)
	}
}

// coveredByNext reports whether the last packet of w, flagged
// SendNoAckReq, may go without AckReq: a first transmission on an RC QP
// without selective repeat, and the next work request already posted, a
// WRITE or SEND without fence whose first packet the window admits at
// once — so it follows right behind, asks for the acknowledgement, and
// that covers w too (SendNoAckReq).
func (r *requester) coveredByNext(w *sendWQE) bool {
	qp := r.qp
	if qp.init.Type != QPTypeRC || qp.sr != nil || qp.attr.State != QPSRTS || r.psn.Diff(r.maxPSN) < 0 || w.wr.Opcode != WRWrite && w.wr.Opcode != WRSend && w.wr.Opcode != WRSendInv && w.wr.Opcode != WRSendImm && w.wr.Opcode != WRWriteImm {
		return false
	}
	next := qp.sqCur + 1
	if next == qp.sqEnd {
		return false
	}
	n := qp.sqAt(next)
	switch n.wr.Opcode {
	case WRWrite, WRWriteImm, WRSend, WRSendImm, WRSendInv:
	default:
		return false
	}
	if n.wr.Flags&SendFence != 0 {
		return false
	}
	return r.psn.Diff(qp.comp.oldestUnacked())+1 < r.window(n, 0)
}

// SmallPacketPayload is the most payload bytes a request packet carries
// that DeviceConfig.MaxUnackedSmallPSNs admits (below the smallest MTU's
// 256, so that full packets never count as small).
const SmallPacketPayload = 128

// window returns how many PSNs may be unacknowledged when packet k of w
// goes: MaxUnackedSmallPSNs for a small SEND or WRITE packet or an
// atomic, MaxUnackedPSNs otherwise (a READ request asks for all its
// response PSNs at once), capped by selective repeat's window.
func (r *requester) window(w *sendWQE, k int) int32 {
	cfg := &r.qp.dev.cfg
	win := cfg.MaxUnackedPSNs
	switch w.wr.Opcode {
	case WRWrite, WRWriteImm, WRSend, WRSendImm, WRSendInv:
		if uint64(w.length)-uint64(k)*uint64(r.qp.mtu) <= SmallPacketPayload {
			win = r.smallWindow()
		}
	case WRCompareSwap, WRFetchAdd:
		win = r.smallWindow()
	}
	if r.qp.sr != nil {
		return r.qp.srWindow(int32(win))
	}
	return int32(win)
}

// smallWindow returns the small-packet window now (see smallWin).
func (r *requester) smallWindow() int {
	if r.smallWin != 0 {
		return int(r.smallWin)
	}
	return r.qp.dev.cfg.MaxUnackedSmallPSNs
}

// smallGrow grows a small-packet window cut by a rewind by a quarter of
// the PSNs an ACK newly acknowledges (acked): from 128 back to 512 takes
// 1,536 PSNs without a loss, and a path losing one packet in 100 keeps it
// near MaxUnackedPSNs.
func (r *requester) smallGrow(acked int32) {
	if r.smallWin == 0 || acked <= 0 {
		return
	}
	r.smallWin += max(1, acked/4)
	if int(r.smallWin) >= r.qp.dev.cfg.MaxUnackedSmallPSNs {
		r.smallWin = 0
	}
}

// failLocal records that the requester could not build the next packet of
// w (its local memory went away after PostSend, or the packet did not
// build). As rxe does, the requester stops at w: no packet of w or of a
// later WQE is sent (again), while the WQEs before w that are already on
// the wire complete as their responses arrive, retransmitted as usual. Once
// they have, w completes with st, the QP moves to ERR and the WQEs after w
// are flushed (failAtHead). If w is the oldest outstanding WQE, that
// happens now.
func (r *requester) failLocal(w *sendWQE, st WCStatus) {
	w.done, w.status = true, st
	r.failAtHead()
}

// failAtHead fails the QP when the oldest outstanding WQE is one the
// requester gave up on (failLocal). The completer calls it after every
// completion.
func (r *requester) failAtHead() {
	qp := r.qp
	if qp.sqHead == qp.sqEnd || qp.attr.State == QPSErr {
		return
	}
	if w := qp.sqAt(qp.sqHead); w.done && w.status != WCSuccess {
		qp.failWQE(w, w.status)
	}
}

// stalled reports whether w is a WQE the requester gave up on (failLocal):
// it sends nothing of it or after it.
func (w *sendWQE) stalled() bool { return w.done && w.status != WCSuccess }

func dataOpcode(op WROpcode, first, last bool) bth.Opcode {
	switch op {
	case WRWrite, WRWriteImm:
		switch {
		case first && last:
			if op == WRWriteImm {
				return bth.RCWriteOnlyImm
			}
			return bth.RCWriteOnly
		case first:
			return bth.RCWriteFirst
		case last:
			if op == WRWriteImm {
				return bth.RCWriteLastImm
			}
			return bth.RCWriteLast
		}
		return bth.RCWriteMiddle
	default:
		switch {
		case first && last:
			switch op {
			case WRSendImm:
				return bth.RCSendOnlyImm
			case WRSendInv:
				return bth.RCSendOnlyInv
			}
			return bth.RCSendOnly
		case first:
			return bth.RCSendFirst
		case last:
			switch op {
			case WRSendImm:
				return bth.RCSendLastImm
			case WRSendInv:
				return bth.RCSendLastInv
			}
			return bth.RCSendLast
		}
		return bth.RCSendMiddle
	}
}

// rewind resets the requester to from, the oldest unacknowledged PSN: the
// next request packet is the one with that PSN (go-back-N).
func (r *requester) rewind(from bth.PSN) {
	qp := r.qp
	for i := qp.sqHead; i != qp.sqEnd && i <= qp.sqCur; i++ {
		qp.sqAt(i).rdCounted = false
	}
	r.rdOut = 0
	qp.sqCur = qp.sqHead
	r.psn = from
	r.noack = 0
	r.curPkt = 0
	if cfg := &qp.dev.cfg; cfg.MaxUnackedSmallPSNs > cfg.MaxUnackedPSNs {
		r.smallWin = int32(cfg.MaxUnackedPSNs)
	}
	if qp.sqHead == qp.sqEnd {
		return
	}
	w := qp.sqAt(qp.sqHead)
	if k := int(from.Diff(w.firstPSN)); k > 0 && k < w.npkts {
		r.curPkt = k
		if isRdAtomic(w.wr.Opcode) {
			w.rdCounted = true
			r.rdOut = 1
		}
	}
}

// rdComplete releases w's place among the outstanding READ/atomic
// requests (max_rd_atomic) once it has completed.
func (r *requester) rdComplete(w *sendWQE) {
	if w.rdCounted {
		w.rdCounted = false
		r.rdOut--
	}
}

// started reports whether the WQE at index i has been (at least partly) sent.
func (r *requester) started(i uint64) bool {
	qp := r.qp
	return i < qp.sqCur || (i == qp.sqCur && r.curPkt > 0)
}

// nextPSN returns the PSN of the next request packet to send; every PSN
// before it was sent.
func (r *requester) nextPSN() bth.PSN { return r.psn }

// execLocal executes a local operation (a type 2 window bind, a local
// invalidate) when the requester reaches it: in order after the WRs before
// it were sent, once only (a go-back-N passes over it). It completes when
// it is the oldest outstanding WR: now, or when the ACKs of the WRs before
// it arrive. It reports false when it failed (failLocal) or must wait.
func (r *requester) execLocal(w *sendWQE) bool {
	qp := r.qp
	if !w.localDone {
		var err error
		if w.wr.Opcode == WRBindMW {
			b := &w.wr.Bind
			_, err = w.wr.MW.BindQP(qp.qpn, b.MR, b.Addr, b.Length, b.Access, uint8(w.wr.RKey))
		} else {
			if qp.zcInFlight() {
				// READ responses built before it are on their way to
				// the link outside the QP (a received batch took them):
				// invalidated now, they would be dropped at the send.
				// It runs in a turn of the scheduler, which waits for
				// them after its batch (waitResp) holding no QP's lock.
				if qp.schedTurn {
					qp.schedMore = true
					qp.dev.sched.waitResp = true
				} else {
					qp.dev.sched.add(qp)
				}
				return false
			}
			// The READ responses built before it leave first (see
			// flushZeroCopy).
			qp.flushZeroCopy()
			err = qp.rv.InvalidateLocal(w.wr.InvRKey)
		}
		if err != nil {
			if qp.trace != nil {
				qp.trace("%v wr_id %#x: %v", w.wr.Opcode, w.wr.WRID, err)
			}
			r.failLocal(w, WCMWBindErr)
			return false
		}
		w.localDone = true
	}
	w.firstPSN = r.psn
	w.npkts = 0
	qp.sqCur++
	if qp.sqHead == qp.sqCur-1 || qp.init.Type == QPTypeUC {
		qp.comp.completeHead(w)
	}
	return true
}
