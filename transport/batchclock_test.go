package transport

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
)

// countingClock is the wall clock, counting Now calls.
type countingClock struct {
	RealClock
	n atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.n.Add(1)
	return c.RealClock.Now()
}

// TestBatchClock: the READ responses of a received batch push the
// requester's ACK deadline out with one clock reading per batch, not one
// per packet (Device.rxNow) — and the READ still completes with the data.
func TestBatchClock(t *testing.T) {
	clk := &countingClock{}
	a, b, _ := newPair(t, pairOpts{clock: clk})
	const size = 64 << 10 // 64 response packets at MTU 1024
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	dst, dmr := a.buffer(t, size, 0)
	fill(src, 3)
	before := clk.n.Load()
	if err := a.qp.PostSend(SendWR{Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 10*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("%+v", wc[0])
	}
	reads := clk.n.Load() - before
	if string(dst) != string(src) {
		t.Fatal("READ data differs")
	}
	// 64 responses, received in batches: far fewer readings than packets
	// (one per packet before).
	if reads >= size/1024/2 {
		t.Errorf("%d clock readings for a READ of %d response packets", reads, size/1024)
	}
	t.Logf("%d clock readings for %d response packets", reads, size/1024)
}

// TestBatchClockSchedMarked: a requester whose scheduler mark is set
// (txSched.account; it stays set while READs are outstanding, as in a
// stream of READs once a timer or a turn has accounted the QP) accounts
// the QP again for every READ response received, and that too uses the
// batch's clock reading (QP.now), not a clock reading per response
// packet (two per packet before: one time.Now for the stale check).
func TestBatchClockSchedMarked(t *testing.T) {
	clk := &countingClock{}
	a, b, _ := newPair(t, pairOpts{clock: clk})
	const size = 64 << 10 // 64 response packets at MTU 1024
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	dst, dmr := a.buffer(t, size, 0)
	fill(src, 5)
	qp := a.qp
	qp.mu.Lock()
	qp.schedMarked, qp.schedStale = true, false
	qp.schedMarkPSN, qp.schedMarkAt = qp.req.psn, a.dev.now().UnixNano()
	qp.mu.Unlock()
	before := clk.n.Load()
	if err := qp.PostSend(SendWR{Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 10*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("%+v", wc[0])
	}
	reads := clk.n.Load() - before
	if string(dst) != string(src) {
		t.Fatal("READ data differs")
	}
	qp.mu.Lock()
	marked, stale := qp.schedMarked, qp.schedStale
	qp.mu.Unlock()
	if marked || stale {
		t.Errorf("after the READ completed: schedMarked %v, schedStale %v; want both false", marked, stale)
	}
	if reads >= size/1024/2 {
		t.Errorf("%d clock readings for a READ of %d response packets on a marked QP", reads, size/1024)
	}
	t.Logf("%d clock readings for %d response packets", reads, size/1024)
}
