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
	n := len(s.holders)
	s.holdMu.Unlock()
	if n != want {
		t.Errorf("%d QPs in holders, %d hold a share", n, want)
	}
}

// TestSchedSweepHoldersOnly: when the budget stays full (a silent peer),
// the scheduler's sweep looks at the QPs holding a share of it, not at
// every QP of the device: 1,000 QPs of which 20 sent, each sweep looks
// at no more than those 20 (before, at all 1,000 — with 10,000 cold QPs,
// milliseconds per stall). The QPs sent to a silent peer still go stale
// (sweep found them) and the holders list matches the shares.
func TestSchedSweepHoldersOnly(t *testing.T) {
	const n, busy = 1000, 20
	// Budget 8 (2 per QP), ACK timeout ~4 s: the peer never answers, so
	// only stale marks (found by the sweep) free the budget.
	r := newSchedRig(t, n, DeviceConfig{SchedQPs: 1, SchedInflight: 8}, 0, 20)
	r.b.Close() // silent peer
	for i := range busy {
		r.post(t, i)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.a.sched.sweeps.Load() < 3 || r.a.Counters().SchedStaleQPs == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps and %d stale QPs in 20 s", r.a.sched.sweeps.Load(), r.a.Counters().SchedStaleQPs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	sweeps, swept := r.a.sched.sweeps.Load(), r.a.sched.swept.Load()
	t.Logf("%d sweeps looked at %d QPs; stale %d", sweeps, swept, r.a.Counters().SchedStaleQPs)
	if swept > busy*sweeps {
		t.Errorf("%d sweeps looked at %d QPs: more than the %d that sent", sweeps, swept, busy)
	}
	checkHolders(t, r.a)
}
