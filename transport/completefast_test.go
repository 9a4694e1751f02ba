package transport

import (
	"errors"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
)

// TestAckNothingToSendIsProgress: the completer skips requester.progress
// after a response only when the send queue has nothing left to send
// (then progress would only mark the pacer idle). With a window of 4 PSNs
// and a manual clock (no ACK timer ever fires), 64 unsignaled WRITEs and
// a signaled one complete only if every ACK that frees window room lets
// the requester send again: skipped then, the queue stalls for good.
func TestAckNothingToSendIsProgress(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{clock: manual(), window: 4, small: -1})
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	for i := range 65 {
		w := wr
		w.WRID = uint64(i)
		if i == 64 {
			w.Flags = SendSignaled
		}
		if err := a.qp.PostSend(w); err != nil {
			t.Fatal(err)
		}
	}
	wc := waitWC(t, a.scq, 1, 10*time.Second)
	if wc[0].WRID != 64 || wc[0].Status != WCSuccess {
		t.Fatalf("completion %+v, want WRID 64 success", wc[0])
	}
	if c := a.dev.Counters(); c.CompleterRetryErr != 0 {
		t.Fatalf("%d go-back-N retries: the window stalled", c.CompleterRetryErr)
	}
}

// TestAckCompletesRun: one ACK that covers many SENDs and WRITEs
// (completer.ackUpTo: one CQ lock for the run) completes them in
// order as one completion each would: signaled ones only, with their
// opcodes, a keep-alive probe among them silently, and nothing past the
// last PSN the ACK covers in full.
func TestAckCompletesRun(t *testing.T) {
	a, la, first, dmr, smr := silentRequester(t)
	post := func(i int) {
		t.Helper()
		wr := SendWR{WRID: uint64(i), Opcode: WRSend, SGEs: sge(smr, 0, 64)}
		if i%2 == 1 {
			wr.Opcode, wr.RemoteAddr, wr.RKey = WRWrite, dmr.IOVA(), dmr.RKey()
		}
		if i != 3 && i != 7 {
			wr.Flags = SendSignaled
		}
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		post(i)
	}
	if err := a.qp.Probe(); err != nil { // PSN first+5
		t.Fatal(err)
	}
	for i := 5; i < 8; i++ {
		post(i)
	}
	// A type 1 window's bind completes in the send queue's order as a
	// local WR (no PSN of its own): the run's CQ lock is let go before
	// it completes through pushWC, and taken again after it.
	_, bmr := a.buffer(t, 64, memreg.AccessMWBind)
	mw, err := a.pd.AllocMW(memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.BindMW(100, mw, MWBindInfo{MR: bmr, Addr: bmr.IOVA(), Length: 64, Access: memreg.AccessRemoteRead}, SendSignaled); err != nil {
		t.Fatal(err)
	}
	for i := 8; i < 10; i++ {
		post(i)
	}
	// WR 11 is two packets (PSNs first+11, first+12).
	if err := a.qp.PostSend(SendWR{WRID: 11, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 1500), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if n := len(la.sent()); n != 13 {
		t.Fatalf("%d packets sent, want 13", n)
	}
	ack := func(psn bth.PSN, msn uint32) {
		t.Helper()
		if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), psn, aeth.ACK(aeth.NoCreditLimit), msn), addrB); err != nil {
			t.Fatal(err)
		}
	}
	check := func(wcs []WC, ids ...uint64) {
		t.Helper()
		if len(wcs) != len(ids) {
			t.Fatalf("%d completions %+v, want WRIDs %v", len(wcs), wcs, ids)
		}
		for k, wc := range wcs {
			op := WCSend
			switch {
			case wc.WRID == 100:
				op = WCBindMW
			case wc.WRID%2 == 1:
				op = WCRDMAWrite
			}
			if wc.WRID != ids[k] || wc.Status != WCSuccess || wc.Opcode != op || wc.ByteLen != 0 || wc.QPN != a.qp.QPN() {
				t.Fatalf("completion %d: %+v, want WRID %d %v success", k, wc, ids[k], op)
			}
		}
	}
	ack(first.Add(6), 7) // WRs 0-4 and the probe, WR 5
	check(waitWC(t, a.scq, 5, 5*time.Second), 0, 1, 2, 4, 5)
	noWC(t, a.scq)
	ack(first.Add(11), 11) // WRs 6-9, the bind, and the first packet of WR 11
	check(waitWC(t, a.scq, 4, 5*time.Second), 6, 100, 8, 9)
	noWC(t, a.scq)
	ack(first.Add(12), 12)
	check(waitWC(t, a.scq, 1, 5*time.Second), 11)
	if c := a.dev.Counters(); c.RDMASends != 5 || c.KeepAliveProbes != 1 {
		t.Fatalf("rdma_sends %d keep_alive_probes %d, want 5 1", c.RDMASends, c.KeepAliveProbes)
	}
	if a.qp.State() != QPSRTS || a.qp.Err() != nil {
		t.Fatalf("QP %v (%v), want RTS", a.qp.State(), a.qp.Err())
	}
}

