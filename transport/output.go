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
	if qp.outBufs[qp.nout] == nil {
		qp.outBufs[qp.nout] = qp.dev.getBuf()
	}
	return qp.outBufs[qp.nout][:]
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
	p.Buf = qp.outBufs[qp.nout][:n]
	p.Payload = nil
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
// Device.zc).
func (qp *QP) commitPayload(n int, payload []byte) {
	qp.commit(n)
	qp.out[qp.nout-1].Payload = payload
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
	if qp.rxNow != nil {
		qp.rxNow.ok = false
	}
	// The link is done with the buffers: back to the pool, so that a QP
	// holds packet memory only while it has packets queued — except the
	// first one in a QP whose ACK timer is kept armed while idle (hot:
	// busy within the last timeout, timers.coldIdle): it keeps that one
	// for its next packet, which then costs no pool round trip. Going
	// cold gives it back (dropSpare).
	keep := qp.tmr.timerArmed && !qp.tmr.coldIdle
	for i := 0; i < qp.nout; i++ {
		qp.out[i].Buf = nil
		qp.out[i].Payload = nil
		if i == 0 && keep {
			continue
		}
		qp.dev.bufs.Put(qp.outBufs[i])
		qp.outBufs[i] = nil
	}
	qp.nout = 0
	qp.ackSlot = 0
}

// dropSpare gives the packet buffer a hot QP kept after its last flush
// (flushOut) back to the device's pool. Called with qp.mu held.
func (qp *QP) dropSpare() {
	if qp.nout == 0 && len(qp.outBufs) > 0 && qp.outBufs[0] != nil {
		qp.dev.bufs.Put(qp.outBufs[0])
		qp.outBufs[0] = nil
	}
}

// traceOut traces the queued packets (but the middle ones of a message).
func (qp *QP) traceOut() {
	var p packetT
	for i := 0; i < qp.nout; i++ {
		if p.Parse(qp.out[i].AppendWire(nil)) == nil && p.BTH.Opcode() != bth.RCWriteMiddle && p.BTH.Opcode() != bth.RCSendMiddle {
			qp.trace("tx %v psn %v", p.BTH.Opcode(), p.BTH.PSN())
		}
	}
}
