package transport

import (
	"net/netip"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

const outBatch = 32

// outBuf returns a packet buffer of full capacity for the next outgoing
// packet; commit must follow. The output queue itself (2 KiB) is made on
// the QP's first packet, so that a QP that never sends holds none.
func (qp *QP) outBuf() []byte {
	if qp.out == nil {
		qp.out = make([]udp.Packet, outBatch)
		qp.outBufs = make([]*[udp.MaxPacketSize]byte, outBatch)
	}
	if qp.nout == len(qp.out) {
		qp.flushOut()
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
	p.Addr = dst
	p.SrcPort = sport
	p.TOS = qp.dev.dataTOS(tos)
	qp.nout++
	qp.ackSlot = 0
}

// flushOut sends the queued packets. Called with qp.mu held so that a QP's
// packets leave in order.
func (qp *QP) flushOut() {
	if qp.nout == 0 {
		return
	}
	qp.ackLast()
	if qp.trace != nil {
		var p packetT
		for i := 0; i < qp.nout; i++ {
			if p.Parse(qp.out[i].Buf) == nil && p.BTH.Opcode() != bth.RCWriteMiddle && p.BTH.Opcode() != bth.RCSendMiddle {
				qp.trace("tx %v psn %v", p.BTH.Opcode(), p.BTH.PSN())
			}
		}
	}
	qp.dev.send(qp.out[:qp.nout])
	// The link is done with the buffers: back to the pool, so that a QP
	// holds packet memory only while it has packets queued.
	for i := 0; i < qp.nout; i++ {
		qp.dev.bufs.Put(qp.outBufs[i])
		qp.outBufs[i] = nil
		qp.out[i].Buf = nil
	}
	qp.nout = 0
	qp.ackSlot = 0
}
