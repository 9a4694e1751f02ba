//go:build linux

package transport

import (
	"runtime"
	"testing"
	"time"
)

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
