package transport

import (
	"net/netip"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

// outBatch is how many packets a QP's output queue holds before it is
// sent, outBatchMax how many on a GSO link (Device.outMax): when the QP
// queues more packets between two flushes (a PostSend of several large
// messages) the queue grows instead of being sent, up to outBatchMax
// packets, so that a PostSend of a window's worth of 64 KiB WRITEs (128
// packets at MTU 4096) leaves in one Link.Send — one sendmmsg of 16 GSO
// datagrams instead of four calls of four. Without GSO a Send of 32 is
// half a sendmmsg batch already, and the smaller queue gets the first
// packets out sooner. The queue starts at outFirst packets and doubles as
// the QP queues more: a QP that only sends ACKs (most of a target's, half
// of every pair's) or one message at a time (10,000 QPs in scheduler
// turns of 16 packets) never makes the full size, which a first send on
// 20,000 fresh QPs paid for in allocation and GC (0.3 s of 2.2 s).
const (
	outFirst    = 4
	outBatch    = 32
	outBatchMax = 128
)

// outBuf returns a packet buffer of full capacity for the next outgoing
// packet; commit must follow. The output queue itself is made on the
// QP's first packet, so that a QP that never sends holds none, and it
// grows (to outBatch, or outBatchMax on a GSO link) only in a QP that
// queues more; it is sent when full at that size (never earlier, however
// small it still is), so the growth changes no flush.
func (qp *QP) outBuf() []byte {
	qp.outSlot()
	if qp.outBufs[qp.nout] == nil {
		qp.outBufs[qp.nout] = qp.dev.getBuf()
	}
	qp.outSmall = false
	return qp.outBufs[qp.nout][:]
}

// slabMax is the largest packet built in a QP's slab (outBufN).
const slabMax = 512

// outBufN returns a buffer for the next outgoing packet, which will be at
// most size bytes long; commit must follow. A small packet (up to
// slabMax: an ACK, a small message's request or READ response, the
// headers of a zero-copy packet) is built in the QP's slab, right behind
// the small packet queued before it, instead of in a pool buffer of its
// own: a window of 64-byte WRITEs then takes one or two pool buffers
// instead of one each (a pool round trip per packet, and 4 KiB of cache
// per ~100-byte packet), and the packets of a GSO datagram lie back to
// back, which the socket link sends as one iovec.
func (qp *QP) outBufN(size int) []byte {
	if size > slabMax {
		return qp.outBuf()
	}
	qp.outSlot() // may flush, which empties the slabs
	if len(qp.slabs) == 0 || qp.slabOff+size > udp.MaxPacketSize {
		qp.newSlab()
	}
	qp.outSmall = true
	return qp.slabs[len(qp.slabs)-1][qp.slabOff:]
}

// outPkt queues the next packet, n bytes for the connected peer, and
// returns its bytes for the caller to fill (outBufN, then commit, in one
// step: the requester's data packets are built in place and cannot fail
// but for their gather, which dropLast undoes). A small packet goes in
// the QP's slab, as outBufN puts it.
func (qp *QP) outPkt(n int) []byte {
	qp.outSlot() // may flush, which empties the slabs
	var b []byte
	if n <= slabMax {
		// The slab and offset held in locals, so that the slice is cut
		// with the one check the condition leaves (o+n fits a slab).
		s, o := qp.slabs, qp.slabOff
		var sl *[udp.MaxPacketSize]byte
		if len(s) != 0 && o+n <= udp.MaxPacketSize {
			sl = s[len(s)-1]
		} else {
			qp.newSlab()
			sl, o = qp.slabs[len(qp.slabs)-1], 0
		}
		b = sl[o : o+n : o+n]
		qp.slabOff = o + n
	} else {
		if qp.outBufs[qp.nout] == nil {
			qp.outBufs[qp.nout] = qp.dev.getBuf()
		}
		b = qp.outBufs[qp.nout][:n]
	}
	p := &qp.out[qp.nout]
	p.Buf = b
	p.Payload = nil
	p.Hold = nil
	p.Addr = qp.peer
	p.SrcPort = qp.srcPort
	p.TOS = qp.dev.dataTOS(qp.attr.AV.TrafficClass)
	qp.nout++
	qp.ackSlot = 0
	return b
}

// dropLast takes the packet of n bytes that outPkt queued last out of
// the queue again (its gather failed), giving its slab room back.
// ackSlot is qp.ackSlot from before outPkt: when outPkt flushed nothing,
// a positive ACK queued last before it is last again, and a newer ACK
// replaces it as if the packet had never been queued
// (TestSendGatherFailureKeepsAckCoalescing).
func (qp *QP) dropLast(n, ackSlot int) {
	qp.nout--
	qp.out[qp.nout].Buf = nil
	if n <= slabMax {
		qp.slabOff -= n
	}
	if ackSlot == qp.nout {
		qp.ackSlot = ackSlot
	}
}

// newSlab starts a new slab for small packets (outBufN).
func (qp *QP) newSlab() {
	qp.slabs = append(qp.slabs, qp.dev.getBuf())
	qp.slabOff = 0
}

// outSlot makes room in the output queue for one more packet, growing it
// or flushing it when full.
func (qp *QP) outSlot() {
	if qp.nout == len(qp.out) { // also a QP's first packet: no queue yet
		qp.outSlotFull()
	}
}

// outSlotFull is outSlot's work, when the queue is full or not made yet.
func (qp *QP) outSlotFull() {
	if qp.out == nil {
		qp.out = make([]udp.Packet, outFirst)
		qp.outBufs = make([]*[udp.MaxPacketSize]byte, outFirst)
	}
	if qp.nout == len(qp.out) {
		if n := len(qp.out); !qp.outFixed && n < qp.dev.outMax {
			qp.out = append(qp.out, make([]udp.Packet, min(n, qp.dev.outMax-n))...)
			qp.outBufs = append(qp.outBufs, make([]*[udp.MaxPacketSize]byte, min(n, qp.dev.outMax-n))...)
		} else {
			qp.flushOut()
		}
	}
}

// commit queues the packet built in the last outBuf with length n, for
// the connected peer.
func (qp *QP) commit(n int) {
	qp.commitTo(n, qp.peer, qp.srcPort, qp.attr.AV.TrafficClass)
}

// commitTo queues the packet built in the last outBuf with length n for
// dst, from UDP source port sport, with traffic class tos.
func (qp *QP) commitTo(n int, dst netip.Addr, sport uint16, tos uint8) {
	p := &qp.out[qp.nout]
	if qp.outSmall {
		// Capped at n: the next small packet follows right behind.
		o := qp.slabOff
		p.Buf = qp.slabs[len(qp.slabs)-1][o : o+n : o+n]
		qp.slabOff += n
		qp.outSmall = false
	} else {
		p.Buf = qp.outBufs[qp.nout][:n]
	}
	p.Payload = nil
	p.Hold = nil
	p.Addr = dst
	p.SrcPort = sport
	p.TOS = qp.dev.dataTOS(tos)
	qp.nout++
	qp.ackSlot = 0
}

// zcMinPayload is the smallest payload sent from registered memory
// (Device.zc): a smaller one is copied into the packet buffer, which
// costs less than the two more iovecs the kernel walks per packet — and
// keeps a one-packet message one iovec, sent with sendto.
const zcMinPayload = 1024

// commitPayload queues the packet built in the last outBuf by
// packet.BuildSplit (length n, its payload left out) with its payload
// in registered memory: the link sends it from there (zero-copy,
// Device.zc), reading it only while hold is acquired (Device.send).
func (qp *QP) commitPayload(n int, payload []byte, hold udp.PayloadHold) {
	qp.commit(n)
	qp.out[qp.nout-1].Payload = payload
	qp.out[qp.nout-1].Hold = hold
}

// flushZeroCopy sends the queued packets now if any of them carries its
// payload from registered memory (zero-copy, commitPayload), before an
// invalidation this QP executes (a received SEND with Invalidate, a
// LOCAL_INV it posted) takes that memory away: the invalidation executes
// after the READ requests before it, and their
// responses must leave with the data the READ was executed on. Left
// queued to the end of the received batch or scheduler turn, READ
// responses from the window the SEND invalidated were dropped
// (zero_copy_dropped) and the requester's READ, resent, failed with a
// remote access error, where rxe (which copies each response as it
// builds it) and this device without zero-copy answered it. Called with
// qp.mu held.
func (qp *QP) flushZeroCopy() {
	// (Those a received batch took out of the QP are not here: see
	// zcInFlight.)
	for i := 0; i < qp.nout; i++ {
		if qp.out[i].Hold != nil {
			qp.flushOut()
			return
		}
	}
}

// zcInFlight reports that zero-copy packets of the QP are between it and
// the link: a received batch took them out (Device.flushPending) and has
// not sent them yet. An invalidation must not run before they are sent
// (flushZeroCopy), and this QP's lock is no place to wait for that:
// flushPending takes QPs' locks before it sends. Called with qp.mu held.
func (qp *QP) zcInFlight() bool {
	return qp.zcTaken > qp.dev.respSent.Load()
}

// flushOut sends the queued packets. Called with qp.mu held so that a QP's
// packets leave in order.
func (qp *QP) flushOut() {
	if qp.nout == 0 {
		return
	}
	qp.ackLast()
	if qp.trace != nil {
		qp.traceOut()
	}
	qp.dev.send(qp.out[:qp.nout])
	// A Link.Send inside a batch (a long READ response, a window refilled
	// after an ACK) may take long, or block on a full socket: the batch's
	// clock reading is too old for the deadlines set after it.
	if qp.rxIn {
		qp.dev.rxNow.drop()
	}
	// The link is done with the buffers: back to the pool, so that a QP
	// holds packet memory only while it has packets queued — except the
	// first one in a QP whose ACK timer is kept armed while idle (hot:
	// busy within the last timeout, timers.coldIdle): it keeps that one
	// for its next packet, which then costs no pool round trip. Going
	// cold gives it back (dropSpare).
	keep := qp.tmr.timerArmed && !qp.tmr.coldIdle
	out := qp.out[:qp.nout]
	bufs := qp.outBufs[:len(out)] // one bounds check for the loop
	for i := range out {
		o := &out[i]
		o.Buf = nil
		if o.Hold != nil || o.Payload != nil {
			// Only a zero-copy packet (commitPayload) has them: a
			// test costs less than two stores with write barriers.
			o.Payload, o.Hold = nil, nil
		}
		if (i == 0 && keep) || bufs[i] == nil {
			continue
		}
		qp.dev.bufs.Put(bufs[i])
		bufs[i] = nil
	}
	qp.nout = 0
	qp.ackSlot = 0
	if keep && len(qp.slabs) == 1 {
		// releaseSlabs' usual case in line: a hot QP's one slab stays.
		qp.slabOff = 0
	} else {
		qp.releaseSlabs(keep)
	}
}

// releaseSlabs ends the slabs' use once nothing queued lies in them: a
// hot QP keeps the first in place for its next packets (as it keeps a
// packet buffer; handing it to a spare and back cost a slice append and a
// loop per flush), the rest go back to the device's pool. Called with
// qp.mu held.
func (qp *QP) releaseSlabs(keep bool) {
	k := 0
	if keep && len(qp.slabs) > 0 {
		k = 1
	}
	for i := k; i < len(qp.slabs); i++ {
		qp.dev.bufs.Put(qp.slabs[i])
		qp.slabs[i] = nil
	}
	qp.slabs = qp.slabs[:k]
	qp.slabOff = 0
}

// dropSpare gives the packet buffers a hot QP kept after its last flush
// (flushOut) back to the device's pool. Called with qp.mu held.
func (qp *QP) dropSpare() {
	if qp.nout == 0 && len(qp.outBufs) > 0 && qp.outBufs[0] != nil {
		qp.dev.bufs.Put(qp.outBufs[0])
		qp.outBufs[0] = nil
	}
	if qp.nout == 0 && len(qp.slabs) > 0 {
		qp.releaseSlabs(false)
	}
}

// traceOut traces the queued packets (but the middle ones of a message).
func (qp *QP) traceOut() {
	var p packetT
	for i := 0; i < qp.nout; i++ {
		o := &qp.out[i]
		if o.Hold != nil && !o.Hold.Acquire() {
			continue // its memory is gone: Device.send drops it
		}
		w := o.AppendWire(nil)
		if o.Hold != nil {
			o.Hold.Release()
		}
		if p.Parse(w) == nil && p.BTH.Opcode() != bth.RCWriteMiddle && p.BTH.Opcode() != bth.RCSendMiddle {
			qp.trace("tx %v psn %v", p.BTH.Opcode(), p.BTH.PSN())
		}
	}
}
