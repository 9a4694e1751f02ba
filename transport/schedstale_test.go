package transport

import (
	"testing"
	"time"
)

// schedStaleRig drives the scheduler's accounting (txSched.account) by
// hand on a ManualClock: QPs "send" and "are acknowledged" by moving
// their PSNs, no packet moves, and every step accounts the QPs holding a
// share as the scheduler's sweep does. The scheduler's goroutine is off
// (SchedQPs -1); accounting does not need it.
type schedStaleRig struct {
	clk *ManualClock
	r   *schedRig
	s   *txSched
}

func newSchedStaleRig(t *testing.T, n int) *schedStaleRig {
	clk := manual()
	r := newSchedRig(t, n, DeviceConfig{Clock: clk, SchedQPs: -1, SchedInflight: 16}, 0, 16) // 268 ms ACK timeout
	t.Cleanup(func() {
		for _, qp := range r.qa {
			qp.mu.Lock()
			qp.req.psn = qp.comp.psn
			qp.dev.sched.account(qp)
			qp.mu.Unlock()
		}
	})
	return &schedStaleRig{clk: clk, r: r, s: &r.a.sched}
}

// send makes QP i send one packet; ack acknowledges all it sent.
func (g *schedStaleRig) send(i int) {
	qp := g.r.qa[i]
	qp.mu.Lock()
	qp.req.psn = qp.req.psn.Add(1)
	g.s.account(qp)
	qp.mu.Unlock()
}

func (g *schedStaleRig) ack(i int) {
	qp := g.r.qa[i]
	qp.mu.Lock()
	qp.comp.psn = qp.req.psn
	g.s.account(qp)
	qp.mu.Unlock()
}

func (g *schedStaleRig) stale(i int) bool {
	qp := g.r.qa[i]
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.schedStale
}

// TestSchedStaleNeedsOvertaking: on a slow link, where every QP's
// packets wait in one queue in the order they were sent, the budget
// (16 packets) goes on bounding that queue however long it takes to
// drain: 6 ms per packet, 96 ms for the budget, far beyond the 20 ms
// stale limit. Before, every QP whose packet had waited 20 ms went stale
// at the next sweep (the ACK delay average, fed only by the QPs not
// stale, stayed below it), its PSNs stopped counting, the scheduler let
// more packets into the queue, and they waited past the 268 ms ACK
// timeout (the wall-clock rig with this link: 98 and 142 of 150 WRITEs
// timed out). A QP goes stale only when a packet sent after its oldest
// one was acknowledged: the second part checks that a silent peer's QP
// still stops counting beside QPs whose peers answer.
func TestSchedStaleNeedsOvertaking(t *testing.T) {
	const n, per = 40, 6 * time.Millisecond
	g := newSchedStaleRig(t, n)
	to := g.r.qa[0].timeout
	// The link: a FIFO of (QP, send time), one packet leaving per 6 ms.
	type pkt struct {
		qp int
		at time.Time
	}
	var fifo []pkt
	next := 0 // the next QP to send, round-robin
	admit := func() {
		for g.s.inflight.Load() < g.s.maxInflight {
			g.send(next)
			fifo = append(fifo, pkt{next, g.clk.Now()})
			next = (next + 1) % n
		}
	}
	admit()
	maxQ, maxWait := len(fifo), time.Duration(0)
	for step := 0; step < 400; step++ {
		// The budget stays full for 5 ms with no ACK: the scheduler
		// accounts the QPs holding it (sweep), and whatever went stale
		// makes room.
		g.clk.Advance(schedStall)
		g.s.sweep()
		admit()
		maxQ = max(maxQ, len(fifo))
		g.clk.Advance(per - schedStall)
		p := fifo[0]
		fifo = fifo[1:]
		if w := g.clk.Now().Sub(p.at); w > maxWait {
			maxWait = w
		}
		g.ack(p.qp)
		admit()
	}
	c := g.r.a.Counters()
	t.Logf("slow link: queue at most %d packets, longest wait %v, sched_stale_qps %d", maxQ, maxWait, c.SchedStaleQPs)
	if c.SchedStaleQPs != 0 || maxQ > int(g.s.maxInflight) || maxWait >= to {
		t.Fatalf("slow link: sched_stale_qps %d, queue up to %d packets (budget %d), a packet waited %v in it (ACK timeout %v)",
			c.SchedStaleQPs, maxQ, g.s.maxInflight, maxWait, to)
	}
	for _, p := range fifo {
		g.ack(p.qp)
	}

	// A silent peer's QP beside QPs acknowledged within a millisecond:
	// overtaken, it goes stale after the stale limit and stops counting.
	const silent = 0
	g.send(silent)
	for step := 0; step < 30; step++ {
		g.clk.Advance(time.Millisecond)
		for i := 1; i < 8; i++ {
			g.send(i)
		}
		g.clk.Advance(time.Millisecond)
		for i := 1; i < 8; i++ {
			g.ack(i)
		}
		g.s.sweep()
	}
	if !g.stale(silent) || g.r.qa[silent].schedInflight != 0 {
		t.Fatalf("a silent peer's QP, 60 ms unanswered beside answered ones: stale %v, share %d; want stale, 0",
			g.stale(silent), g.r.qa[silent].schedInflight)
	}
}

// TestSchedForcedTurnOnlyWhenNothingFreed: a stall of the budget (5 ms
// without room) forces a turn only when no ACK freed room in it for
// schedStaleMax (a peer holding it silently); while ACKs free room, as on
// a slow link whose packets take longer than 5 ms each, the stall only
// sweeps and waits again. Before, every such stall forced a turn: one QP's
// packets more in the link's queue per packet the link sent, a queue
// without bound (TestSchedNoTimeoutWhileWaiting/slow-link on the wall
// clock: 98-142 of 150 WRITEs timed out).
func TestSchedForcedTurnOnlyWhenNothingFreed(t *testing.T) {
	r := newSchedRig(t, 1, DeviceConfig{SchedQPs: 1, SchedInflight: 16}, 0, 14)
	s := &r.a.sched
	if s.started.Load() {
		t.Fatal("the scheduler's goroutine runs: the test calls its stall handling itself")
	}
	s.stalled.Store(true)
	s.freed.Add(1) // an ACK freed room during the stall
	s.stallExpired()
	if s.force || !s.stalled.Load() || r.a.Counters().SchedForcedTurns != 0 {
		t.Fatalf("a stall during which an ACK freed room forced a turn (force %v, stalled %v, sched_forced_turns %d)",
			s.force, s.stalled.Load(), r.a.Counters().SchedForcedTurns)
	}
	// Nothing freed since, for schedStaleMax: a turn is forced.
	s.freedAt = s.freedAt.Add(-schedStaleMax)
	s.stallExpired()
	if !s.force || s.stalled.Load() || r.a.Counters().SchedForcedTurns != 1 {
		t.Fatalf("a stall with nothing freed for %v: force %v, stalled %v, sched_forced_turns %d; want a forced turn",
			schedStaleMax, s.force, s.stalled.Load(), r.a.Counters().SchedForcedTurns)
	}
	s.force = false
}
