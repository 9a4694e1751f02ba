package transport

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestSRQ: three RC QPs on one device share one SRQ; SENDs to each take
// the SRQ's WRs in order; the limit event fires once when the SRQ drops
// below its limit; an empty SRQ makes the responder RNR-NAK until a WR is
// posted; the SRQ cannot be destroyed while QPs use it.
func TestSRQ(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{minRNR: 1, rnrRetry: 7}
	o.defaults()
	srv := newSide(t, n, addrB, &o)
	srq, err := srv.dev.CreateSRQ(srv.pd, SRQAttr{MaxWR: 16, MaxSGE: 2, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	dst, dmr := srv.buffer(t, 16*64, 0)
	for i := 0; i < 5; i++ {
		if err := srq.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: sge(dmr, i*64, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Destroy(); err != nil { // nothing attached yet: fine, but then recreate
		t.Fatal(err)
	}
	srq, _ = srv.dev.CreateSRQ(srv.pd, SRQAttr{MaxWR: 16, MaxSGE: 2, Limit: 3})
	for i := 0; i < 5; i++ {
		srq.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: sge(dmr, i*64, 64)})
	}
	var clients []*side
	var qps []*QP
	for i := 0; i < 3; i++ {
		qp, err := srv.dev.CreateQP(srv.pd, QPInitAttr{Type: QPTypeRC, SendCQ: srv.scq, RecvCQ: srv.rcq, MaxSendWR: 4, SRQ: srq})
		if err != nil {
			t.Fatal(err)
		}
		c := newSide(t, n, netipFrom4([4]byte{192, 0, 2, byte(10 + i)}), &o)
		srvSide := &side{dev: srv.dev, pd: srv.pd, scq: srv.scq, rcq: srv.rcq, qp: qp}
		connect(t, c, srvSide, addrB, 0x100, 0x200, &o)
		connect(t, srvSide, c, c.dev.Addr(), 0x200, 0x100, &o)
		clients, qps = append(clients, c), append(qps, qp)
	}
	if err := srq.Destroy(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Destroy of an SRQ in use: %v", err)
	}
	if err := qps[0].PostRecv(RecvWR{SGEs: sge(dmr, 0, 8)}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("PostRecv on a QP with an SRQ: %v", err)
	}
	send := func(c *side, b byte) {
		t.Helper()
		buf, mr := c.buffer(t, 64, 0)
		for i := range buf {
			buf[i] = b
		}
		if err := c.qp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(mr, 0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range clients {
		send(c, byte('a'+i))
		wc := waitWC(t, srv.rcq, 1, 5*time.Second)[0]
		if wc.Status != WCSuccess || wc.WRID != uint64(100+i) || wc.QPN != qps[i].QPN() {
			t.Fatalf("message %d: %+v", i, wc)
		}
		if !bytes.Equal(dst[i*64:i*64+64], bytes.Repeat([]byte{byte('a' + i)}, 64)) {
			t.Fatalf("message %d landed wrong", i)
		}
	}
	// 5 posted, 3 taken: 2 < limit 3, so the event fired, once.
	ev := expectSRQEvent(t, srv.dev)
	if ev.SRQ != srq || srq.Query().Limit != 0 {
		t.Fatalf("limit event %+v, limit now %d", ev, srq.Query().Limit)
	}
	// Drain the SRQ, then one more SEND waits (RNR) until a WR arrives.
	send(clients[0], 'x')
	send(clients[1], 'y')
	waitWC(t, srv.rcq, 2, 5*time.Second)
	send(clients[2], 'z')
	deadline := time.Now().Add(5 * time.Second)
	for srv.dev.Counters().SendRNRErr == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if srv.dev.Counters().SendRNRErr == 0 {
		t.Fatal("no RNR NAK with the SRQ empty")
	}
	srq.PostRecv(RecvWR{WRID: 999, SGEs: sge(dmr, 15*64, 64)})
	if wc := waitWC(t, srv.rcq, 1, 5*time.Second)[0]; wc.WRID != 999 || wc.QPN != qps[2].QPN() {
		t.Fatalf("after the RNR: %+v", wc)
	}
	// A QP in ERR flushes only what it holds, not the SRQ.
	srq.PostRecv(RecvWR{WRID: 1000, SGEs: sge(dmr, 0, 64)})
	qps[0].Modify(&QPAttr{State: QPSErr}, AttrState)
	if srq.Len() != 1 {
		t.Fatalf("SRQ holds %d WRs after a QP failed, want 1", srq.Len())
	}
	for _, qp := range qps {
		qp.Destroy()
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
}

func expectSRQEvent(t *testing.T, d *Device) AsyncEvent {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-d.Events():
			if ev.Type == EventSRQLimitReached {
				select {
				case ev2 := <-d.Events():
					if ev2.Type == EventSRQLimitReached {
						t.Fatal("the SRQ limit event fired twice")
					}
				default:
				}
				return ev
			}
		case <-deadline:
			t.Fatal("no SRQ limit event")
		}
	}
}

// TestLastWQEReached: a QP attached to an SRQ that enters ERR raises
// EventQPLastWQEReached once, after the receive WQE it held (the first
// packet of a SEND arrived, the last was lost) has been flushed to the
// CQ; the SRQ's other WRs stay. Another trip through ERR (a PostSend in
// ERR) does not raise it again, a QP without an SRQ never raises it, and
// Destroy does not. Before, the event was never raised, and a program
// that waits for it before destroying the QP (Linux's ib_drain_rq) hung.
func TestLastWQEReached(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	srv := newSide(t, n, addrB, &o)
	srq, err := srv.dev.CreateSRQ(srv.pd, SRQAttr{MaxWR: 16, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, dmr := srv.buffer(t, 4*4096, 0)
	for i := range 4 {
		if err := srq.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: sge(dmr, i*4096, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	qp, err := srv.dev.CreateQP(srv.pd, QPInitAttr{Type: QPTypeRC, SendCQ: srv.scq, RecvCQ: srv.rcq, MaxSendWR: 4, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	lc, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	dl := &dropLink{Wrap: udp.Wrap{Link: lc}, drop: func(op bth.Opcode) bool { return op == bth.RCSendLast }}
	c := sideOn(t, dl, &o)
	srvSide := &side{dev: srv.dev, pd: srv.pd, scq: srv.scq, rcq: srv.rcq, qp: qp}
	connect(t, c, srvSide, addrB, 0x100, 0x200, &o)
	connect(t, srvSide, c, addrA, 0x200, 0x100, &o)
	_, smr := c.buffer(t, 2000, 0)
	if err := c.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, SGEs: sge(smr, 0, 2000)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the SEND's first packet", func() bool { return srv.dev.Counters().RcvdPkts >= 1 })
	noWC(t, srv.rcq)
	if err := qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	var ev AsyncEvent
	select {
	case ev = <-srv.dev.Events():
	case <-time.After(5 * time.Second):
		t.Fatal("no event after an SRQ QP entered ERR")
	}
	if ev.Type != EventQPLastWQEReached || ev.QP != qp || ev.SRQ != srq {
		t.Fatalf("event %v (QP %p SRQ %p), want last WQE reached on %p/%p", ev, ev.QP, ev.SRQ, qp, srq)
	}
	// The held WQE was flushed before the event was raised.
	var wc [2]WC
	if k := srv.rcq.Poll(wc[:]); k != 1 || wc[0].WRID != 100 || wc[0].Status != WCWRFlushErr {
		t.Fatalf("recv CQ after the event: %d completions %+v, want WR 100 flushed", k, wc[:k])
	}
	// ERR again (a post in ERR flushes through the same path): no second event.
	if err := qp.PostSend(SendWR{WRID: 2, Opcode: WRSend}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, srv.scq, 1, 5*time.Second)
	// A QP without an SRQ, and Destroy: no event.
	if err := srv.qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-srv.dev.Events():
		t.Fatalf("unexpected event %v", ev)
	case <-time.After(20 * time.Millisecond):
	}
	// The SRQ's other WRs are still there for other QPs.
	if k := srv.rcq.Poll(wc[:]); k != 0 {
		t.Fatalf("completions %+v", wc[:k])
	}
}

// TestLastWQEReachedAfterFatal: an SRQ QP that fails by itself raises its
// error event first and Last WQE Reached after it (once), as a consumer
// that tears the QP down on the fatal event expects; before, Last WQE
// Reached came first.
func TestLastWQEReachedAfterFatal(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrB, &o)
	srq, err := s.dev.CreateSRQ(s.pd, SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := s.dev.CreateQP(s.pd, QPInitAttr{Type: QPTypeRC, SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 4, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	qp.fail(EventQPFatal, ErrCQOverflow)
	qp.mu.Unlock()
	var got []EventType
	for len(got) < 2 {
		select {
		case ev := <-s.dev.Events():
			if ev.QP == qp {
				got = append(got, ev.Type)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("events %v, want the fatal event and last WQE reached", got)
		}
	}
	if got[0] != EventQPFatal || got[1] != EventQPLastWQEReached {
		t.Fatalf("events %v, want [%v %v]", got, EventQPFatal, EventQPLastWQEReached)
	}
	select {
	case ev := <-s.dev.Events():
		t.Fatalf("a third event %v", ev)
	case <-time.After(50 * time.Millisecond):
	}
}