// TestAckRunOverflowsCQ: a CQ that overflows in the middle of an ACK's
// run of completions keeps the ones before, loses the rest, raises
// EventCQErr once, and its QP moves to ERR, as one completion at a time
// did.
func TestAckRunOverflowsCQ(t *testing.T) {
	a, la, first, dmr, smr := silentRequesterWith(t, pairOpts{cqDepth: 4})
	for i := range 7 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(la.sent()); n != 7 {
		t.Fatalf("%d packets sent, want 7", n)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(6), aeth.ACK(aeth.NoCreditLimit), 7), addrB); err != nil {
		t.Fatal(err)
	}
	wcs := make([]WC, 8)
	if n := a.scq.Poll(wcs); n != 4 {
		t.Fatalf("%d completions, want 4", n)
	}
	for k, wc := range wcs[:4] {
		if wc.WRID != uint64(k) || wc.Status != WCSuccess {
			t.Fatalf("completion %d: %+v", k, wc)
		}
	}
	if err := a.scq.Err(); !errors.Is(err, ErrCQOverflow) {
		t.Fatalf("CQ error %v, want overflow", err)
	}
	if st := a.qp.State(); st != QPSErr {
		t.Fatalf("QP %v, want ERR", st)
	}
	if c := a.dev.Counters(); c.CQOverflow != 1 {
		t.Fatalf("cq_overflow %d, want 1", c.CQOverflow)
	}
	cqErr := 0
	for {
		select {
		case ev := <-a.dev.Events():
			if ev.Type == EventCQErr {
				cqErr++
			}
			continue
		default:
		}
		break
	}
	if cqErr != 1 {
		t.Fatalf("%d EventCQErr, want 1", cqErr)
	}
}

// TestArmRetransFast: in every state of an armed ACK timer (requests
// outstanding or not, lazyPush, coldIdle, a zero timeout) where
// armRetransFast reports it handled progress, it left the timer as
// armRetrans would have; where it does not, progressed calls armRetrans.
func TestArmRetransFast(t *testing.T) {
	a, _, _, dmr, smr := silentRequester(t)
	if err := a.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	qp := a.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !qp.tmr.timerArmed || qp.comp.psn == qp.req.psn {
		t.Fatalf("after a post to a silent peer: timer armed %v, outstanding %v", qp.tmr.timerArmed, qp.comp.psn != qp.req.psn)
	}
	tmr0, psn0, to0, lazy0 := qp.tmr, qp.comp.psn, qp.timeout, qp.dev.lazyPush
	defer func() { qp.tmr, qp.comp.psn, qp.timeout, qp.dev.lazyPush = tmr0, psn0, to0, lazy0 }()
	handled := 0
	for k := range 16 {
		outstanding, lazy, cold, zero := k&1 != 0, k&2 != 0, k&4 != 0, k&8 != 0
		set := func() {
			qp.tmr, qp.comp.psn, qp.timeout, qp.dev.lazyPush = tmr0, psn0, to0, lazy
			qp.tmr.coldIdle = cold
			if !outstanding {
				qp.comp.psn = qp.req.psn
			}
			if zero {
				qp.timeout = 0
			}
		}
		set()
		before := qp.tmr
		if !qp.armRetransFast() {
			if qp.tmr != before {
				t.Fatalf("state %d: armRetransFast changed the timer and reported false", k)
			}
			continue
		}
		handled++
		fast := qp.tmr
		set()
		qp.armRetrans()
		if qp.tmr != fast {
			t.Fatalf("state %d (outstanding %v lazyPush %v coldIdle %v zero timeout %v): armRetransFast left %+v, armRetrans %+v",
				k, outstanding, lazy, cold, zero, fast, qp.tmr)
		}
	}
	if handled != 4 { // outstanding with lazyPush, idle and warm: each with the other flag either way
		t.Fatalf("armRetransFast handled %d states, want 4", handled)
	}
}

