package transport

import (
	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// READ responses, a quantum at a time.
//
// One READ request asks for up to 2 GiB: 2 M response packets at MTU
// 1024. Built in one loop where the request is handled — in the device's
// receive goroutine, under the QP's lock — a 256 MiB READ kept every
// other QP of the device from receiving anything for seconds: their ACKs
// went unread, their timers expired, and a connection that had nothing
// to do with the reader failed with retry exceeded. rxe sends one
// response packet per pass of its responder (res->read.resid says what
// is left), and each QP's task yields after a bounded number of passes;
// an RNIC arbitrates READ responses between QPs as it does requests.
//
// So here a READ response (readResp) goes out in quanta of at most the
// send scheduler's per-turn quantum (QP.schedQuantum: 64 KiB, 16
// packets at MTU 4096). The request's handler sends the first quantum
// right away — a READ of up to 64 KiB is answered exactly as before, in
// the same received batch — and, if more is left, queues the QP for a
// responder turn in the device's scheduler (sched.go: txSched.addResp);
// each such turn sends the next quantum, until the response is complete.
// Responder turns take their place in the scheduler's round-robin beside
// the QPs' requester turns, but the request budget (SchedInflight) does
// not hold them back: a response is never acknowledged. In between, the
// receive goroutine handles the other QPs' packets, and the scheduler
// serves the other QPs' turns.
// (HandlePacket, which runs in its caller's goroutine and blocks nobody
// else, answers a READ in full, as a replay of a capture expects.)
//
// Order: the responder answers in PSN order, as IB requires and rxe does
// (it takes the next request packet from its queue only once the READ's
// last response is sent). Every request packet for the QP that arrives
// while a response is under way — a SEND, a WRITE, another READ, an
// atomic, a duplicate, whatever its PSN — is held (heldReqs: its bytes
// copied into pool buffers, several small packets to a buffer) and
// executed after the response's last packet, in arrival order, in the
// QP's responder turns (responder.progress). Its execution, and its ACK,
// NAK, READ response or atomic ACK, so come after the READ's responses,
// as they did when the response was sent in one piece. The expected PSN
// and the MSN move when the READ is executed, as before; the saved
// resource (max_dest_rd_atomic) is taken then too, and a duplicate READ
// is replayed from it, a quantum at a time like a new one. Selective
// repeat holds its out-of-order packets as before (srHold); a READ
// executed from them stops srDrain until its response is complete.
// What a QP holds is bounded (heldMaxPkts packets in heldMaxBufs pool
// buffers, 1 MiB; all QPs together heldMaxDev buffers); a request beyond
// that is dropped and counted
// (resp_held_dropped), and the requester resends it as it would a lost
// packet. A well-behaved requester does not get there: a READ takes its
// PSNs from the requester's window, so little can follow it.
//
// Responses the receive goroutine queued for the QP may have been taken
// out of it to go with other QPs' in one Link.Send (flushPending) and be
// on their way to the link right now; a turn that would send after them
// first makes sure they are gone (Device.respMu), or they could be
// overtaken.

// readResp is the READ response under way (active): the next packet's
// PSN, the remote memory it reads and the bytes left after it.
type readResp struct {
	active bool
	first  bool    // the next packet is the response's first (FIRST or ONLY)
	inSeq  bool    // a request executed in sequence (not a replay): srDrain follows it
	req    bth.PSN // the request's PSN
	psn    bth.PSN
	va     uint64
	rkey   uint32
	rest   uint32
}

// heldMaxPkts and heldMaxBufs bound the request packets a QP holds
// behind a READ response: twice the requester's window (512 small
// packets, or 128 of a full MTU), since a selective repeat requester
// whose short timeout expires meanwhile sends its window again.
// heldMaxDev bounds the pool buffers all the device's QPs use for them
// together (8192: about 38 MiB), so that a peer with many QPs cannot
// make the device hold more.
const (
	heldMaxPkts = 1024
	heldMaxBufs = 256
	heldMaxDev  = 8192
)

// heldReqs are the request packets received while a READ response was
// under way, in arrival order: q[head:] are still to execute. Their
// bytes lie back to back in pool buffers; off is how much of the last
// packet's buffer is used, bufs how many buffers the packets take.
type heldReqs struct {
	q    []heldReq
	head int
	off  int
	bufs int
}

// heldReq is one held request packet: n bytes at off in buf.
type heldReq struct {
	buf    *[udp.MaxPacketSize]byte
	off, n int32
}

// n returns how many packets are held.
func (h *heldReqs) n() int { return len(h.q) - h.head }

// readReply answers [va, va+n) from psn on with READ responses: the
// first quantum now, the rest in the QP's responder turns (progress). A
// new request starts with FIRST/ONLY; a replay of a partly answered
// request (first == false) starts with MIDDLE/LAST, as rxe does. inSeq
// says a new request was executed in sequence (not a replay). A request,
// new or replayed, that cannot read the memory (the region was
// deregistered or the window invalidated since the first execution) is
// answered with a NAK, as rxe's read_reply does after rxe_recheck_mr.
func (r *responder) readReply(psn bth.PSN, va uint64, rkey uint32, n uint32, first, inSeq bool) {
	r.rd = readResp{active: true, first: first, inSeq: inSeq, req: psn, psn: psn, va: va, rkey: rkey, rest: n}
	r.readMore()
}

// readMore sends the next packets of the READ response under way: in a
// responder turn as many as the turn has left, in a received batch one
// quantum, elsewhere (HandlePacket) all of them. If some are left the
// QP gets a turn (again) for them. Called with qp.mu held.
func (r *responder) readMore() {
	qp := r.qp
	budget := -1
	switch {
	case qp.schedRespTurn:
		// A turn spent (schedLeft 0 or below: a held request ran after
		// the last packet it allowed) allows nothing more; -1 would
		// mean no limit, and a held READ went out whole in one turn
		// (review25).
		budget = max(qp.schedLeft, 0)
		if qp.dev.sched.queued.Load() == 0 {
			// No other QP waits for a turn: four quanta (256 KiB)
			// in this one, so that a READ response alone leaves in
			// batches as large as it did before it went by quanta
			// (a lone 1 MiB READ lost a fifth of its goodput going
			// one quantum per Link.Send).
			budget *= 4
		}
	case qp.rxBatch:
		budget = qp.schedQuantum()
	}
	for r.rd.active {
		if budget == 0 {
			if qp.schedRespTurn {
				qp.schedMore = true
			} else {
				qp.dev.sched.addResp(qp)
			}
			return
		}
		r.readPacket()
		if budget > 0 {
			budget--
		}
		if qp.schedRespTurn {
			qp.schedLeft--
		}
	}
}

// readPacket sends the next packet of the READ response under way; the
// last one ends it.
func (r *responder) readPacket() {
	qp := r.qp
	rd := &r.rd
	mtu := uint32(qp.mtu)
	isLast := rd.rest <= mtu
	var op bth.Opcode
	switch {
	case rd.first && isLast:
		op = bth.RCReadResponseOnly
	case rd.first:
		op = bth.RCReadResponseFirst
	case isLast:
		op = bth.RCReadResponseLast
	default:
		op = bth.RCReadResponseMiddle
	}
	plen := min(rd.rest, mtu)
	psn, va, rkey := rd.psn, rd.va, rd.rkey
	if isLast {
		rd.active = false
	} else {
		rd.first = false
		rd.rest -= plen
		rd.va += uint64(plen)
		rd.psn = psn.Add(1)
	}
	f := &r.qp.respF
	*f = packet.Fields{}
	f.BTH.Opcode = op
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = psn
	f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
	f.AETH.MSN = r.msn
	zc := plen >= zcMinPayload && qp.dev.zc
	size := packet.Len(op, int(plen))
	if zc {
		size -= int(plen) // the payload stays in the region
	}
	buf := qp.outBufN(size)
	if zc {
		// Zero-copy: the response's payload leaves from the region.
		view, hold, err := qp.rv.ReadView(rkey, va, int(plen))
		if err != nil {
			rd.active = false
			r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
		k, err := packet.BuildSplit(buf, f, int(plen))
		if err != nil {
			rd.active = false
			return
		}
		qp.commitPayload(k, view, hold)
		return
	}
	if plen > 0 {
		hdr := bth.Size + op.Info().HeaderLen
		slot := buf[hdr : hdr+int(plen)]
		if err := qp.rv.ReadRemote(rkey, va, slot); err != nil {
			rd.active = false
			r.fatal(memreg.NAKCode(err), psn, WCRemAccessErr)
			return
		}
		f.Payload = slot
	}
	k, err := packet.Build(buf, f)
	if err != nil {
		rd.active = false
		return
	}
	qp.commit(k)
}

// progress is the QP's responder turn in the scheduler: the READ
// response under way goes on, and once it is complete the requests held
// behind it are executed in order, each counting against the turn's
// quantum, until the quantum is spent or another READ response is under
// way. Called with qp.mu held, in a responder turn (txSched.serveResp).
func (r *responder) progress() {
	qp := r.qp
	if !r.rd.active && r.held.n() == 0 {
		return
	}
	if st := qp.attr.State; st < QPSRTR || st == QPSErr || qp.destroyed {
		r.rd = readResp{}
		r.dropHeld()
		return
	}
	// Responses a received batch took out of this QP may be between it
	// and the link (flushPending holds respMu until they are sent):
	// nothing of the QP's goes before them. Not waited for here, under
	// the QP's lock (flushPending takes it under respMu): the scheduler
	// waits after its batch, and the QP takes its next turn.
	if !qp.dev.respMu.TryLock() {
		qp.schedMore = true
		qp.dev.sched.waitResp = true
		return
	}
	qp.dev.respMu.Unlock()
	var pk packetT
	for {
		if r.rd.active {
			req, inSeq := r.rd.req, r.rd.inSeq
			r.readMore()
			if r.rd.active || qp.attr.State == QPSErr {
				return
			}
			if inSeq && qp.sr != nil {
				// What srDrain would have executed after the READ.
				qp.srDrain(req)
				if r.rd.active {
					continue
				}
			}
		}
		if r.held.n() == 0 {
			return
		}
		if qp.schedLeft <= 0 {
			qp.schedMore = true
			return
		}
		if st := qp.attr.State; st < QPSRTR || st == QPSErr || qp.destroyed {
			r.dropHeld()
			return
		}
		h := &r.held
		e := h.q[h.head]
		h.q[h.head] = heldReq{}
		h.head++
		// The packet's buffer goes back to the pool after it, unless
		// the next held packet lies in it too.
		owned := h.head == len(h.q) || h.q[h.head].buf != e.buf
		if h.head == len(h.q) {
			h.q, h.head, h.off = h.q[:0], 0, 0
		}
		if owned {
			h.bufs--
		}
		if pk.Decode(e.buf[e.off:e.off+e.n]) == packet.FaultNone {
			r.inputNow(&pk)
		}
		if owned {
			qp.dev.bufs.Put(e.buf)
			qp.dev.respHeldBufs.Add(-1)
		}
		qp.schedLeft--
		qp.settle()
	}
}

// hold keeps a copy of the request p, received while a READ response is
// under way, to be executed after it (progress). Called with qp.mu held.
func (r *responder) hold(p *packetT) {
	qp := r.qp
	h := &r.held
	raw := p.BTH[:bth.Size+p.Info.HeaderLen+len(p.Payload)+int(p.BTH.PadCount())+packet.ICRCSize]
	if h.n() >= heldMaxPkts {
		inc(&qp.dev.ctr.RespHeldDropped)
		return
	}
	var buf *[udp.MaxPacketSize]byte
	if h.n() > 0 && h.off+len(raw) <= udp.MaxPacketSize {
		buf = h.q[len(h.q)-1].buf
	} else {
		if h.bufs >= heldMaxBufs {
			inc(&qp.dev.ctr.RespHeldDropped)
			return
		}
		if qp.dev.respHeldBufs.Add(1) > heldMaxDev {
			qp.dev.respHeldBufs.Add(-1)
			inc(&qp.dev.ctr.RespHeldDropped)
			return
		}
		buf = qp.dev.getBuf()
		h.bufs++
		h.off = 0
	}
	if h.head > 0 && len(h.q) == cap(h.q) {
		// Full at the tail with room at the head: move down.
		k := copy(h.q, h.q[h.head:])
		clear(h.q[k:])
		h.q, h.head = h.q[:k], 0
	}
	n := copy(buf[h.off:], raw)
	h.q = append(h.q, heldReq{buf: buf, off: int32(h.off), n: int32(n)})
	h.off += n
	inc(&qp.dev.ctr.RespHeld)
}

// dropHeld gives the held requests' buffers back to the device's pool
// (the QP left the states that take requests, or reset). Called with
// qp.mu held.
func (r *responder) dropHeld() {
	h := &r.held
	var last *[udp.MaxPacketSize]byte
	for i := h.head; i < len(h.q); i++ {
		if b := h.q[i].buf; b != last {
			r.qp.dev.bufs.Put(b)
			r.qp.dev.respHeldBufs.Add(-1)
			last = b
		}
		h.q[i] = heldReq{}
	}
	h.q, h.head, h.off, h.bufs = h.q[:0], 0, 0, 0
}
