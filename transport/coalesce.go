package transport

import (
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

// respBatch collects, at the end of a received batch, the responses (ACKs,
// NAKs, READ and atomic responses, CNPs) that the batch made the QPs
// queue, so that they leave in one Link.Send for all the QPs instead of
// one per QP: with many QPs each getting a message per batch, that is one
// sendmmsg (or one GSO datagram) for all their ACKs instead of one system
// call per QP. Only the batch's owner (Device.flushPending) uses it; the
// send scheduler has one of its own for the turns it sends together
// (sched.go).
//
// Order: only the batch owner creates a QP's responses (they answer
// received requests), so a QP's responses leave in the order they were
// queued even when they are taken out of the QP; a QP's requests (posted
// by the application, resent by a timer) are never taken: a QP that has
// any queued sends everything itself, under its lock, as before. Requests
// and responses are the two independent PSN sequences of a connection,
// so their relative order does not matter to the peer (see ackLast).
type respBatch struct {
	pkts []udp.Packet
	bufs []*[udp.MaxPacketSize]byte
}

// takeResponses moves the QP's queued packets into b if they are all
// responses and reports whether it did (a QP with nothing queued counts as
// done), and whether any of them carries its payload from registered
// memory (zero-copy). Called with qp.mu held.
func (qp *QP) takeResponses(b *respBatch) (took, zc bool) {
	if qp.nout == 0 {
		return true, false
	}
	if qp.trace != nil {
		return false, false // flushOut traces what it sends
	}
	for i := 0; i < qp.nout; i++ {
		if bth.Opcode(qp.out[i].Buf[0]).Info().Request {
			return false, false
		}
		if qp.out[i].Hold != nil {
			zc = true
		}
	}
	b.pkts, b.bufs = qp.takeOut(b.pkts, b.bufs)
	return true, zc
}

// takeOut moves the QP's queued packets and their buffers to the end of
// pkts and bufs (the caller sends them and gives the buffers back to the
// device's pool) and empties the queue. Called with qp.mu held.
func (qp *QP) takeOut(pkts []udp.Packet, bufs []*[udp.MaxPacketSize]byte) ([]udp.Packet, []*[udp.MaxPacketSize]byte) {
	for i := 0; i < qp.nout; i++ {
		pkts = append(pkts, qp.out[i])
		bufs = append(bufs, qp.outBufs[i])
		qp.outBufs[i] = nil
		qp.out[i].Buf = nil
		qp.out[i].Payload = nil
		qp.out[i].Hold = nil
	}
	qp.nout = 0
	qp.ackSlot = 0
	// The slabs go with the packets in them (the caller gives them back
	// after the send); the QP starts a new one for its next small packet.
	for i, s := range qp.slabs {
		bufs = append(bufs, s)
		qp.slabs[i] = nil
	}
	qp.slabs = qp.slabs[:0]
	qp.slabOff = 0
	return pkts, bufs
}

// send hands the collected responses to the link in one call and returns
// their buffers to the device's pool.
func (b *respBatch) send(d *Device) {
	if len(b.pkts) == 0 {
		return
	}
	d.send(b.pkts)
	for i := range b.pkts {
		b.pkts[i].Buf = nil
		b.pkts[i].Payload = nil
		b.pkts[i].Hold = nil
	}
	for i, buf := range b.bufs {
		if buf != nil { // a small packet's slot: its slab is in bufs too
			d.bufs.Put(buf)
		}
		b.bufs[i] = nil
	}
	b.pkts = b.pkts[:0]
	b.bufs = b.bufs[:0]
}
