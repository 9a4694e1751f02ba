//go:build linux

package transport

import (
	"testing"

	"github.com/gorocev2/rocev2/aeth"
)

// TestProgressAfterBatch walks the Progress calls after a polled batch
// (rxDriver.after) one by one on a memLoop link, whose lease (twice its
// busy-poll budget of a second) keeps the receive goroutine off the link
// meanwhile: the call right after a batch that queued only an ACK does
// nothing — it neither receives what waits in the link nor sends the ACK
// (it takes no lock for that) — and the call after it sends the ACK and
// receives again; the call right after a batch that queued more sends it
// and does not receive.
func TestProgressAfterBatch(t *testing.T) {
	p := newProtoPingPong(t)
	if err := p.round(3); err != nil {
		t.Fatal(err)
	}
	d := p.r.dev
	waiting := queuedIn(d)
	// send has A send a SEND (with the ACK A may have queued for B) and
	// returns how many packets wait in B's link then.
	send := func() int {
		t.Helper()
		if err := p.a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: p.asge}); err != nil {
			t.Fatal(err)
		}
		w := waiting()
		if w == 0 {
			t.Fatal("A's SEND is not in B's link")
		}
		return w
	}
	// Settle: whatever the rounds left is handled and sent.
	for range 4 {
		d.Progress()
	}
	if w := waiting(); w != 0 {
		t.Fatalf("%d packets left in B's link after the rounds", w)
	}

	w := send()
	d.rx.after.Store(afterACKs)
	st := d.rx.stats
	deferred, skips, sent := st.deferred.Load(), st.skips.Load(), d.Counters().SentPkts
	if n := d.Progress(); n != 0 || waiting() != w {
		t.Fatalf("after an ACK-only batch: Progress handled %d, %d packets wait in the link, want 0 and %d", n, waiting(), w)
	}
	if a := d.rx.after.Load(); a != afterNone || st.deferred.Load() != deferred+1 || st.skips.Load() != skips+1 {
		t.Fatalf("after an ACK-only batch: after %d, deferred +%d, skips +%d; want %d, +1, +1", a, st.deferred.Load()-deferred, st.skips.Load()-skips, afterNone)
	}
	// The next call receives: the SEND, which queues an ACK only.
	if n := d.Progress(); n != w {
		t.Fatalf("the call after: Progress handled %d packets, want %d", n, w)
	}
	if b := d.rxBusy.Load(); !d.realClk || b != 0 {
		t.Fatalf("after the batch: rxBusy %d (wall clock %v), want 0: the device looks stuck in a batch (inputBehind)", b, d.realClk)
	}
	if a := d.rx.after.Load(); a != afterACKs {
		t.Fatalf("a batch that queued an ACK: after %d, want %d", a, afterACKs)
	}
	if n := d.Progress(); n != 0 || d.Counters().SentPkts != sent {
		t.Fatalf("right after it: Progress handled %d, sent %d; want 0, 0 (the ACK kept)", n, d.Counters().SentPkts-sent)
	}
	if n := d.Progress(); n != 0 || d.Counters().SentPkts != sent+1 {
		t.Fatalf("the call after that: Progress handled %d, sent %d; want 0, 1 (the ACK)", n, d.Counters().SentPkts-sent)
	}
	if err := p.r.qp.PostRecv(RecvWR{SGEs: p.rrecv}); err != nil {
		t.Fatal(err)
	}
	p.r.rcq.Poll(p.wcs) // the SEND's completion (Poll's own Progress finds nothing)

	// After a batch that queued more than ACKs: what is queued goes, and
	// the link is not read. (An ACK stands for it here.)
	w = send()
	qp := p.r.qp
	qp.mu.Lock()
	qp.resp.sendAck(aeth.ACK(aeth.NoCreditLimit), qp.resp.psn.Add(-1))
	qp.rxQueued = true
	d.rxPending = append(d.rxPending, qp)
	qp.mu.Unlock()
	d.rx.after.Store(afterBatch)
	sent = d.Counters().SentPkts
	if n := d.Progress(); n != 0 || waiting() != w || d.Counters().SentPkts != sent+1 {
		t.Fatalf("after a batch: Progress handled %d, %d wait in the link, sent %d; want 0, %d, 1", n, waiting(), d.Counters().SentPkts-sent, w)
	}
	if n := d.Progress(); n != w {
		t.Fatalf("the call after: Progress handled %d packets, want %d", n, w)
	}
}

