//go:build linux

package transport

import (
	"runtime"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
)

// TestFlushPendingSkipsEmptyQueues checks flushPending's fast path: the
// QPs of a received batch whose queues are empty by the batch's flush (a
// ping-pong's ACK left with the answer PostSend sent) only have their
// marks cleared, without the take and send under respMu (respTook does
// not move), while a QP after them that still has an ACK queued gets it
// sent, in the same flush.
func TestFlushPendingSkipsEmptyQueues(t *testing.T) {
	// A memLoop pair: its devices are driven by Progress, whose poll
	// lease (twice the link's busy-poll budget of a second) keeps the
	// receive goroutine parked, out of Recv.
	p := newProtoPingPong(t)
	if err := p.round(3); err != nil {
		t.Fatal(err)
	}
	a, b := p.a, p.r
	o := pairOpts{mtu: MTU4096}
	o.defaults()
	scq, _ := b.dev.CreateCQ(16)
	qb2, err := b.dev.CreateQP(b.pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: scq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	qa2, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	sa2, sb2 := &side{dev: a.dev, pd: a.pd, qp: qa2}, &side{dev: b.dev, pd: b.pd, qp: qb2}
	connect(t, sa2, sb2, b.dev.Addr(), 100, 200, &o)
	connect(t, sb2, sa2, a.dev.Addr(), 200, 100, &o)
	d := b.dev
	// Hold the receive driver, as a batch's owner does: the receive
	// goroutine neither handles a batch nor flushes meanwhile. (Progress
	// renews the lease that keeps it out of the link.)
	for i := 0; !d.rx.own.tryLock(rxHolderPoller); i++ {
		if i > 1e6 {
			t.Fatal("the receive driver stays held")
		}
		d.Progress()
		runtime.Gosched()
	}
	defer d.rx.own.unlock()
	d.flushPending() // what the rounds left
	pending := func(qp *QP, ack bool) {
		qp.mu.Lock()
		if ack {
			qp.resp.sendAck(aeth.ACK(aeth.NoCreditLimit), qp.resp.psn.Add(-1))
		}
		qp.rxQueued = true
		d.rxPending = append(d.rxPending, qp)
		qp.mu.Unlock()
	}
	check := func(what string, took uint64, sent uint64) {
		t.Helper()
		for _, qp := range []*QP{b.qp, qb2} {
			qp.mu.Lock()
			q, n := qp.rxQueued, qp.nout
			qp.mu.Unlock()
			if q || n != 0 {
				t.Fatalf("%s: qp %#x still marked (%v) or queued (%d)", what, qp.qpn, q, n)
			}
		}
		if len(d.rxPending) != 0 {
			t.Fatalf("%s: %d QPs left pending", what, len(d.rxPending))
		}
		d.respMu.Lock()
		got := d.respTook
		d.respMu.Unlock()
		if got != took {
			t.Fatalf("%s: respTook %d, want %d", what, got, took)
		}
		if s := d.Counters().SentPkts; s != sent {
			t.Fatalf("%s: %d packets sent, want %d", what, s, sent)
		}
	}
	d.respMu.Lock()
	took := d.respTook
	d.respMu.Unlock()
	sent := d.Counters().SentPkts

	// Both queues empty: no take.
	pending(b.qp, false)
	pending(qb2, false)
	d.flushPending()
	check("empty queues", took, sent)

	// The first empty, the second with an ACK: one take, the ACK sent.
	pending(b.qp, false)
	pending(qb2, true)
	d.flushPending()
	check("an empty queue, then an ACK", took+1, sent+1)

	// The first with an ACK, the second empty.
	pending(b.qp, true)
	pending(qb2, false)
	d.flushPending()
	check("an ACK, then an empty queue", took+2, sent+2)
}
