package transport

import (
	"runtime"
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

// TestBatchClockDropped: on the wall clock a batch's QPs share its one
// reading (QP.now returns it). A Link.Send inside the batch (flushOut)
// drops that reading: the next QP.now reads the clock again instead of
// returning the batch's old time.
func TestBatchClockDropped(t *testing.T) {
	// A memLoop pair: its devices are driven by Progress, whose poll
	// lease keeps the receive goroutine parked, out of Recv, so that the
	// test can hold A's receive driver (the batch clock is its state).
	p := newProtoPingPong(t)
	if err := p.round(3); err != nil {
		t.Fatal(err)
	}
	a := p.a
	if !a.dev.realClk {
		t.Fatal("pair not on the wall clock")
	}
	qp := a.qp
	d := a.dev
	for i := 0; !d.rx.own.tryLock(rxHolderPoller); i++ {
		if i > 1e6 {
			t.Fatal("the receive driver stays held")
		}
		d.Progress()
		runtime.Gosched()
	}
	reading := d.now()
	c := &d.rxNow
	*c = batchClock{t: reading, ok: true}
	at := func() time.Time {
		qp.mu.Lock()
		defer qp.mu.Unlock()
		qp.rxIn = true
		defer func() { qp.rxIn = false }()
		return qp.now()
	}
	if got, want := at(), reading; !got.Equal(want) {
		d.rx.own.unlock()
		t.Fatalf("batch time %v, want %v", got, want)
	}
	*c = batchClock{t: reading, ok: true}
	time.Sleep(2 * time.Millisecond)
	mark := d.now()
	// PostSend's flushOut sends the SEND while the QP is in the batch, as
	// a flushOut inside a batch would.
	qp.mu.Lock()
	qp.rxIn = true
	qp.mu.Unlock()
	err := qp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: p.asge})
	qp.mu.Lock()
	qp.rxIn = false
	qp.mu.Unlock()
	if err != nil {
		d.rx.own.unlock()
		t.Fatal(err)
	}
	got := at()
	d.rx.own.unlock()
	if got.Before(mark) {
		t.Fatalf("time after the send %v is the batch's old reading (before %v)", got, mark)
	}
	// The SEND arrives and completes (B's ACK leaves at its next
	// Progress: ACKs wait one call for an answer to go with).
	if err := p.await(p.r, p.rrecv); err != nil {
		t.Fatal(err)
	}
	for i := 0; a.scq.Poll(p.wcs[:1]) == 0; i++ {
		if i > 1<<24 {
			t.Fatal("the SEND did not complete")
		}
		p.r.dev.Progress()
		runtime.Gosched()
	}
	if p.wcs[0].Status != WCSuccess {
		t.Fatalf("%+v", p.wcs[0])
	}
}
