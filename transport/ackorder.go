package transport

import (
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

// ackLast moves the ACKs queued at the head of the QP's output behind the
// requests queued after them, when everything after the ACKs is a
// request: a responder's ACK (queued when a request arrived) and the
// requests the application posted in answer (a ping-pong's SEND or WRITE)
// belong to the two independent PSN sequences of the connection, so their
// order on the wire does not matter to the peer. The request then reaches
// the peer first, and ACK and request form one UDP GSO datagram (the
// last segment of a GSO group may be shorter, an ACK is the shortest
// packet), which the peer's GRO socket takes in one buffer: one datagram
// per message and direction instead of two. The order among the ACKs and
// among the requests is kept. Called with qp.mu held.
func (qp *QP) ackLast() {
	n := qp.nout
	if n < 2 {
		return
	}
	if n == 2 {
		// An ACK and the answer posted to the message it acknowledges
		// (a ping-pong's usual pair): the general case below, without
		// its loops.
		// (Both slots cut once: one bounds check for each slice.)
		out, bufs := qp.out[:2], qp.outBufs[:2]
		if p := &out[1]; out[0].Buf[0] == byte(bth.RCAck) && p.Buf[0] != byte(bth.RCAck) &&
			requestOps[p.Buf[0]] {
			swapOut(&out[0], p)
			if bufs[0] != nil || bufs[1] != nil { // both in the slab: nothing to swap
				bufs[0], bufs[1] = bufs[1], bufs[0]
			}
		}
		return
	}
	a := 0
	for a < n && qp.out[a].Buf[0] == byte(bth.RCAck) {
		a++
	}
	if a == 0 || a == n {
		return
	}
	for i := a; i < n; i++ {
		if !requestOps[qp.out[i].Buf[0]] {
			return
		}
	}
	if a == 1 {
		// One ACK (a ping-pong's): moved behind the requests by
		// swapping it along, field by field (a copy of whole Packets
		// went through typedslicecopy, a call per slice and a write
		// barrier per pointer word).
		for i := 0; i < n-1; i++ {
			swapOut(&qp.out[i], &qp.out[i+1])
			qp.outBufs[i], qp.outBufs[i+1] = qp.outBufs[i+1], qp.outBufs[i]
		}
		return
	}
	// Rotate out[:n] and outBufs[:n] left by a (three reversals, no
	// allocation).
	qp.revOut(0, a-1)
	qp.revOut(a, n-1)
	qp.revOut(0, n-1)
}

// requestOps marks the request opcodes (bth.Info.Request), for ackLast
// without Info's 24-byte copy.
var requestOps = func() (t [256]bool) {
	for i := range t {
		t[i] = bth.Opcode(i).Info().Request
	}
	return t
}()

// swapOut exchanges the packets x and y. The destination, source port
// and TOS are swapped only when they differ (an ACK and a request of one
// QP go to the same peer): an Addr holds a pointer, and its swap two
// write barriers' checks.
func swapOut(x, y *udp.Packet) {
	x.Buf, y.Buf = y.Buf, x.Buf
	if x.Addr != y.Addr {
		x.Addr, y.Addr = y.Addr, x.Addr
	}
	x.SrcPort, y.SrcPort = y.SrcPort, x.SrcPort
	x.TOS, y.TOS = y.TOS, x.TOS
	if x.Payload != nil || y.Payload != nil {
		x.Payload, y.Payload = y.Payload, x.Payload
	}
	if x.Hold != nil || y.Hold != nil {
		x.Hold, y.Hold = y.Hold, x.Hold
	}
}

// revOut reverses out[i:j+1] and outBufs[i:j+1].
func (qp *QP) revOut(i, j int) {
	for ; i < j; i, j = i+1, j-1 {
		qp.out[i], qp.out[j] = qp.out[j], qp.out[i]
		qp.outBufs[i], qp.outBufs[j] = qp.outBufs[j], qp.outBufs[i]
	}
}
