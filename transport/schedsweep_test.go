package transport

import (
	"testing"
	"time"
)

// checkHolders asserts the scheduler's holders list: exactly the QPs of
// d whose share of inflight is above zero, each at the index it names.
func checkHolders(t *testing.T, d *Device) {
	t.Helper()
	s := &d.sched
	d.mu.Lock()
	qps := make([]*QP, 0, len(d.qps))
	for _, qp := range d.qps {
		qps = append(qps, qp)
	}
	d.mu.Unlock()
	want := 0
	for _, qp := range qps {
		qp.mu.Lock()
		s.holdMu.Lock()
		in, h := qp.schedInflight, qp.schedHolder
		ok := h == 0 || (int(h) <= len(s.holders) && s.holders[h-1] == qp)
		s.holdMu.Unlock()
		qp.mu.Unlock()
		if (in > 0) != (h > 0) || !ok {
			t.Errorf("QP %#x: share %d, holder index %d (in the list: %v)", qp.qpn, in, h, ok)
		}
		if in > 0 {
			want++
		}
	}
	s.holdMu.Lock()
	n := 0
	for _, qp := range s.holders {
		if qp != nil {
			n++
		}
	}
	free := len(s.holdFree)
	s.holdMu.Unlock()
	if n != want {
		t.Errorf("%d QPs in holders, %d hold a share", n, want)
	}
	if n+free != len(s.holders) {
		t.Errorf("%d holders and %d free slots in a list of %d", n, free, len(s.holders))
	}
}

// TestSchedHoldTouchesNoOtherQP: a QP whose share of inflight drops to
// zero leaves the holders list without writing to another QP (each
// holder keeps its index), and the next QP to hold a share takes the slot
// it left, so that the list stays as long as the most holders at once.
// Before, the last holder moved into the slot and its schedHolder was
// rewritten: with 10,000 QPs taking turns, a write to a cold QP per ACK.
func TestSchedHoldTouchesNoOtherQP(t *testing.T) {
	var s txSched
	qps := make([]*QP, 4)
	for i := range qps {
		qps[i] = &QP{}
	}
	for _, qp := range qps[:3] {
		s.hold(qp, true)
	}
	s.hold(qps[0], false)
	if qps[0].schedHolder != 0 {
		t.Errorf("the QP that left still has index %d", qps[0].schedHolder)
	}
	for i, qp := range qps[1:3] {
		if want := int32(i + 2); qp.schedHolder != want || s.holders[want-1] != qp {
			t.Errorf("holder %d: index %d, want %d (unchanged)", i+1, qp.schedHolder, want)
		}
	}
	s.hold(qps[3], true)
	if qps[3].schedHolder != 1 || len(s.holders) != 3 || len(s.holdFree) != 0 {
		t.Errorf("a new holder got index %d in a list of %d (%d free), want the free slot 1 of 3", qps[3].schedHolder, len(s.holders), len(s.holdFree))
	}
	s.hold(qps[3], true) // already a holder: no second slot
	if len(s.holders) != 3 {
		t.Errorf("holding twice made the list %d long", len(s.holders))
	}
}

// TestSchedSweepHoldersOnly: when the budget stays full (a silent peer),
// the scheduler's sweep looks at the QPs holding a share of it, not at
// every QP of the device: 1,000 QPs of which 20 sent to a silent peer
// and one more to a peer that answers; each sweep looks at no more than
// those 21 (before, at all 1,000 — with 10,000 cold QPs, milliseconds
// per stall). The QPs sent to the silent peer still go stale (the sweep
// found them, overtaken by the answered QP's WRITEs) and the holders
// list matches the shares.
func TestSchedSweepHoldersOnly(t *testing.T) {
	const n, busy = 1000, 20
	// Budget 8 (2 per QP), ACK timeout ~4 s: the silent QPs' peer never
	// answers, so only stale marks (found by the sweep) free the budget.
	r := newSchedRig(t, n, DeviceConfig{SchedQPs: 1, SchedInflight: 8}, 0, 20)
	for i := range busy {
		r.qb[i].Destroy() // silent peer: B drops what comes to these QPNs
	}
	for i := range busy {
		r.post(t, i)
	}
	// QP busy answers: its WRITEs, sent after the silent ones (forced
	// turns while the budget is full), overtake them.
	per := make([]int, n)
	deadline := time.Now().Add(20 * time.Second)
	for r.a.sched.sweeps.Load() < 3 || r.a.Counters().SchedStaleQPs == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps and %d stale QPs in 20 s", r.a.sched.sweeps.Load(), r.a.Counters().SchedStaleQPs)
		}
		r.post(t, busy)
		if r.collect(t, 1, 10*time.Second, per, time.Time{}) != 1 {
			t.Fatal("the answered QP's WRITE did not complete")
		}
		time.Sleep(5 * time.Millisecond)
	}
	sweeps, swept := r.a.sched.sweeps.Load(), r.a.sched.swept.Load()
	t.Logf("%d sweeps looked at %d QPs; stale %d", sweeps, swept, r.a.Counters().SchedStaleQPs)
	if swept > (busy+1)*sweeps {
		t.Errorf("%d sweeps looked at %d QPs: more than the %d that sent", sweeps, swept, busy+1)
	}
	checkHolders(t, r.a)
}