// TestPollSkipsAfterACKs: CQ.Poll of an empty CQ takes Progress's first
// case itself (skipAfterACKs, without the call) — and only that case.
// Right after a batch that queued only ACKs it returns without receiving
// and takes the mark, so that the next Poll receives; after any other
// batch, or none, it drives the link as Progress does.
func TestPollSkipsAfterACKs(t *testing.T) {
	p := newProtoPingPong(t)
	if err := p.round(3); err != nil {
		t.Fatal(err)
	}
	d := p.r.dev
	waiting := queuedIn(d)
	for range 4 {
		d.Progress()
	}
	if w := waiting(); w != 0 {
		t.Fatalf("%d packets left in B's link after the rounds", w)
	}
	empty := p.r.scq // B's send CQ: the rounds' completions were polled
	send := func() int {
		t.Helper()
		if err := p.a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: p.asge}); err != nil {
			t.Fatal(err)
		}
		if w := waiting(); w != 0 {
			return w
		}
		t.Fatal("A's SEND is not in B's link")
		return 0
	}
	st := d.rx.stats

	w := send()
	d.rx.after.Store(afterACKs)
	deferred, skips := st.deferred.Load(), st.skips.Load()
	if k := empty.Poll(p.wcs); k != 0 || waiting() != w {
		t.Fatalf("after an ACK-only batch: Poll returned %d with %d packets waiting, want 0 with %d (not received)", k, waiting(), w)
	}
	if a := d.rx.after.Load(); a != afterNone || st.deferred.Load() != deferred+1 || st.skips.Load() != skips+1 {
		t.Fatalf("after an ACK-only batch: after %d, deferred +%d, skips +%d; want %d, +1, +1 (the mark taken)", a, st.deferred.Load()-deferred, st.skips.Load()-skips, afterNone)
	}
	// The next Poll receives the SEND (its completion lands in B's
	// receive CQ, not in the polled one).
	if k := empty.Poll(p.wcs); k != 0 || waiting() != 0 {
		t.Fatalf("the Poll after: returned %d with %d packets waiting, want 0 with 0 (received)", k, waiting())
	}
	if k := p.r.rcq.Poll(p.wcs[:1]); k != 1 {
		t.Fatalf("the SEND's completion: %d", k)
	}
	if err := p.r.qp.PostRecv(RecvWR{SGEs: p.rrecv}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		d.Progress()
	}

	// After a batch that queued more than ACKs the skip is not taken:
	// Progress sends what is queued (afterBatch) and does not count the
	// call as one that kept ACKs back.
	w = send()
	d.rx.after.Store(afterBatch)
	deferred = st.deferred.Load()
	if k := empty.Poll(p.wcs); k != 0 || waiting() != w || st.deferred.Load() != deferred || d.rx.after.Load() != afterNone {
		t.Fatalf("after a batch: Poll returned %d, %d packets wait, deferred +%d, after %d; want 0, %d, +0, %d",
			k, waiting(), st.deferred.Load()-deferred, d.rx.after.Load(), w, afterNone)
	}
	if k := empty.Poll(p.wcs); k != 0 || waiting() != 0 {
		t.Fatalf("the Poll after: returned %d with %d packets waiting, want 0 with 0", k, waiting())
	}
}

// queuedIn returns a function that counts the packets waiting in d's
// memLoop link.
func queuedIn(d *Device) func() int {
	link := d.link.(*memLoop)
	return func() int {
		link.mu.Lock()
		defer link.mu.Unlock()
		return len(link.q)
	}
}