// TestAckRunFiresChannel: a send completion that an ACK's run stores in
// place fires the CQ's completion channel when ReqNotify armed it for
// any completion, and not when armed for solicited ones only.
func TestAckRunFiresChannel(t *testing.T) {
	a, r, _ := newPair(t, pairOpts{})
	ch, err := a.dev.CreateCompChannel(1)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := a.dev.CreateCQWith(CQAttr{Depth: 16, Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	aq, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: a.rcq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	rq, err := r.dev.CreateQP(r.pd, QPInitAttr{Type: QPTypeRC, SendCQ: r.scq, RecvCQ: r.rcq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := aq.Connect(ConnParams{Peer: addrB, DestQPN: rq.QPN(), RQPSN: 7, SQPSN: 9}); err != nil {
		t.Fatal(err)
	}
	if err := rq.Connect(ConnParams{Peer: addrA, DestQPN: aq.QPN(), RQPSN: 9, SQPSN: 7, Access: memreg.AccessRemoteWrite}); err != nil {
		t.Fatal(err)
	}
	_, smr := a.buffer(t, 8, 0)
	_, dmr := r.buffer(t, 8, memreg.AccessRemoteWrite)
	write := func(id uint64) {
		t.Helper()
		if err := aq.PostSend(SendWR{WRID: id, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.WRID != id || wc.Status != WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if err := cq.ReqNotify(true); err != nil { // solicited only: a WRITE's success does not fire
		t.Fatal(err)
	}
	write(1)
	select {
	case <-ch.C():
		t.Fatal("a successful send completion fired a CQ armed for solicited completions")
	default:
	}
	if err := cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	write(2)
	select {
	case got := <-ch.C():
		if got != cq {
			t.Fatalf("event for %p, want %p", got, cq)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no channel event for the send completion")
	}
}

// TestCQSlotRing: completions stored as ackUpTo and completeWQE store
// them (slotFast in line, slotLocked where it returns nil: a full ring,
// a CQ in error) come out of Poll in order, with the ring wrapping and growing,
// until the CQ overflows at its depth: the completion that overflows it
// and every later one are lost, the ones stored before are still polled.
func TestCQSlotRing(t *testing.T) {
	for _, depth := range []int{1, 5, 16, 40} {
		a, _, _ := newPair(t, pairOpts{})
		cq, err := a.dev.CreateCQ(depth)
		if err != nil {
			t.Fatal(err)
		}
		var model []uint64 // what the CQ holds, oldest first
		next := uint64(0)
		store := func(k int) (lost int) {
			cq.mu.Lock()
			for range k {
				slot, over := cq.slotFast(), false
				if slot == nil {
					slot, over = cq.slotLocked()
				}
				if slot == nil {
					if over != (lost == 0 && len(model) == depth && cq.err == ErrCQOverflow) {
						t.Fatalf("depth %d: over %v with %d held", depth, over, len(model))
					}
					lost++
					continue
				}
				*slot = WC{WRID: next}
				model = append(model, next)
				next++
			}
			cq.mu.Unlock()
			return lost
		}
		wcs := make([]WC, 64)
		poll := func(k int) {
			t.Helper()
			n := cq.Poll(wcs[:k])
			if n != min(k, len(model)) {
				t.Fatalf("depth %d: polled %d of %d, want %d", depth, n, len(model), min(k, len(model)))
			}
			for i := range n {
				if wcs[i].WRID != model[i] {
					t.Fatalf("depth %d: polled WRID %d, want %d", depth, wcs[i].WRID, model[i])
				}
			}
			model = model[n:]
		}
		rng := []int{3, 2, 7, 1, 4, 6, 5, 9, 2, 8}
		for i, k := range rng {
			if lost := store(min(k, depth-len(model))); lost != 0 {
				t.Fatalf("depth %d: lost %d before the CQ was full", depth, lost)
			}
			poll(rng[(i+3)%len(rng)])
			for len(model) > depth/2 { // keep room for the next round
				poll(1)
			}
		}
		// Fill it, then one more overflows it.
		if lost := store(depth - len(model) + 3); lost != 3 {
			t.Fatalf("depth %d: lost %d, want 3", depth, lost)
		}
		if err := cq.Err(); !errors.Is(err, ErrCQOverflow) {
			t.Fatalf("depth %d: CQ error %v", depth, err)
		}
		poll(64)
		if len(model) != 0 {
			t.Fatalf("depth %d: %d left", depth, len(model))
		}
	}
}
